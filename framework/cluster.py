"""Devices and links: how long compute and transfers take.

Devices
-------
A device turns a piece of work (`Work`: forward/backward/step of a unit range at some batch
size, or a fixed number of seconds) into seconds, by one of three time models:

- `analytic`: `slowdown` x FLOPs / `flops_per_s`, with per-layer-kind factors (`kind_factors`, e.g.
  `{depthwise: 3.0}`) so that FLOPs alone cannot predict the device, as on real hardware.
  Backward costs `backward_ratio` x forward; the optimizer step `step_flops_per_param`;
  every call pays `call_overhead_s` per unit (dispatch), so tiny micro-batches are not free.
  Memory streams add to compute: each layer's activations (`act_bytes` per sample) at
  `activation_bytes_per_s`, the unit's weights once per sample at `weight_bytes_per_s` (both
  .inf by default: free). Bytes per FLOP differ tenfold between a network's layers, so two
  devices balanced differently between compute and memory are no fixed multiple of each other.
  Exact and free: the default for tests and planners.
- `profile`: per-unit forward/backward/step times measured once on this host (median of
  repeats) at batch sizes 1, 2, 4, ... up to the run's batch size, cached on disk, times
  `slowdown` (and kind factors). Times between sampled sizes are interpolated linearly, so a
  micro-batch of 1 costs what it really costs on this host, not 1/B of a batch of B (small
  batches use the processor poorly; pipeline schedules and planners must see that).
  Deterministic once cached.
- `measured`: the wall time of the real call times `slowdown`. Not deterministic.
- `table`: a paper's measured per-cut training times of a named real device (Raspberry Pi 4B,
  Jetson TX2, a server GPU), shipped under `conf/profile_tables/` (framework.profile_tables),
  times `slowdown`. Deterministic; for the model the table was measured on.

Links
-----
A directed link has a bandwidth (bit/s, `inf` = instantaneous), a one-way latency, a loss
probability, an optional wake-up time and an optional piecewise-constant bandwidth trace.
Transfers on one channel are FIFO: a message starts when the channel is free, occupies it for
wake-up + size/bandwidth, and arrives `latency` later. Every link has its own channel (full duplex), unless the cluster is a
`shared_medium`, where all links share one (a WLAN hotspot: one transfer at a time). A lost
message of a reliable send is retransmitted after `retransmit_timeout_s` (head-of-line
blocking, as TCP); an unreliable send just never arrives, unless it asks for `retries`: then the
link runs a bounded stop-and-wait ARQ (a radio MAC's ACKs and retransmissions; `Link.schedule`).
"""

from __future__ import annotations

import bisect
import copy
import fnmatch
import hashlib
import itertools
import json
import math
import os
import random
import time
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from framework import profile_tables
from framework.config import knobs
from framework.config.schemas import DeviceConfig, LinkConfig
from framework.errors import ConfigError, listing
from framework.lean_torch import SGD, backward


@dataclass(frozen=True)
class Work:
    """A piece of compute: `kind` in fwd/bwd/step over units [start, stop) at `batch` samples,
    `share` of those units' neurons (EdgePipe's neuron chunks: their time is that share of the
    units'), or a fixed `seconds` (codecs, aggregation, anything a plugin prices itself)."""

    kind: str
    start: int = 0
    stop: int = 0
    batch: int = 0
    seconds: float | None = None
    share: float = 1.0


class Device:
    def __init__(self, name: str, cfg: DeviceConfig, infos=None, profile=None):
        self.name = name
        self.cfg = cfg
        self.infos = infos or []
        self.profile = profile  # host seconds: {"batches": [b...], "fwd"/"bwd": [[t(b)...] per unit], "step": [...]}
        knobs.check({"time_model": cfg.time_model}, DeviceConfig, f"cluster.devices.{name}")  # a cluster built from code too
        if cfg.time_model == "profile" and profile is None:
            raise ValueError(f"device {name}: the profile time model needs a host profile")
        self.table = profile_tables.device_table(cfg, name, len(self.infos) if self.infos else None) if cfg.time_model == "table" else None
        self._unit_factor = [self._kind_factor(i) for i in self.infos]
        # seconds per sample each unit spends streaming memory (the analytic model)
        self._unit_stream = [i.act_bytes / cfg.activation_bytes_per_s + i.param_bytes / cfg.weight_bytes_per_s for i in self.infos]
        self._memo: dict[Work, float] = {}
        self.trace = _speed_trace(name, cfg.trace)
        if cfg.cores is not None and cfg.slots != 1:
            raise ConfigError(f"cluster.devices.{name}.cores", f"shares {cfg.cores} cores among every computation (processor sharing); FIFO slots ({cfg.slots}) are the other discipline: set one of them")
        if cfg.cores is not None and self.trace:
            raise ConfigError(f"cluster.devices.{name}.cores", "a shared processor with a speed trace is not modelled: drop the trace or the cores")

    def _kind_factor(self, info) -> float:
        kf = self.cfg.kind_factors
        if not kf or info.flops <= 0:
            return 1.0
        return sum(f * kf.get(k, 1.0) for k, f in info.flops_by_kind.items()) / info.flops

    @property
    def slots(self) -> int:
        return max(1, int(self.cfg.slots))

    def time(self, work: Work, wall_s: float | None = None) -> float:
        """Seconds this device needs for `work`; `wall_s` is the host's measured time of the call."""
        if work.seconds is not None:
            return float(work.seconds)
        if self.cfg.time_model == "measured":
            if wall_s is None:
                raise ValueError(f"device {self.name}: the measured time model needs the call's wall time")
            return self.cfg.slowdown * wall_s
        t = self._memo.get(work)  # analytic and profile times depend on the work alone
        if t is None:
            t = self._memo[work] = self._model_time(work) * work.share
        return t

    def speed_factor(self, t: float) -> float:
        """How many times longer than its time model this device computes at time t (its trace)."""
        f = 1.0
        for t0, factor in self.trace or ():
            if t0 > t:
                break
            f = factor
        return f

    def duration(self, work: Work, start: float, wall_s: float | None = None) -> float:
        """Seconds `work` takes when it starts at `start`: the time model's seconds stretched by the
        speed trace, integrated across its changes (work done at rate 1/factor), as link traces are."""
        base = self.time(work, wall_s)
        if not self.trace or base <= 0:
            return base
        t, left = start, base
        changes = [t0 for t0, _ in self.trace if t0 > start]
        for nxt in changes + [math.inf]:
            f = self.speed_factor(t)
            if left * f <= nxt - t:
                return t + left * f - start
            left -= (nxt - t) / f
            t = nxt
        return t - start  # unreachable: the last segment is unbounded

    def _model_time(self, work: Work) -> float:
        cfg = self.cfg
        units = range(work.start, work.stop)
        if cfg.time_model == "analytic":
            if work.kind == "step":
                params = sum(self.infos[i].params for i in units)
                return cfg.slowdown * (cfg.step_flops_per_param * params / cfg.flops_per_s + cfg.call_overhead_s * len(units))
            flops = sum(self.infos[i].flops * self._unit_factor[i] for i in units) * work.batch
            stream = sum(self._unit_stream[i] for i in units) * work.batch
            busy = flops / cfg.flops_per_s + stream
            if work.kind == "bwd":
                busy *= cfg.backward_ratio
            return cfg.slowdown * (busy + cfg.call_overhead_s * len(units))
        if cfg.time_model == "table":
            return profile_tables.work_seconds(self.table, cfg, work.kind, work.start, work.stop, work.batch)
        if cfg.time_model == "profile":
            if work.kind == "step":
                return cfg.slowdown * sum(self.profile["step"][i] * self._unit_factor[i] for i in units)
            table, batches = self.profile[work.kind], self.profile["batches"]
            return cfg.slowdown * sum(curve_time(table[i], batches, work.batch) * self._unit_factor[i] for i in units)
        raise ValueError(f"device {self.name}: no model time for time model {cfg.time_model!r}")


def _speed_trace(name: str, trace) -> list[tuple[float, float]] | None:
    if not trace:
        return None
    out = []
    for i, point in enumerate(trace):
        if len(point) != 2 or not float(point[1]) > 0:
            raise ConfigError(f"cluster.devices.{name}.trace[{i}]", f"{list(point)} is not [t_s, factor] with factor > 0")
        out.append((float(point[0]), float(point[1])))
    return sorted(out)


class Channel:
    """A medium that carries one transfer at a time; `free_at` is when it next is idle."""

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0


def check_link(cfg: LinkConfig, where: str) -> None:
    """A link's numbers in their ranges (LinkConfig's, checked before the run too): a cluster
    built from code gets the same checks."""
    knobs.check(cfg, LinkConfig, where)


class Link:
    def __init__(self, src: str, dst: str, cfg: LinkConfig, channel: Channel, seed: int):
        self.src, self.dst, self.cfg, self.channel = src, dst, cfg, channel
        self.name = f"{src}->{dst}"
        check_link(cfg, f"cluster.links.{self.name}")
        self.trace = sorted((float(t), float(b)) for t, b in cfg.trace) if cfg.trace else None
        self.rng = random.Random(zlib.crc32(f"{seed}:{self.name}".encode()))
        self.drew_acks = False

    def set_loss(self, loss: float) -> None:
        """Set the probability that a message is lost (a scheduler with a channel model of its own,
        such as EdgePipe's PRR matrix). 1 drops every message: only unreliable sends may use such
        a link (a reliable one would be sent again for ever)."""
        if not 0.0 <= loss <= 1.0:
            raise ConfigError(f"cluster.links.{self.name}.loss", f"must be in [0, 1], got {loss}")
        self.cfg.loss = float(loss)

    def set_retransmit_timeout(self, seconds: float) -> None:
        """Set how long a sender waits before sending a lost message again (a radio MAC's ACK wait
        rather than the config's TCP-like timeout, for a scheduler whose retries must fit a slot)."""
        if not seconds >= 0:
            raise ConfigError(f"cluster.links.{self.name}.retransmit_timeout_s", f"must be >= 0, got {seconds}")
        self.cfg.retransmit_timeout_s = float(seconds)

    def bandwidth_at(self, t: float) -> float:
        bw = self.cfg.bandwidth_bps
        if self.trace:
            for t0, b in self.trace:
                if t0 <= t:
                    bw = b
        return bw

    def tx_time(self, nbytes: int, start: float) -> float:
        """Seconds the channel is busy pushing `nbytes` onto the link from `start`: the wake-up,
        then the bytes (integrating the trace)."""
        bits = 8.0 * nbytes
        wake = self.cfg.wakeup_s
        if not self.trace:
            bw = self.cfg.bandwidth_bps
            return wake + (0.0 if math.isinf(bw) else bits / bw)
        return wake + self._push_time(bits, start + wake)

    def _push_time(self, bits: float, start: float) -> float:
        t = start
        changes = [t0 for t0, _ in self.trace if t0 > start]
        while True:
            bw = self.bandwidth_at(t)
            nxt = changes.pop(0) if changes else math.inf
            if math.isinf(bw):
                return t - start
            can = (nxt - t) * bw
            if bits <= can:
                return t + bits / bw - start
            bits -= can
            t = nxt

    def schedule(self, nbytes: int, now: float, reliable: bool = True, retries: int = 0, ack_loss: float = 0.0):
        """Reserve the channel for one message sent at `now`.

        `reliable`: retransmit after `retransmit_timeout_s` until delivered. Unreliable with
        `retries` = k > 0: stop-and-wait ARQ, at most k retransmissions after
        `retransmit_timeout_s` each; an attempt is repeated if it was lost or its ACK was (with
        probability `ack_loss`, the reverse link's loss, drawn from this link's generator); the
        receiver sees the first copy that arrives, later ones are duplicates it drops.

        Returns (attempts, arrival or None if lost): `attempts` is a list of (start, end, outcome)
        busy intervals on the channel, one per transmission, outcome "send" (the copy delivered),
        "lost" or "dup"."""
        if reliable and retries:
            raise ValueError(f"link {self.name}: retries={retries} is for unreliable sends (a reliable one retransmits until delivered)")
        attempts = []
        arrival = None
        t = now
        for i in itertools.count():
            start = max(t, self.channel.free_at)
            end = start + self.tx_time(nbytes, start)
            self.channel.free_at = end
            lost = self.cfg.loss > 0 and self.rng.random() < self.cfg.loss
            if not lost:
                attempts.append((start, end, "send" if arrival is None else "dup"))
                if arrival is None:
                    arrival = end + self.cfg.latency_s
                # the last attempt's ACK changes nothing: no draw, so retries=0 draws as before
                if reliable or i == retries or not (ack_loss > 0 and self._ack_lost(ack_loss)):
                    return attempts, arrival
            else:
                attempts.append((start, end, "lost"))
                if not reliable and i == retries:
                    return attempts, arrival
                if reliable and self.cfg.loss >= 1.0:
                    raise ConfigError(f"cluster.links.{self.name}.loss", "is 1 (every message lost): a reliable send on it would be retransmitted for ever")
            t = end + self.cfg.retransmit_timeout_s

    def _ack_lost(self, ack_loss: float) -> bool:
        self.drew_acks = True  # the generator moved on a loss-free link: checkpoints keep its state
        return self.rng.random() < ack_loss


def _merge(dc_cls, base, override: dict, where: str):
    """A copy of dataclass `base` with `override`'s keys; unknown keys fail naming the choices."""
    valid = {f.name for f in fields(dc_cls)}
    values = {f.name: getattr(base, f.name) for f in fields(dc_cls)}
    for k, v in (override or {}).items():
        if k not in valid:
            raise ConfigError(f"{where}.{k}", f"unknown key; valid keys: {', '.join(sorted(valid))}")
        values[k] = v
    obj = dc_cls(**values)
    if isinstance(obj, DeviceConfig):
        obj.kind_factors = dict(obj.kind_factors or {})
    return obj


def _plain(node) -> Any:
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


class Cluster:
    """The devices and links of a run, built from the `cluster` config group."""

    def __init__(self, cfg, model=None, *, batch_size: int = 1, seed: int = 0, dtype=torch.float32):
        self.cfg = cfg
        n = int(cfg.num_devices)
        if n < 1:
            raise ConfigError("cluster.num_devices", f"must be >= 1, got {n}")
        base_dev = _merge(DeviceConfig, DeviceConfig(), _plain(cfg.device), "cluster.device")
        overrides = _plain(cfg.devices) or {}
        names = [f"dev{i}" for i in range(n)]
        names += [k for k in overrides if k not in names and not _is_dev_index(k) and not _is_glob(k)]
        for k in overrides:
            if _is_dev_index(k) and k not in names:
                raise ConfigError(f"cluster.devices.{k}", f"no such device: the cluster has {n} devices dev0..dev{n - 1}")
        infos = model.infos if model is not None else []
        self.devices: dict[str, Device] = {}
        profile = None
        for name in names:
            over: dict = {}
            for pattern, values in overrides.items():  # glob patterns first, in order; exact names win
                if _is_glob(pattern) and fnmatch.fnmatchcase(name, pattern):
                    over.update(values or {})
            over.update(overrides.get(name) or {})
            dcfg = _merge(DeviceConfig, base_dev, over, f"cluster.devices.{name}")
            if dcfg.time_model == "profile" and profile is None:
                if model is None:
                    raise ValueError("the profile time model needs the model")
                profile = host_profile(model, batch_size, dtype)
            self.devices[name] = Device(name, dcfg, infos, profile)

        base_link = _merge(LinkConfig, LinkConfig(), _plain(cfg.link), "cluster.link")
        link_over = _plain(cfg.links) or {}
        for pattern in link_over:
            src, dst = _split_link(pattern)
            for side in (src, dst):
                if not _is_glob(side) and side not in self.devices:
                    raise ConfigError(f"cluster.links.{pattern}", f"device {side!r} does not exist; devices: {listing(self.devices)}")
        # every value is checked now (fail before running); a link itself is built the first time
        # a message takes it: K devices have K(K-1) pairs, a star topology uses 2K of them
        check_link(base_link, "cluster.link")
        for pattern, values in link_over.items():
            check_link(_merge(LinkConfig, base_link, values or {}, f"cluster.links.{pattern}"), f"cluster.links.{pattern}")
        self._base_link, self._link_over = base_link, [(_split_link(p), v or {}) for p, v in link_over.items()]
        self._seed = seed
        self._shared = Channel("medium") if cfg.shared_medium else None
        self.channels = [self._shared] if self._shared else []
        self.links: dict[tuple[str, str], Link] = {}  # the links used so far

    @property
    def names(self) -> list[str]:
        return list(self.devices)

    def device(self, name: str) -> Device:
        try:
            return self.devices[name]
        except KeyError:
            raise ConfigError("cluster", f"no device {name!r}; devices: {listing(self.devices)}") from None

    def link(self, src: str, dst: str) -> Link | None:
        """The link from device src to dst; None within one device (free)."""
        if src == dst:
            return None
        link = self.links.get((src, dst))
        if link is None:
            self.device(src), self.device(dst)
            over: dict = {}
            for (ps, pd), values in self._link_over:  # later patterns win
                if fnmatch.fnmatchcase(src, ps) and fnmatch.fnmatchcase(dst, pd):
                    over.update(values)
            ch = self._shared or Channel(f"{src}->{dst}")
            if not self._shared:
                self.channels.append(ch)
            link = self.links[(src, dst)] = Link(src, dst, _merge(LinkConfig, self._base_link, over, f"cluster.links.{src}->{dst}"), ch, self._seed)
        return link


def _is_glob(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def _is_dev_index(name: str) -> bool:
    return name.startswith("dev") and name[3:].isdigit()


def _split_link(key: str) -> tuple[str, str]:
    if "->" not in key:
        raise ConfigError(f"cluster.links.{key}", "link keys are 'src->dst' (glob patterns allowed, e.g. 'dev*->server')")
    src, dst = key.split("->", 1)
    return src.strip(), dst.strip()


# ---------------------------------------------------------------------------------------------
# host profiling for the `profile` time model


def _cache_dir() -> Path:
    return Path(os.environ.get("PIPELAB_CACHE", Path.home() / ".cache" / "pipelab")) / "profiles"


def profile_batches(batch_size: int) -> list[int]:
    """The batch sizes a host profile samples: powers of two below `batch_size`, and it."""
    out, b = [], 1
    while b < batch_size:
        out.append(b)
        b *= 2
    return out + [batch_size]


def curve_time(times: list[float], batches: list[int], batch: int) -> float:
    """One unit's seconds at `batch`, from its times at the sampled `batches` (ascending):
    linear between samples, proportional beyond the largest (throughput has saturated there)."""
    if batch >= batches[-1]:
        return times[-1] * batch / batches[-1]
    k = bisect.bisect_left(batches, batch)
    if k == 0:
        return times[0] * batch / batches[0]
    b0, b1 = batches[k - 1], batches[k]
    return times[k - 1] + (times[k] - times[k - 1]) * (batch - b0) / (b1 - b0)


def host_profile(model, batch_size: int, dtype=torch.float32, repeats: int = 5, min_s: float = 0.02, timer=time.perf_counter) -> dict:
    """Per-unit forward/backward seconds of `model` on this host at `profile_batches(batch_size)`
    and optimizer-step seconds, cached on disk.

    Each time is the median of at least `repeats` calls after one warm-up, more for short calls
    (until `min_s` of measuring), because microsecond calls are noisy. Along the batch sizes each
    unit's time is made non-decreasing (a running maximum): more samples never take less time,
    and a noisy inversion would otherwise reward splitting a batch for nothing.

    `timer`: what a call's seconds are read from; `time.thread_time` measures a one-thread torch
    (whose kernels run on the calling thread) by the CPU time it got, so other load on the machine
    inflates it far less than wall time (experiments/calibrate_pipar.py)."""
    batches = profile_batches(batch_size)
    key = json.dumps(
        {
            "version": 2,  # 2: batch-size curves
            "model": model.name,
            "units": [(i.name, i.in_shape, i.out_shape, i.params, round(i.flops)) for i in model.infos],
            "batches": batches,
            "dtype": str(dtype),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        sort_keys=True,
    )
    path = _cache_dir() / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass  # a corrupt cache entry is measured again
    rng_state = torch.get_rng_state()
    units = [copy.deepcopy(u).to(dtype) for u in model.units]
    for u in units:
        u.train()
    fwd = [[0.0] * len(batches) for _ in units]
    bwd = [[0.0] * len(batches) for _ in units]
    for col, b in enumerate(batches):
        x = torch.randn((b, *model.input_shape), dtype=dtype)
        for row, u in enumerate(units):
            xin = x.detach().requires_grad_(True)
            tf, tb = [], []
            r = 0
            # BatchNorm cannot train on one value per channel (batch 1 after global pooling):
            # time that unit in eval mode, which does the same arithmetic
            try:
                u(xin)
            except ValueError:
                u.eval()
            while r <= repeats or (sum(tf) + sum(tb) < min_s and r <= 50 * repeats):
                t0 = timer()
                y = u(xin)
                t1 = timer()
                g = torch.ones_like(y)
                t2 = timer()
                backward(y, g)
                t3 = timer()
                if r:  # the first round warms up
                    tf.append(t1 - t0)
                    tb.append(t3 - t2)
                r += 1
            fwd[row][col], bwd[row][col] = _median(tf), _median(tb)
            u.train()
            x = y.detach()
    for table in (fwd, bwd):
        for row in table:
            for col in range(1, len(row)):
                row[col] = max(row[col], row[col - 1])
    step = []
    for u in units:
        params = [p for p in u.parameters() if p.grad is not None]
        ts = []
        if params:
            opt = SGD(params, lr=1e-6, momentum=0.9)
            for r in range(repeats + 1):
                t0 = timer()
                opt.step()
                if r:
                    ts.append(timer() - t0)
        step.append(_median(ts) if ts else 0.0)
    torch.set_rng_state(rng_state)
    prof = {"batches": batches, "fwd": fwd, "bwd": bwd, "step": step}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(prof))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a re-measure next time
    return prof


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0
