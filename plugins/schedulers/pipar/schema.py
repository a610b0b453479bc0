"""The config schema of PiPar and its baselines (FL, SFL, SL) (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from framework.config.knobs import Range, knob
from framework.config.schemas import SchedulerConfig


@dataclass
class CollabConfig(SchedulerConfig):
    name: str = "pipar"
    P: Optional[int] = knob(None, "split point: units 1..P on the device; null = chosen by `select`")
    N: Optional[int] = knob(None, "parallel batch number (micro-batches per iteration); null = chosen by `select`")
    select: str = knob(
        "auto",
        "how (P, N) is chosen: auto (every (P, N) on Table I as the run prices it: shared server, real micro-batch costs) | paper (Sec. III-C as published: profile one iteration at batch B, scale it linearly, Eq. 14's N(P), argmin) | exhaustive (one timing-only trial iteration per (P, N): the paper's \"Opt\") | refine (paper's shortlist, then a few trials)",
        choices=("auto", "paper", "exhaustive", "refine"),
    )
    max_device_units: Optional[int] = knob(None, "Q': most units a device may hold; null = Q - 1")
    n_clamp: bool = knob(True, "N <= min(B/2, 100), then N = B // (B // N) (the authors' code)")
    estimator: str = knob("table1", "table1 (the paper's DAG, corrected) | code_legacy (the authors' code's DAG)", choices=("table1", "code_legacy"))
    server_mode: str = knob("parallel", "parallel: K replicas at once (Fig. 3c) | sequential (Fig. 3b)", choices=("parallel", "sequential"))
    aggregate_every: int = knob(1, "epochs between FedAvg rounds", range=Range(1, integer=True, note="epochs between FedAvg rounds"))
    shard: str = knob("contiguous", "contiguous | dirichlet (non-IID, outside the paper)", choices=("contiguous", "dirichlet"))
    # checked whatever the shard: a sweep may switch dirichlet on
    dirichlet_alpha: float = knob(0.5, "shard=dirichlet: the concentration (small = few labels per device)", range=Range(0, low_open=True, note="the Dirichlet concentration of scheduler.shard=dirichlet: small = few labels per device"))
    failures: List[List[int]] = knob([], "[[device, epoch], ...]: the device drops out for that epoch's round; or [[device, epoch, after_iterations]]")
    dp_sigma: float = knob(0.0, "Gaussian noise (std dp_sigma x clip) on uploaded device models (classic DP overhead study); 0 = off", range=Range(0))
    dp_clip: Optional[float] = knob(None, "clip the uploaded parameter vector to this L2 norm first; null = no clipping", range=Range(0, low_open=True, null=True))
    reselect: bool = knob(True, "re-select (P, N) at the next epoch boundary after a device's link bandwidth changed")
    reselect_mode: str = knob("full_profile", "full_profile (pays a profiling iteration, as the paper) | reestimate_only", choices=("full_profile", "reestimate_only"))


@dataclass
class FLConfig(CollabConfig):
    name: str = "fl"
    P: Optional[int] = knob(None, "fixed by fl: P = Q (the whole model on the device)")
    N: Optional[int] = knob(None, "fixed by fl: N = 1")


@dataclass
class SFLConfig(CollabConfig):
    name: str = "sfl"
    N: Optional[int] = knob(None, "fixed: N = 1")
    server_model: str = knob("per_device", "per_device (replicas, FedAvg'd; the notes' decision 12) | shared (one server model)", choices=("per_device", "shared"))


@dataclass
class SLConfig(CollabConfig):
    name: str = "sl"
    N: Optional[int] = knob(None, "fixed: N = 1")
