"""Per-epoch metrics reach MLflow once they vary: a number that stays the same every epoch (the
virtual clock's epoch time of a deterministic run, a codec's fixed bit width) would draw a chart
of one flat line, or, with float noise in its last digit, an autoscaled "dramatic diagonal".

`EpochSeries` holds a metric's values while they are all the same (to 1e-9, relative); the first
value that differs sends the held ones and it, and from then on every value goes straight on. At
the run's end a metric that never varied is logged once, at its last step, so it is still the
run's latest value (a runs-table column, a sweep's objective), one point rather than a line.
summary.json's `history` keeps every epoch's value either way.
"""

from __future__ import annotations

import math


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))


class EpochSeries:
    """Holds constant per-epoch metrics back from a tracker (see the module's doc). Its state is
    plain data (`state`: held values and the keys that varied) that a checkpoint keeps, so a
    resumed run goes on holding what the stopped one held."""

    def __init__(self, state: dict | None = None):
        self.state = state if state is not None else {}
        self.state.setdefault("held", {})  # key -> [[step, value], ...] while all the same
        self.state.setdefault("varying", [])

    def log(self, tracker, key: str, value: float, step: int) -> None:
        held_all, varying = self.state["held"], self.state["varying"]
        if key in varying:
            tracker.log_metric(key, value, step)
            return
        held = held_all.setdefault(key, [])
        if held and not same(held[0][1], value):
            logged = key in self.state.get("logged", ())  # its last held value is in MLflow already
            for s, v in held[:-1] if logged else held:
                tracker.log_metric(key, v, s)
            tracker.log_metric(key, value, step)
            varying.append(key)
            del held_all[key]
        else:
            held.append([int(step), float(value)])

    def resumed(self) -> None:
        """A run resumed from a checkpoint: the stopped run logged the last value of each metric
        it held when it ended (`finish`), so that value is not logged again should it vary now.
        (One that stays constant across the resume gets a second point: MLflow deletes none.)"""
        self.state["logged"] = sorted(self.state["held"])

    def finish(self, tracker) -> None:
        """Log each metric that never varied once, at its last step."""
        for key, held in self.state["held"].items():
            step, value = held[-1]
            tracker.log_metric(key, value, step)
        self.state["held"] = {}
