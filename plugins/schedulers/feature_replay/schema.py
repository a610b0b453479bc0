"""The config schema of context-aware feature replay and its baselines (JointDNN, edge-only) (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from framework.config import SchedulerConfig


@dataclass
class FeatureReplayConfig(SchedulerConfig):
    name: str = "feature_replay"
    K: Optional[int] = 5  # staleness bound t - t' <= K; null = unbounded (the full pipeline, Eq. 11)
    K_schedule: List[List[Any]] = field(default_factory=list)  # [[epoch, K], ...]: from that epoch on (e.g. [[8, 5]] after K=4)
    staleness_policy: str = "block"  # block (the official code) | fixed (gradient of t-K after forward t: timing-independent) | group (Eq. 12) | discard
    cut: Optional[int] = None  # units on the edge (1..L; L = edge-only); null = the decision engine's choice (Alg. 2)
    edge_device: str = "dev0"
    cloud_device: Optional[str] = None  # null: the cluster's `cloud` device, else its `server`
    price_replay: bool = True  # charge the replay's forward (the device runs it; the paper's T1); false: an ablation, the official cost model's T1 (profile + compression)
    cost_model: str = "policy"  # the plan's prediction and the engine's cost: policy (walks the staleness policy's pipeline) | paper (Eq. 10/12, Alg. 2 as printed)
    include_edge_only: bool = True  # the engine may choose edge-only (the code, section 6.3; section 4.5 excludes it)
    adaptive: bool = True  # the edge re-runs the engine every iteration on measured bandwidths and migrates the cut (Alg. 2)
    tau_beta: float = 0.8  # Eq. 14's EWMA (the code's value); tau starts at the iterations per epoch
    rate_beta: float = 0.8  # EWMA of the measured link rates (the notes' proposal; the code does not smooth)
    upstream: str = "edge"  # the party with the inputs and units [0, cut) that replays: edge | cloud (generative models: the edge keeps the targets)
    drift_lags: List[int] = field(default_factory=list)  # record std(w^t - w^{t-k}) of the edge's weights per epoch for these k (Fig. 4)


@dataclass
class JointDNNConfig(FeatureReplayConfig):
    name: str = "jointdnn"
    K: Optional[int] = 0


@dataclass
class EdgeOnlyConfig(FeatureReplayConfig):
    name: str = "edge_only"
