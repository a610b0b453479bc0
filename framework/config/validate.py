"""Cross-field checks that fail before anything runs, with messages a user can act on.

Types and unknown keys are Hydra's job (the schemas); this catches what a type cannot say:
numbers out of range or not finite and words not among their choices (each knob's, read from its
schema field by framework.config.validate_knobs), and options the chosen runtime would ignore. Plugins
check their own combinations when they are built, which also happens before the tracking run
starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import shutil
import typing
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from framework import registry
from framework.config import validate_knobs
from framework.config.schemas import Config, TrainConfig
from framework.errors import ConfigError, listing
from framework.profile_tables import table_names
from framework.tracking import objective


def _check_keys(node, schema, where: str) -> None:
    """Every key of `node` must be a field of dataclass `schema` (recursively into dataclass-typed
    fields): a key added with `+` that no schema declares would otherwise be silently ignored."""
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key in node.keys():
        if key not in hints:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {where}{close[0]}?" if close else ""
            raise ConfigError(f"{where}{key}", f"no such key{hint} (keys of {where.rstrip('.') or 'the config'}: {', '.join(names)})")
        sub = hints[key]
        if dataclasses.is_dataclass(sub) and OmegaConf.is_dict(node[key]):
            _check_keys(node[key], sub, f"{where}{key}.")


def check_known_keys(cfg) -> None:
    names = [f.name for f in dataclasses.fields(Config)]
    for key in cfg.keys():
        if key == "hydra":
            continue
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(str(key), f"no such key{hint} (top-level keys: {', '.join(names)})")
    _check_keys(cfg.train, TrainConfig, "train.")
    for group in registry.GROUPS:
        _check_keys(cfg[group], validate_knobs.group_schema(group, cfg[group].name), f"{group}.")


def validate(cfg) -> None:
    """Every check here reads the config and the registry's declared entries alone, so a config
    error is reported before torch is imported (framework.cli runs it first); a plugin's own
    combinations are checked when it is built."""
    for group in registry.GROUPS:
        if group == "cluster":
            continue  # cluster presets are data; their fields are checked by framework.cluster
        registry.declared(group, cfg[group].name)  # an unknown name fails here; the code is imported when built
    check_known_keys(cfg)
    validate_knobs.check(cfg)  # every knob in its range and choices, every number finite
    t = cfg.train
    s = cfg.scheduler
    if s.microbatches > t.batch_size:
        raise ConfigError(
            "scheduler.microbatches",
            f"{s.microbatches} micro-batches cannot split a batch of {t.batch_size} samples; use at most {t.batch_size} or raise train.batch_size",
        )
    objective.check(cfg.tracking)  # optimized_direction, optimized_metric, metric_floor
    check_tracking(cfg.tracking)
    check_runtime(cfg)
    check_tables(cfg.cluster)


# where MLflow can keep runs: a tracking URI's scheme (a bare path is a folder of runs)
MLFLOW_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")


def check_tracking(tcfg) -> None:
    if tcfg.name != "mlflow":
        return
    uri = str(tcfg.uri)
    scheme = urlparse(uri).scheme.split("+")[0].lower()  # postgresql+psycopg2://: a SQLAlchemy driver
    if scheme not in MLFLOW_SCHEMES and len(scheme) > 1:  # one letter: a Windows drive (C:/runs)
        raise ConfigError("tracking.uri", f"{uri!r}: MLflow cannot keep runs at a {scheme}:// address; use sqlite:///<file>.db (the default sqlite:///outputs/mlflow.db), a folder, http(s)://<tracking server>, or postgresql/mysql/mssql://<database>")
    if not str(tcfg.experiment).strip():
        raise ConfigError("tracking.experiment", "must be a non-empty experiment name (default pipelab)")


def check_replica_conv(runtime, device: str) -> None:
    """`runtime.replica_conv` (one of its choices: validate_knobs) only where replicas are batched."""
    conv = runtime.get("replica_conv")
    if conv is None:
        return
    if not runtime.numerics:
        raise ConfigError("runtime.replica_conv", "sets how batched replicas convolve, and a timing-only run (runtime.numerics=false) convolves nothing; leave runtime.replica_conv=null")
    batched = runtime.get("batch_replicas")
    if batched is False or (batched is None and device == "cpu"):
        why = "runtime.batch_replicas=false" if batched is False else "runtime.batch_replicas=null is off on cpu"
        raise ConfigError("runtime.replica_conv", f"sets how batched replicas convolve, but none are batched here ({why}); set runtime.batch_replicas=true, or leave runtime.replica_conv=null")


def check_runtime(cfg) -> None:
    """What the chosen runtime can do with the other choices: options it would ignore are errors."""
    rt, transport = cfg.runtime.name, cfg.transport.name
    if rt == "sim" and transport != "inproc":
        raise ConfigError("transport", f"transport={transport} is ignored by runtime=sim, which runs every role in this process on the virtual clock and prices messages with the cluster's links; use runtime=local (or remote) with transport={transport}, or leave transport=inproc")
    device = str(cfg.runtime.get("torch_device", "cpu"))
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ConfigError("runtime.torch_device", f"{device!r} is not a torch device this runtime runs on; choices: cpu, cuda, cuda:<n>")
    if device != "cpu" and not cfg.runtime.numerics:
        raise ConfigError("runtime.torch_device", f"{device} with runtime.numerics=false: a timing-only run does no tensor math; leave runtime.torch_device=cpu")
    if cfg.runtime.get("tf32"):
        if device == "cpu":
            raise ConfigError("runtime.tf32", "TF32 is a mode of CUDA's tensor cores and runtime.torch_device=cpu runs none; set runtime.torch_device=cuda, or leave runtime.tf32=false")
        if cfg.runtime.dtype != "float32":
            raise ConfigError("runtime.tf32", f"TF32 rounds float32 math and runtime.dtype={cfg.runtime.dtype} has none; set runtime.dtype=float32, or leave runtime.tf32=false")
    check_replica_conv(cfg.runtime, device)
    python = cfg.runtime.get("python")
    if rt == "local" and python:
        if shutil.which(str(python)) is None:
            raise ConfigError("runtime.python", f"{python!r} is not an executable; give the interpreter of the role processes (a path or a name on PATH), or null for this one")


def check_tables(cluster) -> None:
    """`table` of the device template and of each device entry, named by the key it was set at,
    whatever the time model: a name that does not exist is a mistake even where this device's
    time model does not read it (yet). (`time_model` is among its choices: validate_knobs.)"""
    entries = [("cluster.device", cluster.device)] + [(f"cluster.devices.{k}", v) for k, v in (cluster.devices or {}).items()]
    for where, node in entries:
        model = node.get("time_model") if isinstance(node, DictConfig) else None
        table = node.get("table") if isinstance(node, DictConfig) else None
        if table is not None and str(table) not in table_names():
            read = "" if model == "table" else " (read by time_model=table)"
            names = table_names()
            raise ConfigError(f"{where}.table", f"no profile table {str(table)!r}{read}; choices (the {len(names)} in conf/profile_tables/, or null): {listing(names, 4)}")
