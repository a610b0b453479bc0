"""What a sweep's parent MLflow run holds once its jobs are done: the comparison.

- params: the ones every child shares (same value in all), so the parent says what was held fixed;
- tags and metric: the best child by `tracking.optimized_metric` (`tracking.optimized_direction`
  max or min): `pipelab.best_child_run_id`, `pipelab.best_child_name`, `best/<metric>`;
- artifacts: `comparison.csv` and `comparison.md` (one row per child: its run name, the params
  that differ between children, the key metrics) and `comparison.png` (the optimized metric and
  the epoch time per child, each bar labelled with its value, the axis zoomed to close values),
  also written to the sweep directory.

The table itself is `framework.tracking.comparison`'s, the one `python -m framework.report` writes too.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from framework.tracking import objective
from framework.tracking.bars import value_bars
from framework.tracking.comparison import KEY_METRICS, RunRecord, distinct_columns, markdown_table, short_labels, write_csv
from framework.tracking.comparison import compare as compare_records

__all__ = ["KEY_METRICS", "children_of", "compare", "write_tables", "plot", "summarize_sweep", "record_of"]


def children_of(client, experiment_id: str, parent_id: str) -> list:
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000)
    # in job order (parallel jobs start in any order; `pipelab.job_num` is the sweep's own)
    return sorted(runs, key=lambda r: (int(r.data.tags["pipelab.job_num"]) if r.data.tags.get("pipelab.job_num", "").isdigit() else math.inf, r.info.start_time or 0))


def record_of(run) -> RunRecord:
    """An MLflow run as the shared comparison sees it."""
    return RunRecord(run.info.run_name, run.info.run_id, run.info.status, dict(run.data.params), dict(run.data.metrics))


def compare(children: list, metric: str, direction: str) -> dict:
    """Common params, differing params, table rows and the best child (None if none has `metric`)."""
    return compare_records([record_of(r) for r in children], metric, direction)


def write_tables(result: dict, out_dir: Path) -> list[Path]:
    rows = result["rows"]
    if not rows:
        return []
    csv_path, md_path = write_csv(rows, out_dir / "comparison.csv"), out_dir / "comparison.md"
    best = result["best"]
    head = f"Best by the optimized metric: **{best.name}**\n\n" if best is not None else ""
    md_path.write_text(head + markdown_table(rows))
    return [csv_path, md_path]


def plot(result: dict, metric: str, out_dir: Path) -> Path | None:
    rows = result["rows"]
    if not rows:
        return None
    import matplotlib  # matplotlib: start-up (a sweep's end imports it, no run does)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: start-up (after the Agg backend is chosen)

    panels = [m for m in (metric, "time/epoch_virtual_s") if any(isinstance(r.get(m), float) for r in rows)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 0.5 * len(rows) + 2), squeeze=False)
    # what differs between the jobs (a group by its name: `compressor=fp16`, not its eight sub-keys), else the run name
    names = short_labels(rows, distinct_columns(result["columns"]))
    for ax, m in zip(axes[0], panels):  # values written on the bars; the axis zoomed to close values (framework.tracking.bars)
        value_bars(ax, [r[m] if isinstance(r.get(m), float) else None for r in rows], names, m)
    fig.suptitle("sweep: one bar per job")
    fig.tight_layout()
    path = out_dir / "comparison.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long labels stay inside the image
    plt.close(fig)
    return path


def summarize_sweep(client, experiment_id: str, parent_id: str, tcfg, sweep_dir: Path) -> dict:
    """Fill the parent run (params, best child, artifacts); returns the comparison."""
    from mlflow.entities import Metric, Param  # mlflow: start-up (the CLI imports this module before any run)

    metric, direction = tcfg.optimized_metric, tcfg.optimized_direction
    children = children_of(client, experiment_id, parent_id)
    result = compare(children, metric, direction)
    # the best child that meets tracking.metric_floor: the rule by which each job told a sweeper
    # (Optuna) its value, so both name the same job (framework.tracking.objective)
    result["best"] = objective.best([record_of(r) for r in children], tcfg)
    floor = objective.describe_floor(tcfg)
    if floor:
        client.set_tag(parent_id, "pipelab.metric_floor", floor)
        if result["best"] is None and children:
            print(f"warning: no job of the sweep met the floor {floor}: the parent run names no best child", file=sys.stderr)
    params = [Param(k, str(v)[:6000]) for k, v in result["common"].items()]
    for i in range(0, len(params), 100):
        client.log_batch(parent_id, params=params[i : i + 100])
    best = result["best"]
    if best is not None:
        client.set_tag(parent_id, "pipelab.best_child_run_id", best.run_id)
        client.set_tag(parent_id, "pipelab.best_child_name", best.name)
        client.set_tag(parent_id, "pipelab.optimized_metric", f"{metric} ({direction})")
        client.log_batch(parent_id, metrics=[Metric(f"best/{metric}", best.metrics[metric], 0, 0)])
    sweep_dir.mkdir(parents=True, exist_ok=True)
    paths = write_tables(result, sweep_dir)
    fig = plot(result, metric, sweep_dir)
    for p in paths + ([fig] if fig else []):
        client.log_artifact(parent_id, str(p))
    return result
