"""Context-aware feature replay (Yao et al. 2021): an edge/cloud pipeline whose stale gradients are
replayed through the current weights, with its baselines JointDNN and edge-only.

- scheduler: the three schedulers; plan: their plan, typed; pricing: each cut's module times
- role_specs: what each role is built from; side: what both roles share (the messages, a side's
  units); upstream / downstream: the replaying (edge) and the training (cloud) role;
  replay_stage: the upstream stage's history queue; meters: the link-rate and drift estimates
- cost: the paper's cost model and decision engine (sections 4.4-4.5); pipeline: the
  policy-aware cost model (the epoch under the edge's staleness policy); engine: Alg. 2 over the
  plan's profile, as the coordinator and the adaptive edge run it
"""

from framework.registry import declare
from framework.tracking.objective import declare_metrics
from plugins.schedulers.feature_replay.schema import EdgeOnlyConfig, FeatureReplayConfig, JointDNNConfig

declare("scheduler", "feature_replay", "plugins.schedulers.feature_replay.scheduler:FeatureReplay", schema=FeatureReplayConfig,
        doc="context-aware feature replay: edge/cloud 4-module pipeline, stale gradients replayed through current weights (Yao et al. 2021)")
declare("scheduler", "jointdnn", "plugins.schedulers.feature_replay.scheduler:JointDNN", schema=JointDNNConfig,
        doc="JointDNN: the best static edge/cloud cut, trained serially (feature replay's baseline)")
declare("scheduler", "edge_only", "plugins.schedulers.feature_replay.scheduler:EdgeOnly", schema=EdgeOnlyConfig,
        doc="the whole model trained on the edge device (feature replay's baseline)")

declare_metrics("replay/discarded", "replay/peak_history", "replay/migrations")
