"""Splitting a model's units into contiguous stages (stage s runs on device s).

- `partition=dp` (the default): AccEPT's and FTPipeHD's dynamic program (AccEPT Eq. 9-10). It
  minimises the pipeline's bottleneck: the slowest of every stage's forward+backward time per
  micro-batch (the predictor's, for the stage's whole unit range) and every boundary's transfer
  time (the activation that crosses it, as the compressor packs it, on the link's bandwidth).
  Decision (AccEPT notes 8.5): a boundary's cost is the slower of its two directions, since the
  cluster's links are full duplex (the activation goes down one link, its gradient up the other,
  each its own resource); the paper's 2 x T_c charges both to one link.
- `partition=search` (pipeline schedulers, framework.pipeline.scheduler): every partition played out on the
  predicted costs (framework.pipeline.timing), the fastest epoch taken.
- `partition=even`: the same program over compute alone (links ignored), per-unit costs summed.
- Explicit cuts (`partition=[3, 7]`) are checked and used as given.
"""

from __future__ import annotations

from framework.cluster import Work
from framework.errors import ConfigError


def check_stage_count(num_stages: int, num_units: int, model_name: str) -> None:
    if num_stages < 1:
        raise ConfigError("scheduler.stages", f"must be >= 1, got {num_stages}")
    if num_stages > num_units:
        raise ConfigError(
            "scheduler.stages",
            f"{num_stages} stages but model {model_name!r} has only {num_units} units; use at most {num_units} stages (scheduler.stages or cluster.num_devices)",
        )


def bounds_from_cuts(cuts, num_stages: int, num_units: int) -> list[tuple[int, int]]:
    cuts = [int(c) for c in cuts]
    if len(cuts) != num_stages - 1:
        raise ConfigError("scheduler.partition", f"{len(cuts)} cut indices {cuts} for {num_stages} stages; give {num_stages - 1} cuts (or 'dp', 'search', 'even')")
    if any(b <= a for a, b in zip([0] + cuts, cuts + [num_units])):
        raise ConfigError("scheduler.partition", f"cut indices {cuts} must be strictly increasing within 1..{num_units - 1}")
    edges = [0] + cuts + [num_units]
    return list(zip(edges[:-1], edges[1:]))


def balanced_bounds(unit_cost, num_stages: int, num_units: int) -> list[tuple[int, int]]:
    """Contiguous split minimising the maximum stage cost; unit_cost(stage, i) -> seconds (summed
    over a stage's units; links cost nothing). Ties go to earlier cuts, so equal costs give the
    textbook even split."""
    prefix = [[0.0] * (num_units + 1) for _ in range(num_stages)]
    for s in range(num_stages):
        for i in range(num_units):
            prefix[s][i + 1] = prefix[s][i] + unit_cost(s, i)
    return bottleneck_bounds(lambda s, a, b: prefix[s][b] - prefix[s][a], lambda s, p: 0.0, num_stages, num_units)[0]


def bottleneck_bounds(stage_cost, link_cost, num_stages: int, num_units: int) -> tuple[list[tuple[int, int]], float]:
    """(bounds, bottleneck): contiguous stages minimising the slowest resource (AccEPT Eq. 10).

    `stage_cost(s, a, b)`: seconds of units [a, b) on stage s; `link_cost(s, p)`: seconds of the
    boundary before unit p between stages s and s + 1. Every stage gets at least one unit; ties go
    to earlier cuts."""
    inf = float("inf")
    best = [[inf] * (num_units + 1) for _ in range(num_stages)]  # best[s][j]: units [0, j) on stages [0, s]
    arg = [[0] * (num_units + 1) for _ in range(num_stages)]
    for j in range(1, num_units + 1):
        best[0][j] = stage_cost(0, 0, j)
    for s in range(1, num_stages):
        for j in range(s + 1, num_units + 1):
            for k in range(s, j):  # stage s takes units [k, j)
                c = max(best[s - 1][k], link_cost(s - 1, k), stage_cost(s, k, j))
                if c < best[s][j] - 1e-15 * abs(c):
                    best[s][j], arg[s][j] = c, k
    edges = [num_units]
    for s in range(num_stages - 1, 0, -1):
        edges.append(arg[s][edges[-1]])
    edges.append(0)
    edges.reverse()
    return list(zip(edges[:-1], edges[1:])), best[num_stages - 1][num_units]


CHOICES = "dp, search, even, or a list of cut indices like [3, 7]"


def partition(spec, devices, num_units: int, model_name: str, predictor, batch: int, link_cost=None) -> list[tuple[int, int]]:
    """Stage bounds [(start, stop), ...] for stages on `devices` (one per stage). `link_cost(s, p)`
    (seconds of the boundary before unit p after stage s) is what `dp` adds to compute."""
    num_stages = len(devices)
    check_stage_count(num_stages, num_units, model_name)
    if isinstance(spec, str):
        if spec == "dp":
            cache: dict = {}

            def stage_cost(s, a, b):
                key = (s, a, b)
                if key not in cache:
                    d = devices[s]
                    cache[key] = predictor.predict(d, Work("fwd", a, b, batch)) + predictor.predict(d, Work("bwd", a, b, batch))
                return cache[key]

            return bottleneck_bounds(stage_cost, link_cost or (lambda s, p: 0.0), num_stages, num_units)[0]
        if spec != "even":
            raise ConfigError("scheduler.partition", f"{spec!r} is not a partition; choices: {CHOICES}")

        def cost(s, i):
            d = devices[s]
            return predictor.predict(d, Work("fwd", i, i + 1, batch)) + predictor.predict(d, Work("bwd", i, i + 1, batch))

        return balanced_bounds(cost, num_stages, num_units)
    try:
        cuts = list(spec)
    except TypeError:
        raise ConfigError("scheduler.partition", f"{spec!r} is not a partition; choices: {CHOICES}") from None
    return bounds_from_cuts(cuts, num_stages, num_units)
