"""Context-aware feature replay (Yao et al., IMWUT 2021): `scheduler=feature_replay`, and its
baselines `jointdnn` (the best static cut, serial: K = 0) and `edge_only`.

Two roles, one cut: the `edge` holds units [0, cut) and the raw data, the `cloud` units
[cut, L). One iteration is four modules that run at once on different batches (notes 2.2):

    P1 edge: forward batch t (no graph kept), keep its input in the history queue;
             apply the gradients that came back: replay the stored input through the
             current weights and backpropagate the old gradient through it (Eq. 3)
    P2 uplink: the feature (compressed by `compressor=minmax_ef`, labels beside it)
    P3 cloud: forward, loss, backward, step on the fresh feature
    P4 downlink: the gradient of the feature (fp32)

P2 and P4 are the links (a send returns at once; the link carries it beside compute), and the
queues Q1-Q4 are the links' and mailboxes' FIFOs. The edge's staleness bound K (t - t' <= K for
the gradient of batch t' applied after forwarding batch t) is enforced by a policy:

- `block` (default, the official code): apply every gradient that has arrived; wait for the
  next one while t - last applied > K;
- `fixed`: apply the gradient of t - K right after forwarding t, never earlier, so which weights
  each replay sees is fixed by the schedule and not by timing: the same numbers on the
  simulator and on real processes (and the code's `base.py` simulation behind Table 4);
- `group` (Eq. 12's model): groups of K + 1 batches; arrived gradients are applied within a
  group, and the group's last forward waits for all of them;
- `discard` (the paper's section 4.1.3 text): a gradient more than K batches old when it
  arrives is dropped, never applied; the edge waits only when 2 (K + 1) batches are in flight
  (the history queue's bound; the paper leaves the queue unbounded).

`K: null` is no bound (the full pipeline of Eq. 11). Every epoch ends with a flush: the edge
applies every outstanding gradient before evaluation (the official code's EndTrain).

Pricing: the edge's send forward, replay forward (unless `price_replay: false`), backward and
step, the uplink codec, the cloud's forward, backward and step, by the devices' time models.
With the shipped profile tables (`time_model: table`), `price_replay: false` takes the measured
iteration as all of P1, as the official cost model does (notes section 4.3).
"""

from __future__ import annotations

import collections

import torch

from framework import checkpoint as ck
from framework import repartition as rp
from framework.cluster import Work
from framework.errors import ConfigError
from framework.scheduler import Role, Scheduler
from framework.stage import Stage
from plugins.schedulers import feature_replay_cost as cost
from plugins.schedulers.schemas import EdgeOnlyConfig, FeatureReplayConfig, JointDNNConfig  # noqa: F401  (registry.declare)

POLICIES = ("block", "fixed", "group", "discard")


class FeatureReplay(Scheduler):
    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.L = len(ctx.model)
        self.edge_device, self.cloud_device = str(cfg.edge_device), str(cfg.cloud_device)
        self._check_config()
        self._plan = ctx.plan if ctx.plan is not None else self._make_plan()
        self.cut = int(self._plan["cut"])
        self.eval_copy = None

    # ---- configuration -----------------------------------------------------------------------

    def _check_config(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        if cfg.staleness_policy not in POLICIES:
            raise ConfigError("scheduler.staleness_policy", f"{cfg.staleness_policy!r} is not a policy; choices: {', '.join(POLICIES)}")
        if cfg.K is not None and int(cfg.K) < 0:
            raise ConfigError("scheduler.K", f"the staleness bound must be >= 0 (or null: unbounded), got {cfg.K}")
        for i, entry in enumerate(cfg.K_schedule or []):
            if len(entry) != 2 or int(entry[0]) < 0 or (entry[1] is not None and int(entry[1]) < 0):
                raise ConfigError(f"scheduler.K_schedule[{i}]", f"{list(entry)} is not [epoch >= 0, K >= 0 or null]")
        for key, dev in (("edge_device", self.edge_device), ("cloud_device", self.cloud_device)):
            if dev not in ctx.cluster.devices:
                raise ConfigError(f"scheduler.{key}", f"no device {dev!r}; devices: {', '.join(ctx.cluster.devices)}")
        if self.edge_device == self.cloud_device:
            raise ConfigError("scheduler.cloud_device", f"edge and cloud are both {self.edge_device!r}; they need two devices and a link")
        if cfg.cut is not None and not 1 <= int(cfg.cut) <= self.L:
            raise ConfigError("scheduler.cut", f"the edge holds 1..{self.L} of the model's {self.L} units ({self.L}: edge-only), got {cfg.cut}")

    def default_cut(self) -> int | None:
        """The configured cut; None: the decision engine chooses."""
        return None if self.cfg.cut is None else int(self.cfg.cut)

    def K_at(self, epoch: int) -> int | None:
        """The staleness bound in `epoch`: K, changed from each K_schedule entry's epoch on."""
        k = self.cfg.K
        for start, value in sorted((int(e), v) for e, v in (self.cfg.K_schedule or [])):
            if epoch >= start:
                k = value
        return None if k is None else int(k)

    # ---- the plan: cut, module times, the cost model's predictions ---------------------------

    def _uplink_bits(self) -> int:
        d = self.ctx.compressor.directions[self.ctx.compressor.forward_tag]
        return d.bits if d.codec is not None else 32

    def _rates(self) -> tuple[float, float]:
        """Bytes per second up and down at the start (the links' configured bandwidths)."""
        cl = self.ctx.cluster
        up, down = cl.link(self.edge_device, self.cloud_device), cl.link(self.cloud_device, self.edge_device)
        return up.bandwidth_at(0.0) / 8.0, down.bandwidth_at(0.0) / 8.0

    def module_times(self, cut: int) -> dict:
        """T1..T4 of one steady-state iteration at `cut`, priced as the simulator prices them: the
        devices' time models, the compressor's codec seconds and the packets' real sizes."""
        ctx, B = self.ctx, int(self.ctx.cfg.train.batch_size)
        edge, cloud = ctx.cluster.device(self.edge_device), ctx.cluster.device(self.cloud_device)
        if cut == self.L:
            t1 = sum(edge.time(Work(k, 0, self.L, B)) for k in ("fwd", "bwd")) + edge.time(Work("step", 0, self.L))
            return {"T1": t1, "T2": 0.0, "T3": 0.0, "T4": 0.0}
        fwd, bwd = edge.time(Work("fwd", 0, cut, B)), edge.time(Work("bwd", 0, cut, B))
        comp = ctx.new_compressor()
        feature = {"x": torch.empty((B, *ctx.model.infos[cut - 1].out_shape), device="meta"), "y": torch.empty((B,), dtype=torch.int64, device="meta")}
        _, up_bytes, _ = comp.encode(feature, src="edge", dst="cloud", tag=comp.forward_tag)
        _, down_bytes, _ = comp.encode({"x": feature["x"]}, src="cloud", dst="edge", tag=comp.backward_tag)
        enc = comp.codec_seconds("encode", comp.forward_tag, feature, 0.0)
        dec = comp.codec_seconds("decode", comp.forward_tag, feature, 0.0)
        up = ctx.cluster.link(self.edge_device, self.cloud_device)
        down = ctx.cluster.link(self.cloud_device, self.edge_device)
        t1 = fwd + (fwd if self.cfg.price_replay else 0.0) + bwd + edge.time(Work("step", 0, cut)) + enc
        t3 = dec + sum(cloud.time(Work(k, cut, self.L, B)) for k in ("fwd", "bwd")) + cloud.time(Work("step", cut, self.L))
        return {"T1": t1, "T2": up.tx_time(up_bytes, 0.0) + up.cfg.latency_s, "T3": t3, "T4": down.tx_time(down_bytes, 0.0) + down.cfg.latency_s,
                "uplink_bytes": up_bytes, "downlink_bytes": down_bytes}

    def cut_profile(self) -> cost.CutProfile:
        """The engine's view of every cut at the run's uplink bit width (from module_times)."""
        itemsize = 8 if self.ctx.cfg.runtime.dtype == "float64" else 4
        rows = [self.module_times(c) for c in range(1, self.L + 1)]
        bits = self._uplink_bits()
        up, down = self._rates()
        return cost.CutProfile(
            edge_s=[r["T1"] for r in rows],  # compression is inside T1 already
            cloud_s=[r["T3"] for r in rows],
            feature_bytes=[r["downlink_bytes"] for r in rows[:-1]],  # the fp32 feature's packet
            compress_s=lambda c, b: 0.0,
            block_bytes=[i.params * itemsize for i in self.ctx.model.infos],
            min_bits=None,
        ), bits, up, down

    def _make_plan(self) -> dict:
        tau = self.ctx.iterations_per_epoch()
        K = self.K_at(0)
        chosen = "fixed"
        decision = None
        if self.default_cut() is None:
            profile, bits, up, down = self.cut_profile()
            # the uplink's bit width is the compressor's; the engine picks the cut (Alg. 2 with
            # one width); K = 0 makes it JointDNN's argmin of the serial cost (Eq. 10)
            start = cost.Deployment(self.L, 32) if self.cfg.include_edge_only else cost.Deployment(1, bits)
            decision = cost.decide(profile, start, K, up, down, tau, bits_candidates=(bits,), include_edge_only=bool(self.cfg.include_edge_only))
            cut, chosen = decision.deployment.cut, "engine"
        else:
            cut = int(self.default_cut())
        T = self.module_times(cut)
        mods = [T["T1"], T["T2"], T["T3"], T["T4"]]
        edge_only = self.module_times(self.L)["T1"] * tau
        if cut == self.L:
            serial = grouped = edge_only
        else:
            serial, grouped = cost.serial_cost(mods, tau), cost.grouped_cost(mods, K, tau)
        return {
            "scheduler": self.cfg.name,
            "cut": cut,
            "cut_chosen_by": chosen,
            "edge": {"role": "edge", "device": self.edge_device, "units": [0, cut], "unit_names": self.ctx.model.unit_names[:cut]},
            "cloud": {"role": "cloud", "device": self.cloud_device, "units": [cut, self.L], "unit_names": self.ctx.model.unit_names[cut:]},
            "uplink_bits": self._uplink_bits(),
            "K": K,
            "staleness_policy": self.cfg.staleness_policy,
            "module_times_s": {k: v for k, v in T.items() if k.startswith("T")},
            "iterations_per_epoch": tau,
            "predicted_epoch_s": {"serial_eq10": serial, "grouped_eq12": grouped, "edge_only": edge_only},
            "predicted_iter_s": grouped / tau,
            "candidates": [{"cut": c, "bits": b, "cost_s": v} for c, b, v in decision.candidates] if decision else [],
        }

    def plan(self) -> dict:
        return self._plan

    # ---- roles -------------------------------------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return {"edge": self.edge_device, "cloud": self.cloud_device}

    def build_role(self, role: str) -> Role:
        if role == "edge":
            return EdgeRole(self)
        if role == "cloud":
            return CloudRole(self)
        raise KeyError(f"no role {role!r}; roles: edge, cloud")

    def eval_model(self, states: dict[str, dict]):
        if self.eval_copy is None:
            import copy

            self.eval_copy = copy.deepcopy(self.ctx.model)
        for state in states.values():
            rp.unpack_units(self.eval_copy, state, True)
        return self.eval_copy

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        out = super().report(total, timeline, role_stats, dropouts)
        edge = role_stats.get("edge", {})
        stale = edge.get("staleness", [])
        hist = collections.Counter(stale)
        pl = self._plan
        epochs = max(1, int(self.ctx.cfg.train.epochs))
        out["summary"]["staleness"]["histogram"] = {str(k): hist[k] for k in sorted(hist)}
        out["summary"]["feature_replay"] = {
            "cut": pl["cut"], "K": pl["K"], "policy": pl["staleness_policy"], "uplink_bits": pl["uplink_bits"],
            "discarded_gradients": edge.get("discarded", 0), "peak_history": edge.get("peak_history", 0),
            "measured_epoch_s": total / epochs, "predicted_epoch_s": pl["predicted_epoch_s"],
        }
        out["metrics"].update({"plan/predicted_epoch_s": pl["predicted_epoch_s"]["grouped_eq12"], "replay/discarded": edge.get("discarded", 0), "replay/peak_history": edge.get("peak_history", 0)})
        return out


class _Side(Role):
    def __init__(self, sched: FeatureReplay, role: str, start: int, stop: int):
        self.sched = sched
        self.name = role
        self.device = sched.edge_device if role == "edge" else sched.cloud_device
        ctx = sched.ctx
        self.stage = Stage(ctx.model, start, stop, ctx.cfg.train, numerics=ctx.numerics) if stop > start else None
        self.it = 0  # batches this role has handled, over all epochs (the messages' iteration ids)

    def state(self) -> dict:
        st = self.stage
        return rp.pack_units(self.sched.ctx.model, None, list(range(st.start, st.stop)), True) if st is not None and self.sched.ctx.numerics else {}

    def checkpoint(self, bag, prefix: str) -> dict:
        return {"it": self.it, "stage": self.stage.checkpoint(bag, f"{prefix}.stage") if self.stage is not None else None}

    def restore(self, bag, desc: dict) -> None:
        self.it = int(desc["it"])
        if self.stage is not None:
            self.stage.restore(bag, desc["stage"])


class EdgeRole(_Side):
    """P1 (and the sender of P2): forwards, the history queue, replays."""

    def __init__(self, sched: FeatureReplay):
        super().__init__(sched, "edge", 0, sched.cut)
        self.inflight: collections.deque[int] = collections.deque()  # sent, gradient not applied yet
        self.last_applied = -1
        self.discarded = 0
        self.K: int | None = sched.K_at(0)

    def stats(self) -> dict:
        return {"staleness": list(self.stage.staleness), "peak_history": self.stage.peak_history, "discarded": self.discarded}

    def checkpoint(self, bag, prefix: str) -> dict:
        return {**super().checkpoint(bag, prefix), "last_applied": self.last_applied, "discarded": self.discarded}

    def restore(self, bag, desc: dict) -> None:
        super().restore(bag, desc)
        self.last_applied, self.discarded = int(desc["last_applied"]), int(desc["discarded"])

    async def run(self, ctx) -> None:
        s = self.sched
        numerics = s.ctx.numerics
        for epoch in range(self.first_epoch, s.ctx.cfg.train.epochs):
            if s.cut == s.L:
                await self.train_alone(ctx, epoch)
                await ctx.end_epoch(epoch)
                continue
            K = self.K = s.K_at(epoch)
            batches = s.ctx.train_batches(epoch)
            for i, (x, y) in enumerate(batches):
                t = self.it
                h = await ctx.compute(self.stage.fwd_work(len(x)), self.stage.forward_to_replay, x, t, iteration=t)
                ctx.send("cloud", "act", {"x": h, "y": y if numerics else torch.empty(y.shape, dtype=y.dtype, device="meta")}, iteration=t)
                self.inflight.append(t)
                self.it += 1
                await self.keep_bound(ctx, t, K, group_end=K is not None and ((i + 1) % (K + 1) == 0))
            while self.inflight:  # the epoch's flush
                await self.apply_next(ctx, t)
            await ctx.end_epoch(epoch)

    async def keep_bound(self, ctx, t: int, K: int | None, group_end: bool) -> None:
        policy = self.sched.cfg.staleness_policy
        if policy == "fixed":
            while self.inflight and K is not None and self.inflight[0] <= t - K:
                await self.apply_next(ctx, t)
            return
        while self.inflight and await self.apply_next(ctx, t, wait=False):  # what has come back
            pass
        if K is None:
            return
        if policy == "block":
            while t - self.last_applied > K:
                await self.apply_next(ctx, t)
        elif policy == "group" and group_end:
            while self.inflight:
                await self.apply_next(ctx, t)
        elif policy == "discard":
            while len(self.inflight) >= 2 * (K + 1):
                await self.apply_next(ctx, t)

    async def apply_next(self, ctx, t: int, wait: bool = True) -> bool:
        """Take the oldest batch's gradient (False if `wait` is off and it has not come back),
        replay that batch through the current weights, backpropagate, step (Eq. 3)."""
        g = await ctx.recv("cloud", "grad", timeout=None if wait else 0.0)
        if g is None:
            return False
        st = self.stage
        old = self.inflight.popleft()
        self.last_applied = old
        if self.sched.cfg.staleness_policy == "discard" and self.K is not None and t - old > self.K:
            st.forget(old)
            self.discarded += 1
            return True
        replay_work = st.fwd_work(self.sched.ctx.cfg.train.batch_size) if self.sched.cfg.price_replay else Work("replay", seconds=0.0)
        await ctx.compute(replay_work, st.replay, old, iteration=old)
        await ctx.compute(st.bwd_work(self.sched.ctx.cfg.train.batch_size), st.backward, old, g, iteration=old)
        await ctx.compute(st.step_work(), st.step, iteration=old)
        return True

    async def train_alone(self, ctx, epoch: int) -> None:
        """Edge-only: the whole model, local training, nothing sent."""
        st = self.stage
        for x, y in self.sched.ctx.train_batches(epoch):
            t = self.it
            out = await ctx.compute(st.fwd_work(len(x)), st.forward, x, t, y, 1.0 / len(y), iteration=t)
            if self.sched.ctx.numerics:
                ctx.report_train(*out)
            await ctx.compute(st.bwd_work(len(x)), st.backward, t, iteration=t)
            await ctx.compute(st.step_work(), st.step, iteration=t)
            self.it += 1
            ctx.iteration_done(epoch, self.it, len(y))


class CloudRole(_Side):
    """P3 (and the sender of P4): trains on each fresh feature, returns its gradient."""

    def __init__(self, sched: FeatureReplay):
        super().__init__(sched, "cloud", sched.cut, sched.L)

    async def run(self, ctx) -> None:
        s = self.sched
        for epoch in range(self.first_epoch, s.ctx.cfg.train.epochs):
            if s.cut < s.L:
                st = self.stage
                for _ in range(s.ctx.iterations_per_epoch()):
                    t = self.it
                    msg = await ctx.recv("edge", "act")
                    a, y = msg["x"], msg["y"]
                    out = await ctx.compute(st.fwd_work(a.shape[0]), st.forward, a, t, y, 1.0 / a.shape[0], iteration=t)
                    if s.ctx.numerics:
                        ctx.report_train(*out)
                    g = await ctx.compute(st.bwd_work(a.shape[0]), st.backward, t, iteration=t)
                    ctx.send("edge", "grad", g, iteration=t)  # P4 starts as soon as the gradient exists
                    await ctx.compute(st.step_work(), st.step, iteration=t)
                    self.it += 1
                    ctx.iteration_done(epoch, self.it, int(a.shape[0]))
            await ctx.end_epoch(epoch)


class JointDNN(FeatureReplay):
    """JointDNN (Eshratifar et al.), the paper's baseline: the cut of least serial cost (Eq. 10)
    at the links' configured bandwidths, kept for the whole run, and no pipelining (K = 0)."""

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.K != 0 or self.cfg.K_schedule:
            raise ConfigError("scheduler.K", f"jointdnn is serial (K = 0, no K_schedule); got K={self.cfg.K}; pipelining is scheduler=feature_replay")


class EdgeOnly(FeatureReplay):
    """The paper's other baseline: the whole model trains on the edge device; nothing is sent."""

    def default_cut(self) -> int | None:
        return self.L if self.cfg.cut is None else int(self.cfg.cut)

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.cut is not None and int(self.cfg.cut) != self.L:
            raise ConfigError("scheduler.cut", f"edge_only keeps all {self.L} units on the edge; got cut={self.cfg.cut} (a split is scheduler=feature_replay or jointdnn)")
