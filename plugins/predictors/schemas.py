"""The config schemas of the built-in latency predictors (dataclasses only; see
framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass

from framework.config import PredictorConfig


@dataclass
class OracleConfig(PredictorConfig):
    name: str = "oracle"


@dataclass
class LutConfig(PredictorConfig):
    name: str = "lut"


@dataclass
class CapacityConfig(PredictorConfig):
    name: str = "capacity"
    central: str = "dev0"  # FTPipeHD's central node: its per-unit profile is scaled by each device's ratio


@dataclass
class FlopsConfig(PredictorConfig):
    name: str = "flops"
    flops_per_s: float = 1.0e9  # assumed rate when the device declares none
