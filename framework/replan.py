"""Re-planning a pipeline when its devices drift: AccEPT's dynamic prediction (notes 2.1), on
FTPipeHD's periodic feedback and dynamic scheduling.

With `scheduler.replan_epsilon: eps`, every stage measures its forward + backward time per
mini-batch over each epoch, on its own clock (virtual on the simulator, the wall on real
runtimes), and at the epoch's end reports it to stage 0, the central node (message `report`).
If a stage's time is off its prediction by more than eps (relative), the central node tells the
predictor what those stages measured (`Predictor.observe`: AccEPT re-measures the device's
hardware vector and fine-tunes on the reports; FTPipeHD's ratio and the other predictors rescale
the device), plans again with the run's partitioner, and sends every stage the cuts (message
`plan`); units then move as in a configured repartition (framework/repartition.py) before the
next epoch. The plan and its predicted epoch time are kept per re-planning in the summary
(`replans`).

Decisions (the paper leaves them open): the report period is one epoch; the measured time is the
stage's forward and backward calls only (its waits for messages are the pipeline's, not the
device's); a stage whose prediction was 0 is never called off (nothing to compare).
"""

from __future__ import annotations

import torch

from framework.errors import ConfigError
from framework.partition import bounds_from_cuts
from framework.predictor import Predictor


def check(sched) -> None:
    """Fail before running where re-planning cannot work."""
    eps = sched.cfg.get("replan_epsilon")
    if eps is None:
        return
    if not float(eps) > 0:
        raise ConfigError("scheduler.replan_epsilon", f"must be > 0 (a relative drift, e.g. 0.15) or null, got {eps}")
    if not isinstance(sched.cfg.partition, str) or sched.cfg.partition not in ("dp", "even", "search"):
        raise ConfigError("scheduler.replan_epsilon", f"re-plans with the run's partitioner; partition={sched.cfg.partition} fixes the cuts (choices: dp, even, search)")
    if sched.cfg.get("repartition"):
        raise ConfigError("scheduler.replan_epsilon", "and scheduler.repartition both move units between epochs; use one")
    if not isinstance(sched.ctx.predictor, Predictor):
        raise ConfigError("scheduler.replan_epsilon", f"predictor={sched.ctx.cfg.predictor.name} is not a framework.predictor.Predictor: it cannot take reported times")


def drifted(predicted: list[float], measured: list[float], eps: float) -> list[int]:
    """Stages whose measured time is off the prediction by more than eps (relative)."""
    return [s for s, (p, m) in enumerate(zip(predicted, measured)) if p > 0 and abs(m - p) / p > eps]


def _calls_per_batch(sched) -> int:
    """Forward + backward calls a stage makes per mini-batch (its micro-batches; one where the
    mini-batch is the unit of pipelining)."""
    return sched.microbatches if sched.flush_per == "iteration" else 1


def decide(sched, bounds: list[tuple[int, int]], measured: list[float], now: float, epoch: int) -> tuple[list[tuple[int, int]], dict | None]:
    """The central node's decision: (the bounds for the next epoch, what happened or None)."""
    predictor, devices, M = sched.ctx.predictor, [sched.ctx.cluster.device(d) for d in sched.devices], _calls_per_batch(sched)
    predicted = [M * predictor.fwd_bwd(devices[s], a, b, sched.mb_size) for s, (a, b) in enumerate(bounds)]
    off = drifted(predicted, measured, float(sched.cfg.replan_epsilon))
    if not off:
        return bounds, None
    event = {"epoch": epoch, "time_s": now, "drifted": [sched.roles_[s] for s in off], "measured_bounds": [list(b) for b in bounds], "measured_s": measured}
    _observe(sched, event)
    new = sched.plan_bounds(sched.devices)
    return new, {
        **event,
        "predicted_s": predicted,
        "bounds": [list(b) for b in new],
        "predicted_epoch_s": sched.predicted_epoch_s(sched.devices, new),
    }


def _observe(sched, event: dict) -> None:
    """Tell the predictor what the stages called off in `event` measured."""
    M = _calls_per_batch(sched)
    for role in event["drifted"]:
        s = sched.roles_.index(role)
        a, b = event["measured_bounds"][s]
        sched.ctx.predictor.observe(sched.ctx.cluster.device(sched.devices[s]), a, b, sched.mb_size, event["measured_s"][s] / M, event["time_s"])


def restore(sched, events: list[dict]) -> None:
    """A resumed run's predictor learns again what the checkpointed decisions had taught it."""
    for event in events:
        _observe(sched, event)


async def exchange(role, ctx, epoch: int) -> None:
    """A stage's part at an epoch's end: report this epoch's time per mini-batch to stage 0, get
    the cuts back, and move units if they changed (stage 0 decides)."""
    sched, S = role.sched, len(role.bounds)
    per_batch = role.busy_s / max(role.batches, 1)
    central = sched.roles_[0]
    if role.s:
        ctx.send(central, "report", torch.tensor([per_batch], dtype=torch.float64), iteration=epoch)
        cuts = [int(c) for c in await ctx.recv(central, "plan")]
    else:
        measured = [per_batch] + [float((await ctx.recv(sched.roles_[t], "report"))[0]) for t in range(1, S)]
        new, event = decide(sched, list(role.bounds), measured, ctx.now(), epoch)
        if event is not None:
            role.replans.append(event)
        cuts = [b for _, b in new[:-1]]
        for t in range(1, S):
            ctx.send(sched.roles_[t], "plan", torch.tensor(cuts, dtype=torch.int64), iteration=epoch)
    new_bounds = bounds_from_cuts(cuts, S, role.bounds[-1][1])
    if new_bounds != list(role.bounds):
        await role.repartition(ctx, new_bounds, epoch + 1)
