"""Cross-field checks that fail before anything runs, with messages a user can act on.

Types and unknown keys are Hydra's job (the schemas); this catches what a type cannot say.
Plugins check their own combinations when they are built, which also happens before the
tracking run starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing

from omegaconf import OmegaConf

from framework import registry
from framework.config import TrainConfig
from framework.errors import ConfigError

DTYPES = ("float32", "float64")
OPTIMIZERS = ("sgd", "adam")


def _positive(value, key: str, minimum: int = 1) -> None:
    if value is None or value < minimum:
        raise ConfigError(key, f"must be >= {minimum}, got {value}")


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
    from framework.config import BASE_SCHEMAS, Config

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
        schema = registry.entry(group, cfg[group].name).schema if group != "cluster" else None
        _check_keys(cfg[group], schema or BASE_SCHEMAS[group], f"{group}.")


def validate(cfg) -> None:
    for group in registry.GROUPS:
        if group == "cluster":
            continue  # cluster presets are data; their fields are checked by framework.cluster
        registry.entry(group, cfg[group].name)
    check_known_keys(cfg)
    t = cfg.train
    _positive(t.epochs, "train.epochs", 0)
    _positive(t.batch_size, "train.batch_size")
    _positive(t.eval_batch_size, "train.eval_batch_size")
    if t.iterations_per_epoch is not None:
        _positive(t.iterations_per_epoch, "train.iterations_per_epoch")
    if t.optimizer not in OPTIMIZERS:
        raise ConfigError("train.optimizer", f"{t.optimizer!r} is not an optimizer; choices: {', '.join(OPTIMIZERS)}")
    if t.lr <= 0:
        raise ConfigError("train.lr", f"must be > 0, got {t.lr}")
    _positive(cfg.cluster.num_devices, "cluster.num_devices")
    s = cfg.scheduler
    _positive(s.microbatches, "scheduler.microbatches")
    if s.microbatches > t.batch_size:
        raise ConfigError(
            "scheduler.microbatches",
            f"{s.microbatches} micro-batches cannot split a batch of {t.batch_size} samples; use at most {t.batch_size} or raise train.batch_size",
        )
    if s.stages is not None:
        _positive(s.stages, "scheduler.stages")
    if cfg.tracking.get("optimized_direction", "max") not in ("max", "min"):
        raise ConfigError("tracking.optimized_direction", f"{cfg.tracking.optimized_direction!r} is not a direction; choices: max, min")
    if cfg.runtime.dtype not in DTYPES:
        raise ConfigError("runtime.dtype", f"{cfg.runtime.dtype!r} is not supported; choices: {', '.join(DTYPES)}")
    if cfg.runtime.threads is not None:
        _positive(cfg.runtime.threads, "runtime.threads")
