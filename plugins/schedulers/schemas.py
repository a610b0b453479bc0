"""The config schemas of the built-in schedulers (dataclasses only: importing this imports no
torch; see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from framework.config import PipelineConfig, SchedulerConfig


@dataclass
class LocalConfig(PipelineConfig):
    name: str = "local"


@dataclass
class GPipeConfig(PipelineConfig):
    name: str = "gpipe"
    microbatches: int = 4


@dataclass
class OneFOneBConfig(PipelineConfig):
    name: str = "1f1b"
    microbatches: int = 4


@dataclass
class PipeDreamConfig(PipelineConfig):
    name: str = "pipedream"
    # mini-batches stage 0 admits before its first backward; null: one per stage (FTPipeHD's
    # semaphore). 2S-1 also counts each link as a stage (PipeDream's planner): see one_f_one_b
    in_flight: Optional[int] = None


@dataclass
class CollabConfig(SchedulerConfig):
    name: str = "pipar"
    P: Optional[int] = None  # split point: units 1..P on the device; null = chosen by `select`
    N: Optional[int] = None  # micro-batches per iteration; null = chosen by `select`
    select: str = "auto"  # auto (every (P, N) on Table I as the run prices it: shared server, real micro-batch costs) | paper (Sec. III-C as published) | exhaustive (one trial iteration per (P, N)) | refine (paper's shortlist, then trials)
    max_device_units: Optional[int] = None  # Q': most units a device may hold; null = Q - 1
    n_clamp: bool = True  # N <= min(B/2, 100), snapped to B // (B // N) (the authors' code)
    estimator: str = "table1"  # table1 (the paper, corrected) | code_legacy (the authors' code's DAG)
    server_mode: str = "parallel"  # parallel: K replicas at once (Fig. 3c) | sequential (Fig. 3b)
    aggregate_every: int = 1  # epochs between FedAvg rounds
    shard: str = "contiguous"  # contiguous | dirichlet (non-IID, outside the paper)
    dirichlet_alpha: float = 0.5
    failures: List[List[int]] = field(default_factory=list)  # [[device, epoch], ...] or [[device, epoch, after_iterations]]
    dp_sigma: float = 0.0  # Gaussian noise (std dp_sigma x clip) on uploaded device models; 0 = off
    dp_clip: Optional[float] = None  # clip the uploaded parameter vector to this L2 norm first; null = no clipping
    reselect: bool = True  # re-select (P, N) at an epoch boundary when a device's link bandwidth changed
    reselect_mode: str = "full_profile"  # full_profile (pays a profiling iteration, as the paper) | reestimate_only


@dataclass
class FLConfig(CollabConfig):
    name: str = "fl"


@dataclass
class SFLConfig(CollabConfig):
    name: str = "sfl"
    server_model: str = "per_device"  # per_device (replicas, FedAvg'd) | shared (one server model)


@dataclass
class SLConfig(CollabConfig):
    name: str = "sl"


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


@dataclass
class PRRConfig:
    """Where the links' packet reception ratios come from (EdgePipe, notes 2.11). The channel's
    defaults are the paper's Table I and Sec. V ("six edge devices randomly distributed over
    50 x 50 m2 ... a path-loss exponent of 3.1, a reference loss of 46.68 dB, and an additive white
    Gaussian noise N(0, 8^2), resulting in an average PRR of 80.9 %")."""

    source: str = "channel"  # channel (path loss + shadowing, random placement) | given (matrix below) | cluster (1 - the links' configured loss)
    matrix: Optional[List[List[float]]] = None  # source=given: PRR[i][j] from device i to j (the diagonal is ignored)
    # source=channel: the placement and probe seed. 0 is a choice; experiment=edgepipe sets the
    # first seed whose mean PRR is the paper's 80.9 % (docs/calibration.md)
    topology_seed: int = 0
    roi_m: float = 50.0  # side of the square region the devices are placed in (Table I: 25-100 m, mainly 50)
    pathloss_exp: float = 3.1  # Table I: 2.9-3.7, mainly 3.1
    sigma_db: float = 8.0  # log-normal shadowing (Table I: N(0, 8^2) dB)
    # P_tx - threshold - PL(d0), which the paper does not give (no transmit power, no receiver
    # threshold): fitted to the one link property it reports, the average PRR of 80.9 % on six
    # devices in 50 x 50 m (Sec. V): the notes' Monte Carlo; over 2000 random placements of six
    # devices (seeds 0-1999) 51.8 dB gives a mean PRR of 0.8086 (edgepipe_channel)
    k_margin_db: float = 51.8
    probe_packets: int = 50  # the PRR the mapper sees is measured with this many packets per link (Sec. V: "by sending 50 packets")


@dataclass
class SuperNeuronConfig(SchedulerConfig):
    """EdgePipe (Yoon et al.; notes 2). Defaults are the paper's mechanism where it gives one; the
    rest are the notes' proposals (section 8) or choices, said as such."""

    name: str = "super_neuron"
    partition_class: str = "hybrid"  # hybrid (EdgePipe, Alg. 1) | vertical (PipeDream core; 1 device = Naive) | horizontal
    m_layers: Optional[int] = None  # hybrid: layers per group, overriding Eq. 1 (the Fig. 6 sweep)
    rounding: str = "hamilton"  # devices per group: hamilton (the notes' repair, 8 item 7) | half_up | half_even (the paper's round)
    n_devices: Optional[int] = None  # use dev0..dev{n-1}; null = every devK of the cluster
    mapping: str = "ga"  # ga (Alg. 2) | random | upper (brute force) | identity
    mapping_seed: int = 0  # the GA's random reorderings (a choice: the paper gives none)
    generations: Optional[int] = None  # ga: null = 1000 for N <= 6, else 10000 (Sec. V)
    prr: PRRConfig = field(default_factory=PRRConfig)
    pipeline: bool = True  # false: the Model baseline (2L - 1 slots per minibatch, no pipelining)
    weight_stashing: bool = True  # Eq. 3: backward at the forward's weights, applied to the latest
    bwd_mode: str = "masked"  # masked (true gradient of the zero-filled graph; notes 8 item 2) | phantom (as if every input had arrived)
    # an output holder missing a logit share: abort (no update, nothing sent back: the paper's
    # all-or-nothing backward, Sec. IV-D, applied to the output layer, whose loss needs every
    # logit) | zero_fill (the notes' proposal, 2.10: train on the view with the share zero)
    share_missing: str = "abort"
    slot_s: Optional[float] = None  # null: worst op compute + worst message transfer + slot_margin_s, from the cluster's models
    slot_margin_s: float = 0.1  # Eq. 4's margin (Sec. V: "a margin of 100 ms")
    init: str = "glorot"  # glorot (Glorot-uniform weights, zero biases: TF 1.15's default, notes 8 item 17) | model (the model plugin's init)
    recovery: str = "none"  # none (the paper's EdgePipe) | rtx (every message sent rtx_copies times) | ack (retransmit until ACKed; Fig. 9(f))
    rtx_copies: int = 2  # Fig. 9(f): "a simple redundant transmission scheme with two consecutive times"
    ack_max_retries: int = 3  # ack: retransmissions per message at most (the notes' default, 2.11; the paper gives no cap)
    budget_min: Optional[float] = None  # train for this many simulated minutes (Table III: 194) instead of train.epochs; null = train.epochs
    # after training: test passes through the lossy forward (one draw per link and layer per
    # pass). 10 is a choice for a quick run; the paper ran 100 (Sec. V), as the study does
    lossy_test_passes: int = 10
    lossy_test_seed: int = 0
    # test accuracy over time (edgepipe_curve): a snapshot each eval_every_min simulated minutes
    # of the slot clock, each tested with eval_passes lossy passes; null: no curve
    eval_every_min: Optional[float] = None
    eval_passes: int = 5  # a choice: a curve point's mean over passes (the final test has its own count)


@dataclass
class AdaLearnerConfig(SchedulerConfig):
    """AdaLearner (Mao et al.): synchronous data parallelism over one shared WLAN (notes 2)."""

    name: str = "adalearner"
    partition: Any = "linear"  # linear (W_i = C_i (T - a_i), the notes' default) | lookup_table (Fig. 6)
    architecture: str = "auto"  # auto (Eq. 9 per n) | fp32 (gradients up, weights down) | onebit (the compressor's codec both ways)
    workers: Optional[int] = None  # n worker nodes; null: Algorithm 1 chooses (1 = local training on the group owner)
    max_workers: Optional[int] = None  # the candidates Algorithm 1 looks at; null: every dev<i>
    early_stop: bool = True  # Algorithm 1 stops at the first n whose estimate is worse (the paper's)
    local_when_n1: bool = True  # n = 1 is the group owner training alone, no communication
    planner: str = "fifo"  # fifo (the iteration as the FIFO star runs it) | paper (Eq. 4, 7-9) | paper_printed (Eq. 7-8 as printed)
    lookup_step_s: float = 0.1  # lookup_table: the table's time thresholds are multiples of this
    group_owner: str = "go"  # the device of the group owner (the user's phone, the hotspot)
