"""What a sweep's parent MLflow run holds once its jobs are done: the comparison.

- params: the ones every child shares (same value in all), so the parent says what was held fixed;
- tags and metric: the best child by `tracking.optimized_metric` (`tracking.optimized_direction`
  max or min): `pipelab.best_child_run_id`, `pipelab.best_child_name`, `best/<metric>`;
- artifacts: `comparison.csv` and `comparison.md` (one row per child: its run name, the params
  that differ between children, the key metrics) and `comparison.png` (the optimized metric and
  the epoch time per child), also written to the sweep directory.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

KEY_METRICS = ("val/acc", "test/acc", "time/virtual_s", "time/epoch_virtual_s", "throughput/samples_per_s", "pipe/bubble_frac")


def children_of(client, experiment_id: str, parent_id: str) -> list:
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000)
    return sorted(runs, key=lambda r: r.info.start_time or 0)


def compare(children: list, metric: str, direction: str) -> dict:
    """Common params, differing params, table rows and the best child (None if none has `metric`)."""
    keys = set().union(*(r.data.params for r in children)) if children else set()
    common, differing = {}, []
    for k in sorted(keys):
        values = {r.data.params.get(k) for r in children}
        if len(values) == 1 and None not in values:
            common[k] = values.pop()
        else:
            differing.append(k)
    metrics = [metric] + [m for m in KEY_METRICS if m != metric]
    rows = []
    for r in children:
        row = {"run": r.info.run_name, "run_id": r.info.run_id, "status": r.info.status}
        row.update({k: r.data.params.get(k, "") for k in differing})
        row.update({m: r.data.metrics.get(m, "") for m in metrics})
        rows.append(row)
    scored = [r for r in children if isinstance(r.data.metrics.get(metric), float) and math.isfinite(r.data.metrics[metric])]
    best = None
    if scored:
        pick = max if direction == "max" else min
        best = pick(scored, key=lambda r: r.data.metrics[metric])
    return {"common": common, "differing": differing, "metrics": metrics, "rows": rows, "best": best}


def write_tables(result: dict, out_dir: Path) -> list[Path]:
    rows = result["rows"]
    if not rows:
        return []
    cols = list(rows[0])
    csv_path, md_path = out_dir / "comparison.csv", out_dir / "comparison.md"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)

    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    shown = [c for c in cols if c != "run_id"]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(cell(r[c]) for c in shown) + " |" for r in rows]
    best = result["best"]
    head = f"Best by the optimized metric: **{best.info.run_name}**\n\n" if best is not None else ""
    md_path.write_text(head + "\n".join(lines) + "\n")
    return [csv_path, md_path]


def plot(result: dict, metric: str, out_dir: Path) -> Path | None:
    rows = result["rows"]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [m for m in (metric, "time/epoch_virtual_s") if any(isinstance(r.get(m), float) for r in rows)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 0.5 * len(rows) + 2), squeeze=False)
    # short labels: what differs between the jobs (the last part of each key), else the run name
    names = [", ".join(f"{k.rsplit('.', 1)[-1]}={r[k]}" for k in result["differing"]) or r["run"] for r in rows]
    for ax, m in zip(axes[0], panels):
        ax.barh(range(len(rows)), [r[m] if isinstance(r.get(m), float) else 0.0 for r in rows], color="tab:blue")
        ax.set_yticks(range(len(rows)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(m)
    fig.suptitle("sweep: one bar per job")
    fig.tight_layout()
    path = out_dir / "comparison.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summarize_sweep(client, experiment_id: str, parent_id: str, tcfg, sweep_dir: Path) -> dict:
    """Fill the parent run (params, best child, artifacts); returns the comparison."""
    from mlflow.entities import Metric, Param

    metric, direction = tcfg.optimized_metric, tcfg.optimized_direction
    result = compare(children_of(client, experiment_id, parent_id), metric, direction)
    params = [Param(k, str(v)[:6000]) for k, v in result["common"].items()]
    for i in range(0, len(params), 100):
        client.log_batch(parent_id, params=params[i : i + 100])
    best = result["best"]
    if best is not None:
        client.set_tag(parent_id, "pipelab.best_child_run_id", best.info.run_id)
        client.set_tag(parent_id, "pipelab.best_child_name", best.info.run_name)
        client.set_tag(parent_id, "pipelab.optimized_metric", f"{metric} ({direction})")
        client.log_batch(parent_id, metrics=[Metric(f"best/{metric}", best.data.metrics[metric], 0, 0)])
    sweep_dir.mkdir(parents=True, exist_ok=True)
    paths = write_tables(result, sweep_dir)
    fig = plot(result, metric, sweep_dir)
    for p in paths + ([fig] if fig else []):
        client.log_artifact(parent_id, str(p))
    return result
