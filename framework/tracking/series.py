"""Per-epoch metrics reach MLflow as a line only once they vary: a number that stays the same every
epoch (the virtual clock's epoch time of a deterministic run, val/acc stuck at chance) would draw a
flat line, or, with float noise in its last digit, an autoscaled "dramatic diagonal".

`EpochSeries` logs a metric's first value at once (a run being watched shows it) and holds the
values after it while they are the same (to 1e-9, relative); the first value that differs sends the
held ones and it, and from then on every value goes straight on. A metric that never varies is one
point, its first epoch's: its value is still the run's latest (a runs-table column, a sweep's
objective). summary.json's `history` keeps every epoch's value either way.
"""

from __future__ import annotations

import math


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))


class EpochSeries:
    """Holds the repeats of constant per-epoch metrics back from a tracker (see the module's doc).
    Its state is plain data (held values, the keys that varied) that a checkpoint keeps, so a
    resumed run goes on where the stopped one was."""

    def __init__(self, state: dict | None = None):
        self.state = state if state is not None else {}
        self.state.setdefault("held", {})  # key -> [[step, value], ...] while all the same; the first is logged
        self.state.setdefault("varying", [])

    def log(self, tracker, key: str, value: float, step: int) -> None:
        held_all, varying = self.state["held"], self.state["varying"]
        if key in varying:
            tracker.log_metric(key, value, step)
            return
        held = held_all.get(key)
        if held is None:
            tracker.log_metric(key, value, step)
            held_all[key] = [[int(step), float(value)]]
        elif same(held[0][1], value):
            held.append([int(step), float(value)])
        else:
            for s, v in held[1:]:
                tracker.log_metric(key, v, s)
            tracker.log_metric(key, value, step)
            varying.append(key)
            del held_all[key]
