"""The config schema of the classic pipeline schedules (GPipe, 1F1B, PipeDream, one device) (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from framework.config.knobs import knob
from framework.config.schemas import PipelineConfig


@dataclass
class LocalConfig(PipelineConfig):
    name: str = "local"


@dataclass
class GPipeConfig(PipelineConfig):
    name: str = "gpipe"
    microbatches: int = 4


@dataclass
class OneFOneBConfig(PipelineConfig):
    name: str = "1f1b"
    microbatches: int = 4


@dataclass
class PipeDreamConfig(PipelineConfig):
    name: str = "pipedream"
    microbatches: int = 1  # the mini-batch is the unit of pipelining
    # 2S-1 also counts each link as a stage (PipeDream's planner): see one_f_one_b
    in_flight: Optional[int] = knob(None, "mini-batches stage 0 admits before its first backward; null: one per stage (FTPipeHD's semaphore of N)")
