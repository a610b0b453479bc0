"""What a scheduler is: the interface between a training schedule and the runtimes.

A scheduler turns the run's parts into a **plan** and a set of **roles**. A role is a program
bound to a device that owns its state (a pipeline stage, a device's half of a split model, the
aggregator's global model); whatever another role needs travels as a message through the role
context. The same roles therefore run on the virtual clock (`runtime=sim`, every role in one
process) and as separate processes (`runtime=local`/`remote`), where each process builds only its
own role from the spec that the coordinator made once and shipped (framework.specs):

    coordinator                                   role process (one per role)
    sched = Scheduler(cfg, ctx)                   sched = Scheduler(cfg, ctx with plan=..., role=r)
    plan = sched.plan()        # the search       sched.plan() is the shipped plan: no search
    sched.role_devices()       # who runs where
    spec = sched.role_spec(r)  # r's slice        role = sched.role_from_spec(r, spec.to_json())
                               #   of the plan    # only its own state, no reference to sched
    ... epoch ends: sched.eval_model(states) evaluates the roles' reported states ...

A scheduler sees a `SchedulerContext` (the config, model, dataset, cluster, compressor and
predictor), never the Job; the runtime's callbacks to the job are `RuntimeHooks`, beside the
runtime interface (framework.runtime.base).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import nn

from framework import registry
from framework.data import batches, num_batches
from framework.errors import ConfigError
from framework.specs import RoleSpec
from framework.stage import OptimizerSettings

RUNTIMES = ("sim", "local", "remote")


@dataclass
class SchedulerContext:
    """The run's parts a scheduler may use. In a role process `role` names the one role to build
    and `plan` is the coordinator's plan (so the process neither searches nor builds others)."""

    cfg: Any  # the whole resolved config (read only)
    model: Any  # framework.models.UnitModel, initialised from the seed
    dataset: Any  # framework.data.Dataset
    cluster: Any  # framework.cluster.Cluster
    compressor: Any  # the run's compressor (roles' messages go through it)
    predictor: Any  # compute-time estimates for planners
    role: str | None = None
    plan: dict | None = None
    _batches: dict = field(default_factory=dict, repr=False)

    @cached_property  # read once: a config lookup costs 20 us, and every role of a K-device run asks
    def numerics(self) -> bool:
        return bool(self.cfg.runtime.numerics)

    @cached_property
    def dtype(self) -> torch.dtype:
        return torch.float64 if self.cfg.runtime.dtype == "float64" else torch.float32

    @property
    def train(self):
        return self.cfg.train

    @cached_property
    def optimizer(self):
        """The run's optimizer settings (framework.stage.OptimizerSettings), read once: every
        role's `Stage` is built from them."""
        return OptimizerSettings.of(self.cfg.train)

    def new_compressor(self):
        """A fresh compressor of the run's kind: planners price packets with it without touching
        the state (residuals, scales) of the one the roles use."""
        return registry.build("compressor", self.cfg.compressor)

    def iterations_per_epoch(self) -> int:
        """Mini-batches per epoch over the whole training split (capped by train.iterations_per_epoch)."""
        n = num_batches(len(self.dataset.x_train), self.cfg.train.batch_size)
        cap = self.cfg.train.iterations_per_epoch
        return min(n, int(cap)) if cap else n

    def train_batches(self, epoch: int) -> list:
        """The epoch's mini-batches of the whole training split, in the seeded order every process
        draws alike; built once per epoch however many roles of this process ask."""
        if epoch not in self._batches:
            self._batches.clear()
            n = self.iterations_per_epoch()
            self._batches[epoch] = list(batches(self.dataset.x_train, self.dataset.y_train, self.cfg.train.batch_size, self.cfg.seed, epoch, limit=n))
        return self._batches[epoch]


class Role(ABC):
    """One role: its device, its program and the state it owns."""

    device: str
    first_epoch: int = 0  # where `run` starts: 0, or the epoch after a restored checkpoint's

    @abstractmethod
    async def run(self, ctx) -> None:
        """The role program (ctx: framework.runtime.base.RoleContext). It runs epochs
        `first_epoch` .. train.epochs - 1, so a restored role continues where it stopped."""

    def checkpoint(self, bag, prefix: str) -> dict:
        """Everything this role needs to continue bit for bit from the epoch end where every role
        now waits: tensors into `bag` (framework.checkpoints.state.Bag) under `prefix`, the returned
        JSON for the rest. A role that cannot raises NotImplementedError (its runs then write no
        checkpoints and cannot resume)."""
        raise NotImplementedError(f"{type(self).__name__} does not checkpoint")

    def restore(self, bag, desc: dict) -> None:
        """Take back what `checkpoint` wrote (the runtime sets `first_epoch`)."""
        raise NotImplementedError(f"{type(self).__name__} does not checkpoint")

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors the coordinator needs from this role at epoch ends and at the end (the
        weights it evaluates). Empty for roles whose weights another role aggregates."""
        return {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take state back (the counterpart of `state`)."""

    def stats(self) -> dict:
        """JSON counters for the summary (peak activations alive, staleness, ...)."""
        return {}


class Scheduler(ABC):
    """A training schedule. Subclasses implement the abstract methods; the rest have defaults.

    `runtimes` lists where it runs. Construction must stay cheap and must not search when
    `ctx.plan` is given; `plan()` does the search on first use otherwise."""

    runtimes: ClassVar[tuple[str, ...]] = RUNTIMES

    def __init__(self, cfg, ctx: SchedulerContext):
        self.cfg = cfg
        self.ctx = ctx

    @abstractmethod
    def plan(self) -> dict:
        """The plan as JSON: written to plan.json and shipped to every role process."""

    @abstractmethod
    def role_devices(self) -> dict[str, str]:
        """Every role of the run and the device it runs on (in a stable order)."""

    @abstractmethod
    def role_spec(self, role: str) -> RoleSpec:
        """What `role` needs of the plan and the config, as a frozen `framework.specs.RoleSpec`:
        made on the coordinator, shipped to the role's process as JSON."""

    @abstractmethod
    def role_from_spec(self, role: str, spec: dict) -> Role:
        """Build `role` from its spec as shipped (JSON) and this process's parts (`self.ctx`:
        model, dataset, cluster, compressor); the role keeps no reference to the scheduler."""

    def build_role(self, role: str) -> Role:
        """`role` built in this process the way a role process builds it: from its spec's JSON."""
        return self.role_from_spec(role, self.role_spec(role).to_json())

    @abstractmethod
    def eval_model(self, states: dict[str, dict]) -> nn.Module:
        """The model to evaluate, from the roles' `state()`s (only roles with state appear)."""

    def planned_epoch_s(self) -> float | None:
        """The epoch the plan predicts, in seconds of the run's clock (None: this schedule makes no
        prediction). Every run records it as `plan/predicted_epoch_s` beside the epoch it took,
        and their ratio `plan/epoch_over_predicted`: a planner earns trust when it predicts what
        the simulator then measures."""
        return None

    def optional_roles(self) -> set[str]:
        """Roles whose loss a real runtime survives (each is told through `PeerLost`); the loss
        of any other role fails the run."""
        return set()

    def iterations_per_epoch(self) -> int:
        """Iterations the progress bar and metrics count per epoch."""
        return self.ctx.iterations_per_epoch()

    def samples_per_epoch(self) -> int:
        return min(len(self.ctx.dataset.x_train), self.iterations_per_epoch() * int(self.ctx.cfg.train.batch_size))

    def epoch_metrics(self, epoch: int, start: float, end: float, timeline) -> dict[str, float]:
        """Scheduler-specific metrics of one epoch, [start, end) on the run's clock."""
        return {}

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        """Summary sections and final metrics: {"summary": {...}, "metrics": {...}}. The default
        gathers the roles' `peak_inflight` and `staleness` counters."""
        peak = {r: s["peak_inflight"] for r, s in role_stats.items() if "peak_inflight" in s}
        stale = [x for s in role_stats.values() for x in s.get("staleness", [])]
        mean = sum(stale) / len(stale) if stale else 0.0
        metrics = {"pipe/staleness": mean} if stale else {}
        return {"summary": {"peak_inflight": peak, "staleness": {"mean": mean, "max": max(stale, default=0)}}, "metrics": metrics}

    def check_runtime(self, runtime: str) -> None:
        if runtime not in self.runtimes:
            raise ConfigError("runtime.name", f"scheduler {self.cfg.name!r} runs on runtime={', '.join(self.runtimes)}; got runtime={runtime}")


class ProgramRole(Role):
    """A role from a bare program (tests, trial runs): no state of its own."""

    def __init__(self, device: str, program):
        self.device = device
        self.program = program

    async def run(self, ctx) -> None:
        await self.program(ctx)
