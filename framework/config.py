"""Typed config schemas.

Every config group has a base dataclass here; a plugin subclasses it for its own knobs and
registers the subclass (`registry.register(..., schema=...)`), and its YAML file extends that
schema through its defaults list (`- /schema/<group>/<name>@_here_`). Hydra then rejects a wrong
type or an unknown key while composing. Checks that span fields or groups live in
`framework.validate`.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import MISSING, OmegaConf

from framework.errors import ConfigError

# the config tree (an absolute path: Hydra resolves relative ones against the module, which fails under `-m`)
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def yaml_presets(group: str, dirs=None) -> list[str]:
    """The YAML presets of a config group: <dir>/<group>/**/*.yaml of each config folder (conf/
    and, for a command line, the user's: `search_dirs`), as `group=option` names them."""
    out = set()
    for d in dirs if dirs is not None else [Path(CONF_DIR)]:
        root = Path(d) / group
        out.update(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    return sorted(out)


def search_dirs(argv=()) -> list[Path]:
    """The config folders Hydra composes from for command-line arguments `argv`: conf/, the
    folder of `--config-dir <dir>` (or -cd) and each folder of `hydra.searchpath=[...]`
    (file://<dir>, or pkg://<package>); a pkg:// package that cannot be found is left out (Hydra
    says so when it composes)."""
    dirs = [Path(CONF_DIR)]
    for d in extra_config_dirs(argv):
        if d not in dirs:
            dirs.append(d)
    return dirs


def extra_config_dirs(argv=(), *, sources: bool = False) -> list:
    """The folders `argv` adds to Hydra's search path (see `search_dirs`), in its order;
    `sources`: as (what added it: "--config-dir" or the hydra.searchpath entry, folder)."""
    argv = list(argv)
    out: list[tuple[str, Path]] = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            out.append((arg, Path(argv[i + 1]).expanduser().absolute()))
        elif arg.startswith("--config-dir="):
            out.append(("--config-dir", Path(arg.split("=", 1)[1]).expanduser().absolute()))
    for entry in searchpath_override(argv) or []:
        d = _search_dir(entry)
        if d is not None:
            out.append((f"hydra.searchpath entry {entry}", d))
    return out if sources else [d for _, d in out]


def searchpath_override(argv) -> list[str] | None:
    """The entries of a `hydra.searchpath=[...]` override among `argv` (None: there is none)."""
    for arg in argv:
        if arg.lstrip("+~").split("=", 1)[0].strip() != "hydra.searchpath" or "=" not in arg:
            continue
        try:
            value = OverridesParser.create().parse_override(arg).value()
        except HydraException:
            return None  # the override check says what is wrong with it
        return [str(v) for v in value] if isinstance(value, list) else None
    return None


def _search_dir(entry: str) -> Path | None:
    scheme, _, rest = entry.partition("://") if "://" in entry else ("file", "", entry)
    if scheme == "file":
        return Path(rest).expanduser().absolute()
    if scheme == "pkg":
        try:
            spec = importlib.util.find_spec(rest.replace("/", "."))
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    return None


@dataclass
class ModelConfig:
    name: str = MISSING


@dataclass
class DatasetConfig:
    name: str = MISSING
    seed: int = 0  # data generation / split seed (independent of the training seed)


TIME_MODELS = ("analytic", "profile", "measured", "table")  # a device's time_model (framework.cluster)


@dataclass
class DeviceConfig:
    """One device's compute model. See framework/cluster.py for the time models."""

    time_model: str = "analytic"  # analytic | profile | measured | table
    flops_per_s: float = 1.0e9  # analytic: sustained FLOP/s of this device
    slowdown: float = 1.0  # every time model: this device is `slowdown` x slower (than its rate, or the host)
    kind_factors: Dict[str, float] = field(default_factory=dict)  # extra factor per layer kind
    backward_ratio: float = 2.0  # analytic: backward FLOPs = ratio x forward FLOPs
    step_flops_per_param: float = 4.0  # analytic: optimizer step cost
    call_overhead_s: float = 0.0  # analytic: fixed seconds per unit per call (dispatch; x slowdown), so small batches cost more per sample
    # analytic: memory streams, added to compute (.inf: free). Activations: each layer's input and
    # output per sample; weights: the unit's parameters once per sample (caches too small to keep
    # them across the batch). Layers differ tenfold in bytes per FLOP, so a device bound by memory
    # is not a fixed multiple of one bound by compute (what FTPipeHD's single ratio assumes)
    activation_bytes_per_s: float = float("inf")
    weight_bytes_per_s: float = float("inf")
    memory_bytes: Optional[float] = None  # capacity; null = unbounded
    slots: int = 1  # computations that may run at once, FIFO, each at full speed
    # cores shared by every computation on the device (processor sharing: n > cores computations
    # each run at cores / n of their speed alone, as an OS shares a server among replica
    # processes); null: FIFO `slots` instead (framework/runtime/shared_processor.py)
    cores: Optional[int] = None
    # [[t_s, factor], ...]: from t_s on, compute takes factor x as long (piecewise constant). Typed
    # loosely because OmegaConf refuses an int (`[[0, 2]]`) in a List[List[float]]; checked in
    # framework.validate_numbers
    trace: Optional[List[Any]] = None
    table: Optional[str] = None  # table: a shipped profile table (conf/profile_tables/<name>.yaml)
    table_device: Optional[str] = None  # table: its column (e.g. pi4b, tx2, rtx2080ti)
    forward_fraction: float = 0.3333333333333333  # table: the forward's share of a measured iteration


@dataclass
class LinkConfig:
    """A directed link. Bandwidth in bit/s (.inf = instantaneous), one-way latency in seconds."""

    bandwidth_bps: float = float("inf")
    latency_s: float = 0.0
    wakeup_s: float = 0.0  # seconds each transfer holds the channel before its bytes flow (a radio waking from power save: AdaLearner's ~100 ms)
    loss: float = 0.0  # probability that one message is lost
    retransmit_timeout_s: float = 0.2  # reliable sends resend after this long
    trace: Optional[List[Any]] = None  # [[t_s, bandwidth_bps], ...] piecewise-constant (typed as the device's trace)


@dataclass
class ClusterConfig:
    name: str = MISSING
    num_devices: int = 2  # devices named dev0 .. dev{n-1}
    device: DeviceConfig = field(default_factory=DeviceConfig)  # template for every device
    devices: Dict[str, Any] = field(default_factory=dict)  # per-device overrides, or extra devices (e.g. server)
    link: LinkConfig = field(default_factory=LinkConfig)  # template for every directed pair
    links: Dict[str, Any] = field(default_factory=dict)  # overrides keyed "src->dst"; glob patterns allowed
    shared_medium: bool = False  # all links share one half-duplex channel (one WLAN hotspot)


@dataclass
class SchedulerConfig:
    name: str = MISSING
    microbatches: int = 1
    partition: Any = "dp"  # "dp" (compute and compressed transfers: AccEPT Eq. 9-10), "even" (compute alone) or cut indices, e.g. [3, 7]
    stages: Optional[int] = None  # pipeline depth; null = one stage per device


@dataclass
class PipelineConfig(SchedulerConfig):
    """Knobs every pipeline schedule (framework.pipeline) shares."""

    repartition: List[Any] = field(default_factory=list)  # [[epoch, cuts], ...]: move units between stages at that epoch's start
    replan_epsilon: Optional[float] = None  # re-plan at an epoch's end when a stage's measured fwd+bwd time is off its prediction by more than this fraction (AccEPT; plugins/predictors/accept_replan.py); null: never


@dataclass
class CompressorConfig:
    name: str = "none"


@dataclass
class DirectionConfig:
    codec: str = "none"  # a codec name (framework.codec), or none
    bits: int = 32
    # [[epoch, bits], ...]: from `epoch` on, use `bits`; empty = always `bits`. A list of pairs
    # rather than a map because Hydra merges a dict override key by key into a struct-mode node,
    # which refuses new keys; a list override replaces the whole list.
    schedule: List[List[int]] = field(default_factory=list)
    options: Dict[str, Any] = field(default_factory=dict)  # codec-specific options


@dataclass
class CodecTimeConfig:
    model: str = "linear"  # linear | measured | none
    encode_s_per_MB: float = 0.02636  # Pi 4B, x = fp32 MB (feature-replay notes, section 2.5)
    encode_s: float = 0.00114
    decode_s_per_MB: float = 0.02636
    decode_s: float = 0.00114
    scale: float = 1.0  # measured: host seconds -> device seconds


@dataclass
class CompressionConfig(CompressorConfig):
    forward: DirectionConfig = field(default_factory=DirectionConfig)
    backward: DirectionConfig = field(default_factory=DirectionConfig)
    forward_tag: str = "act"
    backward_tag: str = "grad"
    time: CodecTimeConfig = field(default_factory=CodecTimeConfig)
    # a received packet may decode to at most this many bytes (WireError beyond, before any
    # allocation): a 1-bit codec's output is 32-64x its payload (framework.wire)
    max_decoded_bytes: int = 1 << 31  # framework.wire.MAX_DECODED_BYTES (not imported here: wire imports torch)


@dataclass
class PredictorConfig:
    name: str = "oracle"


@dataclass
class TransportConfig:
    name: str = "inproc"


@dataclass
class RuntimeConfig:
    name: str = "sim"
    numerics: bool = True  # false: timing only, no tensor math (planners, 100+ devices)
    dtype: str = "float32"  # float32 | float64
    progress: bool = True  # terminal progress bar
    threads: Optional[int] = None  # torch intra-op threads; null = torch's default


@dataclass
class MetricFloorConfig:
    """A bound a run must reach to count in a sweep: `metric` >= `min` (`val/acc` >= 0.9 for "the
    shortest epoch at 90% accuracy"). A run below it, or without the metric, is infeasible: a
    sweep's parent never names it best, and the value it returns to a sweeper (Optuna) is the worst
    there is. See framework/objective.py."""

    metric: str = "val/acc"
    min: Optional[float] = None  # null: no floor


@dataclass
class TrackingConfig:
    name: str = "mlflow"
    uri: str = "sqlite:///outputs/mlflow.db"
    artifact_root: str = "outputs/mlartifacts"
    experiment: str = "pipelab"
    flush_every: int = 200  # buffered metrics per batch write
    gantt_iterations: int = 3  # iterations drawn in timeline.png (the trace holds all)
    max_trace_events: int = 200_000
    optimized_metric: str = "val/acc"  # a sweep's parent run names its best child by this metric
    optimized_direction: str = "max"  # max | min
    metric_floor: MetricFloorConfig = field(default_factory=MetricFloorConfig)  # runs below it are never best


NONFINITE_POLICIES = ("fail", "warn", "ignore")  # train.on_nonfinite (framework/nonfinite.py)


@dataclass
class TrainConfig:
    epochs: int = 2
    batch_size: int = 64
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    iterations_per_epoch: Optional[int] = None  # cap (quick runs); null = the whole training split
    eval_batch_size: int = 512
    checkpoint: bool = True  # write <run dir>/checkpoint at every epoch end (runtime=sim)
    resume: Optional[str] = None  # a run directory: continue that run from its last checkpoint
    on_nonfinite: str = "fail"  # fail | warn | ignore: a NaN/inf loss, parameter or received tensor (framework/nonfinite.py)


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
    seed: int = 0


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


SWEEP_KEYS_FILE = "sweep_keys.json"  # in a sweep's folder: the keys it varies (framework.tracking writes it)


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
