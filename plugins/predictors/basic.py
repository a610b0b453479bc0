"""Baseline latency predictors: `oracle` (the simulator's own device model) and `flops`."""

from __future__ import annotations

from framework.cluster import Device, Work
from framework.predictor import Predictor
from plugins.predictors.schemas import FlopsConfig, OracleConfig  # noqa: F401  (the schemas live in a light module: registry.declare)


def measure(device: Device, work: Work) -> float:
    """`work` "measured" on `device` on the simulator: its time model (a `measured` device, with no
    model before it runs, is priced by FLOPs)."""
    if device.cfg.time_model == "measured":
        return FlopsPredictor.seconds(device, work, device.cfg.flops_per_s)
    return device.time(work)


class OraclePredictor(Predictor):
    """The device's own time model (exact on the simulator; FLOPs for `measured` devices)."""

    def __init__(self, cfg, cluster=None):
        super().__init__()
        self.cfg = cfg

    def estimate(self, device: Device, work: Work) -> float:
        return measure(device, work)


class FlopsPredictor(Predictor):
    """FLOPs / rate: blind to per-layer-type speed, the classic planner assumption."""

    def __init__(self, cfg, cluster=None):
        super().__init__()
        self.cfg = cfg  # flops_per_s in its range: checked when built (framework.registry.build)

    @staticmethod
    def seconds(device: Device, work: Work, rate: float) -> float:
        if work.seconds is not None:
            return work.seconds
        units = range(work.start, work.stop)
        if work.kind == "step":
            return device.cfg.step_flops_per_param * sum(device.infos[i].params for i in units) * work.share / rate
        flops = sum(device.infos[i].flops for i in units) * work.batch * work.share
        return flops * (device.cfg.backward_ratio if work.kind == "bwd" else 1.0) / rate

    def estimate(self, device: Device, work: Work) -> float:
        return self.seconds(device, work, device.cfg.flops_per_s or self.cfg.flops_per_s)
