"""Horizontal bars that show their values and differences: each bar labelled with its value, and
the value axis zoomed to the data when the bars would look alike from 0 (0.915 and 0.94 of
accuracy), saying so on the axis, since a zoomed bar's length is no longer proportional to its
value. Used by a sweep's comparison.png (framework.tracking.sweep_summary)."""

from __future__ import annotations

import math
from typing import Sequence

ZOOM_WHEN = 0.5  # zoom when the values' spread is under this share of the largest |value|
MARGIN = 0.25  # room left and right of the data, as a share of its spread, once zoomed


def zoomed_range(values: Sequence[float]) -> tuple[float, float] | None:
    """The axis (left, right) zoomed to positive values that lie close together, or None when
    bars from 0 already show the differences (or there is nothing to zoom to)."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs or min(xs) <= 0:
        return None
    lo, hi = min(xs), max(xs)
    spread = hi - lo
    if spread >= ZOOM_WHEN * hi:
        return None
    pad = MARGIN * spread if spread > 0 else 0.05 * hi  # one value, or all equal: a window around it
    return max(lo - pad, 0.0), hi + pad


def value_bars(ax, values: Sequence[float | None], labels: Sequence[str], xlabel: str) -> None:
    """One bar per label (top to bottom), its value written at its end; a value that is None is
    drawn as no bar and labelled "no value"."""
    ys = range(len(values))
    drawn = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
    bars = ax.barh(ys, drawn, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.4g}" if v is not None and math.isfinite(v) else "no value" for v in values], padding=3, fontsize=8)
    ax.set_yticks(list(ys), list(labels), fontsize=8)
    ax.invert_yaxis()
    zoom = zoomed_range(values)
    if zoom is None:
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi + 0.12 * (hi - lo))  # room for the labels at the bars' ends
        ax.set_xlabel(xlabel)
        return
    left, right = zoom
    ax.set_xlim(left, right + 0.3 * (right - left))  # room for the labels
    ax.set_xlabel(f"{xlabel}\n(axis zoomed: starts at {left:.4g}, not 0)", color="tab:red" if left > 0 else None)
    if left > 0:  # a break mark on the value axis where it would have met 0
        ax.text(0.0, 0.0, "//", transform=ax.transAxes, ha="center", va="center", backgroundcolor="white", color="tab:red", fontsize=10, fontweight="bold", clip_on=False)
    ax.grid(True, axis="x", alpha=0.3)
