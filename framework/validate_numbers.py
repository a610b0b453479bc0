"""Numbers checked before anything runs: finite, and in the range each knob means something in.

Every float of the composed config must be a finite number: `nan` nowhere, `.inf` only where it
is documented (a link's bandwidth, `.inf` = instantaneous). The ranges of the core's own knobs
are in RULES below, and `describe(key)` says in words what a key takes (the CLI uses it when
Hydra refuses a value of the wrong type). A plugin checks the range of its own knobs when it is
built (PiPar's `dirichlet_alpha`, the LSQ compressor's `init_scale`, ...), which also happens
before the run starts.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """What a number may be: [low, high] (an end `open` is excluded), an integer or not, `null`
    or `.inf` allowed or not. `note` says what the number means, after the range."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    null: bool = False
    inf: bool = False
    note: str = ""

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            text = f"{kind} in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
            if self.integer and not self.low_open and not self.high_open:
                text = f"{kind} in {_num(self.low)}..{_num(self.high)}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            text = f"a finite {'integer' if self.integer else 'number'}"
        extras = [x for x, on in ((".inf", self.inf), ("null", self.null)) if on]
        if extras:
            text += " or " + " or ".join(extras)
        return text + (f" ({self.note})" if self.note else "")

    def problem(self, value) -> str | None:
        """Why `value` is out of range (None when it is fine)."""
        if value is None:
            return None if self.null else "must be set (null is not allowed here)"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number"
        fraction = self.integer and math.isfinite(value) and not float(value).is_integer()
        if math.isnan(value) or fraction or (math.isinf(value) and not (self.inf and value > 0)):
            return f"must be {self.describe()}, got {value}"
        low_bad = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        high_bad = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        return f"must be {self.describe()}, got {value}" if low_bad or high_bad else None


def _num(x: float) -> str:
    if isinstance(x, int) and abs(x) >= 2**30:
        return f"2**{x.bit_length()}-1" if x == 2 ** x.bit_length() - 1 else str(x)
    return f"{x:g}" if isinstance(x, float) else str(x)


SEED = Range(0, 2**63 - 1, integer=True)

DEVICE = {
    "flops_per_s": Range(0, low_open=True, note="FLOP/s"),
    "slowdown": Range(0, low_open=True, note="times slower than its rate"),
    "backward_ratio": Range(0),
    "step_flops_per_param": Range(0),
    "call_overhead_s": Range(0, note="seconds"),
    "activation_bytes_per_s": Range(0, low_open=True, inf=True, note="bytes/s; .inf = free"),
    "weight_bytes_per_s": Range(0, low_open=True, inf=True, note="bytes/s; .inf = free"),
    "memory_bytes": Range(0, low_open=True, null=True, note="bytes; null = unbounded"),
    "slots": Range(1, integer=True),
    "cores": Range(1, integer=True, null=True, note="null = FIFO slots"),
    "forward_fraction": Range(0, 1, low_open=True, high_open=True, note="the forward's share of a measured iteration, time_model=table"),
}

LINK = {
    "bandwidth_bps": Range(0, low_open=True, inf=True, note="bit/s; .inf = instantaneous"),
    "latency_s": Range(0, note="seconds, one way"),
    "wakeup_s": Range(0, note="seconds per transfer"),
    "loss": Range(0, 1, high_open=True, note="probability a message is lost"),
    "retransmit_timeout_s": Range(0, low_open=True, note="seconds a reliable send waits before it resends"),
}

RULES: dict[str, Range] = {
    "seed": SEED,
    "dataset.seed": SEED,
    "train.epochs": Range(0, integer=True),
    "train.batch_size": Range(1, integer=True),
    "train.eval_batch_size": Range(1, integer=True),
    "train.iterations_per_epoch": Range(1, integer=True, null=True),
    "train.lr": Range(0, low_open=True),
    "train.momentum": Range(0, 1, high_open=True),
    "train.weight_decay": Range(0),
    "cluster.num_devices": Range(1, integer=True),
    **{f"cluster.device.{k}": r for k, r in DEVICE.items()},
    **{f"cluster.devices.*.{k}": r for k, r in DEVICE.items()},
    "cluster.device.kind_factors.*": Range(0, note="times a FLOP's time for that layer kind; 0 = free"),
    "cluster.devices.*.kind_factors.*": Range(0, note="times a FLOP's time for that layer kind; 0 = free"),
    **{f"cluster.link.{k}": r for k, r in LINK.items()},
    **{f"cluster.links.*.{k}": r for k, r in LINK.items()},
    "scheduler.microbatches": Range(1, integer=True),
    "scheduler.stages": Range(1, integer=True, null=True),
    "compressor.time.encode_s_per_MB": Range(0, note="seconds"),
    "compressor.time.encode_s": Range(0, note="seconds"),
    "compressor.time.decode_s_per_MB": Range(0, note="seconds"),
    "compressor.time.decode_s": Range(0, note="seconds"),
    "compressor.time.scale": Range(0, low_open=True),
    "transport.broker.port": Range(0, 65535, integer=True, null=True, note="a TCP port; null or 0 = a private broker on a free port"),
    "runtime.threads": Range(1, integer=True, null=True),
    "runtime.join_timeout_s": Range(0, low_open=True, note="seconds"),
    "runtime.max_pending_bytes": Range(1, integer=True),
    "tracking.flush_every": Range(1, integer=True, note="metrics per write"),
    "tracking.gantt_iterations": Range(1, integer=True),
    "tracking.max_trace_events": Range(0, integer=True),
}

# where `.inf` is documented: a link's bandwidth, in its template, its overrides and its traces
INF_ALLOWED = ("cluster.link.bandwidth_bps", "cluster.links.*.bandwidth_bps", "cluster.link.trace[*][1]", "cluster.links.*.trace[*][1]")


def rule(key: str) -> Range | None:
    """The range of `key` (a dotted config key), if the core knows one."""
    if key in RULES:
        return RULES[key]
    parts = key.split(".")
    for pattern, r in RULES.items():
        p = pattern.split(".")
        if len(p) == len(parts) and all(a == "*" or a == b for a, b in zip(p, parts)):
            return r
    return None


def describe(key: str) -> str | None:
    r = rule(key)
    return r.describe() if r else None


def _leaves(node, prefix: str):
    """(dotted key, value) of every leaf under `node`, list items as key[i]."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, node


def resolved(cfg) -> dict:
    """The config as plain containers, every interpolation resolved; one that cannot be resolved
    is a ConfigError naming its key."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        msg = str(getattr(e, "msg", None) or e).splitlines()[0]
        raise ConfigError(key, f"cannot resolve its value: {msg}") from None


def check(cfg) -> None:
    """Every number of `cfg` finite and every known knob in range (see the module's docstring)."""
    plain = resolved(cfg)
    plain.pop("hydra", None)
    for key, value in _leaves(plain, ""):
        r = rule(key)
        if r is not None:
            why = r.problem(value)
            if why:
                raise ConfigError(key, why)
        elif isinstance(value, float) and not math.isfinite(value):
            if math.isinf(value) and value > 0 and any(fnmatch.fnmatchcase(key, p.replace("[", "[[]")) for p in INF_ALLOWED):
                continue
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
