"""Built-in latency predictors, declared (framework.registry.declare)."""

from framework.registry import declare
from plugins.predictors.schemas import AcceptConfig, CapacityConfig, FlopsConfig, LutConfig, OracleConfig

declare("predictor", "flops", "plugins.predictors.basic:FlopsPredictor", schema=FlopsConfig,
        doc="FLOPs / rate: blind to per-layer-type speed, the classic planner assumption.")
declare("predictor", "oracle", "plugins.predictors.basic:OraclePredictor", schema=OracleConfig,
        doc="The device's own time model (exact on the simulator; FLOPs for `measured` devices).")
declare("predictor", "lut", "plugins.predictors.profiled:LutPredictor", schema=LutConfig,
        doc="Each unit's time measured alone on the device, summed (AccEPT's LUT baseline).")
declare("predictor", "capacity", "plugins.predictors.profiled:CapacityPredictor", schema=CapacityConfig,
        doc="FTPipeHD's computing-power ratio: the central node's per-unit profile, scaled per device.")
declare("predictor", "accept", "plugins.predictors.accept:AcceptPredictor", schema=AcceptConfig,
        doc="AccEPT's dual-stream MLP over a sub-model's units and the device's 10 representative times.")
