"""The latency-predictor interface the planners use (DESIGN, "Predictors and planners").

A predictor estimates the seconds of a `Work` on a `Device` (`estimate`, the plugin's model);
planners ask `predict`. A run that re-plans (`scheduler.replan_epsilon`, plugins/predictors/accept_replan.py)
tells it what a stage measured (`observe`): by default the device's predictions are then scaled
by measured over predicted, FTPipeHD's computing-capacity update (a worker's reported time over
the estimate). A predictor with a better answer (AccEPT re-measures the device's hardware vector
and fine-tunes itself) overrides `observe`.
"""

from __future__ import annotations

from framework.cluster import Device, Work


class Predictor:
    def __init__(self) -> None:
        self._scale: dict[str, float] = {}  # device -> measured / estimated, from `observe`

    def estimate(self, device: Device, work: Work) -> float:
        """Seconds of `work` on `device` by the predictor's own model."""
        raise NotImplementedError

    def predict(self, device: Device, work: Work) -> float:
        return self.estimate(device, work) * self._scale.get(device.name, 1.0)

    def fwd_bwd(self, device: Device, start: int, stop: int, batch: int) -> float:
        """Predicted forward + backward seconds of units [start, stop) at `batch`."""
        return sum(self.predict(device, Work(k, start, stop, batch)) for k in ("fwd", "bwd"))

    def observe(self, device: Device, start: int, stop: int, batch: int, seconds: float, now: float) -> None:
        """A stage on `device` measured `seconds` for the forward + backward of units
        [start, stop) at `batch`, around time `now`."""
        base = sum(self.estimate(device, Work(k, start, stop, batch)) for k in ("fwd", "bwd"))
        if base > 0 and seconds > 0:
            self._scale[device.name] = seconds / base
