"""AdaLearner (Mao et al.): synchronous data parallelism over one shared WLAN, fp32 or 1-bit
error-feedback gradients, Algorithm 1 choosing the number of workers n.

- scheduler: the scheduler; roles: the group owner and the worker nodes
- plan: the minibatch split and an iteration's communication (notes 2.3-2.8, Eq. 4, 7-9);
  planner: Algorithm 1 over a run's devices; fifo: the iteration as the FIFO star runs it
"""

from framework.registry import declare
from framework.tracking.objective import declare_metrics
from plugins.schedulers.adalearner.schema import AdaLearnerConfig

declare("scheduler", "adalearner", "plugins.schedulers.adalearner.scheduler:AdaLearner", schema=AdaLearnerConfig,
        doc="AdaLearner: data parallelism over one shared WLAN, fp32 or 1-bit error feedback, Algorithm 1 picks n (Mao et al.)")

declare_metrics("plan/n", "plan/predicted_iteration_s", "adalearner/iteration_s", "adalearner/speedup_vs_local", "adalearner/estimate_error")
