"""PiPar (collaborative split learning with pipelined micro-batches and server replicas) and the
baselines it compares against: FL (FedAvg), SFL (SplitFed) and vanilla SL.

- scheduler: PiPar, FL, SFL; sl: SL; roles: the device and server roles; aggregator: the FedAvg role
- specs: the typed plan (plan.json) and each role's spec, what a role is built from with the
  run's parts (never the scheduler); training: what roles and scheduler compute alike (batches)
- plan / planner / search / refine: choosing (P, N) (Sec. III-C, trial iterations, the shortlist)
- fedavg: the aggregation (a pure function); model_vectors: split models as flat vectors
- idle: the server's and devices' idle times (Figs 4-7)
"""

from framework.registry import declare
from framework.tracking.objective import declare_metrics
from plugins.schedulers.pipar.schema import CollabConfig, FLConfig, SFLConfig, SLConfig

declare("scheduler", "fl", "plugins.schedulers.pipar.scheduler:FL", schema=FLConfig,
        doc="FedAvg: whole model on every device, average every epoch (PiPar with P = Q, N = 1)")
declare("scheduler", "pipar", "plugins.schedulers.pipar.scheduler:PiPar", schema=CollabConfig,
        doc="PiPar: split at P, N pipelined micro-batches per device, K server replicas, FedAvg")
declare("scheduler", "sfl", "plugins.schedulers.pipar.scheduler:SFL", schema=SFLConfig,
        doc="SplitFed: N = 1 at the best split point, server replicas or one shared server model")
declare("scheduler", "sl", "plugins.schedulers.pipar.sl:SL", schema=SLConfig, doc="vanilla split learning: N = 1, one server model, devices train in turn")

# the metrics these schedulers record beside the core's (what tracking.optimized_metric may name)
declare_metrics("idle/server_s", "idle/device_mean_s", "idle/device_max_s", "plan/P", "plan/N", "plan/predicted_iter_s", "plan/search_s")
