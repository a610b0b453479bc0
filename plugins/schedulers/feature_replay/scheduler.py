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
import copy

from framework.errors import ConfigError, listing
from framework.pipeline import repartition as rp
from framework.scheduler import Role, Scheduler
from plugins.schedulers.feature_replay import cost, engine, pipeline
from plugins.schedulers.feature_replay.downstream import DownstreamRole
from plugins.schedulers.feature_replay.engine import COST_MODELS, Engine
from plugins.schedulers.feature_replay.plan import Candidate, FeatureReplayPlan, LinkRates, ModuleTimes, Placement, PredictedEpoch
from plugins.schedulers.feature_replay.pricing import Pricing
from plugins.schedulers.feature_replay.role_specs import DownstreamSpec, SideSpec, StalenessBound, UpstreamSpec
from plugins.schedulers.feature_replay.upstream import UpstreamRole


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
        self.bound = StalenessBound.of(cfg.K, cfg.K_schedule)
        up, down = (self.cloud_device, self.edge_device) if self.reversed else (self.edge_device, self.cloud_device)
        self.pricing = Pricing(ctx, up, down, labels_travel=not self.reversed, price_replay=bool(cfg.price_replay))
        self._plan = FeatureReplayPlan.from_json(ctx.plan) if ctx.plan is not None else self._make_plan()
        self.cut = self._plan.cut
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

    # ---- the plan: cut, module times, the cost model's predictions ---------------------------

    def cost_model(self, name: str | None = None):
        """The engine's M: `paper` (Eq. 12) or `policy` (the staleness policy's pipeline)."""
        return engine.cost_model(name or str(self.cfg.cost_model), str(self.cfg.staleness_policy))

    def _make_plan(self) -> FeatureReplayPlan:
        tau = self.ctx.iterations_per_epoch()
        K = self.bound.at(0)
        bits = self.pricing.uplink_bits()
        prof = self.pricing.profile()
        up, down = self.pricing.rates()
        policy = str(self.cfg.staleness_policy)
        chosen = "fixed"
        decisions = {}
        if self.default_cut() is None:
            # the uplink's bit width is the compressor's; the engine picks the cut (Alg. 2 with
            # one width) by the configured cost model, and the other model's choice is recorded
            # beside it; K = 0 makes it JointDNN's argmin of the serial cost (Eq. 10)
            start = self.L if self.cfg.include_edge_only else 1
            for name in COST_MODELS:
                decisions[name] = Engine(prof, name, policy, bool(self.cfg.include_edge_only)).decide(start, K, up, down, tau)
            cut, chosen = decisions[str(self.cfg.cost_model)].deployment.cut, "engine"
        else:
            cut = int(self.default_cut())
        T = self.pricing.cut(cut)
        edge_only = prof.edge_s[-1] * tau
        if cut == self.L:
            serial = grouped = walked = edge_only
        else:
            serial, grouped = cost.serial_cost(T.modules, tau), cost.grouped_cost(T.modules, K, tau)
            walked = pipeline.epoch_seconds(engine.cut_profile(prof).stages(cut, 32, up, down), K, policy, tau, exact=True)
        planned = walked if self.cfg.cost_model == "policy" else grouped
        edge_units, cloud_units = ((cut, self.L), (0, cut)) if self.reversed else ((0, cut), (cut, self.L))
        return FeatureReplayPlan(
            scheduler=self.cfg.name,
            cut=cut,
            cut_chosen_by=chosen,
            cost_model=str(self.cfg.cost_model),
            cut_by_cost_model={name: d.deployment.cut for name, d in decisions.items()},
            adaptive=self.adaptive,
            upstream=self.upstream_role,
            edge=self._placement("edge", self.edge_device, edge_units),
            cloud=self._placement("cloud", self.cloud_device, cloud_units),
            uplink_bits=bits,
            K=K,
            staleness_policy=policy,
            price_replay=bool(self.cfg.price_replay),
            module_times_s=ModuleTimes(*T.modules),
            iterations_per_epoch=tau,
            # planned: the configured cost model's; policy: the staleness policy's pipeline walked
            # over the epoch; serial_eq10 / grouped_eq12: the paper's formulas on T1..T4
            predicted_epoch_s=PredictedEpoch(planned=planned, policy=walked, serial_eq10=serial, grouped_eq12=grouped, edge_only=edge_only),
            predicted_iter_s=planned / tau,
            link_bytes_per_s=LinkRates(up, down),
            candidates=tuple(Candidate(c, v) for c, _, v in decisions[str(self.cfg.cost_model)].candidates) if decisions else (),
            profile=prof,
        )

    def _placement(self, role: str, device: str, units: tuple[int, int]) -> Placement:
        return Placement(role, device, units, tuple(self.ctx.model.unit_names[units[0]:units[1]]))

    @property
    def adaptive(self) -> bool:
        """Whether the edge re-decides the cut online (feature_replay with K > 0, as the code)."""
        return bool(self.cfg.adaptive) and type(self) is FeatureReplay and not self.reversed

    def plan(self) -> dict:
        return self._plan.to_json()

    def planned_epoch_s(self) -> float:
        """The configured cost model's epoch: the staleness policy's pipeline (`cost_model:
        policy`, default) or Eq. 12 (`paper`; Eq. 10 at K = 0, where both agree)."""
        return float(self._plan.predicted_epoch_s.planned)

    # ---- roles -------------------------------------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return {"edge": self.edge_device, "cloud": self.cloud_device}

    def role_spec(self, role: str) -> SideSpec:
        """The upstream side gets the staleness policy and what its online engine re-decides
        with; the downstream side only the cut."""
        device, pl = self.role_devices()[role], self._plan
        if role != self.upstream_role:
            return DownstreamSpec(role, device, pl.cut, self.reversed)
        cfg = self.cfg
        return UpstreamSpec(role, device, pl.cut, self.reversed, K=self.bound, staleness_policy=pl.staleness_policy, price_replay=pl.price_replay,
                            adaptive=pl.adaptive, profile=pl.profile, cost_model=pl.cost_model, include_edge_only=bool(cfg.include_edge_only),
                            iterations_per_epoch=pl.iterations_per_epoch, tau_beta=float(cfg.tau_beta), rate_beta=float(cfg.rate_beta),
                            drift_lags=tuple(int(k) for k in cfg.drift_lags or ()))

    def role_from_spec(self, role: str, spec: dict) -> Role:
        if role not in ("edge", "cloud"):
            raise KeyError(f"no role {role!r}; roles: edge, cloud")
        if role == self.upstream_role:
            return UpstreamRole(UpstreamSpec.from_json(spec), self.ctx)
        return DownstreamRole(DownstreamSpec.from_json(spec), self.ctx)

    def eval_model(self, states: dict[str, dict]):
        if self.eval_copy is None:
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
            "cut": pl.cut, "K": pl.K, "policy": pl.staleness_policy, "uplink_bits": pl.uplink_bits,
            "discarded_gradients": edge.get("discarded", 0), "peak_history": edge.get("peak_history", 0),
            "measured_epoch_s": total / epochs, "predicted_epoch_s": pl.predicted_epoch_s.to_json(),
            "migrations": edge.get("migrations", []), "final_cut": edge.get("cut", pl.cut),
            "measured_rates_Bps": edge.get("rates"), "tau": edge.get("tau"), "drift_std": edge.get("drift_std", {}),
        }
        out["metrics"].update({"replay/discarded": edge.get("discarded", 0), "replay/peak_history": edge.get("peak_history", 0),
                               "replay/migrations": len(edge.get("migrations", []))})
        return out


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
