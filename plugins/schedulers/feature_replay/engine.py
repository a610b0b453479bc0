"""The decision engine as the plan and the adaptive upstream side run it: Alg. 2 over the plan's
profile (plugins.schedulers.feature_replay.cost) with the configured cost M, at the run's one
uplink width. The coordinator decides the first cut with it; the upstream side builds its own
from its spec and re-decides every iteration on the rates it measures.
"""

from __future__ import annotations

from framework.config.knobs import choices
from plugins.schedulers.feature_replay import cost, pipeline
from plugins.schedulers.feature_replay.plan import Profile
from plugins.schedulers.feature_replay.schema import FeatureReplayConfig

COST_MODELS = choices(FeatureReplayConfig, "cost_model")


def cost_model(name: str, policy: str):
    """The engine's M: `paper` (Eq. 12) or `policy` (the staleness policy's pipeline)."""
    return cost.paper_cost if name == "paper" else pipeline.policy_cost(policy)


def cut_profile(profile: Profile) -> cost.CutProfile:
    """The engine's CutProfile from the plan's profile: compression is inside edge_s (and
    edge_send_s) and the uplink bytes are the compressed packet's, so the engine prices transfers
    at 32 'bits' of those bytes (the run's bit width is the compressor's; switching widths online
    is not done)."""
    return cost.CutProfile(profile.edge_s, profile.cloud_s, profile.uplink_bytes[:-1], lambda c, b: 0.0, profile.block_bytes,
                           down_bytes=profile.downlink_bytes[:-1], send_s=profile.edge_send_s, cloud_step_s=profile.cloud_step_s,
                           latency_s=profile.latency_s, overhead_s=profile.overhead_s)


class Engine:
    """Alg. 2 with one cost model over one profile."""

    def __init__(self, profile: Profile, cost_model_name: str, policy: str, include_edge_only: bool):
        self.profile = cut_profile(profile)
        self.cost = cost_model(cost_model_name, policy)
        self.include_edge_only = include_edge_only

    def decide(self, cut: int, K: int | None, r_up: float, r_down: float, tau: float) -> cost.Decision:
        """The deployment of least M + U from the current `cut` (moving costs its weights)."""
        return cost.decide(self.profile, cost.Deployment(cut, 32), K, r_up, r_down, tau, bits_candidates=(32,),
                           include_edge_only=self.include_edge_only, model=self.cost)
