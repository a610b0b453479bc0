"""AccEPT's latency data (Chen et al., notes 2.1): every contiguous sub-model of a model, timed.

- `submodels(L)`: the M = L(L+1)/2 contiguous unit ranges [a, b), `mask` their binary encoding
  (the predictor's first stream), `representatives`: the 10 sub-models whose times form a
  device's hardware vector h (sorted by forward FLOPs, indices floor(k(M-1)/9), k = 0..9).
- `profile_host`: forward+backward time of every sub-model at one batch size on this host under
  several core counts (the paper's `taskset` core limits): n cores as intra-op data parallelism,
  one thread's CPU seconds at batch / n (experiments/accept_profile.py says why: two threads
  cannot be timed on the shared 2-core machine), the minimum of `repeats` after a warm-up.
- `SyntheticDevice`: a device whose time for a sub-model is a non-linear transform of the host's
  (the issue's stand-in for the paper's 24 CPU configurations): the host profile of its core
  count, per-layer-kind speed factors weighted by the sub-model's FLOP mix, a saturation exponent
  on the host time, a launch overhead per unit and 1 % of multiplicative noise fixed per (device,
  sub-model) (what is left of timing noise after the paper's 100 repeats). Each is seeded: the same seed, the same device.

The dataset file (`save`/`load`, npz) holds the host profiles and the model's per-unit FLOPs by
kind, so devices, masks and the evaluation are rebuilt from it without timing anything again.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from framework.models import KINDS


def submodels(L: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(L) for b in range(a + 1, L + 1)]


def mask(L: int, a: int, b: int) -> np.ndarray:
    m = np.zeros(L, dtype=np.float32)
    m[a:b] = 1.0
    return m


def representatives(flops: dict[tuple[int, int], float]) -> list[tuple[int, int]]:
    """The 10 representative sub-models: sorted by FLOPs (ties by range), floor(k(M-1)/9)."""
    order = sorted(flops, key=lambda ab: (flops[ab], ab))
    M = len(order)
    return [order[(k * (M - 1)) // 9] for k in range(10)]


@dataclass
class ModelFacts:
    """What the evaluation needs of the model: forward FLOPs per sample by kind, per unit."""

    name: str
    flops_by_kind: np.ndarray  # (L, len(KINDS))

    @property
    def L(self) -> int:
        return len(self.flops_by_kind)

    def flops(self, a: int, b: int) -> float:
        return float(self.flops_by_kind[a:b].sum())

    def kind_mix(self, a: int, b: int) -> np.ndarray:
        f = self.flops_by_kind[a:b].sum(0)
        return f / f.sum() if f.sum() > 0 else np.full(len(KINDS), 1.0 / len(KINDS))


def model_facts(model) -> ModelFacts:
    return ModelFacts(model.name, np.array([[info.flops_by_kind.get(k, 0.0) for k in KINDS] for info in model.infos]))


def time_submodel(model, a: int, b: int, batch: int, repeats: int) -> float:
    """Forward + backward CPU seconds of units [a, b) on a random batch (input gradient too, as a
    pipeline stage that returns one), one thread: the minimum of `repeats` calls after a warm-up
    (what other jobs on the machine add only ever adds)."""
    part = model.slice(a, b)
    shape = (batch, *model.infos[a - 1].out_shape) if a > 0 else (batch, *model.input_shape)
    x = torch.randn(shape)
    times = []
    for r in range(repeats + 1):
        xi = x.detach().requires_grad_(a > 0)
        t0 = time.process_time()
        part(xi).float().sum().backward()
        if r:  # the first is a warm-up
            times.append(time.process_time() - t0)
        part.zero_grad(set_to_none=True)
    return min(times)


def profile_host(model, batch: int, cores: list[int], repeats: int, progress=None) -> dict[int, np.ndarray]:
    """{cores: times[M]} of every sub-model (in `submodels` order): n cores each run batch / n
    samples (rounded), one thread, scaled to exactly batch / n."""
    before = torch.get_num_threads()
    out = {}
    model.train()
    try:
        torch.set_num_threads(1)
        for n in cores:
            b = max(1, round(batch / n))
            out[n] = np.array([time_submodel(model, a, c, b, repeats) for a, c in submodels(len(model))]) * (batch / n / b)
            if progress:
                progress(f"profiled {len(out[n])} sub-models on {n} core(s): {out[n].sum():.1f} s of compute")
    finally:
        torch.set_num_threads(before)
    return out


def save(path, facts: ModelFacts, host: dict[int, np.ndarray], batch: int) -> None:
    np.savez(path, name=facts.name, flops_by_kind=facts.flops_by_kind, batch=batch, threads=np.array(sorted(host)), **{f"host_{t}": host[t] for t in host})


def load(path) -> tuple[ModelFacts, dict[int, np.ndarray], int]:
    with np.load(Path(path)) as z:
        host = {int(t): z[f"host_{int(t)}"] for t in z["threads"]}
        return ModelFacts(str(z["name"]), z["flops_by_kind"]), host, int(z["batch"])


class SyntheticDevice:
    """A device built from the host's profiles by a seeded non-linear transform (module doc)."""

    def __init__(self, seed: int, facts: ModelFacts, host: dict[int, np.ndarray], noise: float = 0.01):
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.threads = int(rng.choice(sorted(host)))  # its core count (a key of `host`)
        self.speed = float(np.exp(rng.uniform(math.log(0.5), math.log(4.0))))  # x host time
        self.kind_factor = np.exp(rng.uniform(math.log(0.6), math.log(1.7), len(KINDS)))
        self.exponent = float(rng.uniform(0.85, 1.15))  # saturation: small work runs relatively slower (or faster)
        self.launch_s = float(rng.uniform(0.0, 2e-3))  # per unit and call
        self.facts = facts
        base = host[self.threads]
        ref = float(np.median(base))
        subs = submodels(facts.L)
        self.noise = np.exp(rng.normal(0.0, noise, len(subs)))
        self._times = {}
        for i, (a, b) in enumerate(subs):
            mix = float(facts.kind_mix(a, b) @ self.kind_factor)
            t = self.speed * ref * (base[i] / ref) ** self.exponent * mix + self.launch_s * (b - a)
            self._times[(a, b)] = t * self.noise[i]

    def time(self, a: int, b: int) -> float:
        return self._times[(a, b)]

    def times(self) -> np.ndarray:
        return np.array([self._times[ab] for ab in submodels(self.facts.L)])

    def hardware_vector(self, reps: list[tuple[int, int]]) -> np.ndarray:
        return np.array([self._times[ab] for ab in reps])
