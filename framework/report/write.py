"""The report folder: runs.csv, the PNGs and report.md embedding both (readable on GitHub or in
a browser as it is), plus a short console table."""

from __future__ import annotations

import sys
from pathlib import Path

from framework.report import plots
from framework.report.plan import COLUMNS as PLAN_COLUMNS
from framework.report.sources import BYTES_TOTAL, EPOCH_MEAN, Source
from framework.tracking.comparison import cell, compare, distinct_columns, markdown_table, short_labels, swept_columns, write_csv

METRICS = ("val/acc", "test/acc", "time/virtual_s", EPOCH_MEAN, "throughput/samples_per_s", "pipe/bubble_frac", BYTES_TOTAL)
FIXED = ("scheduler.name", "model.name", "dataset.name", "cluster.name", "compressor.name", "runtime.name", "train.epochs", "train.batch_size")
CONSOLE = ("val/acc", EPOCH_MEAN, BYTES_TOTAL)


def table(src: Source) -> dict:
    """The shared comparison, with the swept keys as param columns (every differing param, a
    group's sub-keys folded into its name, when the sweep's keys are not known) and the metric
    columns some run has."""
    recs = src.records
    base = compare(recs, metrics=())
    columns = swept_columns(src.sweep_keys, recs) if src.sweep_keys else []
    if not columns:
        columns = distinct_columns(base["differing"])
    metrics = [m for m in METRICS if any(m in r.metrics for r in recs)]
    return with_plans(compare(recs, columns=columns, metrics=metrics), recs)


def with_plans(result: dict, records) -> dict:
    """The plan columns some run has, after the params and before the metrics: the cut, the
    schedule, PiPar's (P, N), AdaLearner's n (framework.report.plan)."""
    plan = [c for c in PLAN_COLUMNS if any(c in r.plan for r in records)]
    params = ["run", "run_id", "status", *result["columns"]]
    result["rows"] = [{**{k: row[k] for k in params}, **{c: r.plan.get(c, "") for c in plan}, **{m: row[m] for m in result["metrics"]}} for row, r in zip(result["rows"], records)]
    result["plan"] = plan
    return result


def write_report(src: Source, out: Path) -> dict:
    """Write the report to `out`; returns the comparison and {plot title: (path, note)}."""
    out.mkdir(parents=True, exist_ok=True)
    result = table(src)
    rows, columns = result["rows"], result["columns"]
    labels = short_labels(rows, columns)
    write_csv(rows, out / "runs.csv")
    drawn = {}
    for title, draw in (
        ("Epoch time", lambda: plots.epoch_time(src.records, columns, labels, out)),
        ("Accuracy per epoch", lambda: plots.accuracy(src.records, labels, out)),
        ("Bytes per link", lambda: plots.link_bytes(src.records, labels, out)),
    ):
        try:
            drawn[title] = draw()
        except Exception as e:  # one odd run must not cost the table and the other plots
            print(f"warning: {title}: not drawn: {e}", file=sys.stderr)
            drawn[title] = (None, f"not drawn: {type(e).__name__}: {e}")
    (out / "report.md").write_text(markdown(src, result, drawn, out))
    return {"result": result, "plots": drawn, "labels": labels}


def markdown(src: Source, result: dict, drawn: dict, out: Path) -> str:
    lines = [f"# Report: {src.title}", "", f"Source: `{src.location}`  "]
    if src.overrides:
        lines.append(f"Sweep: `python -m framework -m {src.overrides}`  ")
    fixed = [f"{k.removesuffix('.name')}={result['common'][k]}" for k in FIXED if k in result["common"]]
    if fixed and len(src.records) > 1:
        lines.append("Held fixed: " + ", ".join(f"`{f}`" for f in fixed) + "  ")
    lines.append(f"Runs: {len(src.records)}" + (f" (left out: {', '.join(src.skipped)})" if src.skipped else ""))
    lines += ["", "## Runs", "", markdown_table(result["rows"])]
    notes = {EPOCH_MEAN: f"`{EPOCH_MEAN}` averages every epoch", BYTES_TOTAL: f"`{BYTES_TOTAL}` sums every directed link"}
    said = [text for m, text in notes.items() if m in result["metrics"]]
    if result.get("plan"):
        said.insert(0, "`plan/...` is each run's plan.json: `plan/cuts` the units where a new stage starts, `plan/schedule` micro-batches and flushes, PiPar's `plan/P` and `plan/N`, AdaLearner's `plan/n`")
    lines.append("; ".join(said + ["every column, run ids included: [runs.csv](runs.csv)"]) + ".")
    for title, (path, note) in drawn.items():
        lines += ["", f"## {title}", ""]
        lines.append(f"![{title}]({Path(path).relative_to(out).as_posix()})" if path else f"*Not drawn: {note}.*")
    return "\n".join(lines) + "\n"


def console_table(result: dict, labels: list[str]) -> str:
    """A few columns per run, fixed width, for the terminal."""
    metrics = [m for m in CONSOLE if m in result["metrics"]]
    plan = [c for c in result.get("plan", []) if len({r[c] for r in result["rows"]}) > 1]  # a plan that differs explains a difference
    head = ["run"] + [c.removeprefix("plan/") for c in plan] + [m.split(" (")[0] + (" mean" if m == EPOCH_MEAN else " total" if m == BYTES_TOTAL else "") for m in metrics]
    body = [[lab] + [str(r[c]) for c in plan] + [cell(r[m]) for m in metrics] for lab, r in zip(labels, result["rows"])]
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    return "\n".join(fmt(r) for r in [head] + body)
