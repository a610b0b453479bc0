"""Runs side by side: the one table both a sweep's parent run (`framework.tracking.sweep_summary`) and
`python -m framework.report` write, whichever source the runs came from.

A run is a `RunRecord` (its params as MLflow holds them: every config leaf by dotted name, as a
string), so MLflow runs and job folders on disk compare the same way.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from framework.tracking.store import mlflow_name

KEY_METRICS = ("val/acc", "test/acc", "time/virtual_s", "time/epoch_virtual_s", "throughput/samples_per_s", "pipe/bubble_frac")


@dataclass
class RunRecord:
    """One run, from whichever source: MLflow or a job folder."""

    name: str
    run_id: str
    status: str
    params: dict[str, str]
    metrics: dict[str, float]
    history: dict[str, list] = field(default_factory=dict)  # per-epoch values (summary.json's `history`)
    links: dict[str, float] = field(default_factory=dict)  # bytes sent per directed link
    clock: str = "virtual"
    plan: dict[str, str] = field(default_factory=dict)  # the plan's report columns (framework.report.plan)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def compare(records: Sequence[RunRecord], metric: str = "val/acc", direction: str = "max", columns: Sequence[str] | None = None, metrics: Sequence[str] | None = None) -> dict:
    """Common params, differing params, table rows and the best record (None if none has `metric`).

    `columns`: the params shown per row (default: every param that differs); `metrics`: the
    metric columns (default: `metric`, then KEY_METRICS)."""
    keys = set().union(*(r.params for r in records)) if records else set()
    common, differing = {}, []
    for k in sorted(keys):
        values = {r.params.get(k) for r in records}
        if len(values) == 1 and None not in values:
            common[k] = values.pop()
        else:
            differing.append(k)
    shown = list(differing if columns is None else columns)
    metrics = list(metrics) if metrics is not None else [metric] + [m for m in KEY_METRICS if m != metric]
    rows = []
    for r in records:
        row = {"run": r.name, "run_id": r.run_id, "status": r.status}
        row.update({k: r.params.get(k, "") for k in shown})
        row.update({m: r.metrics.get(m, "") for m in metrics})
        rows.append(row)
    scored = [r for r in records if is_number(r.metrics.get(metric))]
    best = None
    if scored:
        pick = max if direction == "max" else min
        best = pick(scored, key=lambda r: r.metrics[metric])
    return {"common": common, "differing": differing, "columns": shown, "metrics": metrics, "rows": rows, "best": best}


def swept_columns(keys, records: Sequence[RunRecord]) -> list[str]:
    """The param columns of a sweep's keys: `cluster.link.bandwidth_bps` as is, a config group
    (`compressor=none,fp16`) by its `compressor.name`; keys no run has as a param are left out."""
    params = set().union(*(r.params for r in records)) if records else set()
    out = []
    for k in keys:
        k = mlflow_name(k.replace('"', "").replace("'", ""))  # `cluster.links."dev*->server".x` as params name it
        col = k if k in params else f"{k}.name" if f"{k}.name" in params else None
        if col and col not in out:
            out.append(col)
    return out


def distinct_columns(differing: Sequence[str]) -> list[str]:
    """The differing params minus those a differing group choice implies: `compressor=fp16`
    changes `compressor.forward.bits` and the rest with it, and `compressor.name` says it all."""
    groups = {k[: -len(".name")] for k in differing if k.endswith(".name")}
    return [k for k in differing if k.endswith(".name") or not any(k.startswith(g + ".") for g in groups)]


def short_key(key: str) -> str:
    """`cluster.link.bandwidth_bps` -> `bandwidth_bps`; a group's `compressor.name` -> `compressor`."""
    if key.endswith(".name"):
        key = key[: -len(".name")]
    return key.rsplit(".", 1)[-1]


def short_value(v) -> str:
    """`1000000.0` -> `1e+06`: params are strings; numbers read better in %g."""
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return str(v)


def short_labels(rows: list[dict], columns: Sequence[str]) -> list[str]:
    """One label per row from its values of `columns` (the run's name when there are none)."""
    return [", ".join(f"{short_key(k)}={short_value(r[k])}" for k in columns) or r["run"] for r in rows]


def cell(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def write_csv(rows: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def markdown_table(rows: list[dict], hide: Sequence[str] = ("run_id",)) -> str:
    """The rows as a Markdown table (run ids left out: long, and in the CSV)."""
    shown = [c for c in rows[0] if c not in hide]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(cell(r[c]).replace("|", "\\|") for c in shown) + " |" for r in rows]
    return "\n".join(lines) + "\n"
