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

Pricing: the edge's send forward, replay forward, backward and step, the uplink codec, the
cloud's forward, backward and step, by the devices' time models. The replay's forward is charged
because the device runs it and the paper's T1 lists it (section 4.4); `price_replay: false` is
an ablation, the official code's cost model, which takes a profile table's measured iteration
as all of P1 (notes section 4.3).

The plan (and the decision engine's cost M) comes from `cost_model`: `policy` (default) walks
the staleness policy's pipeline (plugins.schedulers.feature_replay.pipeline), so the predicted
epoch is what the simulator measures under every policy; `paper` is Eq. 12 as Alg. 2 prints it,
kept so that its predictions and choices can be compared (plan.json records both models'
predictions and cuts).
"""

from __future__ import annotations

import collections

import torch

from framework import repartition as rp
from framework.cluster import Work
from framework.errors import ConfigError, listing
from framework.knobs import choices
from framework.scheduler import Role, Scheduler
from framework.specs import RoleSpec
from plugins.schedulers.feature_replay import cost
from plugins.schedulers.feature_replay import pipeline
from plugins.schedulers.feature_replay.schema import FeatureReplayConfig

COST_MODELS = choices(FeatureReplayConfig, "cost_model")


class FeatureReplay(Scheduler):
    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.L = len(ctx.model)
        devices = ctx.cluster.devices
        self.edge_device = str(cfg.edge_device)
        # null: the cluster's `cloud`, else its `server` (the collaborative clusters' edge server)
        self.cloud_device = str(cfg.cloud_device) if cfg.cloud_device else ("cloud" if "cloud" in devices or "server" not in devices else "server")
        # the party that holds the inputs and the first units and replays; the cloud for a
        # generative model, whose ground truth (the targets) stays on the edge (notes 2.9)
        self.upstream_role = str(cfg.upstream)
        self.reversed = self.upstream_role == "cloud"
        self._check_config()
        self._plan = ctx.plan if ctx.plan is not None else self._make_plan()
        self.cut = int(self._plan["cut"])
        self.eval_copy = None

    # ---- configuration -----------------------------------------------------------------------

    def _check_config(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        for i, entry in enumerate(cfg.K_schedule or []):
            if len(entry) != 2 or int(entry[0]) < 0 or (entry[1] is not None and int(entry[1]) < 0):
                raise ConfigError(f"scheduler.K_schedule[{i}]", f"{list(entry)} is not [epoch >= 0, K >= 0 or null]")
        for key, dev in (("edge_device", self.edge_device), ("cloud_device", self.cloud_device)):
            if dev not in ctx.cluster.devices:
                raise ConfigError(f"scheduler.{key}", f"no device {dev!r}; devices: {listing(ctx.cluster.devices)}")
        if self.edge_device == self.cloud_device:
            raise ConfigError("scheduler.cloud_device", f"edge and cloud are both {self.edge_device!r}; they need two devices and a link")
        if self.reversed:
            if cfg.adaptive or cfg.cut is None:
                raise ConfigError("scheduler.adaptive" if cfg.adaptive else "scheduler.cut", "with upstream=cloud (a generative model) the cut is fixed: the decision engine places the edge's input-side blocks; set scheduler.cut and scheduler.adaptive=false")
            if not 1 <= int(cfg.cut) < self.L:
                raise ConfigError("scheduler.cut", f"with upstream=cloud the cloud holds units 1..cut and the edge the rest: 1..{self.L - 1}, got {cfg.cut}")
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
        a, b = (self.cloud_device, self.edge_device) if self.reversed else (self.edge_device, self.cloud_device)
        up, down = cl.link(a, b), cl.link(b, a)
        return up.bandwidth_at(0.0) / 8.0, down.bandwidth_at(0.0) / 8.0

    def module_times(self, cut: int) -> dict:
        """T1..T4 of one steady-state iteration at `cut`, priced as the simulator prices them: the
        devices' time models, the compressor's codec seconds and the packets' real sizes; with
        the parts the policy-aware model needs (what the edge spends when it sends, what per
        applied gradient; the cloud's step after the gradient has left)."""
        ctx, B = self.ctx, int(self.ctx.cfg.train.batch_size)
        up_dev, down_dev = (self.cloud_device, self.edge_device) if self.reversed else (self.edge_device, self.cloud_device)
        edge, cloud = ctx.cluster.device(up_dev), ctx.cluster.device(down_dev)  # the replaying party, the other
        if cut == self.L:
            t1 = sum(edge.time(Work(k, 0, self.L, B)) for k in ("fwd", "bwd")) + edge.time(Work("step", 0, self.L))
            return {"T1": t1, "T2": 0.0, "T3": 0.0, "T4": 0.0, "encode_s": 0.0, "send_s": t1, "cloud_step_s": 0.0}
        fwd, bwd = edge.time(Work("fwd", 0, cut, B)), edge.time(Work("bwd", 0, cut, B))
        comp = ctx.new_compressor()
        feature = {"x": torch.empty((B, *ctx.model.infos[cut - 1].out_shape), device="meta")}
        if not self.reversed:  # labels travel with the feature
            feature["y"] = torch.empty((B,), dtype=torch.int64, device="meta")
        _, up_bytes, _ = comp.encode(feature, src="edge", dst="cloud", tag=comp.forward_tag)
        _, down_bytes, _ = comp.encode({"x": feature["x"]}, src="cloud", dst="edge", tag=comp.backward_tag)
        enc = comp.codec_seconds("encode", comp.forward_tag, feature, 0.0)
        dec = comp.codec_seconds("decode", comp.forward_tag, feature, 0.0)
        up = ctx.cluster.link(up_dev, down_dev)  # the feature's way
        down = ctx.cluster.link(down_dev, up_dev)
        t1 = fwd + (fwd if self.cfg.price_replay else 0.0) + bwd + edge.time(Work("step", 0, cut)) + enc
        cloud_step = cloud.time(Work("step", cut, self.L))
        t3 = dec + sum(cloud.time(Work(k, cut, self.L, B)) for k in ("fwd", "bwd")) + cloud_step
        return {"T1": t1, "T2": up.tx_time(up_bytes, 0.0) + up.cfg.latency_s, "T3": t3, "T4": down.tx_time(down_bytes, 0.0) + down.cfg.latency_s,
                "uplink_bytes": up_bytes, "downlink_bytes": down_bytes, "encode_s": enc, "send_s": fwd + enc, "cloud_step_s": cloud_step}

    def _links(self):
        """(the feature's link, the gradient's link)."""
        a, b = (self.cloud_device, self.edge_device) if self.reversed else (self.edge_device, self.cloud_device)
        return self.ctx.cluster.link(a, b), self.ctx.cluster.link(b, a)

    def _profile_rows(self) -> dict:
        """Every cut's module times and packet sizes (JSON, shipped in the plan: the edge's
        online engine and its bandwidth estimates read them)."""
        itemsize = 8 if self.ctx.cfg.runtime.dtype == "float64" else 4
        rows = [self.module_times(c) for c in range(1, self.L + 1)]
        up, down = self._links()
        return {
            "edge_s": [r["T1"] for r in rows],  # compression included (at the run's bit width)
            "edge_send_s": [r["send_s"] for r in rows],  # of which the forward and compression of the sent batch
            "cloud_s": [r["T3"] for r in rows],
            "cloud_step_s": [r["cloud_step_s"] for r in rows],
            "uplink_bytes": [r.get("uplink_bytes", 0) for r in rows],
            "downlink_bytes": [r.get("downlink_bytes", 0) for r in rows],  # the fp32 feature's gradient packet
            "encode_s": [r["encode_s"] for r in rows],
            "block_bytes": [i.params * itemsize for i in self.ctx.model.infos],
            "latency_s": [up.cfg.latency_s, down.cfg.latency_s],
            "overhead_s": [up.cfg.wakeup_s, down.cfg.wakeup_s],
        }

    def cost_model(self, name: str | None = None):
        """The engine's M: `paper` (Eq. 12) or `policy` (the staleness policy's pipeline)."""
        name = name or str(self.cfg.cost_model)
        return cost.paper_cost if name == "paper" else pipeline.policy_cost(str(self.cfg.staleness_policy))

    def _make_plan(self) -> dict:
        tau = self.ctx.iterations_per_epoch()
        K = self.K_at(0)
        bits = self._uplink_bits()
        prof = self._profile_rows()
        up, down = self._rates()
        engine = engine_profile(prof)
        policy = str(self.cfg.staleness_policy)
        chosen = "fixed"
        decisions = {}
        if self.default_cut() is None:
            # the uplink's bit width is the compressor's; the engine picks the cut (Alg. 2 with
            # one width) by the configured cost model, and the other model's choice is recorded
            # beside it; K = 0 makes it JointDNN's argmin of the serial cost (Eq. 10)
            start = cost.Deployment(self.L, 32) if self.cfg.include_edge_only else cost.Deployment(1, 32)
            for name in COST_MODELS:
                decisions[name] = cost.decide(engine, start, K, up, down, tau, bits_candidates=(32,), include_edge_only=bool(self.cfg.include_edge_only),
                                              model=self.cost_model(name))
            decision = decisions[str(self.cfg.cost_model)]
            cut, chosen = decision.deployment.cut, "engine"
        else:
            cut = int(self.default_cut())
        T = self.module_times(cut)
        mods = [T["T1"], T["T2"], T["T3"], T["T4"]]
        edge_only = prof["edge_s"][-1] * tau
        if cut == self.L:
            serial = grouped = walked = edge_only
        else:
            serial, grouped = cost.serial_cost(mods, tau), cost.grouped_cost(mods, K, tau)
            walked = pipeline.epoch_seconds(engine.stages(cut, 32, up, down), K, policy, tau, exact=True)
        planned = walked if self.cfg.cost_model == "policy" else grouped
        return {
            "scheduler": self.cfg.name,
            "cut": cut,
            "cut_chosen_by": chosen,
            "cost_model": str(self.cfg.cost_model),
            "cut_by_cost_model": {name: d.deployment.cut for name, d in decisions.items()},
            "adaptive": self.adaptive,
            "upstream": self.upstream_role,
            **{role: {"role": role, "device": dev, "units": units, "unit_names": self.ctx.model.unit_names[units[0]:units[1]]}
               for role, dev, units in (("edge", self.edge_device, [cut, self.L] if self.reversed else [0, cut]),
                                        ("cloud", self.cloud_device, [0, cut] if self.reversed else [cut, self.L]))},
            "uplink_bits": bits,
            "K": K,
            "staleness_policy": policy,
            "price_replay": bool(self.cfg.price_replay),
            "module_times_s": {k: v for k, v in T.items() if k.startswith("T")},
            "iterations_per_epoch": tau,
            # planned: the configured cost model's; policy: the staleness policy's pipeline walked
            # over the epoch; serial_eq10 / grouped_eq12: the paper's formulas on T1..T4
            "predicted_epoch_s": {"planned": planned, "policy": walked, "serial_eq10": serial, "grouped_eq12": grouped, "edge_only": edge_only},
            "predicted_iter_s": planned / tau,
            "link_bytes_per_s": {"up": up, "down": down},
            "candidates": [{"cut": c, "cost_s": v} for c, _, v in decisions[str(self.cfg.cost_model)].candidates] if decisions else [],
            "profile": prof,
        }

    @staticmethod
    def engine_profile(prof: dict) -> cost.CutProfile:
        return engine_profile(prof)

    @property
    def adaptive(self) -> bool:
        """Whether the edge re-decides the cut online (feature_replay with K > 0, as the code)."""
        return bool(self.cfg.adaptive) and type(self) is FeatureReplay and not self.reversed

    def plan(self) -> dict:
        return self._plan

    def planned_epoch_s(self) -> float:
        """The configured cost model's epoch: the staleness policy's pipeline (`cost_model:
        policy`, default) or Eq. 12 (`paper`; Eq. 10 at K = 0, where both agree)."""
        return float(self._plan["predicted_epoch_s"]["planned"])

    # ---- roles -------------------------------------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return {"edge": self.edge_device, "cloud": self.cloud_device}

    def role_spec(self, role: str) -> RoleSpec:
        return RoleSpec(role, self.role_devices()[role])  # issue 45: the role's slice of the plan moves here

    def role_from_spec(self, role: str, spec: dict) -> Role:
        from plugins.schedulers.feature_replay.roles import DownstreamRole, UpstreamRole

        if role not in ("edge", "cloud"):
            raise KeyError(f"no role {role!r}; roles: edge, cloud")
        return UpstreamRole(self, role) if role == self.upstream_role else DownstreamRole(self, role)

    def eval_model(self, states: dict[str, dict]):
        if self.eval_copy is None:
            import copy

            self.eval_copy = copy.deepcopy(self.ctx.model)
        for state in states.values():
            rp.unpack_units(self.eval_copy, state, True)
        return self.eval_copy

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        out = super().report(total, timeline, role_stats, dropouts)
        edge = role_stats.get(self.upstream_role, {})  # the replaying side's counters
        stale = edge.get("staleness", [])
        hist = collections.Counter(stale)
        pl = self._plan
        epochs = max(1, int(self.ctx.cfg.train.epochs))
        out["summary"]["staleness"]["histogram"] = {str(k): hist[k] for k in sorted(hist)}
        out["summary"]["feature_replay"] = {
            "cut": pl["cut"], "K": pl["K"], "policy": pl["staleness_policy"], "uplink_bits": pl["uplink_bits"],
            "discarded_gradients": edge.get("discarded", 0), "peak_history": edge.get("peak_history", 0),
            "measured_epoch_s": total / epochs, "predicted_epoch_s": pl["predicted_epoch_s"],
            "migrations": edge.get("migrations", []), "final_cut": edge.get("cut", pl["cut"]),
            "measured_rates_Bps": edge.get("rates"), "tau": edge.get("tau"), "drift_std": edge.get("drift_std", {}),
        }
        out["metrics"].update({"replay/discarded": edge.get("discarded", 0), "replay/peak_history": edge.get("peak_history", 0),
                               "replay/migrations": len(edge.get("migrations", []))})
        return out


def engine_profile(prof: dict) -> cost.CutProfile:
    """The decision engine's CutProfile from the plan's rows: compression is inside edge_s (and
    edge_send_s) and the uplink bytes are the compressed packet's, so the engine prices transfers
    at 32 'bits' of those bytes (the run's bit width is the compressor's; switching widths online
    is not done)."""
    up = prof["uplink_bytes"]
    return cost.CutProfile(prof["edge_s"], prof["cloud_s"], up[:-1], lambda c, b: 0.0, prof["block_bytes"], down_bytes=prof["downlink_bytes"][:-1],
                           send_s=prof["edge_send_s"], cloud_step_s=prof["cloud_step_s"], latency_s=tuple(prof["latency_s"]), overhead_s=tuple(prof["overhead_s"]))


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
