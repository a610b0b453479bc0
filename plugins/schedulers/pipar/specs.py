"""What the coordinator decides, as typed data: the plan of a collaborative run (written to
plan.json, shipped to every role process) and each role's spec, its slice of that plan and the
knobs it reads (framework.specs). A role is built from its spec and the run's parts; it never
sees the scheduler.

- `DevicePlan`: one device's (P, N) and its predicted times; `CollabPlan`: the whole plan
  (plan.json is its JSON, key for key);
- `PlannerKnobs`: what the (P, N) planner reads of `cfg.scheduler` (the server role builds its
  own planner from them to re-select);
- `DeviceSpec`, `ServerSpec`, `FedSpec`: the roles of PiPar, FL and SFL (SL's use the first two).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from framework.specs import Data, RoleSpec


@dataclass(frozen=True)
class DevicePlan(Data):
    """One device's (P, N) and what its training is predicted to take (iterations only; the
    epoch's model exchange is the planner's `epoch_end_s`)."""

    P: int
    N: int
    micro_batch: int
    predicted_iter_s: float
    predicted_epoch_s: float
    shortlist: tuple[dict, ...] = ()  # the candidates or trials it was chosen from (plan.json only)
    paper_epoch_s: float | None = None  # select=paper: the paper's own estimate of this plan's epoch

    def lean(self) -> DevicePlan:
        """The plan without its shortlist: what roles, checkpoints and summaries keep."""
        return dataclasses.replace(self, shortlist=()) if self.shortlist else self

    def without_shortlist(self) -> dict:
        """The JSON of `lean()` (a deep copy of the shortlist cost each checkpoint 4 ms at K = 16)."""
        return self.lean().to_json()


@dataclass(frozen=True)
class DeviceRecord(Data):
    """One device in plan.json: its plan and what it trains per epoch."""

    device: str
    P: int
    N: int
    micro_batch: int
    iterations_per_epoch: int
    shard_size: int
    predicted_iter_s: float
    predicted_epoch_s: float
    plan: DevicePlan

    @classmethod
    def of(cls, device: str, plan: DevicePlan, iterations: int, shard_size: int) -> DeviceRecord:
        return cls(device, plan.P, plan.N, plan.micro_batch, iterations, shard_size, plan.predicted_iter_s, plan.predicted_epoch_s, plan.lean())


@dataclass(frozen=True)
class CollabPlan(Data):
    """The plan of a PiPar, FL, SFL or SL run. P, N, micro_batch, predicted_iter_s and
    paper_epoch_s are one value when every device has the same plan, else one per device."""

    scheduler: str
    select: str  # the method that chose (P, N), or "fixed" (scheduler.P and scheduler.N set)
    P: int | list[int]
    N: int | list[int]
    micro_batch: int | list[int]
    predicted_iter_s: float | list[float]
    predicted_epoch_s: float  # the slowest device's training and the model exchange
    paper_epoch_s: float | list[float | None] | None
    server_share: float
    search_s: float
    search_wall_s: float
    num_units: int
    devices: tuple[DeviceRecord, ...]
    server_roles: dict[str, tuple[int, ...]]  # server-side training role -> the devices it serves
    shortlist_dev0: tuple[dict, ...]

    @classmethod
    def of(cls, *, scheduler: str, select: str, plans: list[DevicePlan], records: list[DeviceRecord], predicted_epoch_s: float, server_share: float,
           search_s: float, search_wall_s: float, num_units: int, server_roles: dict[str, tuple[int, ...]]) -> CollabPlan:
        uniform = len({(p.P, p.N) for p in plans}) == 1

        def each(name: str):
            return getattr(plans[0], name) if uniform else [getattr(p, name) for p in plans]

        return cls(scheduler, select, each("P"), each("N"), each("micro_batch"), each("predicted_iter_s"), predicted_epoch_s, each("paper_epoch_s"), server_share,
                   search_s, search_wall_s, num_units, tuple(records), server_roles, plans[0].shortlist)

    def plans(self) -> list[DevicePlan]:
        return [d.plan for d in self.devices]


@dataclass(frozen=True)
class PlannerKnobs(Data):
    """What the (P, N) planner reads of `cfg.scheduler` (pipar.planner.Planner)."""

    kind: str  # pipar, fl, sfl or sl: which of P and N it pins
    select: str
    P: int | None
    N: int | None
    max_device_units: int | None
    n_clamp: bool
    estimator: str
    dp_sigma: float
    serial_server: bool  # one server role serves the devices in turn: no replicas share its cores


@dataclass(frozen=True)
class Shard(Data):
    """A device's training samples: the block [start, stop) of the training split, or (when they
    are not one block, e.g. Dirichlet shards) their indices."""

    start: int
    stop: int
    indices: tuple[int, ...] | None = None

    @classmethod
    def of(cls, indices: torch.Tensor) -> Shard:
        n = len(indices)
        first = int(indices[0]) if n else 0
        if n == 0 or torch.equal(indices, torch.arange(first, first + n, dtype=indices.dtype)):
            return cls(first, first + n)
        return cls(0, n, tuple(indices.tolist()))

    @property
    def size(self) -> int:
        return self.stop - self.start if self.indices is None else len(self.indices)

    def tensor(self) -> torch.Tensor:
        """The indices as the scheduler's shard had them (int64)."""
        return torch.arange(self.start, self.stop) if self.indices is None else torch.tensor(self.indices, dtype=torch.int64)


@dataclass(frozen=True)
class CollabRoleSpec(RoleSpec):
    """What every role of a collaborative run knows of its rounds."""

    epochs: int
    aggregate_every: int
    iteration_cap: int  # train.iterations_per_epoch (0: the whole shard)

    def aggregates(self, epoch: int) -> bool:
        return aggregates(epoch, self.aggregate_every, self.epochs)

    def iterations(self, shard_size: int, plan: DevicePlan) -> int:
        return iterations_per_epoch(shard_size, plan, self.iteration_cap)


def aggregates(epoch: int, every: int, epochs: int) -> bool:
    """Whether the models meet (FedAvg) at the end of `epoch`: every `every` epochs and after the last."""
    return (epoch + 1) % every == 0 or epoch == epochs - 1


def iterations_per_epoch(shard_size: int, plan: DevicePlan, cap: int) -> int:
    """Iterations a device trains per epoch: as many N x B' as its shard holds, at most `cap` (0: no cap)."""
    n = shard_size // (plan.micro_batch * plan.N)
    return min(n, cap) if cap else n


def active_iterations(n: int, failures: dict[int, int], epoch: int) -> tuple[int, bool]:
    """(iterations a device trains in `epoch` of its `n`, whether it is connected at the epoch's
    end), from its scripted failures (epoch -> iterations it trains before it drops)."""
    if epoch in failures:
        return min(n, failures[epoch]), False
    return n, True


@dataclass(frozen=True)
class DeviceSpec(CollabRoleSpec):
    """dev<k>: its plan, its shard and its server; DP noise and re-selection knobs."""

    k: int
    plan: DevicePlan
    shard: Shard
    server: str | None  # the server-side role that serves it (None: no split, FL)
    failures: dict[int, int]  # epoch -> iterations trained before it drops out (scheduler.failures)
    dp_sigma: float
    dp_clip: float | None
    reselect_mode: str
    profile_units: int  # units a re-selection's profiling iteration runs: the most a device may hold


@dataclass(frozen=True)
class ServerSpec(CollabRoleSpec):
    """srv<k>, or `server` serving several devices in turn: each device's plan, its shard size
    and failures, and the planner's knobs for re-selection."""

    devices_served: tuple[int, ...]
    shared: bool  # one server model for all of them (SFL's server_model=shared)
    plans: dict[int, DevicePlan]
    shard_sizes: dict[int, int]
    failures: dict[int, dict[int, int]]  # device -> its scripted failures (devices with none left out)
    reselect_mode: str
    planner: PlannerKnobs


@dataclass(frozen=True)
class FedSpec(CollabRoleSpec):
    """fed: each device's split point, who serves it, who fails when; whether to re-select."""

    cuts: tuple[int, ...]  # device k's P
    server_roles: dict[str, tuple[int, ...]]
    failures: dict[int, dict[int, int]]
    reselect: bool  # re-select at a round when a device's link bandwidth changed

    def server_of(self) -> dict[int, str]:
        """Device -> its server role."""
        return {k: r for r, ks in self.server_roles.items() for k in ks}
