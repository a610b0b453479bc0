"""The config schemas of the built-in latency predictors (dataclasses only; see
framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass

from framework.config import PredictorConfig


@dataclass
class OracleConfig(PredictorConfig):
    name: str = "oracle"


@dataclass
class FlopsConfig(PredictorConfig):
    name: str = "flops"
    flops_per_s: float = 1.0e9  # assumed rate when the device declares none
