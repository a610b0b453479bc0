"""Knobs checked before anything runs: every number finite and in its range, every word among
its choices.

The composed config is read against the schemas it was composed from (`knob_leaves`): the
core's (framework.config.schemas) and, per group, the selected plugin's (`group_schema`), whose fields
say each knob's range and choices (framework.config.knobs). A map of partial entries is read against
its entries' schema (each of `cluster.devices` against DeviceConfig). A number no knob bounds
must still be finite: `nan` nowhere, `.inf` only where a range allows it (a link's bandwidth,
`.inf` = instantaneous). Traces are checked point by point (`_check_traces`).
"""

from __future__ import annotations

import math

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework import registry
from framework.config import knobs
from framework.config.schemas import BASE_SCHEMAS, Config
from framework.errors import ConfigError


def group_schema(group: str, name) -> type:
    """The schema a group's node is composed from: the selected plugin's, else the group's base
    (cluster presets are data: ClusterConfig)."""
    schema = registry.declared(group, name).schema if group != "cluster" else None
    return schema or BASE_SCHEMAS[group]


def knob_leaves(plain: dict):
    """(dotted key, value, Knob or None) of every leaf of the plain composed config `plain`."""
    groups = {g: plain[g] for g in registry.GROUPS if isinstance(plain.get(g), dict)}
    yield from knobs.leaves({k: v for k, v in plain.items() if k not in groups}, Config, "")
    for group, node in groups.items():
        yield from knobs.leaves(node, group_schema(group, node.get("name")), group)


def resolved(cfg) -> dict:
    """The config as plain containers, every interpolation resolved; one that cannot be resolved
    is a ConfigError naming its key."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        msg = str(getattr(e, "msg", None) or e).splitlines()[0]
        raise ConfigError(key, f"cannot resolve its value: {msg}") from None


def _is_trace_point(key: str) -> bool:
    """A number of a device's or a link's trace: `_check_traces` checks each point whole."""
    return key.startswith("cluster.") and ".trace[" in key


def check(cfg) -> None:
    """Every knob of `cfg` in its range and choices, every other number finite (see the module's
    docstring)."""
    plain = resolved(cfg)
    plain.pop("hydra", None)
    for key, value, k in knob_leaves(plain):
        why = k.problem(value) if k is not None else None
        if why:
            raise ConfigError(key, why)
        if k is None or k.range is None:
            if isinstance(value, float) and not math.isfinite(value) and not _is_trace_point(key):
                raise ConfigError(key, f"must be a finite number, got {value}")
    _check_traces(plain.get("cluster") or {})


def _check_traces(cluster: dict) -> None:
    """Traces are [[t_s, value], ...]: from t_s on, the device computes `value` x slower, or the
    link carries `value` bit/s."""
    nodes = [("cluster.device", cluster.get("device"), "factor"), ("cluster.link", cluster.get("link"), "bandwidth_bps")]
    nodes += [(f"cluster.devices.{k}", v, "factor") for k, v in (cluster.get("devices") or {}).items()]
    nodes += [(f"cluster.links.{k}", v, "bandwidth_bps") for k, v in (cluster.get("links") or {}).items()]
    for where, node, what in nodes:
        trace = (node or {}).get("trace") if isinstance(node, dict) else None
        if trace is None:
            continue
        if not isinstance(trace, list):
            raise ConfigError(f"{where}.trace", f"{trace!r} is not a list of [t_s, {what}] pairs, e.g. [[0, 1.0], [30, 2.0]]")
        for i, point in enumerate(trace):
            ok = isinstance(point, list) and len(point) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in point)
            if ok:
                t, v = point
                ok = math.isfinite(t) and t >= 0 and v > 0 and (math.isfinite(v) or what == "bandwidth_bps")
            if not ok:
                bound = "> 0 bit/s or .inf" if what == "bandwidth_bps" else "> 0"
                raise ConfigError(f"{where}.trace[{i}]", f"{point!r} is not [t_s, {what}] with t_s >= 0 and {what} {bound}")
