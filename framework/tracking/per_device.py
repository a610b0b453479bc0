"""Per-device metrics of a large cluster as one table: a family of metrics with one value per
role or link (`util/busy_frac/<role>`, `net/bytes/<link>`, a scheduler's own `<group>/<what>/<who>`)
with more than `tracking.per_device_max` members goes to MLflow as its mean, p50, p95 and max
(`util/busy_frac/mean`, ...), and its values as the artifacts `per_device.csv` (one row per role
or link, one column per family) and `per_device.png` (a histogram per family). At K = 1,000
devices a run would otherwise log about 2,000 metrics, each a chart of one dot.
summary.json keeps every value.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

STATS = ("mean", "p50", "p95", "max")
ARTIFACTS = ("per_device.csv", "per_device.png")  # in the run directory and the MLflow run


def family(key: str) -> str | None:
    """`util/busy_frac/dev3` -> `util/busy_frac`; a key of fewer than three parts has none."""
    parts = key.split("/")
    return "/".join(parts[:-1]) if len(parts) >= 3 else None


def split(metrics: dict[str, float], most: int) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(the metrics to log one by one, {family: {member: value}} of the families over `most`)."""
    members: dict[str, dict[str, float]] = {}
    for k, v in metrics.items():
        f = family(k)
        if f is not None:
            members.setdefault(f, {})[k[len(f) + 1:]] = v
    tables = {f: m for f, m in members.items() if len(m) > most}
    kept = {k: v for k, v in metrics.items() if family(k) not in tables}
    return kept, tables


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the nearest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(tables: dict[str, dict[str, float]]) -> dict[str, float]:
    """`<family>/mean`, `/p50`, `/p95`, `/max` of each family's finite values."""
    out = {}
    for f, m in tables.items():
        xs = [float(v) for v in m.values() if isinstance(v, (int, float)) and math.isfinite(v)]
        if not xs:
            continue
        out.update({f"{f}/mean": sum(xs) / len(xs), f"{f}/p50": quantile(xs, 0.5), f"{f}/p95": quantile(xs, 0.95), f"{f}/max": max(xs)})
    return out


def write_csv(tables: dict[str, dict[str, float]], path: Path) -> Path:
    """One row per role or link, one column per family (blank where a family has no value)."""
    families = sorted(tables)
    names = list(dict.fromkeys(n for f in families for n in tables[f]))
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", *families])
        for n in names:
            w.writerow([n, *(repr(float(tables[f][n])) if n in tables[f] else "" for f in families)])
    return Path(path)


def plot(tables: dict[str, dict[str, float]], path: Path) -> Path:
    """A histogram per family, its mean, p50 and p95 marked."""
    import matplotlib  # matplotlib: start-up (only a run with a family over tracking.per_device_max draws this)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: start-up (after the Agg backend is chosen)

    families = sorted(tables)
    cols = min(3, len(families))
    rows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    summary = stats(tables)
    for ax, f in zip(axes.flat, families):
        xs = [float(v) for v in tables[f].values() if math.isfinite(v)]
        ax.hist(xs, bins=min(50, max(5, len(xs) // 10)), color="tab:blue")
        for stat, style in (("mean", "-"), ("p50", "--"), ("p95", ":")):
            if f"{f}/{stat}" in summary:
                ax.axvline(summary[f"{f}/{stat}"], color="black", linestyle=style, linewidth=1, label=f"{stat} {summary[f'{f}/{stat}']:.4g}")
        ax.set_title(f"{f} ({len(xs)})", fontsize=9)
        ax.set_ylabel("count", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(families):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
