"""The plots a paper shows, chosen from what the runs hold. Each returns (png path, None), or
(None, a one-line reason) when its data is absent: timing-only runs have no accuracy, a
one-device run no link bytes.

Beside each PNG, its data as JSON (`epoch_time.json` next to `epoch_time.png`): every plotted
value at 6 significant digits, so a figure in the docs can be checked against what its command
produces now (experiments/docs_figures.py) without comparing pixels.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from framework.report.sources import EPOCH_MEAN
from framework.tracking.comparison import RunRecord, is_number, short_key, short_value

MAX_LINKS = 10  # links drawn one by one; the rest are summed into "other links" (K=100 devices have 200 links)


def _plt():
    import matplotlib  # matplotlib: start-up (only drawing a plot imports it)

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt  # matplotlib: start-up (after the Agg backend is chosen)

    return plt


def figure_value(v: float) -> float:
    """A plotted value as the figure's data keeps it: 6 significant digits (more than a plot
    shows, fewer than float noise could change)."""
    return float(f"{v:.6g}")


def _save(fig, path: Path, data: dict) -> Path:
    fig.savefig(path, dpi=120, bbox_inches="tight")  # bbox: legends placed outside the axes stay in the image
    _plt().close(fig)
    path.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    return path


def _clock(records: Sequence[RunRecord]) -> str:
    return "wall clock" if all(r.clock == "wall" for r in records) else "virtual clock"


def _numbers(records: Sequence[RunRecord], column: str) -> list[float] | None:
    """The column's values as finite numbers, or None if any is not one (a categorical key)."""
    try:
        xs = [float(r.params[column]) for r in records]
    except (KeyError, ValueError):
        return None
    return xs if all(is_number(x) for x in xs) else None


def _spans_decades(vals: Sequence[float], ratio: float) -> bool:
    return len(vals) > 1 and min(vals) > 0 and max(vals) / min(vals) >= ratio


def _x_axis(ax, xs: Sequence[float], col: str) -> None:
    """Log when the values span a decade (bandwidths, sizes); ticks at the swept values themselves
    when there are few (2 and 4 micro-batches, not 2.25, 2.5, ...); bit/s in engineering units."""
    from matplotlib.ticker import EngFormatter, FuncFormatter, NullFormatter  # matplotlib: start-up

    values = sorted(set(xs))
    if _spans_decades(values, 10):
        ax.set_xscale("log")
    if len(values) <= 8:
        ax.set_xticks(values)
    ax.xaxis.set_major_formatter(EngFormatter(unit="bit/s") if col.endswith("_bps") else FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if len(values) > 5:
        ax.tick_params(axis="x", labelsize=8)


def _y_axis(ax, ys: Sequence[float]) -> None:
    """Log when epoch times span a decade (they fall by decades with bandwidth: the fast end stays
    visible), labelled in plain seconds at 1-2-5 steps (0.1, 0.2, 0.5, 1), not 10^-1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # matplotlib: start-up

    if not _spans_decades(ys, 10):
        return
    ax.set_yscale("log")
    decades = math.log10(max(ys) / min(ys))
    subs = (1.0, 2.0, 3.0, 5.0) if decades <= 1.5 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _legend(ax, n: int, title: str | None = None) -> None:
    """Inside for a few entries; outside on the right for many, where it hides no data."""
    if n <= 4:
        ax.legend(title=title, fontsize=8, title_fontsize=8)
    else:
        ax.legend(title=title, fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def epoch_time(records: Sequence[RunRecord], columns: Sequence[str], labels: Sequence[str], out_dir: Path):
    """Mean epoch time against each numeric swept param, one line per value of the other swept
    keys; bars per run when no swept param is a number (say a scheduler sweep)."""
    runs = [(r, lab) for r, lab in zip(records, labels) if is_number(r.metrics.get(EPOCH_MEAN))]
    if not runs:
        return None, "no run records time/epoch_virtual_s per epoch"
    recs = [r for r, _ in runs]
    ylabel = f"epoch time (s, {_clock(recs)}), mean over epochs"
    numeric = [c for c in columns if (xs := _numbers(recs, c)) is not None and len(set(xs)) > 1]
    plt = _plt()
    if not numeric:
        fig, ax = plt.subplots(figsize=(7, 0.4 * len(runs) + 1.6))
        bars = ax.barh(range(len(runs)), [r.metrics[EPOCH_MEAN] for r in recs], color="tab:blue")
        ax.bar_label(bars, fmt="%.4g", padding=3, fontsize=8)  # the value at each bar's end
        ax.margins(x=0.15)  # room for the labels
        ax.set_yticks(range(len(runs)), [lab for _, lab in runs], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(ylabel)
        ax.grid(True, axis="x", alpha=0.3)
        data = {"figure": "epoch_time", "value": ylabel, "bars": {lab: figure_value(r.metrics[EPOCH_MEAN]) for r, lab in runs}}
        return _save(fig, out_dir / "epoch_time.png", data), None
    fig, axes = plt.subplots(1, len(numeric), figsize=(6 * len(numeric), 4.2), squeeze=False)
    data = {"figure": "epoch_time", "value": ylabel, "panels": []}
    for ax, col in zip(axes[0], numeric):
        others = [c for c in columns if c != col]
        lines: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in recs:  # one other key: the legend's title names it, the entries give its values
            values = [short_value(r.params.get(o, "")) for o in others]
            key = values[0] if len(others) == 1 else ", ".join(f"{short_key(o)}={v}" for o, v in zip(others, values))
            lines[key][float(r.params[col])].append(r.metrics[EPOCH_MEAN])
        panel = {"x": col, "lines": {}}
        for key, pts in lines.items():
            xs = sorted(pts)
            ys = [sum(pts[x]) / len(pts[x]) for x in xs]  # repeats of one point: their mean
            ax.plot(xs, ys, marker="o", label=key or None)
            panel["lines"][key] = [[figure_value(x), figure_value(y)] for x, y in zip(xs, ys)]
        data["panels"].append(panel)
        _x_axis(ax, _numbers(recs, col), col)
        _y_axis(ax, [r.metrics[EPOCH_MEAN] for r in recs])
        ax.set_xlabel(col)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if others:
            _legend(ax, len(lines), short_key(others[0]) if len(others) == 1 else None)
    fig.tight_layout()
    return _save(fig, out_dir / "epoch_time.png", data), None


def accuracy(records: Sequence[RunRecord], labels: Sequence[str], out_dir: Path):
    """val/acc after each epoch, one curve per run (summary.json's history)."""
    curves = [(r.history["val/acc"], lab) for r, lab in zip(records, labels) if any(is_number(v) for v in r.history.get("val/acc", []))]
    if not curves:
        return None, "no run has val/acc per epoch (timing-only runs, runtime.numerics=false, have none)"
    from matplotlib.ticker import MaxNLocator  # matplotlib: start-up

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    markers = "osD^vP*Xh<>"
    for i, (acc, lab) in enumerate(curves):
        ax.plot(range(1, len(acc) + 1), acc, marker=markers[i % len(markers)], markersize=5, alpha=0.85, label=lab)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epochs done")
    ax.set_ylabel("val/acc")
    ax.grid(True, alpha=0.3)
    _legend(ax, len(curves))
    data = {"figure": "accuracy", "value": "val/acc after each epoch", "curves": {lab: [figure_value(v) if is_number(v) else None for v in acc] for acc, lab in curves}}
    return _save(fig, out_dir / "accuracy.png", data), None


def link_bytes(records: Sequence[RunRecord], labels: Sequence[str], out_dir: Path):
    """Bytes on the wire per run, stacked by directed link (the busiest MAX_LINKS links by name)."""
    runs = [(r, lab) for r, lab in zip(records, labels) if sum(r.links.values()) > 0]
    if not runs:
        return None, "no bytes crossed any link (one device, or no link recorded)"
    totals: dict[str, float] = defaultdict(float)
    for r, _ in runs:
        for name, b in r.links.items():
            totals[name] += b
    names = sorted(totals, key=lambda n: -totals[n])
    shown, rest = sorted(names[:MAX_LINKS]), names[MAX_LINKS:]
    from matplotlib.ticker import EngFormatter  # matplotlib: start-up

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(runs) + 1.8))
    left = [0.0] * len(runs)
    data = {"figure": "link_bytes", "value": "bytes on the wire, whole run", "runs": {lab: {} for _, lab in runs}}
    colors = plt.get_cmap("tab10" if len(shown) + bool(rest) <= 10 else "tab20").colors
    segments = [(n.replace("->", " → "), lambda r, n=n: r.links.get(n, 0.0)) for n in shown]
    if rest:
        segments.append((f"other links ({len(rest)})", lambda r: sum(r.links.get(n, 0.0) for n in rest)))
    for i, (label, get) in enumerate(segments):
        widths = [get(r) for r, _ in runs]
        for (_, lab), w in zip(runs, widths):
            data["runs"][lab][label] = figure_value(w)
        ax.barh(range(len(runs)), widths, left=left, color=colors[i % len(colors)], label=label)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(runs)), [lab for _, lab in runs], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(EngFormatter(unit="B"))
    ax.set_xlabel("bytes on the wire, whole run")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(title="link", fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out_dir / "link_bytes.png", data), None
