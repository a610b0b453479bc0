"""What each of feature replay's roles needs of the plan and of `scheduler.*`: its spec, made by
the scheduler on the coordinator and shipped as JSON (framework.specs)."""

from __future__ import annotations

from dataclasses import dataclass

from framework.specs import Data, RoleSpec
from plugins.schedulers.feature_replay.plan import Profile


@dataclass(frozen=True)
class StalenessBound(Data):
    """The edge's staleness bound per epoch: `K` (None: unbounded), changed to each entry's value
    from its epoch on (`scheduler.K_schedule`, sorted by epoch)."""

    K: int | None
    changes: tuple[tuple[int, int | None], ...] = ()

    @classmethod
    def of(cls, K, schedule) -> "StalenessBound":
        """From the config's `K` and `K_schedule` ([[epoch, K], ...])."""
        as_k = lambda v: None if v is None else int(v)  # noqa: E731
        return cls(as_k(K), tuple(sorted((int(e), as_k(v)) for e, v in (schedule or []))))

    def at(self, epoch: int) -> int | None:
        k = self.K
        for start, value in self.changes:
            if epoch >= start:
                k = value
        return k


@dataclass(frozen=True)
class SideSpec(RoleSpec):
    cut: int  # units on the upstream side at the start: it holds [0, cut), the downstream side [cut, L)
    reversed: bool  # the cloud is upstream (a generative model): the downstream party keeps the targets


@dataclass(frozen=True)
class DownstreamSpec(SideSpec):
    """P3: the other side needs only where the cut is and who holds the targets."""


@dataclass(frozen=True)
class UpstreamSpec(SideSpec):
    """P1: the staleness policy it enforces, and what its online engine re-decides with."""

    K: StalenessBound
    staleness_policy: str
    price_replay: bool  # charge the replay's forward to the device
    adaptive: bool  # re-run the engine every iteration and migrate the cut
    profile: Profile  # the plan's: the engine's tables and each message's bytes and encoding time
    cost_model: str  # the engine's M: policy | paper
    include_edge_only: bool
    iterations_per_epoch: int  # tau's start (Eq. 14)
    tau_beta: float
    rate_beta: float
    drift_lags: tuple[int, ...]
