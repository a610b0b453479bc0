"""The config schema of PiPar and its baselines (FL, SFL, SL) (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from framework.config import SchedulerConfig


@dataclass
class CollabConfig(SchedulerConfig):
    name: str = "pipar"
    P: Optional[int] = None  # split point: units 1..P on the device; null = chosen by `select`
    N: Optional[int] = None  # micro-batches per iteration; null = chosen by `select`
    select: str = "auto"  # auto (every (P, N) on Table I as the run prices it: shared server, real micro-batch costs) | paper (Sec. III-C as published) | exhaustive (one trial iteration per (P, N)) | refine (paper's shortlist, then trials)
    max_device_units: Optional[int] = None  # Q': most units a device may hold; null = Q - 1
    n_clamp: bool = True  # N <= min(B/2, 100), snapped to B // (B // N) (the authors' code)
    estimator: str = "table1"  # table1 (the paper, corrected) | code_legacy (the authors' code's DAG)
    server_mode: str = "parallel"  # parallel: K replicas at once (Fig. 3c) | sequential (Fig. 3b)
    aggregate_every: int = 1  # epochs between FedAvg rounds
    shard: str = "contiguous"  # contiguous | dirichlet (non-IID, outside the paper)
    dirichlet_alpha: float = 0.5
    failures: List[List[int]] = field(default_factory=list)  # [[device, epoch], ...] or [[device, epoch, after_iterations]]
    dp_sigma: float = 0.0  # Gaussian noise (std dp_sigma x clip) on uploaded device models; 0 = off
    dp_clip: Optional[float] = None  # clip the uploaded parameter vector to this L2 norm first; null = no clipping
    reselect: bool = True  # re-select (P, N) at an epoch boundary when a device's link bandwidth changed
    reselect_mode: str = "full_profile"  # full_profile (pays a profiling iteration, as the paper) | reestimate_only


@dataclass
class FLConfig(CollabConfig):
    name: str = "fl"


@dataclass
class SFLConfig(CollabConfig):
    name: str = "sfl"
    server_model: str = "per_device"  # per_device (replicas, FedAvg'd) | shared (one server model)


@dataclass
class SLConfig(CollabConfig):
    name: str = "sl"
