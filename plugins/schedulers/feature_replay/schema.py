"""The config schema of context-aware feature replay and its baselines (JointDNN, edge-only) (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from framework.config.knobs import Range, knob
from framework.config.schemas import SchedulerConfig


@dataclass
class FeatureReplayConfig(SchedulerConfig):
    name: str = "feature_replay"
    K: Optional[int] = knob(5, "staleness bound t - t' <= K; null = unbounded (the full pipeline, Eq. 11)", range=Range(0, integer=True, null=True, note="null: unbounded"))
    K_schedule: List[List[Any]] = knob([], "[[epoch, K], ...]: from that epoch on, e.g. [[8, 5]] after K=4 (BI-LSTM), [[3, 6]] after K=5 (TinyImageNet)")
    staleness_policy: str = knob(
        "block",
        "block (the official code) | fixed (gradient of t-K after forward t: timing-independent) | group (Eq. 12) | discard",
        choices=("block", "fixed", "group", "discard"),
    )
    cut: Optional[int] = knob(None, "units on the edge (1..L; L = edge-only); null = the decision engine's choice (Alg. 2, Eq. 12 + 13)")
    edge_device: str = knob("dev0", "the edge device")
    cloud_device: Optional[str] = knob(None, "null: the cluster's `cloud` device, else its `server`")
    price_replay: bool = knob(True, "charge the replay's forward: it costs what a forward costs (the device runs it; the paper's T1); false: an ablation, the official cost model's T1 (measured iteration + compression)")
    cost_model: str = knob(
        "policy",
        "the plan's predicted epoch and the engine's cost: policy (walks the staleness policy's pipeline) | paper (Eq. 10/12, Alg. 2 as printed)",
        choices=("policy", "paper"),
    )
    include_edge_only: bool = knob(True, "the engine may choose edge-only (the code, section 6.3; section 4.5 excludes it)")
    adaptive: bool = knob(True, "the edge re-runs the engine every iteration on measured link rates and migrates the cut (Alg. 2)")
    tau_beta: float = knob(0.8, "Eq. 14's EWMA (the code's value); tau starts at the iterations per epoch")
    rate_beta: float = knob(0.8, "EWMA of the measured link rates (the notes' proposal; the code does not smooth)")
    upstream: str = knob(
        "edge",
        "the party with the inputs and units [0, cut) that replays: edge (discriminative models) | cloud (generative: the cloud holds the input side and replays, the edge the output side and the targets)",
        choices=("edge", "cloud"),
    )
    drift_lags: List[int] = knob([], "record std(w^t - w^{t-k}) of the edge's weights per epoch in summary.json for these k, e.g. [4, 5, 6] (Fig. 4)")


@dataclass
class JointDNNConfig(FeatureReplayConfig):
    name: str = "jointdnn"
    K: Optional[int] = 0


@dataclass
class EdgeOnlyConfig(FeatureReplayConfig):
    name: str = "edge_only"
