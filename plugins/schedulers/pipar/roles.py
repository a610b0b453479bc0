"""The roles of PiPar, FL and SFL: devices, server-side trainers and the aggregator.

Each role owns its state and learns everything else from messages:

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

from framework import checkpoint as ck
from framework.cluster import Work
from framework.models import clone_module
from framework.runtime.base import PeerLost
from framework.scheduler import Role
from framework.stage import Stage
from plugins.schedulers.pipar import plan as plan_mod
from plugins.schedulers.pipar.fedavg import fedavg
from plugins.schedulers.pipar.iteration import SERVER, local_iteration, serve_iteration, split_iteration
from plugins.schedulers.pipar.planner import DevicePlan, Planner

def own_copy(sched):
    """A role's private copy of the initial model (timing-only runs share the untouched one)."""
    return clone_module(sched.ctx.model) if sched.numerics else sched.ctx.model


def plan_tensor(p: DevicePlan) -> torch.Tensor:
    return torch.tensor([p.P, p.N, p.micro_batch], dtype=torch.int64)


# ---- the roles ---------------------------------------------------------------------------------


class DeviceRole(Role):
    def __init__(self, sched, k: int):
        self.sched, self.k = sched, k
        self.device = sched.devices[k]
        self.plan = sched.plans[k]
        self.model = own_copy(sched)
        self.stage = Stage(self.model, 0, self.plan.P, sched.ctx.optimizer, numerics=sched.numerics)
        self.it = 0

    @property
    def server(self) -> str | None:
        return self.sched.server_role_of(self.k) if self.plan.P < self.sched.Q else None

    def checkpoint(self, bag, prefix: str) -> dict:
        return {"plan": self.plan.without_shortlist(), "it": self.it, **ck.model_and_stage(bag, prefix, self.model, self.stage, self.sched.numerics)}

    def restore(self, bag, desc: dict) -> None:
        s = self.sched
        self.plan = DevicePlan.from_dict(desc["plan"])
        if self.plan.P != self.stage.stop:  # a re-selection had moved the cut
            self.stage = Stage(self.model, 0, self.plan.P, s.ctx.optimizer, numerics=s.numerics)
        ck.load_model_and_stage(bag, desc, self.model, self.stage, s.numerics)
        self.it = int(desc["it"])

    async def run(self, ctx) -> None:
        s, k = self.sched, self.k
        for epoch in range(self.first_epoch, s.epochs):
            n_it, connected = s.active_iterations(k, epoch, self.plan)
            its = s.iteration_batches(k, epoch, self.plan)[:n_it]
            # on the simulator the round's tensor work may queue until the aggregator needs it,
            # and run batched across the devices (framework/runtime/deferred.py)
            with ctx.deferred_results():
                for xs, ys in its:
                    if self.server is None:
                        await local_iteration(ctx, self.stage, self.it, xs, ys, s.numerics)
                    else:
                        await split_iteration(ctx, self.stage, self.server, self.it, xs, ys, s.numerics)
                    self.it += 1
                    ctx.iteration_done(epoch, self.it, sum(len(y) for y in ys))
                if s.aggregates(epoch):
                    if connected:
                        await self.upload(ctx, n_samples=sum(len(y) for _, ys in its for y in ys))
                    flag = await ctx.recv("fed", "round")  # sent once the aggregate is made
            if s.aggregates(epoch):
                if int(flag[0]):
                    await self.reselect(ctx)
                msg = await ctx.recv("fed", "global")
                if s.numerics:
                    s.layout.load(self.model, 0, self.plan.P, msg)
            await ctx.end_epoch(epoch)

    async def upload(self, ctx, n_samples: int) -> None:
        """The device part of the model goes to the aggregator, with optional DP noise."""
        s = self.sched
        P = self.plan.P
        flat = ctx.deferred_read(s.layout.flat, self.model, 0, P, s.dtype, s.numerics, model=self.model, like=s.layout.flat(self.model, 0, P, s.dtype, False))
        if s.cfg.dp_sigma > 0:
            # noise generation costs about one pass over the parameters: priced as an optimizer step
            seconds = s.ctx.cluster.device(self.device).time(Work("step", 0, P))
            flat = await ctx.compute(Work("dp_noise", seconds=seconds), self._dp_noise, flat)
        flat["n"] = torch.tensor([float(n_samples)], dtype=torch.float64)
        ctx.send("fed", "model", flat, iteration=self.it)  # labelled after the device's last iteration

    def _dp_noise(self, flat: dict) -> dict:
        """Classic DP on the uploaded device model (the notes' decision 15): clip the parameter
        vector to `dp_clip` (if set), then add N(0, (dp_sigma * C)^2), C = dp_clip or 1. An
        overhead study; no privacy accounting is claimed."""
        s = self.sched
        if not s.numerics:
            return flat
        p = flat["p"]
        clip = s.cfg.dp_clip
        if clip is not None:
            norm = float(p.norm())
            if norm > clip:
                p = p * (clip / norm)
        g = torch.Generator().manual_seed(s.ctx.cfg.seed * 1_000_003 + 7 * self.k + self.it)
        # drawn on the CPU, whose generator this is, and moved to where the model is (a GPU run:
        # `runtime.torch_device`), so that a seed gives the same noise on either
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.device, p.dtype)
        return {**flat, "p": p + noise * (s.cfg.dp_sigma * (clip or 1.0))}

    async def reselect(self, ctx) -> None:
        """Full profile (the paper's accounting): one profiling iteration of the device's units at
        batch B, profile up, plan down. Training pauses meanwhile."""
        s = self.sched
        server = s.server_role_of(self.k)
        if s.cfg.reselect_mode == "full_profile":
            prof = plan_mod.profile_side(s.ctx.predictor, s.ctx.cluster.device(self.device), s.Q, s.B)
            await ctx.compute(Work("profile", seconds=prof.iteration_s(max(s.p_range()))), iteration=self.it)
            ctx.send(server, "profile", torch.zeros(3 * s.Q, dtype=torch.float64), iteration=self.it)
        P, N, mb = (int(v) for v in await ctx.recv(server, "plan"))
        if P != self.plan.P:
            self.stage = Stage(self.model, 0, P, s.ctx.optimizer, numerics=s.numerics)  # the cut moves
        self.plan = DevicePlan(P, N, mb, self.plan.predicted_iter_s, self.plan.predicted_epoch_s)


class ServerRole(Role):
    """Server-side training for the devices `ks`, one at a time, each on its own replica (or one
    shared model)."""

    def __init__(self, sched, name: str, ks: list[int], shared: bool = False):
        self.sched, self.name, self.ks = sched, name, ks
        self.device = SERVER
        self.plans = {k: sched.plans[k] for k in ks}
        self.shared = shared
        if shared:
            model = own_copy(sched)
            self.models = {k: model for k in ks}
            stage = Stage(model, self.plans[ks[0]].P, sched.Q, sched.ctx.optimizer, numerics=sched.numerics)
            self.stages = {k: stage for k in ks}
        else:
            self.models = {k: own_copy(sched) for k in ks}
            self.stages = {k: self._stage(k) for k in ks}
        self.served = {k: 0 for k in ks}  # iterations served per device (timeline labels)
        self.gone: set[int] = set()  # devices lost on a real runtime
        self.reselections: list[dict] = []
        self._planner: Planner | None = None

    def _stage(self, k: int) -> Stage:
        return Stage(self.models[k], self.plans[k].P, self.sched.Q, self.sched.ctx.optimizer, numerics=self.sched.numerics)

    def stats(self) -> dict:
        return {"reselections": self.reselections, "lost_devices": sorted(self.gone)}

    def checkpoint(self, bag, prefix: str) -> dict:
        s = self.sched
        out = {"plans": {str(k): p.without_shortlist() for k, p in self.plans.items()}, "served": {str(k): n for k, n in self.served.items()}, "gone": sorted(self.gone), "reselections": self.reselections}
        own = [self.ks[0]] if self.shared else self.ks  # the shared model and stage once
        out["stages"] = {str(k): self.stages[k].checkpoint(bag, f"{prefix}.stage{k}", weights=False) for k in own}
        if s.numerics:
            out["models"] = {str(k): ck.module_state(bag, f"{prefix}.model{k}", self.models[k]) for k in own}
        return out

    def restore(self, bag, desc: dict) -> None:
        s = self.sched
        self.plans = {int(k): DevicePlan.from_dict(p) for k, p in desc["plans"].items()}
        for k in self.ks if not self.shared else ():  # the shared stage keeps its first cut
            if self.plans[k].P != self.stages[k].start:  # a re-selection had moved the cut
                self.stages[k] = self._stage(k)
        for key, d in desc["stages"].items():
            if s.numerics:
                ck.load_module_state(bag, desc["models"][key], self.models[int(key)])
            self.stages[int(key)].restore(bag, d)
        self.served = {int(k): int(n) for k, n in desc["served"].items()}
        self.gone, self.reselections = set(desc["gone"]), list(desc["reselections"])

    async def run(self, ctx) -> None:
        s = self.sched
        for epoch in range(self.first_epoch, s.epochs):
            counts = {k: s.active_iterations(k, epoch, self.plans[k])[0] for k in self.ks}
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
                if s.aggregates(epoch):
                    for k in self.ks:
                        if s.active_iterations(k, epoch, self.plans[k])[1]:
                            ok = k not in self.gone and done[k] == counts[k]
                            ctx.send("fed", "served", torch.tensor([1 if ok else 0], dtype=torch.int64))
                            if ok:
                                st = self.stages[k]
                                like = s.layout.flat(st.model, st.start, s.Q, s.dtype, False)
                                ctx.send("fed", "model", ctx.deferred_read(s.layout.flat, st.model, st.start, s.Q, s.dtype, s.numerics, model=st.model, like=like))
                    for k in self.ks:
                        flag = await ctx.recv("fed", "round")  # sent once the aggregate is made
                        if int(flag[0]):
                            await self.reselect(ctx, k)
            if s.aggregates(epoch):
                for k in self.ks:
                    msg = await ctx.recv("fed", "global")
                    st = self.stages[k]
                    if s.numerics:
                        s.layout.load(st.model, st.start, s.Q, msg)
            await ctx.end_epoch(epoch)

    async def serve(self, ctx, k: int) -> None:
        p = self.plans[k]
        await serve_iteration(ctx, self.stages[k], f"dev{k}", p.N, 1.0 / (p.N * p.micro_batch), self.served[k], self.sched.numerics)
        self.served[k] += 1

    async def reselect(self, ctx, k: int) -> None:
        """Re-plan device k at the current bandwidths (select=auto, as the paper re-selects)."""
        s = self.sched
        if self._planner is None:
            self._planner = Planner(s.cfg, s.ctx, s.kind, s.shards, s.serial_server())
        old = self.plans[k]
        try:
            if s.cfg.reselect_mode == "full_profile":
                await ctx.compute(Work("profile", seconds=self._planner.server_profile_s()), iteration=self.served[k])
                await ctx.recv(f"dev{k}", "profile")
            new = self._planner.choose_plan(k, ctx.now(), method="auto")
        except PeerLost:
            self.gone.add(k)
            new = old
        self.plans[k] = new
        if new.P != old.P and not self.shared:
            self.stages[k] = self._stage(k)  # the replica is whole here: only the cut moves
        bw = s.bandwidths(k, ctx.now())
        self.reselections.append({"device": k, "time_s": ctx.now(), "old": [old.P, old.N], "new": [new.P, new.N], "bandwidth_bps": list(bw)})
        ctx.send(f"dev{k}", "plan", plan_tensor(new), iteration=self.served[k])
        ctx.send("fed", "plan", plan_tensor(new))


class FedRole(Role):
    """The aggregator: owns the global model; FedAvg over the parts that arrive (Eq. 3)."""

    def __init__(self, sched):
        self.sched = sched
        self.device = SERVER
        self.model = own_copy(sched)
        self.P = [p.P for p in sched.plans]
        self.bw_at_plan = [sched.bandwidths(k, 0.0) for k in range(sched.K)]
        self.lost: set[int] = set()
        self.rounds: list[dict] = []

    def state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()} if self.sched.numerics else {}

    def stats(self) -> dict:
        return {"rounds": self.rounds, "lost_devices": sorted(self.lost)}

    def checkpoint(self, bag, prefix: str) -> dict:
        out = {"P": self.P, "bw_at_plan": [list(b) for b in self.bw_at_plan], "lost": sorted(self.lost), "rounds": self.rounds}
        if self.sched.numerics:
            out["model"] = ck.module_state(bag, f"{prefix}.model", self.model)
        return out

    def restore(self, bag, desc: dict) -> None:
        if self.sched.numerics:
            ck.load_module_state(bag, desc["model"], self.model)
        self.P = [int(p) for p in desc["P"]]
        self.bw_at_plan = [tuple(b) for b in desc["bw_at_plan"]]
        self.lost, self.rounds = set(desc["lost"]), list(desc["rounds"])

    async def run(self, ctx) -> None:
        s = self.sched
        for epoch in range(self.first_epoch, s.epochs):
            if s.aggregates(epoch):
                await self.aggregate(ctx, epoch)
            await ctx.end_epoch(epoch)

    async def aggregate(self, ctx, epoch: int) -> None:
        s = self.sched
        with ctx.deferred_results():  # the parts may be placeholders: `average` waits for them
            parts, counts, present = await self._collect(ctx, epoch)
            seconds = len(present) * s.ctx.cluster.device(SERVER).time(Work("step", 0, s.Q))  # one weighted add per model
            await ctx.compute(Work("aggregate", seconds=seconds), self.average, parts, counts)
        self.rounds.append({"epoch": epoch, "devices": present})
        await self._send_round(ctx, epoch)

    async def _collect(self, ctx, epoch: int) -> tuple[list, list[float], list[int]]:
        """The round's parts: (device part, server part or None) per device present, their
        sample counts, and who they are."""
        s = self.sched
        parts, counts, present = [], [], []
        for k in range(s.K):
            if not s.active_iterations(k, epoch, s.plans[k])[1]:
                continue  # disconnected at the round's end (config `failures`)
            dev = None
            if k not in self.lost:
                try:
                    dev = await ctx.recv(f"dev{k}", "model")
                except PeerLost:
                    self.lost.add(k)
                    dev = None
            srv = None
            if self.P[k] < s.Q:
                served = await ctx.recv(s.server_role_of(k), "served")
                if int(served[0]):
                    srv = await ctx.recv(s.server_role_of(k), "model")
                elif dev is not None:
                    dev = None  # the server side of its model is incomplete: leave it out
            if dev is None:
                continue
            present.append(k)
            counts.append(float(dev["n"][0]) if s.numerics else 1.0)  # timing-only packets carry no values
            parts.append((dev, srv))
        return parts, counts, present

    async def _send_round(self, ctx, epoch: int) -> None:
        s = self.sched
        reselect = self.check_bandwidth(ctx.now())
        for k in range(s.K):
            flag = torch.tensor([1 if k in reselect else 0], dtype=torch.int64)
            if k not in self.lost:
                ctx.send(f"dev{k}", "round", flag)
            if self.P[k] < s.Q:
                ctx.send(s.server_role_of(k), "round", flag)
        parts: dict = {}  # P -> the global model's units [0, P), flattened once for all the devices

        def part(P: int) -> dict:  # that take it: a message to a device crosses a link, so each
            if P not in parts:  # receives its own copy (a server role on the same processor gets
                parts[P] = s.layout.flat(self.model, 0, P, s.dtype, s.numerics)  # the object sent)
            return parts[P]

        for k in sorted(range(s.K), key=lambda k: k in reselect):  # re-planned devices last
            if k in reselect:
                self.P[k] = int((await ctx.recv(s.server_role_of(k), "plan"))[0])
            P = self.P[k]
            if k not in self.lost:
                ctx.send(f"dev{k}", "global", part(P))
            if P < s.Q:
                ctx.send(s.server_role_of(k), "global", s.layout.flat(self.model, P, s.Q, s.dtype, s.numerics))

    def average(self, parts: list[tuple], counts: list[float]) -> None:
        """FedAvg of the (device part, server part or None) pairs into the global model."""
        s = self.sched
        if not s.numerics or not parts or sum(counts) <= 0:
            return  # nobody trained: the global model stays
        whole = [{w: _joined(dev[w], srv[w]) if srv is not None else dev[w] for w in ("p", "b")} for dev, srv in parts]
        s.layout.load(self.model, 0, s.Q, fedavg(whole, counts))

    def check_bandwidth(self, now: float) -> set[int]:
        """Devices whose links changed bandwidth since their plan was made (the emulator tells
        the framework, the notes' decision 16): they re-select at this epoch boundary."""
        s = self.sched
        if not s.cfg.reselect or s.kind == "fl":
            return set()
        out = set()
        for k in range(s.K):
            bw = s.bandwidths(k, now)
            if bw != self.bw_at_plan[k] and k not in self.lost:
                out.add(k)
                self.bw_at_plan[k] = bw
        return out


def _joined(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A device's and its server's halves of one model vector. Timing-only packets are meta
    tensors, and torch.cat on meta tensors goes through torch's reference kernels, which import
    torch._dynamo (2 s once per process): their shape is all there is to join."""
    if a.is_meta or b.is_meta:
        return torch.empty(a.shape[0] + b.shape[0], dtype=a.dtype, device="meta")
    return torch.cat([a, b])

