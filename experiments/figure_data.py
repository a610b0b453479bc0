"""A figure's data, written beside its PNG: the numbers it plots, so a check can compare them
(experiments/docs_figures.py) where pixels could not be.

`save(fig, png, data)` writes `png` and `png.with_suffix(".json")`; the data holds what the
figure draws (its lines, bars, points and reference values, with the labels that tell them
apart), nothing measured on the wall clock, every float at 6 significant digits (the precision
docs_figures compares at: a virtual-clock number is deterministic, so equal data means the same
figure).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def rounded(x):
    """`x` with every float at 6 significant digits, tuples as lists and keys as strings."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"a figure's data must be finite, got {x}")
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {str(k): rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v) for v in x]
    if hasattr(x, "item"):  # a numpy scalar
        return rounded(x.item())
    raise TypeError(f"a figure's data holds numbers, strings and lists, not {type(x).__name__}")


def data_path(png: Path) -> Path:
    return Path(png).with_suffix(".json")


def write(png: Path, data: dict) -> None:
    data_path(png).write_text(json.dumps(rounded(data), indent=1) + "\n")


def save(fig, png: Path, data: dict, dpi: int) -> None:
    """The PNG and its data beside it."""
    fig.savefig(png, dpi=dpi)
    write(png, data)
