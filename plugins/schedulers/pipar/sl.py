"""Vanilla split learning (Gupta & Raskar), PiPar's slowest baseline: `scheduler=sl`.

Devices train one after another: device k trains its shard's iterations (N = 1) against the one
server model, then hands its device-side model to the server, which passes it on to device k+1
with the `turn` message. No averaging; the paper leaves SL out of its experiments as too slow.
Roles: `dev<k>` (its copy of units [0, P)) and `server` (units [P, Q) of the one server model,
and the latest device part, which together are the model evaluated).
"""

from __future__ import annotations


from framework import checkpoint as ck
from framework.errors import ConfigError, listing
from framework.scheduler import Role
from framework.stage import Stage
from plugins.schedulers.pipar.scheduler import Collaborative
from plugins.schedulers.pipar.iteration import SERVER, serve_iteration, split_iteration
from plugins.schedulers.pipar.roles import DeviceRole, own_copy


class SLDevice(DeviceRole):
    """A device as PiPar's (its units [0, P), its iterations), in turn instead of side by side."""

    async def run(self, ctx) -> None:
        s, k, P = self.sched, self.k, self.plan.P
        for epoch in range(self.first_epoch, s.epochs):
            if epoch or k:
                msg = await ctx.recv("server", "turn")
                if s.numerics:
                    s.layout.load(self.model, 0, P, msg)
            for xs, ys in s.iteration_batches(k, epoch, self.plan):
                await split_iteration(ctx, self.stage, "server", self.it, xs, ys, s.numerics)
                self.it += 1
                ctx.iteration_done(epoch, self.it, sum(len(y) for y in ys))
            ctx.send("server", "handoff", s.layout.flat(self.model, 0, P, s.dtype, s.numerics), iteration=self.it)
            await ctx.end_epoch(epoch)


class SLServer(Role):
    def __init__(self, sched):
        self.sched = sched
        self.device = SERVER
        self.model = own_copy(sched)
        self.P = sched.plans[0].P
        self.stage = Stage(self.model, self.P, sched.Q, sched.ctx.optimizer, numerics=sched.numerics)
        self.latest = None  # the device part last handed back: the next device's start
        # iterations served per device: a reply is labelled with the iteration of the device it
        # answers, as the device labels what it sends (an error-feedback compressor pairs each
        # gradient with its activation by that label; one count over all devices paired device
        # k > 0's gradients with nothing, and the correction was lost)
        self.served = {k: 0 for k in range(sched.K)}

    def state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()} if self.sched.numerics else {}

    def checkpoint(self, bag, prefix: str) -> dict:
        out = {"served": {str(k): n for k, n in self.served.items()}, **ck.model_and_stage(bag, prefix, self.model, self.stage, self.sched.numerics)}
        if self.latest is not None:
            out["latest"] = bag.put(f"{prefix}.latest", self.latest)
        return out

    def restore(self, bag, desc: dict) -> None:
        ck.load_model_and_stage(bag, desc, self.model, self.stage, self.sched.numerics)
        served = desc["served"]
        if isinstance(served, int):  # a checkpoint from before the per-device counts: taken at an
            # epoch's end, so every device had been served as many whole epochs
            s = self.sched
            per_epoch = {k: s.num_iterations(k, s.plans[k]) for k in range(s.K)}
            epochs = served // max(1, sum(per_epoch.values()))
            served = {k: epochs * n for k, n in per_epoch.items()}
        self.served = {int(k): int(n) for k, n in served.items()}
        self.latest = bag.take(desc["latest"]) if "latest" in desc else None

    async def run(self, ctx) -> None:
        s = self.sched
        for epoch in range(self.first_epoch, s.epochs):
            for k in range(s.K):
                if self.latest is not None:
                    ctx.send(f"dev{k}", "turn", self.latest, iteration=self.served[k])
                for _ in range(s.num_iterations(k, s.plans[k])):
                    p = s.plans[k]
                    await serve_iteration(ctx, self.stage, f"dev{k}", p.N, 1.0 / (p.N * p.micro_batch), self.served[k], s.numerics)
                    self.served[k] += 1
                self.latest = await ctx.recv(f"dev{k}", "handoff")
            if s.numerics:
                s.layout.load(self.model, 0, self.P, self.latest)
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

    def role_devices(self) -> dict[str, str]:
        return {**{f"dev{k}": self.devices[k] for k in range(self.K)}, "server": SERVER}

    def role_from_spec(self, role: str, spec: dict):
        if role == "server":
            return SLServer(self)
        if role.startswith("dev") and role[3:].isdigit():
            return SLDevice(self, int(role[3:]))
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
