"""What a sweep optimises: one number per run, and which run of a sweep is best.

`tracking.optimized_metric` (`val/acc`, `time/epoch_virtual_s`, ...) and
`tracking.optimized_direction` (max | min) say what to optimise; `tracking.metric_floor`
(`metric`, `min`) says what a run must reach to count at all: with
`tracking.metric_floor.min=0.9` a run whose `val/acc` ends below 0.9 is infeasible, so "the
shortest epoch at 90% accuracy" is `optimized_metric=time/epoch_virtual_s optimized_direction=min
metric_floor.min=0.9`.

One rule serves both ends of a sweep, so they agree:
- the value `python -m framework` returns to a Hydra sweeper (Optuna): the optimized metric if the
  run meets the floor, else the worst value there is (`-inf` when maximising, `inf` when
  minimising), so the sweeper never reports an infeasible trial as best while a feasible one exists;
- the best child a sweep's parent run names (`framework.tracking.sweep_summary`): among the children that
  meet the floor, the best by the optimized metric; on a tie the earliest job, as Optuna does.

A run's metrics here are MLflow's latest values: the end-of-run metrics, and for a per-epoch
metric (`time/epoch_virtual_s`) its last epoch's value.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Callable, Iterable, Optional

from framework import registry
from framework.config import knobs
from framework.config.schemas import TrackingConfig
from framework.errors import ConfigError, listing

# The metrics a run can record: what tracking.optimized_metric and tracking.metric_floor.metric
# may name. `<...>` in a name stands for any text (a role, a link, a layer, a counter). The core
# records these (framework.job, the pipeline schedules, the compressor); a plugin that records
# metrics of its own declares them with `declare_metrics` when it is loaded, as the built-in
# schedulers do (plugins/schedulers/__init__.py), so that a name no run records is an error
# before a sweep starts, not a sweep that ends with no best run.
_METRICS: list[str] = []


def declare_metrics(*names: str) -> None:
    """Metric names a run may record (`<...>`: any text), for the objective's keys to name."""
    for name in names:
        if name not in _METRICS:
            _METRICS.append(name)


declare_metrics(
    "val/acc", "val/loss", "test/acc", "train/loss", "train/acc", "time/epoch_virtual_s", "time/virtual_s",
    "time/wall_s", "test/loss", "train/epoch_loss", "throughput/samples_per_s", "epoch",
    "pipe/bubble_frac", "pipe/staleness", "pipe/replans", "roles/dropouts",
    "plan/predicted_epoch_s", "plan/epoch_over_predicted",
    "util/busy_frac/<role>", "util/idle_s/<role>", "transport/<counter>/<role>",
    "net/bytes/<link>", "net/raw_bytes/<link>", "net/compression_ratio",
    *(f"compression/{k}_{d}" for k in ("ratio", "bits", "rel_err", "encode_s", "decode_s") for d in ("fwd", "bwd")),
)


def metric_names() -> list[str]:
    """Every declared metric name (the plugins' too), core ones first."""
    registry.load_plugins()
    return list(_METRICS)


def known_metric(name: str) -> bool:
    return any(re.fullmatch(".+".join(map(re.escape, re.split(r"<[^>]*>", m))), name) for m in metric_names())


def check_metric(key: str, name: str) -> None:
    """ConfigError unless `name` is a metric some run records (`declare_metrics`)."""
    if known_metric(name):
        return
    names = metric_names()
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(key, f"{name!r} is not a metric a run records{hint}; runs record {listing(names, 8)} (README, MLflow metrics; a plugin adds its own: objective.declare_metrics)")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_metrics(summary: dict) -> dict[str, float]:
    """A finished run's metrics as MLflow holds them (latest value per name): every per-epoch
    metric's last value from `summary["history"]`, overridden by the end-of-run `summary["metrics"]`;
    a per-epoch metric the same every epoch is its first epoch's value, the one point MLflow holds
    (`summary["constant_per_epoch"]`, framework.tracking.series)."""
    out: dict[str, float] = {}
    for k, values in (summary.get("history") or {}).items():
        if isinstance(values, list) and values and _number(values[-1]):
            out[k] = float(values[-1])
    out.update({k: float(v) for k, v in summary.get("metrics", {}).items() if _number(v)})
    out.update({k: float(v) for k, v in (summary.get("constant_per_epoch") or {}).items() if _number(v)})
    return out


def metric_floor(tcfg) -> Optional[tuple[str, float]]:
    """(metric, bound) of `tracking.metric_floor`, or None when no floor is set."""
    floor = tcfg.metric_floor
    if floor is None or floor.get("min") is None:
        return None
    return str(floor.get("metric")), float(floor.get("min"))


def describe_floor(tcfg) -> str:
    floor = metric_floor(tcfg)
    return "" if floor is None else f"{floor[0]} >= {floor[1]:g}"


def check(tcfg) -> None:
    """Config errors in the objective's keys, before anything runs."""
    knobs.check({"optimized_direction": tcfg.get("optimized_direction", "max")}, TrackingConfig, "tracking")  # a sweep's parent checks it too
    if not str(tcfg.get("optimized_metric") or "").strip():
        raise ConfigError("tracking.optimized_metric", "names no metric; give one a run records, e.g. val/acc or time/epoch_virtual_s")
    check_metric("tracking.optimized_metric", str(tcfg.get("optimized_metric")))
    floor = tcfg.get("metric_floor")
    if floor is None or floor.get("min") is None:
        return
    bound = floor.get("min")
    if not _number(bound):
        raise ConfigError("tracking.metric_floor.min", f"must be a finite number (or null for no floor), got {bound}")
    if not str(floor.get("metric") or "").strip():
        raise ConfigError("tracking.metric_floor.metric", f"names no metric; the floor needs one a run records, e.g. tracking.metric_floor.metric=val/acc (min {bound})")
    check_metric("tracking.metric_floor.metric", str(floor.get("metric")))


def require_floor_metric(metrics: dict, tcfg) -> None:
    """A floor on a metric this run did not record is a config error (a typo, or `val/acc` of a
    timing-only run): every trial would be infeasible, silently."""
    floor = metric_floor(tcfg)
    if floor is None or floor[0] in metrics:
        return
    known = ", ".join(sorted(k for k in metrics if "/" in k and not k.startswith(("net/", "util/")))[:20])
    raise ConfigError("tracking.metric_floor.metric", f"{floor[0]!r} is not a metric this run recorded, so no run could meet the floor; it recorded e.g. {known}")


def feasible(metrics: dict, tcfg) -> bool:
    """Whether a run with these metrics meets `tracking.metric_floor` (always, when none is set)."""
    floor = metric_floor(tcfg)
    if floor is None:
        return True
    value = metrics.get(floor[0])
    return _number(value) and value >= floor[1]


def score(metrics: dict, tcfg) -> Optional[float]:
    """The value a sweeper optimises: the optimized metric of a run that meets the floor, the
    worst value there is for one that does not, None for a run without the optimized metric."""
    value = metrics.get(tcfg.optimized_metric)
    if not _number(value):
        return None
    if not feasible(metrics, tcfg):
        return -math.inf if tcfg.optimized_direction == "max" else math.inf
    return float(value)


def best(runs: Iterable, tcfg, metrics_of: Callable[[Any], dict] = lambda r: r.metrics):
    """The best of `runs` (in job order) that meets the floor and has the optimized metric; the
    first one on a tie; None if none qualifies."""
    metric = tcfg.optimized_metric
    scored = [r for r in runs if _number(metrics_of(r).get(metric)) and feasible(metrics_of(r), tcfg)]
    if not scored:
        return None
    pick = max if tcfg.optimized_direction == "max" else min
    return pick(scored, key=lambda r: metrics_of(r)[metric])
