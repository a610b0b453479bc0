"""Re-planning a pipeline when its devices drift: AccEPT's dynamic prediction (notes 2.1), on
FTPipeHD's periodic feedback and dynamic scheduling.

With `scheduler.replan_epsilon: eps`, every stage measures its forward + backward time per
mini-batch over each epoch, on its own clock (virtual on the simulator, the wall on real
runtimes), and at the epoch's end reports it to stage 0, the central node (message `report`).
If a stage's time is off its prediction by more than eps (relative), the central node tells the
predictor what those stages measured (`Predictor.observe`: AccEPT re-measures the device's
hardware vector and fine-tunes on the reports; FTPipeHD's ratio and the other predictors rescale
the device), plans again with the run's partitioner, and sends every stage the cuts (message
`plan`); units then move as in a configured repartition (framework/pipeline/repartition.py) before the
next epoch. The plan and its predicted epoch time are kept per re-planning in the summary
(`replans`).

It lives with the predictors because it is the online half of AccEPT's adaptive predictor (the
reports are what the predictor learns from); it plugs into the pipeline's epoch end
(framework.pipeline.epoch_end), declared in plugins/predictors/__init__.py, and works with any
`framework.predictor.Predictor`. Stage 0 plans with its own planner (`StageView.planner`: the
run's partitioner, this process's predictor and cluster), never with the scheduler.

Decisions (the paper leaves them open): the report period is one epoch; the measured time is the
stage's forward and backward calls only (its waits for messages are the pipeline's, not the
device's); a stage whose prediction was 0 is never called off (nothing to compare).
"""

from __future__ import annotations

import torch

from framework.errors import ConfigError
from framework.pipeline.epoch_end import EpochEndPolicy, EpochEndSpec, StageView
from framework.pipeline.partition import bounds_from_cuts
from framework.predictor import Predictor

KNOB = "replan_epsilon"


def drifted(predicted: list[float], measured: list[float], eps: float) -> list[int]:
    """Stages whose measured time is off the prediction by more than eps (relative)."""
    return [s for s, (p, m) in enumerate(zip(predicted, measured)) if p > 0 and abs(m - p) / p > eps]


def calls_per_batch(stage: StageView) -> int:
    """Forward + backward calls a stage makes per mini-batch (its micro-batches; one where the
    mini-batch is the unit of pipelining)."""
    planner = stage.planner
    return planner.microbatches if planner.flush_per == "iteration" else 1


class Replanning(EpochEndPolicy):
    """Every stage reports its time to stage 0, which re-plans when one drifted past epsilon."""

    def __init__(self, spec: EpochEndSpec):
        super().__init__(spec)
        self.epsilon = float(spec.knobs[KNOB])
        self.replans: list[dict] = []  # stage 0's decisions, each with the plan it chose

    @classmethod
    def check(cls, cfg, parts) -> None:
        eps = cfg.get(KNOB)
        if not float(eps) > 0:
            raise ConfigError("scheduler.replan_epsilon", f"must be > 0 (a relative drift, e.g. 0.15) or null, got {eps}")
        if not isinstance(cfg.partition, str) or cfg.partition not in ("dp", "even", "search"):
            raise ConfigError("scheduler.replan_epsilon", f"re-plans with the run's partitioner; partition={cfg.partition} fixes the cuts (choices: dp, even, search)")
        if cfg.get("repartition"):
            raise ConfigError("scheduler.replan_epsilon", "and scheduler.repartition both move units between epochs; use one")
        if not isinstance(parts.predictor, Predictor):
            raise ConfigError("scheduler.replan_epsilon", f"predictor={parts.cfg.predictor.name} is not a framework.predictor.Predictor: it cannot take reported times")

    async def at_epoch_end(self, stage: StageView, ctx, epoch: int) -> None:
        """A stage's part: report this epoch's time per mini-batch to stage 0, get the cuts
        back, and move units if they changed (stage 0 decides)."""
        S = len(stage.bounds)
        per_batch = stage.busy_s / max(stage.batches, 1)
        central = stage.roles[0]
        if stage.index:
            ctx.send(central, "report", torch.tensor([per_batch], dtype=torch.float64), iteration=epoch)
            cuts = [int(c) for c in await ctx.recv(central, "plan")]
        else:
            measured = [per_batch] + [float((await ctx.recv(stage.roles[t], "report"))[0]) for t in range(1, S)]
            new, event = self.decide(stage, list(stage.bounds), measured, ctx.now(), epoch)
            if event is not None:
                self.replans.append(event)
            cuts = [b for _, b in new[:-1]]
            for t in range(1, S):
                ctx.send(stage.roles[t], "plan", torch.tensor(cuts, dtype=torch.int64), iteration=epoch)
        new_bounds = bounds_from_cuts(cuts, S, stage.bounds[-1][1])
        if new_bounds != list(stage.bounds):
            await stage.repartition(ctx, new_bounds, epoch + 1)

    def decide(self, stage: StageView, bounds: list[tuple[int, int]], measured: list[float], now: float, epoch: int) -> tuple[list[tuple[int, int]], dict | None]:
        """The central node's decision: (the bounds for the next epoch, what happened or None)."""
        planner = stage.planner
        parts, devices = planner.parts, list(stage.devices)
        dev_objs, M = [parts.cluster.device(d) for d in devices], calls_per_batch(stage)
        predicted = [M * parts.predictor.fwd_bwd(dev_objs[s], a, b, planner.mb_size) for s, (a, b) in enumerate(bounds)]
        off = drifted(predicted, measured, self.epsilon)
        if not off:
            return bounds, None
        event = {"epoch": epoch, "time_s": now, "drifted": [stage.roles[s] for s in off], "measured_bounds": [list(b) for b in bounds], "measured_s": measured}
        observe(stage, event)
        new = planner.plan_bounds(devices)
        return new, {
            **event,
            "predicted_s": predicted,
            "bounds": [list(b) for b in new],
            "predicted_epoch_s": planner.predicted_epoch_s(devices, new),
        }

    def stats(self) -> dict:
        return {"replans": self.replans}

    def checkpoint(self) -> dict:
        return {"replans": self.replans}

    def restore(self, stage: StageView, desc: dict) -> None:
        self.replans = list(desc.get("replans", []))
        if stage.index == 0:  # the central node's predictor: what the reports had taught it
            for event in self.replans:
                observe(stage, event)

    @classmethod
    def report(cls, role_stats: dict[str, dict]) -> dict:
        events = [e for st in role_stats.values() for e in st.get("replans", [])]
        return {"summary": {"replans": events}, "metrics": {"pipe/replans": len(events)}}


def observe(stage: StageView, event: dict) -> None:
    """Tell this process's predictor what the stages called off in `event` measured."""
    planner, M = stage.planner, calls_per_batch(stage)
    parts = planner.parts
    for role in event["drifted"]:
        s = stage.roles.index(role)
        a, b = event["measured_bounds"][s]
        parts.predictor.observe(parts.cluster.device(stage.devices[s]), a, b, planner.mb_size, event["measured_s"][s] / M, event["time_s"])
