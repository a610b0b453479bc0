"""Choosing each device's (P, N): PiPar's selection (Section III-C) wired to a run's parts.

The math (Table I's DAG, Eq. 14, the shortlist) is in `pipar.plan`; the exhaustive "Opt" search
in `pipar.search`; the trial-refined selection in `pipar.refine`. `Planner` prices a device-server
pair from the predictor, the links and the real packet sizes, and picks a plan per device:

- `select=auto` (default): every (P, N) on the Table I DAG, priced as the simulator prices the
  run: each micro-batch at its own size, the server's stages stretched by the replicas that share
  its cores (`server_share`), the epoch's model exchange included (cost: the paper's one
  profiling iteration, profile up, plan down);
- `select=paper`: the paper's method as published, profile one iteration, closed-form N(P)
  (Eq. 14), argmin of the estimated epoch of one device-server pair with the batch-B profile
  scaled linearly; its own estimate is kept as `paper_epoch_s`;
- `select=exhaustive`: one timing-only trial iteration per (P, N), the paper's "Opt";
- `select=refine`: the paper's shortlist, then trial iterations of the few best candidates.

Whatever chose (P, N), the plan's `predicted_epoch_s` is `select=auto`'s model of that plan: the
epoch the run is expected to take (`plan/predicted_epoch_s` beside `time/epoch_virtual_s`).

The coordinator plans once and ships each role its device's plan in its spec (pipar.specs); only
the server role plans again, when a device's bandwidth changes (re-selection).
"""

from __future__ import annotations

import math

import torch

from framework.cluster import Work
from plugins.schedulers.pipar import plan as plan_mod
from plugins.schedulers.pipar.iteration import SERVER
from plugins.schedulers.pipar.model_vectors import UnitLayout
from plugins.schedulers.pipar.refine import refine, trial_cost
from plugins.schedulers.pipar.search import exhaustive, trial_iteration
from plugins.schedulers.pipar.specs import DevicePlan, PlannerKnobs


def split_points(max_device_units: int | None, num_units: int) -> range:
    """The P a device may take: 1..Q' (Q' = `max_device_units`, at most Q - 1)."""
    qmax = max_device_units if max_device_units is not None else num_units - 1
    return range(1, min(qmax, num_units - 1) + 1) if num_units > 1 else range(1, 2)


class Planner:
    """Plans for the K devices of one collaborative run (`kind` in pipar, fl, sfl, sl)."""

    def __init__(self, knobs: PlannerKnobs, ctx, shard_sizes):
        """`knobs`: what it reads of `cfg.scheduler`; `ctx`: the run's parts (model, cluster,
        predictor, compressor); `shard_sizes[k]`: device k's training samples, for every device
        it plans (a sequence, or a dict of some of them). With `knobs.serial_server` the server
        trains one replica at a time (one server role serves the devices in turn:
        `server_mode=sequential`, SFL's shared model, SL), so none share its cores."""
        self.knobs, self.ctx, self.kind = knobs, ctx, knobs.kind
        self.serial_server = knobs.serial_server
        self.K = int(ctx.cluster.cfg.num_devices)
        self.devices = [f"dev{k}" for k in range(self.K)]
        self.Q = len(ctx.model)
        self.B = int(ctx.cfg.train.batch_size)
        self.dtype = ctx.dtype
        self.shard_sizes = shard_sizes
        # an estimation-only compressor: pricing packets must not touch the run's codec state
        self._est_compressor = ctx.new_compressor()
        self._packet_cache: dict = {}
        self._srv_prof = None
        self._shares: dict | None = None  # device signature -> its server share, once devices differ
        self._lay = None  # the model's flat layout, for pricing FedAvg's messages
        self.trial_cost = 0.0  # virtual seconds of trial iterations run by exhaustive/refine

    def p_range(self) -> range:
        return split_points(self.knobs.max_device_units, self.Q)

    def fixed_plan(self) -> tuple[int | None, int | None]:
        """(P, N) this kind of scheduler pins (None = choose)."""
        if self.kind == "fl":
            return self.Q, 1
        if self.kind in ("sfl", "sl"):
            return self.knobs.P, 1
        return self.knobs.P, self.knobs.N

    # ---- pricing ------------------------------------------------------------------------------

    def packet_bytes(self, tag: str, P: int, b: int) -> int:
        """Bytes on the link of one micro-batch of b samples cut after unit P."""
        key = (tag, P, b)
        if key not in self._packet_cache:
            shape = (b, *self.ctx.model.infos[P - 1].out_shape)
            tensors = {"x": torch.empty(shape, dtype=self.dtype, device="meta")}
            if tag == "act":
                tensors["y"] = torch.empty((b,), dtype=torch.int64, device="meta")
            _, size, _ = self._est_compressor.encode(tensors, src="est", dst="est", tag=tag)
            self._packet_cache[key] = size
        return self._packet_cache[key]

    def codec_seconds(self, kind: str, tag: str, P: int, b: int) -> float:
        shape = (b, *self.ctx.model.infos[P - 1].out_shape)
        return self._est_compressor.codec_seconds(kind, tag, {"x": torch.empty(shape, dtype=self.dtype, device="meta")}, 0.0)

    def pair_model(self, k: int, now: float = 0.0, model: str = "paper") -> plan_mod.PairModel:
        """Device k with the server: `model="paper"` the paper's estimate (batch-B profiles scaled
        linearly, the pair alone), `"auto"` the run's own prices and the shared server."""
        cl, pred = self.ctx.cluster, self.ctx.predictor
        dev = plan_mod.profile_side(pred, cl.device(self.devices[k]), self.Q, self.B)
        up, down = cl.link(self.devices[k], SERVER), cl.link(SERVER, self.devices[k])
        extra = {}
        if model == "auto":
            sides = {"dev": cl.device(self.devices[k]), "srv": cl.device(SERVER)}

            def price(side, kind, a, b, batch):
                return pred.predict(sides[side], Work(kind, a, b, batch if kind != "step" else 0))

            extra = {"price": price, "server_share": self.server_share(k), "serial_peers": self.K - 1 if self.serial_server and self.kind != "sl" else 0}
        return plan_mod.PairModel(dev, self.server_profile(), self.Q, up.bandwidth_at(now), down.bandwidth_at(now), up.cfg.latency_s, down.cfg.latency_s, self.packet_bytes, self.codec_seconds,
                                  **extra)

    # ---- the shared server ----------------------------------------------------------------------

    def server_cores(self) -> float:
        """What the server runs at once: its shared `cores`, else its FIFO `slots`."""
        cfg = self.ctx.cluster.device(SERVER).cfg
        return float(cfg.cores or max(1, int(cfg.slots)))

    def busy_replicas(self) -> int:
        """Server-side replicas that train at the same time: one per split device when the
        replicas run in parallel (Fig. 3c; identical devices stay in step); one otherwise."""
        if self.kind == "fl":
            return 0
        return 1 if self.serial_server else self.K

    def server_share(self, k: int | None = None) -> float:
        """How many times longer a server-side computation takes than alone: K replicas on C
        cores each get C / K of a core once K > C (processor sharing). Devices that differ
        (`_shared_by_groups`) get their group's share; identical devices stay in step, all
        replicas busy at once."""
        if k is not None and self._shares is not None:
            return self._shares[self._signature(k)]
        return max(1.0, self.busy_replicas() / self.server_cores())

    def _shared_by_groups(self, groups: dict, plans: dict) -> dict:
        """Each group's server share when devices differ: a group's own replicas compute in
        step (all at once), another group's only for the part of this group's epoch its
        replicas are busy at the server (their server seconds over this group's epoch; a fast
        group that has finished no longer competes). `groups`: signature -> device indices;
        `plans`: signature -> its DevicePlan under the current shares."""
        busy, span = {}, {}
        for sig, ks in groups.items():
            k, p = ks[0], plans[sig]
            span[sig] = p.predicted_epoch_s
            if p.P >= self.Q:
                busy[sig] = 0.0
                continue
            model = self.pair_model(k, 0.0, "auto")
            c = plan_mod.candidate(model, p.P, p.N, self.B, self.shard_sizes[k], self.knobs.estimator)
            busy[sig] = c.iterations * (p.N * (c.times.fs + c.times.bs) + c.times.step_s)  # stretched, as the run takes it
        cores = self.server_cores()
        return {g: max(1.0, (len(groups[g]) + sum(len(groups[h]) * min(1.0, busy[h] / span[g]) for h in groups if h != g and span[g] > 0)) / cores)
                for g in groups}

    def server_profile(self) -> plan_mod.SideProfile:
        if self._srv_prof is None:
            self._srv_prof = plan_mod.profile_side(self.ctx.predictor, self.ctx.cluster.device(SERVER), self.Q, self.B)
        return self._srv_prof

    # ---- choosing -----------------------------------------------------------------------------

    def _signature(self, k: int):
        """Devices with equal compute, links and shard size get equal plans (one search each)."""
        cl = self.ctx.cluster
        up, down = cl.link(self.devices[k], SERVER), cl.link(SERVER, self.devices[k])
        return (repr(cl.device(self.devices[k]).cfg), repr(up.cfg), repr(down.cfg), self.shard_sizes[k])

    def choose_plans(self) -> list[DevicePlan]:
        groups: dict = {}
        for k in range(self.K):
            groups.setdefault(self._signature(k), []).append(k)
        memo = {sig: self.choose_plan(ks[0]) for sig, ks in groups.items()}
        if len(groups) > 1 and self.busy_replicas() > self.server_cores() and self.knobs.select in ("auto", "paper"):
            # devices that differ are not in step: each group's share from the others' busy
            # time, and the plans again under it (a few rounds settle it)
            for _ in range(3):
                self._shares = self._shared_by_groups(groups, memo)
                memo = {sig: self.choose_plan(ks[0]) for sig, ks in groups.items()}
        plans: list = [None] * self.K
        for sig, ks in groups.items():
            for k in ks:
                plans[k] = memo[sig]
        return plans

    def choose_plan(self, k: int, now: float = 0.0, method: str | None = None) -> DevicePlan:
        P, N = self.fixed_plan()
        model = self.pair_model(k, now, "auto")
        n = self.shard_sizes[k]
        est = self.knobs.estimator
        method = method or self.knobs.select

        def plan(P_, N_, shortlist, paper_epoch_s=None) -> DevicePlan:
            c = plan_mod.candidate(model, P_, N_, self.B, n, est)  # what the run is expected to take
            return DevicePlan(P_, N_, c.micro_batch, c.iter_s, c.epoch_s, tuple(shortlist), paper_epoch_s)

        if P is not None and N is not None:
            return plan(P, N, [plan_mod.candidate(model, P, N, self.B, n, est).as_dict()])
        p_range = [P] if P is not None else list(self.p_range())
        if method == "exhaustive":
            best, trials = exhaustive(self, k, p_range, [N] if N is not None else None)
            self.trial_cost += sum(t["iter_s"] for t in trials)
            return plan(best["P"], best["N"], trials)
        if method == "refine":
            best, trials = refine(self.pair_model(k, now), self.B, n, p_range, lambda P_, N_: trial_iteration(self, k, P_, N_), fixed_n=N, clamp=self.knobs.n_clamp, estimator=est)
            self.trial_cost += trial_cost(trials)
            return plan(best["P"], best["N"], trials)
        if method == "paper":
            best, shortlist = plan_mod.select_closed_form(self.pair_model(k, now), self.B, n, p_range, fixed_n=N, clamp=self.knobs.n_clamp, estimator=est)
            return plan(best.P, best.N, [c.as_dict() for c in shortlist], best.epoch_s)
        best, shortlist = plan_mod.select_search(model, self.B, n, p_range, fixed_n=N, estimator=est)
        return DevicePlan(best.P, best.N, best.micro_batch, best.iter_s, best.epoch_s, tuple(c.as_dict() for c in shortlist))

    # ---- the epoch ---------------------------------------------------------------------------

    def model_bytes(self, tag: str, a: int, b: int, with_count: bool) -> int:
        """Bytes on the link of units [a, b) as one flat model message (FedAvg's exchange)."""
        key = ("model", tag, a, b, with_count)
        if key not in self._packet_cache:
            lay = self._layout()
            tensors = {"p": torch.empty(lay.p_off[b] - lay.p_off[a], dtype=self.dtype, device="meta"), "b": torch.empty(lay.b_off[b] - lay.b_off[a], dtype=self.dtype, device="meta")}
            if with_count:
                tensors["n"] = torch.empty(1, dtype=torch.float64, device="meta")
            self._packet_cache[key] = self._est_compressor.encode(tensors, src="est", dst="est", tag=tag)[1]
        return self._packet_cache[key]

    def _layout(self):
        if self._lay is None:
            self._lay = UnitLayout(self.ctx.model)
        return self._lay

    def epoch_end_s(self, plans: list[DevicePlan], train_s: list[float]) -> float:
        """From the end of the epoch's training (`train_s[k]` for device k) to every role's
        having the global model: each device uploads its part (DP noise first, if any), FedAvg
        on the server once all are in (alone: the replicas wait), the round flag and the global
        part down each device's link. Server parts stay on the server (no link)."""
        cl = self.ctx.cluster
        srv = cl.device(SERVER)
        arrive = []
        for k, p in enumerate(plans):
            dev = self.devices[k]
            t = train_s[k]
            if self.knobs.dp_sigma > 0:
                t += self.ctx.predictor.predict(cl.device(dev), Work("step", 0, p.P))
            up = cl.link(dev, SERVER)
            arrive.append(t + up.tx_time(self.model_bytes("model", 0, p.P, True), 0.0) + up.cfg.latency_s)
        agg = len(plans) * self.ctx.predictor.predict(srv, Work("step", 0, self.Q))
        flag = self._est_compressor.encode({"x": torch.empty(1, dtype=torch.int64, device="meta")}, src="est", dst="est", tag="round")[1]
        down = max(cl.link(SERVER, self.devices[k]).tx_time(flag, 0.0) + cl.link(SERVER, self.devices[k]).tx_time(self.model_bytes("global", 0, p.P, False), 0.0)
                   + cl.link(SERVER, self.devices[k]).cfg.latency_s for k, p in enumerate(plans))
        return max(arrive) + agg + down - max(train_s)

    def predicted_epoch_s(self, plans: list[DevicePlan], iterations: list[int], aggregating_share: float) -> float:
        """The epoch the run is expected to take: the slowest device's training, plus the model
        exchange in the share of epochs that aggregate (every epoch unless `aggregate_every`)."""
        train = [p.predicted_iter_s * n for p, n in zip(plans, iterations)]
        return max(train) + aggregating_share * self.epoch_end_s(plans, train)

    def search_cost(self) -> float:
        """Virtual seconds the selection costs before training: auto profiles one iteration on
        every device and the server at once, then ships the profile up and the plan down;
        exhaustive trains one iteration per candidate, one after another; refine pays auto's
        profiling and then its trials."""
        P, N = self.fixed_plan()
        if P is not None and N is not None:
            return 0.0
        profile = max(self.profile_cost(k) for k in range(self.K))
        if self.knobs.select == "exhaustive":
            return self.trial_cost
        if self.knobs.select == "refine":
            return profile + self.trial_cost
        return profile

    def profile_cost(self, k: int, now: float = 0.0) -> float:
        pair = self.pair_model(k, now)
        qmax = max(self.p_range())
        dev_s = pair.dev.iteration_s(qmax)
        srv_s = pair.srv.iteration_s(self.Q)
        prof_bytes = 8 * 3 * self.Q + 64  # three float64 per unit and a header
        up = 0.0 if math.isinf(pair.up_bps) else 8 * prof_bytes / pair.up_bps
        down = 0.0 if math.isinf(pair.down_bps) else 8 * 64 / pair.down_bps
        return max(dev_s, srv_s) + up + pair.lat_up + down + pair.lat_down

    def server_profile_s(self) -> float:
        return self.server_profile().iteration_s(self.Q)
