"""A pipeline's plan, typed: which units each stage holds on which device, what that costs and
where it moves. `PipelineScheduler.plan()` returns its JSON (plan.json, shipped to role
processes), with the keys and values plan.json always had."""

from __future__ import annotations

from dataclasses import dataclass

from framework.specs import Data

Bounds = tuple[tuple[int, int], ...]  # every stage's units [start, stop), in pipeline order


@dataclass(frozen=True)
class StageMemory(Data):
    """Bytes a stage holds at its peak (PipelineScheduler.memory_estimate)."""

    bytes: int
    weights_and_optimizer: int
    activations: int
    stashed_weights: int
    microbatches_alive: int


@dataclass(frozen=True)
class StagePlan(Data):
    role: str
    device: str
    units: tuple[int, int]
    unit_names: tuple[str, ...]
    memory_bytes: StageMemory
    predicted_compute_s: float  # forward + backward of one micro-batch, by the run's predictor
    predicted_link_s: float  # its output's transfer to the next stage (0 for the last)


@dataclass(frozen=True)
class Repartition(Data):
    """`scheduler.repartition`: from `epoch` on, the stages hold `bounds`."""

    epoch: int
    bounds: Bounds


@dataclass(frozen=True)
class PipelinePlan(Data):
    scheduler: str
    partition: str  # the partitioner's name, or "cuts" where the config fixed them
    stages: tuple[StagePlan, ...]
    microbatches: int
    predicted_epoch_s: float
    flush_per: str  # "iteration" or "epoch"
    weight_stashing: bool
    repartition: tuple[Repartition, ...]

    @property
    def bounds(self) -> Bounds:
        return tuple(st.units for st in self.stages)

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(st.role for st in self.stages)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(st.device for st in self.stages)
