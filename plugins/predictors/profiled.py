"""Predictors built from per-unit measurements (AccEPT's baselines, notes 2.1 and 5):

- `lut`: a lookup table of each unit's time measured alone on the device itself, summed over a
  sub-model (the per-operator tables of AccEPT's refs [33, 34]). Exact where a sub-model's time
  is the sum of its units' (the analytic model); blind to what does not add up.
- `capacity`: FTPipeHD's computing-power ratio. The central node (`central`, dev0) profiles every
  unit; a worker measures its current sub-model once, and its ratio to the central node's time for
  the same units scales the central profile: T_i(a, b) = r_i * sum_j T_0(j). The "current
  sub-model" is the worker's stage under FTPipeHD's first, average partition (every device taken
  as fast as the central node; framework.pipeline.partition.balanced_bounds over dev0..dev{N-1}); a device
  outside those measures the whole model. Blind to per-layer-kind speed differences.

"Measuring" on the simulator asks the device's time model (a `measured` device, with no model
before it runs, is priced by FLOPs, as `oracle` does).
"""

from __future__ import annotations

from framework.cluster import Device, Work
from framework.pipeline.partition import balanced_bounds
from framework.predictor import Predictor
from plugins.predictors.basic import measure
from plugins.predictors.schemas import CapacityConfig, LutConfig  # noqa: F401  (registry.declare)


def per_unit(device: Device, work: Work) -> list[float]:
    return [measure(device, Work(work.kind, j, j + 1, work.batch, share=work.share)) for j in range(work.start, work.stop)]


class LutPredictor(Predictor):
    def __init__(self, cfg, cluster=None):
        super().__init__()
        self.cfg = cfg

    def estimate(self, device: Device, work: Work) -> float:
        if work.seconds is not None:
            return work.seconds
        return sum(per_unit(device, work))


class CapacityPredictor(Predictor):
    """FTPipeHD's ratio. A re-planning run's reported times update it the way FTPipeHD does: the
    inherited `observe` scales the device's estimates by its measured over estimated time, which is
    the ratio re-measured on its current sub-model."""

    def __init__(self, cfg, cluster):
        super().__init__()
        self.cfg, self.cluster = cfg, cluster
        self.central = cluster.device(str(cfg.central))
        self._ratio: dict = {}

    def _current(self, device: Device, batch: int) -> tuple[int, int]:
        """The units `device` runs under the average partition (the whole model if it has no stage)."""
        L = len(self.central.infos)
        names = [f"dev{i}" for i in range(int(self.cluster.cfg.num_devices))]
        if device.name not in names or len(names) > L:
            return 0, L
        unit = [sum(measure(self.central, Work(k, j, j + 1, batch)) for k in ("fwd", "bwd")) for j in range(L)]
        return balanced_bounds(lambda s, j: unit[j], len(names), L)[names.index(device.name)]

    def ratio(self, device: Device, batch: int) -> float:
        """r_i: the device's measured forward + backward time of its current sub-model over the
        central node's for the same units (one ratio for both, as FTPipeHD keeps)."""
        key = (device.name, batch)
        if key not in self._ratio:
            a, b = self._current(device, batch)
            mine = sum(measure(device, Work(k, a, b, batch)) for k in ("fwd", "bwd"))
            theirs = sum(measure(self.central, Work(k, a, b, batch)) for k in ("fwd", "bwd"))
            self._ratio[key] = mine / theirs if theirs > 0 else 1.0
        return self._ratio[key]

    def estimate(self, device: Device, work: Work) -> float:
        if work.seconds is not None:
            return work.seconds
        return self.ratio(device, max(work.batch, 1)) * sum(per_unit(self.central, work))
