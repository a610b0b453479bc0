"""Typed config schemas.

Every config group has a base dataclass here; a plugin subclasses it for its own knobs and
registers the subclass (`registry.register(..., schema=...)`), and its YAML file extends that
schema through its defaults list (`- /schema/<group>/<name>@_here_`). Hydra then rejects a wrong
type or an unknown key while composing. Every field is a knob (framework.config.knobs): its default,
what it means, its range and its choices are said here, once; checks that span fields or groups
live in `framework.config.validate`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, OmegaConf

from framework.config.knobs import Range, knob, knob_factory
from framework.errors import ConfigError


@dataclass
class ModelConfig:
    name: str = MISSING


SEED = Range(0, 2**63 - 1, integer=True)


@dataclass
class DatasetConfig:
    name: str = MISSING
    seed: int = knob(0, "data generation / split seed (independent of the training seed)", range=SEED)


@dataclass
class DeviceConfig:
    """One device's compute model. See framework/cluster.py for the time models."""

    time_model: str = knob("analytic", "how the device prices work (framework.cluster)", choices=("analytic", "profile", "measured", "table"))
    flops_per_s: float = knob(1.0e9, "analytic: sustained FLOP/s of this device", range=Range(0, low_open=True, note="FLOP/s"))
    slowdown: float = knob(1.0, "every time model: this device is `slowdown` x slower (than its rate, or the host)", range=Range(0, low_open=True, note="times slower than its rate"))
    kind_factors: Dict[str, float] = knob({}, "extra factor per layer kind", range=Range(0, note="times a FLOP's time for that layer kind; 0 = free"))
    backward_ratio: float = knob(2.0, "analytic: backward FLOPs = ratio x forward FLOPs", range=Range(0))
    step_flops_per_param: float = knob(4.0, "analytic: optimizer step cost", range=Range(0))
    call_overhead_s: float = knob(0.0, "analytic: fixed seconds per unit per call (dispatch; x slowdown), so small batches cost more per sample", range=Range(0, note="seconds"))
    activation_bytes_per_s: float = knob(
        float("inf"),
        "analytic: the activations' memory stream, added to compute (.inf: free): each layer's input and output per sample. Layers differ tenfold in bytes per FLOP, so a device bound by memory is not a fixed multiple of one bound by compute (what FTPipeHD's single ratio assumes)",
        range=Range(0, low_open=True, inf=True, note="bytes/s; .inf = free"),
    )
    weight_bytes_per_s: float = knob(
        float("inf"),
        "analytic: the weights' memory stream, added to compute (.inf: free): the unit's parameters once per sample (caches too small to keep them across the batch)",
        range=Range(0, low_open=True, inf=True, note="bytes/s; .inf = free"),
    )
    memory_bytes: Optional[float] = knob(None, "capacity; null = unbounded", range=Range(0, low_open=True, null=True, note="bytes; null = unbounded"))
    slots: int = knob(1, "computations that may run at once, FIFO, each at full speed", range=Range(1, integer=True))
    cores: Optional[int] = knob(
        None,
        "cores shared by every computation on the device (processor sharing: n > cores computations each run at cores / n of their speed alone, as an OS shares a server among replica processes); null: FIFO `slots` instead (framework/runtime/shared_processor.py)",
        range=Range(1, integer=True, null=True, note="null = FIFO slots"),
    )
    # typed loosely because OmegaConf refuses an int (`[[0, 2]]`) in a List[List[float]];
    # checked point by point in framework.config.validate_knobs
    trace: Optional[List[Any]] = knob(None, "[[t_s, factor], ...]: from t_s on, compute takes factor x as long (piecewise constant)")
    table: Optional[str] = knob(None, "table: a shipped profile table (conf/profile_tables/<name>.yaml)")
    table_device: Optional[str] = knob(None, "table: its column (e.g. pi4b, tx2, rtx2080ti)")
    forward_fraction: float = knob(0.3333333333333333, "table: the forward's share of a measured iteration", range=Range(0, 1, low_open=True, high_open=True, note="the forward's share of a measured iteration, time_model=table"))


@dataclass
class LinkConfig:
    """A directed link. Bandwidth in bit/s (.inf = instantaneous), one-way latency in seconds."""

    bandwidth_bps: float = knob(float("inf"), "bit/s (.inf = instantaneous)", range=Range(0, low_open=True, inf=True, note="bit/s; .inf = instantaneous"))
    latency_s: float = knob(0.0, "one-way latency in seconds", range=Range(0, note="seconds, one way"))
    wakeup_s: float = knob(0.0, "seconds each transfer holds the channel before its bytes flow (a radio waking from power save: AdaLearner's ~100 ms)", range=Range(0, note="seconds per transfer"))
    loss: float = knob(0.0, "probability that one message is lost", range=Range(0, 1, high_open=True, note="probability a message is lost"))
    retransmit_timeout_s: float = knob(0.2, "reliable sends resend after this long", range=Range(0, low_open=True, note="seconds a reliable send waits before it resends"))
    trace: Optional[List[Any]] = knob(None, "[[t_s, bandwidth_bps], ...] piecewise-constant (typed as the device's trace)")


@dataclass
class ClusterConfig:
    name: str = MISSING
    num_devices: int = knob(2, "devices named dev0 .. dev{n-1}", range=Range(1, integer=True))
    device: DeviceConfig = knob_factory(DeviceConfig, "template for every device")
    devices: Dict[str, Any] = knob({}, "per-device overrides, or extra devices (e.g. server)", entries=DeviceConfig)
    link: LinkConfig = knob_factory(LinkConfig, "template for every directed pair")
    links: Dict[str, Any] = knob({}, 'overrides keyed "src->dst"; glob patterns allowed', entries=LinkConfig)
    shared_medium: bool = knob(False, "all links share one half-duplex channel (one WLAN hotspot)")


@dataclass
class SchedulerConfig:
    name: str = MISSING
    microbatches: int = knob(1, "micro-batches each mini-batch is split into", range=Range(1, integer=True))
    partition: Any = knob("dp", "dp: the slowest stage or link as small as it goes (compute and compressed transfers: AccEPT Eq. 9-10) | even (compute alone) | search (pipelines: every contiguous partition by its predicted epoch) | cut indices, e.g. [3, 7]")
    stages: Optional[int] = knob(None, "pipeline depth; null = one stage per device", range=Range(1, integer=True, null=True))


@dataclass
class PipelineConfig(SchedulerConfig):
    """Knobs every pipeline schedule (framework.pipeline.scheduler) shares."""

    repartition: List[Any] = knob([], "[[epoch, cuts], ...]: move units between stages at that epoch's start")
    replan_epsilon: Optional[float] = knob(None, "re-plan at an epoch's end when a stage's measured fwd+bwd time is off its prediction by more than this fraction (AccEPT; plugins/predictors/accept_replan.py); null: never")


@dataclass
class CompressorConfig:
    name: str = "none"


@dataclass
class DirectionConfig:
    codec: str = knob("none", "a codec name (framework.codec), or none")
    bits: int = knob(32, "bits per value the codec sends (each codec says which it takes)")
    # a list of pairs rather than a map because Hydra merges a dict override key by key into a
    # struct-mode node, which refuses new keys; a list override replaces the whole list
    schedule: List[List[int]] = knob([], "[[epoch, bits], ...]: from `epoch` on, use `bits`; empty = always `bits`")
    options: Dict[str, Any] = knob({}, "codec-specific options")


@dataclass
class CodecTimeConfig:
    model: str = knob("linear", "linear (seconds per MB plus a fixed cost) | measured (host seconds x scale) | none", choices=("linear", "measured", "none"))
    encode_s_per_MB: float = knob(0.02636, "linear: encoding seconds per MB of fp32 input", range=Range(0, note="seconds"))  # Pi 4B, x = fp32 MB (feature-replay notes, section 2.5)
    encode_s: float = knob(0.00114, "linear: fixed encoding seconds per tensor", range=Range(0, note="seconds"))
    decode_s_per_MB: float = knob(0.02636, "linear: decoding seconds per MB of fp32 output", range=Range(0, note="seconds"))
    decode_s: float = knob(0.00114, "linear: fixed decoding seconds per tensor", range=Range(0, note="seconds"))
    scale: float = knob(1.0, "measured: host seconds -> device seconds", range=Range(0, low_open=True))


@dataclass
class CompressionConfig(CompressorConfig):
    forward: DirectionConfig = knob_factory(DirectionConfig, "what crosses forward (activations)")
    backward: DirectionConfig = knob_factory(DirectionConfig, "what crosses backward (gradients)")
    forward_tag: str = knob("act", "the message tag the forward direction's codec encodes")
    backward_tag: str = knob("grad", "the message tag the backward direction's codec encodes")
    time: CodecTimeConfig = knob_factory(CodecTimeConfig, "what encoding and decoding cost on the devices")
    # a 1-bit codec's output is 32-64x its payload (framework.runtime.wire); the default is
    # framework.runtime.wire.MAX_DECODED_BYTES (not imported here: wire imports torch)
    max_decoded_bytes: int = knob(1 << 31, "a received packet may decode to at most this many bytes (WireError beyond, before any allocation)")


@dataclass
class PredictorConfig:
    name: str = "oracle"


@dataclass
class TransportConfig:
    name: str = "inproc"


@dataclass
class RuntimeConfig:
    name: str = "sim"
    numerics: bool = knob(True, "false: timing only, no tensor math (planners, 100+ devices)")
    dtype: str = knob("float32", "the tensors' floating-point type", choices=("float32", "float64"))
    progress: bool = knob(True, "terminal progress bar")
    threads: Optional[int] = knob(None, "torch intra-op threads; null = torch's default", range=Range(1, integer=True, null=True))


@dataclass
class MetricFloorConfig:
    """A bound a run must reach to count in a sweep: `metric` >= `min` (`val/acc` >= 0.9 for "the
    shortest epoch at 90% accuracy"). A run below it, or without the metric, is infeasible: a
    sweep's parent never names it best, and the value it returns to a sweeper (Optuna) is the worst
    there is. See framework/tracking/objective.py."""

    metric: str = knob("val/acc", "the metric the floor bounds")
    min: Optional[float] = knob(None, "the least value that counts; null: no floor (e.g. 0.9 with optimized_metric=time/epoch_virtual_s, direction min)")


@dataclass
class TrackingConfig:
    name: str = "mlflow"
    uri: str = knob("sqlite:///outputs/mlflow.db", "where MLflow keeps runs: sqlite:///<file>.db, a folder, http(s)://<tracking server>, or a database URI")
    artifact_root: str = knob("outputs/mlartifacts", "where MLflow stores a new experiment's artifacts")
    experiment: str = knob("pipelab", "the MLflow experiment runs are recorded in")
    flush_every: int = knob(200, "buffered metrics per batch write", range=Range(1, integer=True, note="metrics per write"))
    gantt_iterations: int = knob(3, "iterations drawn in timeline.png (the trace holds all)", range=Range(1, integer=True))
    max_trace_events: int = knob(200_000, "the most events the timeline trace keeps", range=Range(0, integer=True))
    per_device_max: int = knob(32, "above this many values of one per-device metric (util/busy_frac/<role>, net/bytes/<link>, ...), MLflow gets their mean, p50, p95 and max, and the values go to the artifacts per_device.csv and per_device.png", range=Range(0, integer=True))
    optimized_metric: str = knob("val/acc", "a sweep's parent run names its best child by this metric")
    optimized_direction: str = knob("max", "whether larger or smaller values of optimized_metric are better", choices=("max", "min"))
    metric_floor: MetricFloorConfig = knob_factory(MetricFloorConfig, "a run must reach this to count as best (and for a sweeper, e.g. Optuna)")


@dataclass
class TrainConfig:
    epochs: int = knob(2, "epochs to train", range=Range(0, integer=True))
    batch_size: int = knob(64, "samples per mini-batch", range=Range(1, integer=True))
    optimizer: str = knob("sgd", "the optimizer", choices=("sgd", "adam"))
    lr: float = knob(0.05, "the learning rate", range=Range(0, low_open=True))
    momentum: float = knob(0.9, "SGD's momentum (adam ignores it)", range=Range(0, 1, high_open=True))
    weight_decay: float = knob(0.0, "the optimizer's weight decay (L2 penalty)", range=Range(0))
    iterations_per_epoch: Optional[int] = knob(None, "cap (quick runs); null = the whole training split", range=Range(1, integer=True, null=True))
    eval_batch_size: int = knob(512, "samples per evaluation batch", range=Range(1, integer=True))
    checkpoint: bool = knob(True, "write <run dir>/checkpoint at every epoch end (weights, optimizer, RNG, clock, links; runtime=sim)")
    resume: Optional[str] = knob(None, "a run directory: continue that run from its last checkpoint")
    on_nonfinite: str = knob("fail", "what a NaN/inf loss, parameter or received tensor does: fail | warn | ignore (framework/nonfinite.py)", choices=("fail", "warn", "ignore"))


@dataclass
class Config:
    model: Any = MISSING
    dataset: Any = MISSING
    cluster: Any = MISSING
    scheduler: Any = MISSING
    compressor: Any = MISSING
    predictor: Any = MISSING
    transport: Any = MISSING
    runtime: Any = MISSING
    tracking: Any = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = knob(0, "the run's random seed (initial weights, batch order, the links' and codecs' draws; the data's own is dataset.seed)", range=SEED)


BASE_SCHEMAS = {
    "model": ModelConfig,
    "dataset": DatasetConfig,
    "cluster": ClusterConfig,
    "scheduler": SchedulerConfig,
    "compressor": CompressorConfig,
    "predictor": PredictorConfig,
    "transport": TransportConfig,
    "runtime": RuntimeConfig,
    "tracking": TrackingConfig,
}


def _mul(*xs):
    out = 1.0
    for x in xs:
        out *= float(x)
    return out


def study_direction(direction: str) -> str:
    """Optuna's name for `tracking.optimized_direction`: max -> maximize, min -> minimize."""
    names = {"max": "maximize", "min": "minimize"}
    if direction not in names:
        raise ConfigError("tracking.optimized_direction", f"{direction!r} is not a direction; choices: max, min")
    return names[direction]


def register_resolvers() -> None:
    """`${mul:2,${cluster.device.slowdown}}`: presets derive one knob from another, so an
    override of the base knob (say the device slowdown) carries through."""
    if not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", _mul)
    if not OmegaConf.has_resolver("pipelab_job_dir"):
        OmegaConf.register_new_resolver("pipelab_job_dir", job_dir_name)
    if not OmegaConf.has_resolver("pipelab_study_direction"):
        # `hydra.sweeper.direction: ${pipelab_study_direction:${tracking.optimized_direction}}`:
        # an Optuna study goes the way the parent run's best child is picked (max -> maximize)
        OmegaConf.register_new_resolver("pipelab_study_direction", study_direction)


SWEEP_KEYS_FILE = "sweep_keys.json"  # in a sweep's folder: the keys it varies (framework.tracking.tracker writes it)


def read_sweep_keys(sweep_dir) -> set[str]:
    """The keys the sweep in `sweep_dir` varies; empty if it recorded none."""
    try:
        return set(json.loads((Path(str(sweep_dir)) / SWEEP_KEYS_FILE).read_text()))
    except (OSError, ValueError):
        return set()


def swept_overrides(overrides, keys: set[str]) -> list[str]:
    """The `key=value` overrides among `overrides` whose key a sweep varies (`+`/`~` dropped)."""
    return [o.lstrip("+~") for o in overrides if o.split("=", 1)[0].lstrip("+~") in keys]


def task_overrides() -> list[str]:
    """This Hydra job's command-line overrides, as written: a `${...}` in a value stays text
    (iterating Hydra's list resolves it, and fails on a key that does not exist)."""
    return [str(o) for o in OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)]


def job_dir_name(num, sweep_dir) -> str:
    """A sweep job's folder: its number and the values of the keys the sweep varies, e.g.
    `2_cluster.link.bandwidth_bps=1e7` (`hydra.sweep.subdir`), safe as one path component."""
    try:
        overrides = task_overrides()
    except ValueError:  # not under Hydra: the number alone
        return str(num)
    swept = swept_overrides(overrides, read_sweep_keys(sweep_dir))
    name = "_".join([str(num)] + [re.sub(r"[^A-Za-z0-9_.=,+-]", "-", o) for o in swept])
    return name[:120]


def store_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(name="pipelab_schema", node=Config)
    for group, schema in BASE_SCHEMAS.items():
        cs.store(group=f"schema/{group}", name="base", node=schema)


register_resolvers()
store_schemas()
