"""Vanilla split learning (Gupta & Raskar), PiPar's slowest baseline: `scheduler=sl`.

Devices train one after another: device k trains its shard's iterations (N = 1) against the one
server model, then hands its device-side model to the server, which passes it on to device k+1
with the `turn` message. No averaging; the paper leaves SL out of its experiments as too slow.
Roles: `dev<k>` (its copy of units [0, P)) and `server` (units [P, Q) of the one server model,
and the latest device part, which together are the model evaluated).
"""

from __future__ import annotations

from framework.checkpoints import state as ck
from framework.errors import ConfigError, listing
from framework.scheduler import Role, SchedulerContext
from framework.stage import Stage
from plugins.schedulers.pipar.iteration import SERVER, serve_iteration, split_iteration
from plugins.schedulers.pipar.model_vectors import layout_of
from plugins.schedulers.pipar.roles import DeviceRole
from plugins.schedulers.pipar.scheduler import Collaborative
from plugins.schedulers.pipar.specs import CollabRoleSpec, DeviceSpec, ServerSpec
from plugins.schedulers.pipar.training import own_copy


class SLDevice(DeviceRole):
    """A device as PiPar's (its units [0, P), its iterations), in turn instead of side by side."""

    async def run(self, ctx) -> None:
        k, P, lay = self.k, self.plan.P, self.layout
        for epoch in range(self.first_epoch, self.spec.epochs):
            if epoch or k:
                msg = await ctx.recv("server", "turn")
                if self.numerics:
                    lay.load(self.model, 0, P, msg)
            for xs, ys in self.batches(epoch):
                await split_iteration(ctx, self.stage, "server", self.it, xs, ys, self.numerics)
                self.it += 1
                ctx.iteration_done(epoch, self.it, sum(len(y) for y in ys))
            ctx.send("server", "handoff", lay.flat(self.model, 0, P, self.dtype, self.numerics), iteration=self.it)
            await ctx.end_epoch(epoch)


class SLServer(Role):
    """The one server model (units [P, Q)), serving the devices in turn (`spec.devices_served`:
    all of them)."""

    def __init__(self, spec: ServerSpec, parts: SchedulerContext):
        self.spec = spec
        self.device = spec.device
        self.Q = len(parts.model)
        self.numerics = parts.numerics  # read once: a config lookup costs 20 us
        self.layout = layout_of(parts.model)
        self.model = own_copy(parts, self.numerics)
        self.P = spec.plans[0].P
        self.stage = Stage(self.model, self.P, self.Q, parts.optimizer, numerics=self.numerics)
        self.latest = None  # the device part last handed back: the next device's start
        # iterations served per device: a reply is labelled with the iteration of the device it
        # answers, as the device labels what it sends (an error-feedback compressor pairs each
        # gradient with its activation by that label; one count over all devices paired device
        # k > 0's gradients with nothing, and the correction was lost)
        self.served = {k: 0 for k in spec.devices_served}

    def iterations(self, k: int) -> int:
        return self.spec.iterations(self.spec.shard_sizes[k], self.spec.plans[k])

    def state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()} if self.numerics else {}

    def checkpoint(self, bag, prefix: str) -> dict:
        out = {"served": {str(k): n for k, n in self.served.items()}, **ck.model_and_stage(bag, prefix, self.model, self.stage, self.numerics)}
        if self.latest is not None:
            out["latest"] = bag.put(f"{prefix}.latest", self.latest)
        return out

    def restore(self, bag, desc: dict) -> None:
        ck.load_model_and_stage(bag, desc, self.model, self.stage, self.numerics)
        served = desc["served"]
        if isinstance(served, int):  # a checkpoint from before the per-device counts: taken at an
            # epoch's end, so every device had been served as many whole epochs
            per_epoch = {k: self.iterations(k) for k in self.spec.devices_served}
            epochs = served // max(1, sum(per_epoch.values()))
            served = {k: epochs * n for k, n in per_epoch.items()}
        self.served = {int(k): int(n) for k, n in served.items()}
        self.latest = bag.take(desc["latest"]) if "latest" in desc else None

    async def run(self, ctx) -> None:
        plans = self.spec.plans
        for epoch in range(self.first_epoch, self.spec.epochs):
            for k in self.spec.devices_served:
                if self.latest is not None:
                    ctx.send(f"dev{k}", "turn", self.latest, iteration=self.served[k])
                for _ in range(self.iterations(k)):
                    p = plans[k]
                    await serve_iteration(ctx, self.stage, f"dev{k}", p.N, 1.0 / (p.N * p.micro_batch), self.served[k], self.numerics)
                    self.served[k] += 1
                self.latest = await ctx.recv(f"dev{k}", "handoff")
            if self.numerics:
                self.layout.load(self.model, 0, self.P, self.latest)
            await ctx.end_epoch(epoch)


class SL(Collaborative):
    kind = "sl"

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.N not in (None, 1):
            raise ConfigError("scheduler.N", f"sl trains one batch at a time (N = 1), got {self.cfg.N}")
        if self.cfg.failures:
            raise ConfigError("scheduler.failures", "sl hands one model from device to device; disconnects are modelled for pipar, fl and sfl")
        if self.cfg.dp_sigma > 0:
            raise ConfigError("scheduler.dp_sigma", "DP noise on uploaded models applies to pipar, fl and sfl (sl uploads none)")

    def adjust_plans(self, plans):
        return [plans[0]] * self.K if len({p.P for p in plans}) != 1 else plans  # one device model travels

    def _server_roles(self):
        return {"server": list(range(self.K))}

    def serial_server(self) -> bool:
        return True  # one server model, the devices in turn

    def shared_server(self, role: str) -> bool:
        return True

    def role_devices(self) -> dict[str, str]:
        return {**{f"dev{k}": self.devices[k] for k in range(self.K)}, "server": SERVER}

    def role_spec(self, role: str) -> CollabRoleSpec:
        if role == "fed":  # SL averages nothing: no aggregator
            raise KeyError(f"no role {role!r}; roles: {listing(self.role_devices())}")
        return super().role_spec(role)

    def role_from_spec(self, role: str, spec: dict) -> Role:
        if role == "server":
            return SLServer(ServerSpec.from_json(spec), self.ctx)
        if self.device_index(role) is not None:
            return SLDevice(DeviceSpec.from_json(spec), self.ctx)
        raise KeyError(f"no role {role!r}; roles: {listing(self.role_devices())}")

    def optional_roles(self) -> set[str]:
        return set()  # the model travels through every device: losing one ends the run

    def aggregates(self, epoch: int) -> bool:
        return False

    def predict_epoch(self) -> float:
        """Devices train one after another: every device's iterations, each hand-off of the
        device part up, and each `turn` down to the next device (dev0's first turn comes only
        from the second epoch on)."""
        pl, cl = self.planner, self.ctx.cluster
        P = self.plans[0].P
        train = sum(p.predicted_iter_s * self.num_iterations(k, p) for k, p in enumerate(self.plans))
        part = pl.model_bytes("handoff", 0, P, False)
        up = sum(cl.link(d, SERVER).tx_time(part, 0.0) + cl.link(d, SERVER).cfg.latency_s for d in self.devices)
        down = [cl.link(SERVER, d).tx_time(pl.model_bytes("turn", 0, P, False), 0.0) + cl.link(SERVER, d).cfg.latency_s for d in self.devices]
        epochs = max(1, self.epochs)
        return train + up + (sum(down[1:]) * epochs + down[0] * (epochs - 1)) / epochs
