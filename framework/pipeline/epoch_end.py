"""What every pipeline stage does at an epoch's end, before the next epoch: a policy a plugin
declares (AccEPT's re-planning, plugins/predictors/accept_replan.py, is one).

A plugin declares its policy with the scheduler-config keys it reads, the first of which
switches it on:

    declare("accept_replan", "plugins.predictors.accept_replan:Replanning", knobs=("replan_epsilon",))

A pipeline scheduler whose config sets that key (`scheduler.replan_epsilon=0.15`) puts the
policy's name and the keys' values in every stage's spec (`EpochEndSpec`); each stage builds the
policy from it and calls `at_epoch_end` with its view of itself (`StageView`) after every epoch
that another follows. The core names no policy: it finds the declared one whose key is set.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from framework import registry
from framework.errors import ConfigError, PipelabError
from framework.specs import Data

if TYPE_CHECKING:
    from framework.pipeline.cost import PipelinePlanner


class StageView(Protocol):
    """What a policy sees of the stage that calls it (framework.pipeline.stage.StageRole)."""

    index: int  # this stage's place in the pipeline, 0 first
    roles: tuple[str, ...]  # every stage's role, in pipeline order (where to send)
    devices: tuple[str, ...]  # every stage's device
    bounds: list[tuple[int, int]]  # every stage's units now
    busy_s: float  # this epoch's forward and backward seconds on this stage's clock
    batches: int  # mini-batches this stage ran this epoch
    planner: PipelinePlanner  # prices and cuts plans with this process's predictor and cluster

    async def repartition(self, ctx, new_bounds: list[tuple[int, int]], epoch: int) -> None:
        """Move units to `new_bounds` with their weights and optimizer state, every stage together."""


@dataclass(frozen=True)
class EpochEndSpec(Data):
    """The policy a stage follows and the values of the scheduler-config keys it declared."""

    name: str  # the declared policy
    knobs: dict[str, float | int | str | bool]  # scalar values only: they travel as JSON

    def policy_class(self) -> type[EpochEndPolicy]:
        return policy_class(self.name)

    def build(self) -> EpochEndPolicy:
        return self.policy_class()(self)


class EpochEndPolicy(ABC):
    """A stage's part at an epoch's end. Every stage of the run holds one (built from the same
    `EpochEndSpec`) and calls it at the same point, so stages may exchange messages in it."""

    def __init__(self, spec: EpochEndSpec):
        self.spec = spec

    @classmethod
    def check(cls, cfg, parts) -> None:
        """Fail before running where the policy cannot work (`cfg`: the scheduler config;
        `parts`: framework.scheduler.SchedulerContext)."""

    @abstractmethod
    async def at_epoch_end(self, stage: StageView, ctx, epoch: int) -> None:
        """Run at the end of `epoch` (ctx: the stage's framework.runtime.base.RoleContext)."""

    def stats(self) -> dict:
        """JSON counters added to the stage's `stats()`."""
        return {}

    def checkpoint(self) -> dict:
        """JSON added to the stage's checkpoint (keys apart from the stage's own)."""
        return {}

    def restore(self, stage: StageView, desc: dict) -> None:
        """Take back what `checkpoint` wrote; `desc` is the stage's whole checkpoint."""

    @classmethod
    def report(cls, role_stats: dict[str, dict]) -> dict:
        """Summary sections and final metrics from every stage's `stats()`:
        {"summary": {...}, "metrics": {...}}."""
        return {"summary": {}, "metrics": {}}


@dataclass(frozen=True)
class _Declared:
    target: str  # "module:attr" of an EpochEndPolicy subclass
    knobs: tuple[str, ...]


_DECLARED: dict[str, _Declared] = {}


def declare(name: str, target: str, *, knobs: tuple[str, ...]) -> None:
    """Declare policy `name` ("module:attr", imported when a stage first builds it), switched on
    by the scheduler-config key `knobs[0]`; every key in `knobs` reaches it in its spec."""
    if ":" not in target or not knobs:
        raise ValueError(f"epoch-end policy {name!r}: target must be 'module:attr' and knobs non-empty, got {target!r}, {knobs!r}")
    previous = _DECLARED.get(name)
    if previous is not None and previous.target != target:
        raise ValueError(f"epoch-end policy {name!r} is declared twice ({previous.target} and {target})")
    _DECLARED[name] = _Declared(target, tuple(knobs))


def chosen(cfg) -> EpochEndSpec | None:
    """The policy the scheduler config `cfg` switches on, with its keys' values; None: none."""
    registry.load_plugins()  # the plugins declare their policies when they are loaded
    on = [(name, d) for name, d in sorted(_DECLARED.items()) if cfg.get(d.knobs[0]) is not None]
    if len(on) > 1:
        keys = " and ".join(f"scheduler.{d.knobs[0]}" for _, d in on)
        raise ConfigError(f"scheduler.{on[1][1].knobs[0]}", f"{keys} each switch on what the stages do at an epoch's end ({', '.join(n for n, _ in on)}); set one")
    if not on:
        return None
    name, d = on[0]
    return EpochEndSpec(name, {k: cfg.get(k) for k in d.knobs})


def policy_class(name: str) -> type[EpochEndPolicy]:
    d = _DECLARED.get(name)
    if d is None:
        raise PipelabError(f"no epoch-end policy {name!r} is declared (declared: {', '.join(sorted(_DECLARED)) or 'none'})")
    module, _, attr = d.target.partition(":")
    try:
        cls: Any = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise PipelabError(f"epoch-end policy {name!r}: cannot import {d.target}: {type(err).__name__}: {err}") from err
    return cls
