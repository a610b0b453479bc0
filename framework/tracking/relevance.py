"""Which of a run's end-of-run metrics MLflow gets: those that vary or matter for the run's
scheduler and compressor. summary.json keeps them all; this is what a researcher sees first.

- a direction without a codec (`compressor=none`: both) has no `compression/*_<fwd|bwd>` metrics
  (32 bits, ratio 1, 0 s), and a run with no codec at all no `net/raw_bytes/<link>` (the same as
  `net/bytes`) and no `net/compression_ratio` (1);
- `pipe/bubble_frac` only where the schedule flushes a pipeline (a collaborative schedule has no
  bubble), `pipe/staleness` only where some update was stale (0 by construction in a synchronous
  pipeline), `roles/dropouts` only where a device dropped out.
"""

from __future__ import annotations

import re

CODEC_METRIC = re.compile(r"compression/.+_(fwd|bwd)")


def for_mlflow(metrics: dict, *, coded: set[str], pipeline: bool, stale: bool) -> dict:
    """`metrics` without those that say nothing about this run (see the module's doc)."""
    out = {}
    for k, v in metrics.items():
        m = CODEC_METRIC.fullmatch(k)
        if m and m.group(1) not in coded:
            continue
        if not coded and (k.startswith("net/raw_bytes/") or k == "net/compression_ratio"):
            continue
        if (k == "pipe/bubble_frac" and not pipeline) or (k == "pipe/staleness" and not stale) or (k == "roles/dropouts" and not v):
            continue
        out[k] = v
    return out
