"""Built-in latency predictors, declared (framework.registry.declare), and AccEPT's re-planning,
the online half of its adaptive predictor, declared as the pipeline stages' epoch-end policy
(framework.pipeline.epoch_end.declare)."""

from framework.pipeline import epoch_end as pipeline_epoch_end
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

# AccEPT's dynamic prediction: stages report their times, stage 0 re-plans the cuts when one drifts past scheduler.replan_epsilon
pipeline_epoch_end.declare("accept_replan", "plugins.predictors.accept_replan:Replanning", knobs=("replan_epsilon",))
