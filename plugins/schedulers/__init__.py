"""Built-in schedulers, declared (framework.registry.declare): the code is imported when a
scheduler is built."""

from framework.objective import declare_metrics
from framework.registry import declare
from plugins.schedulers.schemas import AdaLearnerConfig, CollabConfig, EdgeOnlyConfig, FeatureReplayConfig, FLConfig, JointDNNConfig, GPipeConfig, LocalConfig, OneFOneBConfig, PipeDreamConfig, SFLConfig, SLConfig, SuperNeuronConfig

declare("scheduler", "1f1b", "plugins.schedulers.classic:OneFOneB", schema=OneFOneBConfig,
        doc="1F1B with a flush (PipeDream-flush / DAPPLE): GPipe's bubble, at most S micro-batches alive.")
declare("scheduler", "fl", "plugins.schedulers.collaborative:FL", schema=FLConfig,
        doc="FedAvg: whole model on every device, average every epoch (PiPar with P = Q, N = 1)")
declare("scheduler", "gpipe", "plugins.schedulers.classic:GPipe", schema=GPipeConfig,
        doc="GPipe: every forward, then every backward, then one synchronous step (Huang et al. 2019).")
declare("scheduler", "local", "plugins.schedulers.classic:Local", schema=LocalConfig,
        doc="One device, the reference loop: gradient accumulation over micro-batches, one step.")
declare("scheduler", "pipar", "plugins.schedulers.collaborative:PiPar", schema=CollabConfig,
        doc="PiPar: split at P, N pipelined micro-batches per device, K server replicas, FedAvg")
declare("scheduler", "pipedream", "plugins.schedulers.classic:PipeDream", schema=PipeDreamConfig,
        doc="PipeDream: asynchronous 1F1B over whole mini-batches with weight stashing (Narayanan et al. 2019).")
declare("scheduler", "sfl", "plugins.schedulers.collaborative:SFL", schema=SFLConfig,
        doc="SplitFed: N = 1 at the best split point, server replicas or one shared server model")
declare("scheduler", "sl", "plugins.schedulers.sl:SL", schema=SLConfig, doc="vanilla split learning: N = 1, one server model, devices train in turn")
declare("scheduler", "feature_replay", "plugins.schedulers.feature_replay:FeatureReplay", schema=FeatureReplayConfig,
        doc="context-aware feature replay: edge/cloud 4-module pipeline, stale gradients replayed through current weights (Yao et al. 2021)")
declare("scheduler", "jointdnn", "plugins.schedulers.feature_replay:JointDNN", schema=JointDNNConfig,
        doc="JointDNN: the best static edge/cloud cut, trained serially (feature replay's baseline)")
declare("scheduler", "edge_only", "plugins.schedulers.feature_replay:EdgeOnly", schema=EdgeOnlyConfig,
        doc="the whole model trained on the edge device (feature replay's baseline)")
declare("scheduler", "super_neuron", "plugins.schedulers.super_neuron:SuperNeuron", schema=SuperNeuronConfig,
        doc="EdgePipe: super neurons (neuron chunks over contiguous layers) per device, Eq. 2 slot schedule, lossy links (Yoon et al. 2022)")
declare("scheduler", "adalearner", "plugins.schedulers.adalearner:AdaLearner", schema=AdaLearnerConfig,
        doc="AdaLearner: data parallelism over one shared WLAN, fp32 or 1-bit error feedback, Algorithm 1 picks n (Mao et al.)")

# the metrics these schedulers record beside the core's (what tracking.optimized_metric may name)
declare_metrics(
    "idle/server_s", "idle/device_mean_s", "idle/device_max_s", "plan/P", "plan/N", "plan/predicted_iter_s", "plan/search_s",  # pipar, fl, sfl, sl
    "plan/n", "plan/predicted_iteration_s", "adalearner/iteration_s", "adalearner/speedup_vs_local", "adalearner/estimate_error",  # adalearner
    "replay/discarded", "replay/peak_history", "replay/migrations",  # feature_replay
    "net/data_per_message", "net/packets_per_message", "net/messages_sent", "plan/messages_per_minibatch", "plan/slot_s", "plan/mean_prr",  # super_neuron
    *(f"test/lossy_acc_{k}" for k in ("mean", "std", "min", "frac_below_0.3")), "edgepipe/<rate>/<layer>",
)
