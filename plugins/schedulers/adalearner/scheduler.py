"""AdaLearner (Mao et al.): data-parallel training of one model on several phones that share the
group owner's WLAN hotspot (notes: ../shared/papers/adalearner.notes.md).

The group owner (role `go`, on the cluster's device `go`: the user's phone) aggregates; worker
nodes (roles `wn0`.., on the devices Algorithm 1 chose) each hold the whole model and compute the
gradient of their slice of every global minibatch (`train.batch_size`, 128 in the paper). One
synchronous update per global minibatch:

    fp32 (architecture a):  WN -> GO gradients;  GO sums, steps;  GO -> WN weights
    1-bit (architecture b): WN -> GO gradients through the run's codec (compressor=onebit_ef:
                            sign bits, per-output-unit means, error feedback on the worker);
                            GO decodes each, sums, quantizes the sum once more (its own error
                            feedback) and sends the same bits to every WN; everyone steps

On `cluster=adalearner_wlan` every link shares one half-duplex channel (`shared_medium`) and each
worker's upload first pays the radio's wake-up (`links.dev*->go.wakeup_s`: Eq. 4's D[j], once per
worker and iteration), so the 2n transfers of an iteration queue one after another, as on the
paper's hotspot. The GO answers in the order the gradients arrived (FIFO), so a worker answered
first computes while the others are answered. Algorithm 1 (plugins/schedulers/adalearner/plan.py,
adalearner.planner) picks the number of workers, their slices and the architecture from the
devices' profiles (the run's predictor), the links and the codec's speed, by the iteration as the
FIFO star runs it (`planner=fifo`, adalearner.fifo) or by the paper's Eq. 4 (`planner=paper`);
the choice and every n it looked at are in plan.json and under `plan` in summary.json.

Decisions (notes section 9, where the paper is silent):
- The GO only aggregates (it computes nothing when n >= 2); n = 1 is the GO training alone.
- Every role builds the model from the run's seed, so the initial weights need no broadcast.
- Each worker's loss is its slice's summed loss over the global minibatch size, so the GO's plain
  sum is the size-weighted mean and the fp32 architecture is local minibatch SGD (tested).
- The GO's update (its sum of n gradients and its SGD step) is priced as n - 1 vector adds (a
  quarter of a step each: SGD is about four operations per parameter) plus one step.
- The 1-bit downlink is quantized once by the GO (Eq. 8 counts one quantization there), with the
  run's codec and options, and travels as its bits and scalars (raw bytes, tag `onebit_agg`).
- Parameters only are synchronised: models with running statistics (BatchNorm) are refused.
"""

from __future__ import annotations

import torch

from framework.cluster import Work
from framework.errors import ConfigError, listing
from framework.models import clone_module
from framework.scheduler import Scheduler
from plugins.schedulers.adalearner.gradients import aggregate_meta, gradient_codec, meta_grads, param_shapes
from plugins.schedulers.adalearner.plan import AdaLearnerPlan
from plugins.schedulers.adalearner.planner import make_plan
from plugins.schedulers.adalearner.roles import GroupOwner, GroupOwnerSpec, Worker, WorkerSpec


class AdaLearner(Scheduler):
    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.numerics, self.dtype = ctx.numerics, ctx.dtype
        self.go_device = str(cfg.group_owner)
        cl = ctx.cluster
        if self.go_device not in cl.devices:
            raise ConfigError("scheduler.group_owner", f"no device {self.go_device!r} in the cluster (it has {listing(cl.devices)}); use cluster=adalearner_wlan or add cluster.devices.{self.go_device}")
        self.candidates = [f"dev{i}" for i in range(int(cl.cfg.num_devices))]
        if cfg.max_workers is not None:
            if not 1 <= int(cfg.max_workers) <= len(self.candidates):
                raise ConfigError("scheduler.max_workers", f"must be in 1..{len(self.candidates)} (cluster.num_devices), got {cfg.max_workers}")
            self.candidates = self.candidates[: int(cfg.max_workers)]
        self._check_config()
        self.W = int(ctx.cfg.train.batch_size)
        self.Q = len(ctx.model)
        self._plan = None if ctx.plan is None else AdaLearnerPlan.from_json(ctx.plan)
        self._eval = None
        self._shapes = None

    def _check_config(self) -> None:
        cfg, ctx = self.cfg, self.ctx  # ranges and choices: checked when built (framework.registry.build)
        if cfg.workers is not None and not 1 <= int(cfg.workers) <= len(self.candidates):
            raise ConfigError("scheduler.workers", f"must be in 1..{len(self.candidates)} (the worker candidates dev0..), or null for Algorithm 1's choice; got {cfg.workers}")
        stats = [n for n, b in ctx.model.named_buffers() if b.is_floating_point()]
        if stats:
            raise ConfigError("model", f"scheduler=adalearner synchronises parameters only, and {ctx.cfg.model.name} keeps running statistics ({stats[0]}, ...); use a model without BatchNorm (e.g. model.batchnorm=false)")
        if cfg.architecture != "fp32":
            if self.codec is None:
                if cfg.architecture == "onebit":
                    raise ConfigError("scheduler.architecture", f"onebit sends gradients through the compressor's codec, and compressor={ctx.cfg.compressor.name} codes none; use compressor=onebit_ef")
            elif ctx.compressor.time_cfg.model == "measured":
                raise ConfigError("compressor.time.model", "scheduler=adalearner plans with the codec's modelled speed (Eq. 8); use linear or none, not measured")

    # ---- what the roles and the planner share ------------------------------------------------------

    @property
    def codec(self):
        """The codec of the 1-bit architecture (the compressor's gradient codec), or None."""
        return gradient_codec(self.ctx.compressor)

    @property
    def up_tag(self) -> str:
        """The tag of the workers' gradients: the compressor's gradient tag with 1-bit, else raw fp32."""
        return self.ctx.compressor.backward_tag if self.typed_plan().scheme == "onebit" else "fp32_grad"

    def workers(self) -> list[tuple[str, str, int]]:
        """(role, device, samples per global minibatch) of each worker node, FIFO tie order."""
        return [(f"wn{i}", w.device, int(w.samples)) for i, w in enumerate(self.typed_plan().workers)]

    def param_shapes(self) -> dict[str, tuple]:
        """The whole model's parameter shapes (adalearner.gradients), read once."""
        if self._shapes is None:
            self._shapes = param_shapes(self.ctx.model)
        return self._shapes

    def meta_grads(self) -> dict[str, torch.Tensor]:
        """A whole gradient as meta tensors: what the planner prices messages with."""
        return meta_grads(self.param_shapes(), self.dtype)

    def price_codec(self, kind: str) -> float:
        """The compressor's time model for one encode or decode of a whole gradient (the plan
        keeps the price: `codec_s`)."""
        return float(self.ctx.compressor.codec_estimate(kind, self.ctx.compressor.backward_tag, self.meta_grads()) or 0.0)

    def update_s(self, device: str, n: int) -> float:
        """The GO's sum of n gradients and its SGD step (see the module doc)."""
        step = self.ctx.cluster.device(device).time(Work("step", 0, self.Q))
        return step * (1 + max(0, n - 1) / 4)

    def aggregate_meta(self) -> dict[str, torch.Tensor]:
        """The 1-bit answer's tensors as meta tensors (the planner prices the downlink with them)."""
        return aggregate_meta(self.codec, self.param_shapes())

    # ---- the plan (Algorithm 1) -------------------------------------------------------------------

    def profile(self, device: str):
        """t(b): the device's forward + backward of the whole model on b samples (the predictor)."""
        dev = self.ctx.cluster.device(device)
        pred = self.ctx.predictor
        return lambda b: sum(pred.predict(dev, Work(k, 0, self.Q, b)) for k in ("fwd", "bwd"))

    def typed_plan(self) -> AdaLearnerPlan:
        """The plan: Algorithm 1's search on first use, or the one the coordinator shipped."""
        if self._plan is None:
            self._plan = make_plan(self)
        return self._plan

    def plan(self) -> dict:
        return self.typed_plan().to_json()

    def planned_epoch_s(self) -> float:
        return float(self.typed_plan().predicted_epoch_s)

    # ---- roles --------------------------------------------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return {"go": self.go_device, **{r: d for r, d, _ in self.workers()}}

    def role_spec(self, role: str) -> GroupOwnerSpec | WorkerSpec:
        pl, device = self.typed_plan(), self.role_devices()[role]
        names = [r for r, _, _ in self.workers()]
        if role == "go":
            return GroupOwnerSpec(role, device, tuple(names), pl.scheme, self.up_tag, self.update_s(device, len(names)), float(pl.codec_s.encode))
        return WorkerSpec(role, device, names.index(role), tuple(s for _, _, s in self.workers()), pl.scheme, self.up_tag, float(pl.codec_s.decode))

    def role_from_spec(self, role: str, spec: dict):
        names = [r for r, _, _ in self.workers()]
        if role == "go":
            return GroupOwner(GroupOwnerSpec.from_json(spec), self.ctx)
        if role not in names:
            raise KeyError(f"no role {role!r}; roles: go, {listing(names)}")
        return Worker(WorkerSpec.from_json(spec), self.ctx)

    def eval_model(self, states: dict[str, dict]):
        if self._eval is None:
            self._eval = clone_module(self.ctx.model)
        if "go" in states:
            self._eval.load_state_dict(states["go"])
        return self._eval

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        pl = self.typed_plan()
        go = role_stats.get("go", {})
        its = go.get("iteration_s", [])
        measured = sum(its) / len(its) if its else 0.0
        plan = {k: v for k, v in pl.to_json().items() if k != "lookup_table"}
        summary = {"plan": plan, "iteration_s": {"mean": measured, "predicted": pl.predicted_iteration_s, "iterations": len(its)}}
        metrics = {"plan/n": pl.n, "plan/predicted_iteration_s": pl.predicted_iteration_s, "adalearner/iteration_s": measured}
        if measured > 0:
            metrics["adalearner/speedup_vs_local"] = pl.local_iteration_s / measured
            metrics["adalearner/estimate_error"] = measured / pl.predicted_iteration_s - 1.0
        return {"summary": summary, "metrics": metrics}
