"""Built-in latency predictors, declared (framework.registry.declare)."""

from framework.registry import declare
from plugins.predictors.schemas import FlopsConfig, OracleConfig

declare("predictor", "flops", "plugins.predictors.basic:FlopsPredictor", schema=FlopsConfig,
        doc="FLOPs / rate: blind to per-layer-type speed, the classic planner assumption.")
declare("predictor", "oracle", "plugins.predictors.basic:OraclePredictor", schema=OracleConfig,
        doc="The device's own time model (exact on the simulator; FLOPs for `measured` devices).")
