"""The roles of PiPar, FL and SFL: devices and server-side trainers here, the aggregator in
`pipar.aggregator`. Each is built from its spec (pipar.specs: its slice of the plan and its knobs)
and the run's parts; each owns its state and learns everything else from messages:

- `DeviceRole` (dev<k>): its copy of units [0, P), its iteration count, its plan. Trains its
  shard (split iterations with the server, or whole-model iterations for FL), uploads its part at
  each aggregation round, takes the global model back.
- `ServerRole` (srv<k>, or `server` serving several devices in turn): a replica of units [P, Q)
  per device it serves (or one shared model, SFL's `server_model=shared`). Re-plans a device's
  (P, N) when told to (re-selection), as in the paper the server decides.
- `FedRole` (fed, on the server): the global model. Averages the parts that arrive (FedAvg),
  decides re-selections from link bandwidths, sends every device and replica its slice back.

Per round, for each device k connected at the round's end (config `failures` say who is not):
dev k -> fed `model` (its part, or nothing if it died); the server role -> fed `served` (1 if
it served all of k's iterations) and then `model` (its part) if so; fed -> dev k and the server
role `round` (the re-selection flag), then `global`. Flags travel in their own small messages
because timing-only packets (`runtime.numerics=false`) carry shapes, not values.

A device whose process dies on a real runtime is seen as `PeerLost` by the server role (it stops
serving it) and by the aggregator (it leaves it out of this and later rounds): the run goes on.
"""

from __future__ import annotations

import torch

from framework.checkpoints import state as ck
from framework.cluster import Work
from framework.runtime.base import PeerLost
from framework.scheduler import Role, SchedulerContext
from framework.stage import Stage
from plugins.schedulers.pipar import plan as plan_mod
from plugins.schedulers.pipar.iteration import local_iteration, serve_iteration, split_iteration
from plugins.schedulers.pipar.model_vectors import layout_of
from plugins.schedulers.pipar.planner import Planner
from plugins.schedulers.pipar.specs import DevicePlan, DeviceSpec, ServerSpec, active_iterations
from plugins.schedulers.pipar.training import bandwidths, device_batches, own_copy


def plan_tensor(p: DevicePlan) -> torch.Tensor:
    return torch.tensor([p.P, p.N, p.micro_batch], dtype=torch.int64)


class DeviceRole(Role):
    def __init__(self, spec: DeviceSpec, parts: SchedulerContext):
        self.spec, self.parts = spec, parts
        self.k, self.device, self.plan = spec.k, spec.device, spec.plan
        self.Q = len(parts.model)
        self.numerics, self.dtype = parts.numerics, parts.dtype  # read once: a config lookup costs 20 us
        self.layout = layout_of(parts.model)
        self.indices = spec.shard.tensor()
        self.model = own_copy(parts, self.numerics)
        self.stage = Stage(self.model, 0, self.plan.P, parts.optimizer, numerics=self.numerics)
        self.it = 0

    @property
    def server(self) -> str | None:
        return self.spec.server if self.plan.P < self.Q else None

    def batches(self, epoch: int) -> list:
        """This device's iterations in `epoch` under its current plan."""
        p = self.plan
        return device_batches(self.parts, self.k, self.indices, p.micro_batch, p.N, epoch, self.spec.iterations(self.spec.shard.size, p))

    def checkpoint(self, bag, prefix: str) -> dict:
        return {"plan": self.plan.without_shortlist(), "it": self.it, **ck.model_and_stage(bag, prefix, self.model, self.stage, self.numerics)}

    def restore(self, bag, desc: dict) -> None:
        self.plan = DevicePlan.from_json(desc["plan"])
        if self.plan.P != self.stage.stop:  # a re-selection had moved the cut
            self.stage = Stage(self.model, 0, self.plan.P, self.parts.optimizer, numerics=self.numerics)
        ck.load_model_and_stage(bag, desc, self.model, self.stage, self.numerics)
        self.it = int(desc["it"])

    async def run(self, ctx) -> None:
        spec = self.spec
        for epoch in range(self.first_epoch, spec.epochs):
            n_it, connected = active_iterations(spec.iterations(spec.shard.size, self.plan), spec.failures, epoch)
            its = self.batches(epoch)[:n_it]
            # on the simulator the round's tensor work may queue until the aggregator needs it,
            # and run batched across the devices (framework/runtime/deferred.py)
            with ctx.deferred_results():
                for xs, ys in its:
                    if self.server is None:
                        await local_iteration(ctx, self.stage, self.it, xs, ys, self.numerics)
                    else:
                        await split_iteration(ctx, self.stage, self.server, self.it, xs, ys, self.numerics)
                    self.it += 1
                    ctx.iteration_done(epoch, self.it, sum(len(y) for y in ys))
                if spec.aggregates(epoch):
                    if connected:
                        await self.upload(ctx, n_samples=sum(len(y) for _, ys in its for y in ys))
                    flag = await ctx.recv("fed", "round")  # sent once the aggregate is made
            if spec.aggregates(epoch):
                if int(flag[0]):
                    await self.reselect(ctx)
                msg = await ctx.recv("fed", "global")
                if self.numerics:
                    self.layout.load(self.model, 0, self.plan.P, msg)
            await ctx.end_epoch(epoch)

    async def upload(self, ctx, n_samples: int) -> None:
        """The device part of the model goes to the aggregator, with optional DP noise."""
        P, lay = self.plan.P, self.layout
        flat = ctx.deferred_read(lay.flat, self.model, 0, P, self.dtype, self.numerics, model=self.model, like=lay.flat(self.model, 0, P, self.dtype, False))
        if self.spec.dp_sigma > 0:
            # noise generation costs about one pass over the parameters: priced as an optimizer step
            seconds = self.parts.cluster.device(self.device).time(Work("step", 0, P))
            flat = await ctx.compute(Work("dp_noise", seconds=seconds), self._dp_noise, flat)
        flat["n"] = torch.tensor([float(n_samples)], dtype=torch.float64)
        ctx.send("fed", "model", flat, iteration=self.it)  # labelled after the device's last iteration

    def _dp_noise(self, flat: dict) -> dict:
        """Classic DP on the uploaded device model (the notes' decision 15): clip the parameter
        vector to `dp_clip` (if set), then add N(0, (dp_sigma * C)^2), C = dp_clip or 1. An
        overhead study; no privacy accounting is claimed."""
        if not self.numerics:
            return flat
        p = flat["p"]
        clip = self.spec.dp_clip
        if clip is not None:
            norm = float(p.norm())
            if norm > clip:
                p = p * (clip / norm)
        g = torch.Generator().manual_seed(self.parts.cfg.seed * 1_000_003 + 7 * self.k + self.it)
        # drawn on the CPU, whose generator this is, and moved to where the model is (a GPU run:
        # `runtime.torch_device`), so that a seed gives the same noise on either
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.device, p.dtype)
        return {**flat, "p": p + noise * (self.spec.dp_sigma * (clip or 1.0))}

    async def reselect(self, ctx) -> None:
        """Full profile (the paper's accounting): one profiling iteration of the device's units at
        batch B, profile up, plan down. Training pauses meanwhile."""
        spec, parts = self.spec, self.parts
        if spec.reselect_mode == "full_profile":
            prof = plan_mod.profile_side(parts.predictor, parts.cluster.device(self.device), self.Q, int(parts.cfg.train.batch_size))
            await ctx.compute(Work("profile", seconds=prof.iteration_s(spec.profile_units)), iteration=self.it)
            ctx.send(spec.server, "profile", torch.zeros(3 * self.Q, dtype=torch.float64), iteration=self.it)
        P, N, mb = (int(v) for v in await ctx.recv(spec.server, "plan"))
        if P != self.plan.P:
            self.stage = Stage(self.model, 0, P, parts.optimizer, numerics=self.numerics)  # the cut moves
        self.plan = DevicePlan(P, N, mb, self.plan.predicted_iter_s, self.plan.predicted_epoch_s)


class ServerRole(Role):
    """Server-side training for the devices it serves, one at a time, each on its own replica
    (or one shared model)."""

    def __init__(self, spec: ServerSpec, parts: SchedulerContext):
        self.spec, self.parts = spec, parts
        self.name, self.ks, self.device = spec.role, list(spec.devices_served), spec.device
        self.Q = len(parts.model)
        self.numerics, self.dtype = parts.numerics, parts.dtype
        self.layout = layout_of(parts.model)
        self.plans = dict(spec.plans)  # re-selection replaces a device's
        self.failures = {k: spec.failures.get(k, {}) for k in self.ks}
        self.shared = spec.shared
        if self.shared:
            model = own_copy(parts, self.numerics)
            self.models = {k: model for k in self.ks}
            stage = Stage(model, self.plans[self.ks[0]].P, self.Q, parts.optimizer, numerics=self.numerics)
            self.stages = {k: stage for k in self.ks}
        else:
            self.models = {k: own_copy(parts, self.numerics) for k in self.ks}
            self.stages = {k: self._stage(k) for k in self.ks}
        self.served = {k: 0 for k in self.ks}  # iterations served per device (timeline labels)
        self.gone: set[int] = set()  # devices lost on a real runtime
        self.reselections: list[dict] = []
        self._planner: Planner | None = None  # built on the first re-selection

    def _stage(self, k: int) -> Stage:
        return Stage(self.models[k], self.plans[k].P, self.Q, self.parts.optimizer, numerics=self.numerics)

    def _active(self, k: int, epoch: int) -> tuple[int, bool]:
        return active_iterations(self.spec.iterations(self.spec.shard_sizes[k], self.plans[k]), self.failures[k], epoch)

    def stats(self) -> dict:
        return {"reselections": self.reselections, "lost_devices": sorted(self.gone)}

    def checkpoint(self, bag, prefix: str) -> dict:
        out = {"plans": {str(k): p.without_shortlist() for k, p in self.plans.items()}, "served": {str(k): n for k, n in self.served.items()}, "gone": sorted(self.gone), "reselections": self.reselections}
        own = [self.ks[0]] if self.shared else self.ks  # the shared model and stage once
        out["stages"] = {str(k): self.stages[k].checkpoint(bag, f"{prefix}.stage{k}", weights=False) for k in own}
        if self.numerics:
            out["models"] = {str(k): ck.module_state(bag, f"{prefix}.model{k}", self.models[k]) for k in own}
        return out

    def restore(self, bag, desc: dict) -> None:
        self.plans = {int(k): DevicePlan.from_json(p) for k, p in desc["plans"].items()}
        for k in self.ks if not self.shared else ():  # the shared stage keeps its first cut
            if self.plans[k].P != self.stages[k].start:  # a re-selection had moved the cut
                self.stages[k] = self._stage(k)
        for key, d in desc["stages"].items():
            if self.numerics:
                ck.load_module_state(bag, desc["models"][key], self.models[int(key)])
            self.stages[int(key)].restore(bag, d)
        self.served = {int(k): int(n) for k, n in desc["served"].items()}
        self.gone, self.reselections = set(desc["gone"]), list(desc["reselections"])

    async def run(self, ctx) -> None:
        spec, lay = self.spec, self.layout
        for epoch in range(self.first_epoch, spec.epochs):
            counts = {k: self._active(k, epoch)[0] for k in self.ks}
            done = {k: 0 for k in self.ks}
            # on the simulator the replicas' work may queue until the aggregator needs it, and
            # run batched across them (framework/runtime/deferred.py)
            with ctx.deferred_results():
                for it in range(max(counts.values(), default=0)):
                    for k in self.ks:  # one device at a time (a role serves its devices in turn)
                        if it < counts[k] and k not in self.gone:
                            try:
                                await self.serve(ctx, k)
                                done[k] += 1
                            except PeerLost:
                                self.gone.add(k)  # its iterations end here; the run goes on
                if spec.aggregates(epoch):
                    for k in self.ks:
                        if self._active(k, epoch)[1]:
                            ok = k not in self.gone and done[k] == counts[k]
                            ctx.send("fed", "served", torch.tensor([1 if ok else 0], dtype=torch.int64))
                            if ok:
                                st = self.stages[k]
                                like = lay.flat(st.model, st.start, self.Q, self.dtype, False)
                                ctx.send("fed", "model", ctx.deferred_read(lay.flat, st.model, st.start, self.Q, self.dtype, self.numerics, model=st.model, like=like))
                    for k in self.ks:
                        flag = await ctx.recv("fed", "round")  # sent once the aggregate is made
                        if int(flag[0]):
                            await self.reselect(ctx, k)
            if spec.aggregates(epoch):
                for k in self.ks:
                    msg = await ctx.recv("fed", "global")
                    st = self.stages[k]
                    if self.numerics:
                        lay.load(st.model, st.start, self.Q, msg)
            await ctx.end_epoch(epoch)

    async def serve(self, ctx, k: int) -> None:
        p = self.plans[k]
        await serve_iteration(ctx, self.stages[k], f"dev{k}", p.N, 1.0 / (p.N * p.micro_batch), self.served[k], self.numerics)
        self.served[k] += 1

    async def reselect(self, ctx, k: int) -> None:
        """Re-plan device k at the current bandwidths (select=auto, as the paper re-selects)."""
        if self._planner is None:
            self._planner = Planner(self.spec.planner, self.parts, self.spec.shard_sizes)
        old = self.plans[k]
        try:
            if self.spec.reselect_mode == "full_profile":
                await ctx.compute(Work("profile", seconds=self._planner.server_profile_s()), iteration=self.served[k])
                await ctx.recv(f"dev{k}", "profile")
            new = self._planner.choose_plan(k, ctx.now(), method="auto")
        except PeerLost:
            self.gone.add(k)
            new = old
        self.plans[k] = new
        if new.P != old.P and not self.shared:
            self.stages[k] = self._stage(k)  # the replica is whole here: only the cut moves
        bw = bandwidths(self.parts.cluster, f"dev{k}", ctx.now())
        self.reselections.append({"device": k, "time_s": ctx.now(), "old": [old.P, old.N], "new": [new.P, new.N], "bandwidth_bps": list(bw)})
        ctx.send(f"dev{k}", "plan", plan_tensor(new), iteration=self.served[k])
        ctx.send("fed", "plan", plan_tensor(new))
