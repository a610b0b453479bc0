"""`predictor=accept`: AccEPT's dual-stream latency predictor (notes 2.1) for the planners.

For a model and a batch size it pre-trains `plugins.predictors.accept_mlp.LatencyPredictor` on a
pool of devices, every contiguous sub-model timed forward + backward. The paper pre-trains on CPUs
it measured under `taskset` core limits (24 configurations, two of them the CPUs its scenarios
deploy). With `pool_table` (a profile table measured here, e.g. experiment=accept's
accept_mobilenetv2_b128: this host's core counts) the pool is made the same way: seeded
non-linear transforms of those measured columns (accept_data.SyntheticDevice, the devices
experiments/accept_predictor.py evaluates Figs. 7-8 on). Without it (any other model), analytic
devices with seeded random rates, per-layer-kind factors, per-unit call overheads, backward
ratios and memory streams (framework.cluster). A device of the run is
then known by its hardware vector: the forward + backward times of its 10 representative
sub-models, measured on it (its time model), and the MLP predicts any sub-model from that. The
central node (`central`, dev0) is not predicted: as in the paper's Eq. 9 (and FTPipeHD), the DP
prices its stage by its own per-layer profile, summed (notes 2.3, 8.4); the MLP prices the workers
(Eq. 10).

The predictor is trained for one batch size, the first the planner asks for (its micro-batch);
a prediction at another (an epoch's short last micro-batch) is scaled as the device's measured
whole model scales between the two. What the planners ask for is per kind: the forward's share of a prediction is the share the
device's representatives measured, the backward the rest; an optimizer step is the device's
measured step of the whole model scaled by the parameters. The trained weights are cached on disk
(`cache_dir`, keyed by the model's units, the batch and this config), so only a model's first run
at a batch size pays for pre-training (MobileNetV2: about 2 minutes on one core).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.torch import load_file, save_file

from framework import profile_tables
from framework.cluster import Device, Work
from framework.config.schemas import DeviceConfig
from framework.errors import ConfigError
from framework.models import KINDS
from framework.predictor import Predictor
from plugins.predictors import accept_data as ad
from plugins.predictors.accept_mlp import LatencyPredictor
from plugins.predictors.basic import measure
from plugins.predictors.profiled import per_unit
from plugins.predictors.schemas import AcceptConfig  # noqa: F401  (registry.declare)


def pool_device(seed: int, infos, cfg) -> Device:
    rng = np.random.default_rng(seed)
    lo, hi = (math.log(float(x)) for x in cfg.flops_per_s_range)
    klo, khi = (math.log(float(x)) for x in cfg.kind_factor_range)
    kf = np.exp(rng.uniform(klo, khi, len(KINDS)))
    rate = float(np.exp(rng.uniform(lo, hi)))
    dcfg = DeviceConfig(time_model="analytic", flops_per_s=rate, kind_factors={k: float(f) for k, f in zip(KINDS, kf)},
                        call_overhead_s=float(rng.uniform(0.0, float(cfg.max_call_overhead_s))), backward_ratio=float(rng.uniform(1.5, 2.5)))
    blo, bhi = (math.log(float(x)) for x in cfg.bytes_per_flop_range)
    dcfg.activation_bytes_per_s, dcfg.weight_bytes_per_s = (rate * float(b) for b in np.exp(rng.uniform(blo, bhi, 2)))
    return Device(f"pool{seed}", dcfg, infos)


def fwd_bwd(device: Device, a: int, b: int, batch: int) -> float:
    return measure(device, Work("fwd", a, b, batch)) + measure(device, Work("bwd", a, b, batch))


class AcceptPredictor(Predictor):
    def __init__(self, cfg, cluster):
        super().__init__()
        self.cfg, self.cluster = cfg, cluster
        self.infos = next(iter(cluster.devices.values())).infos if cluster.devices else []
        self.L = len(self.infos)
        self.subs = ad.submodels(self.L)
        flops = {ab: sum(i.flops for i in self.infos[ab[0]:ab[1]]) for ab in self.subs}
        self.reps = ad.representatives(flops)
        self._mlp: dict[int, LatencyPredictor] = {}
        self._device: dict = {}  # (device, batch) -> (hardware vector, forward share)
        self._batch: int | None = None
        self._reported: list[tuple[np.ndarray, np.ndarray, float]] = []  # D-hat: (mask, h, seconds) from a run's reports

    # ---- pre-training ------------------------------------------------------------------------

    def _key(self, batch: int) -> str:
        facts = [[i.name, i.flops, i.params, sorted(i.flops_by_kind.items()), i.act_bytes, i.param_bytes] for i in self.infos]  # what the pool's times depend on
        cfg = {k: self.cfg[k] for k in ("pool", "epochs", "width", "seed", "flops_per_s_range", "kind_factor_range", "max_call_overhead_s", "bytes_per_flop_range")}
        table = self.cfg.get("pool_table")
        if table:  # a measured pool depends on the table's numbers, not on the analytic ranges
            t = profile_tables.load(str(table))
            cfg = {k: cfg[k] for k in ("pool", "epochs", "width", "seed")} | {"pool_table": [t.name, t.batch, sorted(t.prefix.items())]}
        return hashlib.sha256(json.dumps([facts, batch, cfg, "v2"], default=str).encode()).hexdigest()[:16]  # v2: the file holds the normalisation

    def model(self, batch: int) -> LatencyPredictor:
        if batch in self._mlp:
            return self._mlp[batch]
        mlp = LatencyPredictor(self.L, seed=int(self.cfg.seed), width=int(self.cfg.width))
        path = Path(str(self.cfg.cache_dir)).expanduser() / f"accept_{self._key(batch)}.safetensors" if self.cfg.cache_dir else None
        if path is not None and path.is_file():
            mlp.load_tensors(load_file(str(path)))
        else:
            t0 = time.perf_counter()
            print(f"predictor=accept: pre-training on {int(self.cfg.pool)} simulated devices x {len(self.subs)} sub-models at batch {batch} "
                  f"(once{'; cached in ' + str(path.parent) if path else ''})", file=sys.stderr, flush=True)
            mlp.fit(*self.pool_data(batch), epochs=int(self.cfg.epochs))
            print(f"predictor=accept: pre-trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                save_file(mlp.tensors(), str(path))
        self._mlp[batch] = mlp
        return mlp

    def pool_data(self, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pre-training set D: (masks, hardware vectors, seconds), every sub-model of every
        pool device (0.1 s to make: a cached predictor rebuilds it only to fine-tune)."""
        masks = np.stack([ad.mask(self.L, a, b) for a, b in self.subs])
        seeds = [int(self.cfg.seed) * 100_003 + i for i in range(int(self.cfg.pool))]
        if self.cfg.get("pool_table"):
            times = self._measured_pool(str(self.cfg.pool_table), seeds, batch)
        else:
            pool = [pool_device(seed, self.infos, self.cfg) for seed in seeds]
            times = [np.array([fwd_bwd(d, a, b, batch) for a, b in self.subs]) for d in pool]
        hs = [np.repeat(np.array([t[self.subs.index(r)] for r in self.reps])[None], len(self.subs), 0) for t in times]
        return np.concatenate([masks] * len(times)), np.concatenate(hs), np.concatenate(times)

    def _measured_pool(self, name: str, seeds: list[int], batch: int) -> list[np.ndarray]:
        """Every sub-model's seconds on devices made, as the paper's D was measured on CPUs under
        `taskset` core limits, from a profile table measured here (its columns: this host's core
        counts): each a seeded non-linear transform of one column (accept_data.SyntheticDevice:
        speed, per-layer-kind factors, a saturation exponent, a launch cost per unit, 1 % noise),
        standing in for other CPUs. Other batch sizes scale as the table model does (linearly)."""
        table = profile_tables.load(name)
        if table.units != self.L:
            raise ConfigError("predictor.pool_table", f"profile table {name!r} prices {table.units} units, the model has {self.L}")
        host = {i: np.array([table.iteration_seconds(col, a, b) for a, b in self.subs]) for i, col in enumerate(sorted(table.prefix))}
        facts = ad.ModelFacts("pool", np.array([[info.flops_by_kind.get(k, 0.0) for k in KINDS] for info in self.infos]))
        return [ad.SyntheticDevice(seed, facts, host).times() * batch / table.batch for seed in seeds]

    # ---- a device of the run -----------------------------------------------------------------

    def hardware(self, device: Device, batch: int) -> tuple[np.ndarray, float]:
        """(h, forward share): the device's measured times of the 10 representatives."""
        key = (device.name, batch)
        if key not in self._device:
            self._device[key] = self._measure_representatives(device, batch)
        return self._device[key]

    def _measure_representatives(self, device: Device, batch: int, speed: float = 1.0) -> tuple[np.ndarray, float]:
        """(h, forward share) measured on `device` now, running `speed` times slower than its model."""
        fwd = np.array([measure(device, Work("fwd", a, b, batch)) for a, b in self.reps])
        bwd = np.array([measure(device, Work("bwd", a, b, batch)) for a, b in self.reps])
        return (fwd + bwd) * speed, float(fwd.sum() / (fwd + bwd).sum())

    def _batch_ratio(self, device: Device, to: int, frm: int) -> float:
        """How the device's whole model scales from batch `frm` to batch `to`."""
        return 1.0 if to == frm else fwd_bwd(device, 0, self.L, to) / fwd_bwd(device, 0, self.L, frm)

    def observe(self, device: Device, start: int, stop: int, batch: int, seconds: float, now: float) -> None:
        """AccEPT's dynamic prediction and adaptive update (notes 2.1): a report off the
        prediction means the device's resources changed, so its hardware vector is measured again
        (its 10 representatives, at its speed at `now`), and the report joins D-hat; from
        `finetune_min_samples` reports on, the MLP is fine-tuned on D-hat (continual learning).
        The central node, priced by its own profile, is rescaled by its report (FTPipeHD's update)."""
        if device.name == self.cfg.get("central"):
            super().observe(device, start, stop, batch, seconds, now)
            return
        b = self._batch or batch
        h, _ = self._device[(device.name, b)] = self._measure_representatives(device, b, device.speed_factor(now))
        self._reported.append((ad.mask(self.L, start, stop), h, seconds * self._batch_ratio(device, b, batch)))
        if len(self._reported) >= int(self.cfg.finetune_min_samples):
            masks, hs, secs = (np.stack(col) for col in zip(*self._reported))
            mlp = self.model(b)
            if mlp.data is None:  # loaded from the cache: D is replayed beside D-hat
                mlp.data = self.pool_data(b)
            mlp.adapt(masks, hs, secs)

    def estimate(self, device: Device, work: Work) -> float:
        if work.seconds is not None:
            return work.seconds
        if device.name == self.cfg.get("central"):  # Eq. 9: the central node's own profiled layers, summed
            return sum(per_unit(device, work))
        if work.kind == "step":  # not the predictor's: the device's whole-model step, by parameters
            whole = measure(device, Work("step", 0, self.L, 0))
            params = sum(i.params for i in self.infos)
            return whole * work.share * sum(i.params for i in self.infos[work.start:work.stop]) / params if params else 0.0
        batch = max(int(work.batch), 1)
        if self._batch is None:
            self._batch = batch  # the predictor's batch: the first the planner asks for (its micro-batch)
        h, fwd_share = self.hardware(device, self._batch)
        t = float(self.model(self._batch).predict(ad.mask(self.L, work.start, work.stop)[None], h[None])[0])
        t *= work.share * (fwd_share if work.kind == "fwd" else 1.0 - fwd_share)
        t *= self._batch_ratio(device, batch, self._batch)  # another batch (an epoch's short last one): as the whole model scales
        return t
