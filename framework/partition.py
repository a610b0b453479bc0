"""Splitting a model's units into contiguous stages.

`partition=even` balances stages by predicted cost: stage s runs on device s, and a dynamic
program over cut points minimises the slowest stage's forward+backward time (so slower
devices get fewer units). Explicit cuts (`partition=[3, 7]`) are checked and used as given.
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
        raise ConfigError("scheduler.partition", f"{len(cuts)} cut indices {cuts} for {num_stages} stages; give {num_stages - 1} cuts (or 'even')")
    if any(b <= a for a, b in zip([0] + cuts, cuts + [num_units])):
        raise ConfigError("scheduler.partition", f"cut indices {cuts} must be strictly increasing within 1..{num_units - 1}")
    edges = [0] + cuts + [num_units]
    return list(zip(edges[:-1], edges[1:]))


def balanced_bounds(unit_cost, num_stages: int, num_units: int) -> list[tuple[int, int]]:
    """Contiguous split minimising the maximum stage cost; unit_cost(stage, i) -> seconds.

    Ties are broken towards earlier cuts, so equal costs give the textbook even split."""
    inf = float("inf")
    prefix = [[0.0] * (num_units + 1) for _ in range(num_stages)]
    for s in range(num_stages):
        for i in range(num_units):
            prefix[s][i + 1] = prefix[s][i] + unit_cost(s, i)
    # best[s][j]: minimal max cost placing units [0, j) on stages [0, s]
    best = [[inf] * (num_units + 1) for _ in range(num_stages)]
    arg = [[0] * (num_units + 1) for _ in range(num_stages)]
    for j in range(1, num_units + 1):
        best[0][j] = prefix[0][j]
    for s in range(1, num_stages):
        for j in range(s + 1, num_units + 1):
            for k in range(s, j):  # stage s takes units [k, j)
                c = max(best[s - 1][k], prefix[s][j] - prefix[s][k])
                if c < best[s][j] - 1e-15 * abs(c):
                    best[s][j], arg[s][j] = c, k
    edges = [num_units]
    for s in range(num_stages - 1, 0, -1):
        edges.append(arg[s][edges[-1]])
    edges.append(0)
    edges.reverse()
    return list(zip(edges[:-1], edges[1:]))


def partition(spec, devices, num_units: int, model_name: str, predictor, batch: int) -> list[tuple[int, int]]:
    """Stage bounds [(start, stop), ...] for stages on `devices` (one per stage)."""
    num_stages = len(devices)
    check_stage_count(num_stages, num_units, model_name)
    if isinstance(spec, str):
        if spec != "even":
            raise ConfigError("scheduler.partition", f"{spec!r} is not a partition; choices: even, or a list of cut indices like [3, 7]")

        def cost(s, i):
            d = devices[s]
            return predictor.predict(d, Work("fwd", i, i + 1, batch)) + predictor.predict(d, Work("bwd", i, i + 1, batch))

        return balanced_bounds(cost, num_stages, num_units)
    try:
        cuts = list(spec)
    except TypeError:
        raise ConfigError("scheduler.partition", f"{spec!r} is not a partition; choices: even, or a list of cut indices like [3, 7]") from None
    return bounds_from_cuts(cuts, num_stages, num_units)
