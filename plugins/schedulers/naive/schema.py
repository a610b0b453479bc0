"""The options of `scheduler=naive` (a dataclass only: importing it imports no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from framework.config.schemas import PipelineConfig


@dataclass
class NaiveConfig(PipelineConfig):
    """Every pipeline knob (`partition`, `stages`, `repartition`, `replan_epsilon`) and
    `microbatches`: 1 sends the whole mini-batch, as the GPipe paper's baseline does; M > 1 sends
    its M micro-batches one after another and accumulates their gradients (the bubble stays
    (S-1)/S, since no two devices ever work at once)."""

    name: str = "naive"
    microbatches: int = 1
