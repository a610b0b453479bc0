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
from framework.specs import RoleSpec
from plugins.schedulers.adalearner import plan as ap


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
        self._plan = ctx.plan
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

    # ---- what the roles share -------------------------------------------------------------------

    @property
    def codec(self):
        """The codec of the 1-bit architecture (the compressor's gradient codec), or None."""
        return self.ctx.compressor.codec(self.ctx.compressor.backward_tag)

    @property
    def up_tag(self) -> str:
        return self.ctx.compressor.backward_tag if self.scheme == "onebit" else "fp32_grad"

    @property
    def scheme(self) -> str:
        return self.plan()["scheme"]

    def workers(self) -> list[tuple[str, str, int]]:
        """(role, device, samples per global minibatch) of each worker node, FIFO tie order."""
        return [(f"wn{i}", w["device"], int(w["samples"])) for i, w in enumerate(self.plan()["workers"])]

    def slices(self, batch: int) -> list[tuple[int, int]]:
        """Each worker's [start, stop) of a global minibatch of `batch` samples (a short last
        minibatch is split in the same proportions)."""
        sizes = [s for _, _, s in self.workers()]
        if batch != sum(sizes):
            sizes = ap.largest_remainder(batch, sizes)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [(a, a + s) for a, s in zip(starts, sizes)]

    def param_shapes(self) -> dict[str, tuple]:
        """The whole model's parameters by the names a role's Stage gives them."""
        if self._shapes is None:
            self._shapes = {n: tuple(p.shape) for n, p in self.ctx.model.slice(0, self.Q).named_parameters()}
        return self._shapes

    def meta_grads(self) -> dict[str, torch.Tensor]:
        return {n: torch.empty(s, dtype=self.dtype, device="meta") for n, s in self.param_shapes().items()}

    def codec_s(self, kind: str) -> float:
        """Modelled seconds of one encode or decode of a whole gradient: priced once, in the plan."""
        return float(self.plan()["codec_s"][kind])

    def _price_codec(self, kind: str) -> float:
        """The compressor's time model for one encode or decode of a whole gradient."""
        return float(self.ctx.compressor.codec_estimate(kind, self.ctx.compressor.backward_tag, self.meta_grads()) or 0.0)

    def update_s(self, device: str, n: int) -> float:
        """The GO's sum of n gradients and its SGD step (see the module doc)."""
        step = self.ctx.cluster.device(device).time(Work("step", 0, self.Q))
        return step * (1 + max(0, n - 1) / 4)

    def aggregate_meta(self) -> dict[str, torch.Tensor]:
        """The 1-bit answer's tensors (each parameter's scalars and bits, uint8) as meta tensors."""
        out = {}
        for n, shape in self.param_shapes().items():
            meta_n, payload_n = self.codec.wire_size(shape)
            out[f"{n}.meta"] = torch.empty(meta_n, dtype=torch.uint8, device="meta")
            out[f"{n}.bits"] = torch.empty(payload_n, dtype=torch.uint8, device="meta")
        return out

    def own_model(self):
        return clone_module(self.ctx.model) if self.numerics else self.ctx.model

    # ---- the plan (Algorithm 1) -------------------------------------------------------------------

    def _profile(self, device: str):
        """t(b): the device's forward + backward of the whole model on b samples (the predictor)."""
        dev = self.ctx.cluster.device(device)
        pred = self.ctx.predictor
        return lambda b: sum(pred.predict(dev, Work(k, 0, self.Q, b)) for k in ("fwd", "bwd"))

    def plan(self) -> dict:
        if self._plan is None:
            self._plan = self._make_plan()
        return self._plan

    def planned_epoch_s(self) -> float:
        return float(self.plan()["predicted_epoch_s"])

    def _make_plan(self) -> dict:
        from plugins.schedulers.adalearner.planner import make_plan

        return make_plan(self)

    # ---- roles --------------------------------------------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return {"go": self.go_device, **{r: d for r, d, _ in self.workers()}}

    def role_spec(self, role: str) -> RoleSpec:
        return RoleSpec(role, self.role_devices()[role])  # issue 45: the role's slice of the plan moves here

    def role_from_spec(self, role: str, spec: dict):
        from plugins.schedulers.adalearner.roles import GroupOwner, Worker

        if role == "go":
            return GroupOwner(self)
        names = [r for r, _, _ in self.workers()]
        if role not in names:
            raise KeyError(f"no role {role!r}; roles: go, {listing(names)}")
        return Worker(self, names.index(role))

    def eval_model(self, states: dict[str, dict]):
        if self._eval is None:
            self._eval = clone_module(self.ctx.model)
        if "go" in states:
            self._eval.load_state_dict(states["go"])
        return self._eval

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        pl = self.plan()
        go = role_stats.get("go", {})
        its = go.get("iteration_s", [])
        measured = sum(its) / len(its) if its else 0.0
        plan = {k: v for k, v in pl.items() if k not in ("lookup_table",)}
        summary = {"plan": plan, "iteration_s": {"mean": measured, "predicted": pl["predicted_iteration_s"], "iterations": len(its)}}
        metrics = {"plan/n": pl["n"], "plan/predicted_iteration_s": pl["predicted_iteration_s"], "adalearner/iteration_s": measured}
        if measured > 0:
            metrics["adalearner/speedup_vs_local"] = pl["local_iteration_s"] / measured
            metrics["adalearner/estimate_error"] = measured / pl["predicted_iteration_s"] - 1.0
        return {"summary": summary, "metrics": metrics}
