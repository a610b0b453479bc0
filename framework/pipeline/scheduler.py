"""Pipeline schedules as readable programs of actions per stage.

A schedule says, for stage s of S and M micro-batches in one flush, the ordered actions
that stage performs: `F(m)` forward of micro-batch m, `B(m)` backward of it, `STEP` the
optimizer. A classic schedule plugin (GPipe, 1F1B, PipeDream) is then only its action list, as
in `torch.distributed.pipelining.schedules`:

    from framework.pipeline.scheduler import PipelineScheduler, F, B, STEP

    class GPipe(PipelineScheduler):
        def actions(self, stage, num_stages, num_mb):
            return [F(m) for m in range(num_mb)] + [B(m) for m in range(num_mb)] + [STEP]

`PipelineScheduler` plans the stages (framework.pipeline.cost), evaluates the action list into
data for every flush size a run meets (framework.pipeline.schedule.Schedule) and gives each
stage its spec (framework.pipeline.stage): the stage runs the program it received, receiving
activations from stage s-1 and sending them to s+1, and the reverse for gradients. This module
is what a schedule plugin imports: the scheduler and the action vocabulary.

`scheduler.repartition: [[epoch, cuts], ...]` moves units between stages at the start of an
epoch (framework.pipeline.repartition): weights and optimizer state travel stage to stage as messages.
What stages do between epochs beyond that (AccEPT's re-planning) is a policy a plugin declares
(framework.pipeline.epoch_end).
"""

from __future__ import annotations

import copy

from torch import nn

from framework.cluster import Work
from framework.errors import ConfigError
from framework.pipeline import epoch_end as pipeline_epoch_end
from framework.pipeline import repartition as rp
from framework.pipeline.cost import PipelinePlanner
from framework.pipeline.partition import partition
from framework.pipeline.plan import PipelinePlan, Repartition, StageMemory, StagePlan
from framework.pipeline.schedule import STEP, Action, B, F, Schedule, one_f_one_b
from framework.pipeline.stage import StageRole, StageSpec
from framework.scheduler import Scheduler

# the vocabulary a schedule plugin writes its action lists with (its home: framework.pipeline.schedule)
__all__ = ["PipelineScheduler", "Action", "F", "B", "STEP", "one_f_one_b"]


class PipelineScheduler(Scheduler):
    """Stages on devices dev0..dev{S-1}; each iteration runs `actions(s, S, M)` per stage.

    Subclasses set:
    - `actions(stage, num_stages, num_mb)`: the per-stage program of one flush;
    - `flush_per = "iteration"` (a flush per mini-batch, split into micro-batches) or
      `"epoch"` (asynchronous: each mini-batch is one item, the pipeline drains at epoch end);
    - `stash`: weight stashing on the stages (PipeDream);
    - `min_stages`: the fewest stages it runs on (2: one stage is the local loop, `local`'s 1).
    """

    flush_per = "iteration"
    stash = False
    min_stages = 2  # a pipeline of one stage is the local loop: scheduler=local says so

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.microbatches = self.num_microbatches()
        self.mb_size = max(1, int(ctx.cfg.train.batch_size) // self.microbatches)
        given = PipelinePlan.from_json(ctx.plan) if ctx.plan is not None else None
        num_stages = len(given.stages) if given is not None else self.num_stages()
        # the action lists as data, for every flush size a run meets: a short last mini-batch
        # has fewer micro-batches; an asynchronous flush is the epoch's mini-batches
        sizes = range(1, self.microbatches + 1) if self.flush_per == "iteration" else [ctx.iterations_per_epoch()]
        self.schedule = Schedule.of(self.actions, num_stages, sizes)
        self.planner = PipelinePlanner(ctx, partition=cfg.partition, mb_size=self.mb_size, microbatches=self.microbatches, flush_per=self.flush_per, schedule=self.schedule)
        self.pipeline_plan = given if given is not None else self._make_plan(num_stages)  # typed; plan() is its JSON
        self._plan_json = self.pipeline_plan.to_json()
        self.bounds = list(self.pipeline_plan.bounds)
        self.devices = list(self.pipeline_plan.devices)
        self.roles = list(self.pipeline_plan.roles)
        self.epoch_end = pipeline_epoch_end.chosen(cfg)
        if self.epoch_end is not None:
            self.epoch_end.policy_class().check(cfg, ctx)
        self._eval = None

    # -- hooks for subclasses -----------------------------------------------------------------

    def num_stages_override(self, num_stages: int) -> int:
        return num_stages

    def num_microbatches(self) -> int:
        return int(self.cfg.microbatches)

    def actions(self, stage: int, num_stages: int, num_mb: int) -> list[Action]:
        raise NotImplementedError

    # -- the plan -----------------------------------------------------------------------------

    def num_stages(self) -> int:
        """The pipeline's depth: scheduler.stages, else one stage per cluster device."""
        num_devices = self.ctx.cluster.cfg.num_devices  # dev0.., not extra named devices
        num_stages = self.num_stages_override(self.cfg.stages if self.cfg.stages is not None else num_devices)
        if num_stages < self.min_stages:
            key, more = ("scheduler.stages", "scheduler.stages=2") if self.cfg.stages is not None else ("cluster.num_devices", "cluster.num_devices=2")
            raise ConfigError(key, f"scheduler={self.cfg.name} pipelines a model over at least {self.min_stages} stages, got {num_stages}; one stage is scheduler=local (the same micro-batches, no pipeline), or use more stages ({more})")
        if num_stages > num_devices:
            raise ConfigError("scheduler.stages", f"{num_stages} stages need {num_stages} devices but the cluster has {num_devices}; set cluster.num_devices={num_stages}")
        return num_stages

    def _make_plan(self, num_stages: int) -> PipelinePlan:
        ctx, planner = self.ctx, self.planner
        devices = [f"dev{i}" for i in range(num_stages)]
        dev_objs = [ctx.cluster.device(d) for d in devices]
        link_cost = planner.boundary_seconds(devices)
        bounds = planner.plan_bounds(devices)
        memory = [self.memory_estimate(s, bounds) for s in range(num_stages)]
        self.check_memory(devices, bounds, memory)
        later = []
        for i, entry in enumerate(self.cfg.get("repartition") or []):
            key = f"scheduler.repartition[{i}]"
            if len(entry) != 2 or int(entry[0]) < 1:
                raise ConfigError(key, f"{list(entry)} is not [epoch >= 1, cuts]")
            try:
                new = partition(entry[1], dev_objs, len(ctx.model), ctx.model.name, ctx.predictor, self.mb_size, link_cost)
            except ConfigError as e:
                raise ConfigError(key, e.message) from None
            self.check_memory(devices, new, [self.memory_estimate(s, new) for s in range(num_stages)])
            later.append(Repartition(int(entry[0]), tuple(new)))

        def compute_s(s, a, b):
            return sum(ctx.predictor.predict(dev_objs[s], Work(k, a, b, self.mb_size)) for k in ("fwd", "bwd"))

        return PipelinePlan(
            scheduler=self.cfg.name,
            partition=self.cfg.partition if isinstance(self.cfg.partition, str) else "cuts",
            stages=tuple(
                StagePlan(f"stage{s}", d, (a, b), tuple(ctx.model.unit_names[a:b]), mem, compute_s(s, a, b), link_cost(s, b) if s < num_stages - 1 else 0.0)
                for s, (d, (a, b), mem) in enumerate(zip(devices, bounds, memory))
            ),
            microbatches=self.microbatches,
            predicted_epoch_s=planner.predicted_epoch_s(devices, bounds),
            flush_per=self.flush_per,
            weight_stashing=self.stash,
            repartition=tuple(sorted(later, key=lambda r: r.epoch)),
        )

    def plan(self) -> dict:
        return self._plan_json

    def planned_epoch_s(self) -> float:
        return float(self.pipeline_plan.predicted_epoch_s)

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        out = super().report(total, timeline, role_stats, dropouts)
        if self.epoch_end is not None:  # what the stages' epoch-end policy did (AccEPT's re-planning decisions)
            extra = self.epoch_end.policy_class().report(role_stats)
            out["summary"].update(extra["summary"])
            out["metrics"].update(extra["metrics"])
        return out

    # -- what a stage holds ----------------------------------------------------------------------

    def memory_estimate(self, s: int, bounds) -> StageMemory:
        """Bytes stage s holds at its peak: weights, gradients and optimizer state, plus the
        activations of the micro-batches its schedule keeps alive at once (read off the action
        list) and, with weight stashing, one weight copy per batch in flight."""
        ctx = self.ctx
        a, b = bounds[s]
        infos = ctx.model.infos[a:b]
        itemsize = 8 if ctx.cfg.runtime.dtype == "float64" else 4
        param_bytes = sum(i.params for i in infos) * itemsize
        states = {"sgd": 3 if ctx.cfg.train.momentum else 2, "adam": 4}.get(ctx.cfg.train.optimizer, 3)
        # an asynchronous schedule's peak shows within its first S items (the warm-up)
        items = self.microbatches if self.flush_per == "iteration" else len(bounds)
        live = peak = 0
        for act in self.actions(s, len(bounds), items):
            live += {"F": 1, "B": -1}.get(act.op, 0)
            peak = max(peak, live)
        per_mb = self.mb_size * sum(i.out_numel for i in infos) * itemsize
        stash = param_bytes * peak if self.stash else 0
        total = param_bytes * states + per_mb * peak + stash
        return StageMemory(bytes=total, weights_and_optimizer=param_bytes * states, activations=per_mb * peak, stashed_weights=stash, microbatches_alive=peak)

    def check_memory(self, devices, bounds, memory: list[StageMemory]) -> None:
        for s, (dev_name, est) in enumerate(zip(devices, memory)):
            cap = self.ctx.cluster.device(dev_name).cfg.memory_bytes
            if cap is not None and est.bytes > cap:
                a, b = bounds[s]
                mib = 1 << 20
                raise ConfigError(
                    f"cluster.devices.{dev_name}.memory_bytes",
                    f"stage{s} (units {a}..{b - 1}) needs about {est.bytes / mib:.1f} MiB (weights, gradients and optimizer state "
                    f"{est.weights_and_optimizer / mib:.1f} MiB, activations of {est.microbatches_alive} micro-batches "
                    f"{est.activations / mib:.1f} MiB, stashed weights {est.stashed_weights / mib:.1f} MiB) but {dev_name} has "
                    f"{cap / mib:.1f} MiB; use more stages, a schedule with fewer micro-batches alive (1f1b) or a smaller batch",
                )

    # -- what the runtimes ask of a scheduler -----------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return dict(zip(self.roles, self.devices))

    def role_spec(self, role: str) -> StageSpec:
        """Stage `role`'s slice of the plan and the knobs it reads."""
        plan = self.pipeline_plan
        s = self.roles.index(role)
        cut = self.cfg.partition
        return StageSpec(
            role, plan.devices[s], stage=s, roles=plan.roles, devices=plan.devices, bounds=plan.bounds,
            flush_per=self.flush_per, microbatches=self.microbatches, mb_size=self.mb_size, stash=self.stash,
            partition=cut if isinstance(cut, str) else [int(c) for c in cut],
            repartitions={r.epoch: r.bounds for r in plan.repartition}, schedule=self.schedule, epoch_end=self.epoch_end,
        )

    def role_from_spec(self, role: str, spec: dict) -> StageRole:
        return StageRole(StageSpec.from_json(spec), self.ctx)

    def eval_model(self, states: dict[str, dict]) -> nn.Module:
        """The whole model with every stage's reported units loaded (stages may have moved them)."""
        if self._eval is None:
            self._eval = copy.deepcopy(self.ctx.model)
        for state in states.values():
            rp.unpack_units(self._eval, state, True)
        return self._eval
