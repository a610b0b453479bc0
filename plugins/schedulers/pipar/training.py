"""What the roles and the scheduler compute alike from the run's parts (framework.scheduler.
SchedulerContext): a device's batches, its links' bandwidths, a role's own copy of the model."""

from __future__ import annotations

from framework.data import batches, split_microbatches
from framework.models import clone_module
from plugins.schedulers.pipar.iteration import SERVER


def own_copy(parts, numerics: bool):
    """A role's private copy of the initial model (timing-only runs share the untouched one)."""
    return clone_module(parts.model) if numerics else parts.model


def device_batches(parts, k: int, indices, micro_batch: int, n_mb: int, epoch: int, iterations: int) -> list:
    """Device k's iterations in `epoch`: N micro-batches of B' samples each, from its own shard
    (`indices`) in a seeded order; the epoch's tail that fills no iteration is skipped (Alg. 1)."""
    ds = parts.dataset
    seed = parts.cfg.seed * 7919 + k
    return [(split_microbatches(x, n_mb), split_microbatches(y, n_mb))
            for x, y in batches(ds.x_train, ds.y_train, micro_batch * n_mb, seed, epoch, indices=indices, drop_last=True, limit=iterations)]


def bandwidths(cluster, device: str, t: float) -> tuple[float, float]:
    """(uplink, downlink) bandwidth between `device` and the server at time t."""
    return cluster.link(device, SERVER).bandwidth_at(t), cluster.link(SERVER, device).bandwidth_at(t)
