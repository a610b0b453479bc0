"""The config schemas of the built-in latency predictors (dataclasses only; see
framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from framework.config.knobs import Range, knob
from framework.config.schemas import PredictorConfig


@dataclass
class OracleConfig(PredictorConfig):
    name: str = "oracle"


@dataclass
class LutConfig(PredictorConfig):
    name: str = "lut"


@dataclass
class CapacityConfig(PredictorConfig):
    name: str = "capacity"
    central: str = knob("dev0", "FTPipeHD's central node: its per-unit profile is scaled by each device's ratio")


@dataclass
class AcceptConfig(PredictorConfig):
    name: str = "accept"
    pool: int = knob(100, "pre-training devices")  # the paper: 24 CPU configurations
    epochs: int = knob(1500, "pre-training epochs of the MLP")
    width: int = knob(128, "the MLP's hidden width")
    seed: int = knob(0, "the pool's and the MLP's seed")
    flops_per_s_range: List[float] = knob([1.0e8, 1.0e11], "the pool's rates, log-uniform")
    kind_factor_range: List[float] = knob([0.25, 6.0], "the pool's per-layer-kind factors, log-uniform")
    max_call_overhead_s: float = knob(2.0e-3, "the pool's per-unit call overheads, uniform from 0")
    bytes_per_flop_range: List[float] = knob(
        [0.2, 20.0],
        "the pool's activation and weight streams (framework.cluster), each as bytes/s per FLOP/s of the device's rate, log-uniform: 0.2 is memory-bound on most layers, 20 nearly free",
    )
    cache_dir: Optional[str] = knob("outputs/cache", "trained weights per model, batch and config; null: train every run")
    finetune_min_samples: int = knob(8, "a re-planning run fine-tunes the MLP on the stages' reported times from this many reports on (notes: 8)")
    pool_table: Optional[str] = knob(None, "pre-train on transforms of this measured profile table's columns (the paper's measured D); null: analytic devices")
    central: Optional[str] = knob("dev0", "the central node: its stage is priced by its own per-unit profile (Eq. 9), the MLP prices the workers; null: the MLP everywhere")


@dataclass
class FlopsConfig(PredictorConfig):
    name: str = "flops"
    flops_per_s: float = knob(1.0e9, "assumed rate when the device declares none", range=Range(0, low_open=True, note="FLOP/s assumed for a device that declares none"))
