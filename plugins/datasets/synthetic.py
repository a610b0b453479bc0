"""Seeded, class-conditional synthetic datasets: stand-ins for MNIST, CIFAR10 and UCI-HAR.

No downloads are possible where the experiments run, yet accuracy checks need a task a network
can learn but not solve outright. Every sample is a class pattern that is perturbed (random
amplitude, a small shift, a random mode of its class) and buried in Gaussian noise, so the
difficulty is set by `noise`.

- Images (rank >= 2; the last two dims are spatial): each class has `prototypes` smooth random
  fields (a `grid` x `grid` random grid per channel, upsampled bilinearly); a sample is one of
  them, times a random amplitude, rolled by up to `max_shift` pixels, plus noise.
- Vectors (rank 1, e.g. `shape=[64]`): the same, with the prototypes drawn directly in input
  space and no shift.
- HAR (`synthetic_har`, shape [channels, time]): per class and channel a sinusoid with its own
  frequency, phase and amplitude; a sample shifts it in time, jitters frequency and amplitude,
  and adds noise.

Everything comes from one `torch.Generator` seeded by `cfg.seed`, so the same seed gives
bit-identical tensors. Inputs are standardised with train-split statistics, per channel where
samples have a channel axis.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from framework.data import Dataset
from framework.errors import ConfigError
from plugins.datasets.schemas import SyntheticCifar10Config, SyntheticConfig, SyntheticHarConfig, SyntheticMnistConfig  # noqa: F401  (the schemas live in a light module: registry.declare)

# ---------------------------------------------------------------------------------------------
# factories


def synthetic_mnist(cfg, *, inputs: bool = True) -> Dataset:
    """MNIST-shaped class-conditional smooth patterns (1x28x28, 10 classes)."""
    return make_synthetic(cfg, "synthetic_mnist", inputs=inputs)


def synthetic_cifar10(cfg, *, inputs: bool = True) -> Dataset:
    """CIFAR10-shaped class-conditional smooth patterns (3x32x32, 10 classes)."""
    return make_synthetic(cfg, "synthetic_cifar10", inputs=inputs)


def synthetic_har(cfg, *, inputs: bool = True) -> Dataset:
    """HAR-like multichannel sinusoids with class-specific frequency/phase/amplitude (9x128, 6 classes)."""
    return make_synthetic(cfg, "synthetic_har", inputs=inputs, sinusoids=True)


def make_synthetic(cfg, name: str, *, inputs: bool = True, sinusoids: bool = False) -> Dataset:
    """`inputs=False`: the same labels, and inputs as meta tensors of their shape (a timing-only
    run's data, `Dataset.without_inputs`): the labels are drawn first, so they do not depend on it."""
    shape = [int(d) for d in _get(cfg, "shape")]
    k = int(_get(cfg, "num_classes"))
    sizes = [int(_get(cfg, f"n_{s}")) for s in ("train", "val", "test")]
    _check(cfg, shape)
    g = torch.Generator().manual_seed(int(_get(cfg, "seed", 0)))

    # labels first: balanced within every split (class c appears floor or ceil of n/k times)
    ys = [(torch.arange(n) % k)[torch.randperm(n, generator=g)] for n in sizes]
    y = torch.cat(ys)
    if not inputs:
        x = torch.empty((len(y), *shape), device="meta")
    elif sinusoids:
        x = _sinusoids(cfg, shape, k, y, g)
    elif len(shape) >= 2:
        x = _images(cfg, shape, k, y, g)
    else:
        x = _vectors(cfg, shape, k, y, g)

    # per-channel statistics only where dim 0 of a sample really is a channel axis
    per_channel = len(shape) >= 2 if sinusoids else len(shape) >= 3
    if inputs:
        x = _standardise(x, sizes[0], per_channel)
    xs = torch.split(x, sizes)
    source = f"synthetic:seed={int(_get(cfg, 'seed', 0))}"  # the generator and its seed: nothing on disk
    return Dataset(name, xs[0], ys[0], xs[1], ys[1], xs[2], ys[2], k, {"train": source, "val": source, "test": source})


# ---------------------------------------------------------------------------------------------
# generators: each returns float32 inputs [len(y), *shape] for the labels y


def _images(cfg, shape, k, y, g) -> torch.Tensor:
    *lead, h, w = shape
    c = math.prod(lead)
    p = int(_get(cfg, "prototypes", 3))
    grid = max(1, int(_get(cfg, "grid", 4)))
    s = max(0, min(int(_get(cfg, "max_shift", 2)), h // 2, w // 2))

    # k*p smooth prototypes: a coarse random grid upsampled bilinearly is a low-frequency field
    coarse = torch.randn(k * p, c, min(grid, h), min(grid, w), generator=g)
    protos = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
    protos = _unit(protos)

    # one circularly shifted copy of the prototypes per shift (what torch.roll does, built by
    # a single indexing op: 25 roll calls are slow when OpenMP threads contend), so that every
    # sample is then one gather from this bank
    shifts = torch.arange(-s, s + 1)
    rows = (torch.arange(h) - shifts.view(-1, 1)) % h  # [2s+1, h]
    cols = (torch.arange(w) - shifts.view(-1, 1)) % w  # [2s+1, w]
    rows, cols = rows.repeat_interleave(len(shifts), 0), cols.repeat(len(shifts), 1)
    bank = protos[:, :, rows[:, :, None], cols[:, None, :]].permute(2, 0, 1, 3, 4).contiguous()

    n = len(y)
    proto = y * p + torch.randint(p, (n,), generator=g)
    shift = torch.randint(len(bank), (n,), generator=g)
    amp = _amplitudes(cfg, n, g).view(n, 1, 1, 1)
    x = bank[shift, proto].mul_(amp)  # in place: these are the big tensors
    x.add_(torch.randn(x.shape, generator=g), alpha=float(_get(cfg, "noise")))
    return x.reshape(n, *shape)


def _vectors(cfg, shape, k, y, g) -> torch.Tensor:
    # no spatial structure to shift: prototypes live directly in input space
    d = math.prod(shape)
    p = int(_get(cfg, "prototypes", 3))
    protos = _unit(torch.randn(k * p, d, generator=g))
    n = len(y)
    proto = y * p + torch.randint(p, (n,), generator=g)
    x = protos[proto].mul_(_amplitudes(cfg, n, g).view(n, 1))
    x.add_(torch.randn(x.shape, generator=g), alpha=float(_get(cfg, "noise")))
    return x.reshape(n, *shape)


def _sinusoids(cfg, shape, k, y, g) -> torch.Tensor:
    # the last dim is time; any leading dims are flattened into channels ([T] = one channel)
    t_len = shape[-1]
    c = math.prod(shape[:-1]) if len(shape) > 1 else 1
    # per (class, channel): 1..8 cycles per window, any phase, amplitude 0.5..1.5
    freq = 1.0 + 7.0 * torch.rand(k, c, 1, generator=g)
    phase = 2 * math.pi * torch.rand(k, c, 1, generator=g)
    amp = 0.5 + torch.rand(k, c, 1, generator=g)

    n = len(y)
    s = max(0, int(_get(cfg, "max_shift", 16)))
    jitter = float(_get(cfg, "freq_jitter", 0.05))
    # a per-sample time shift and frequency jitter, shared by all channels (one recording)
    t0 = torch.randint(-s, s + 1, (n, 1, 1), generator=g).float()
    fj = 1.0 + jitter * (2 * torch.rand(n, 1, 1, generator=g) - 1)
    t = (torch.arange(t_len, dtype=torch.float32).view(1, 1, t_len) + t0) / t_len
    wave = amp[y] * torch.sin(2 * math.pi * freq[y] * fj * t + phase[y])
    x = wave.mul_(_amplitudes(cfg, n, g).view(n, 1, 1))
    # noise is relative to a typical pattern's std (a unit sinusoid's is 1/sqrt 2)
    x.add_(torch.randn(x.shape, generator=g), alpha=float(_get(cfg, "noise")) / math.sqrt(2))
    return x.reshape(n, *shape)


# ---------------------------------------------------------------------------------------------
# helpers


def _amplitudes(cfg, n, g) -> torch.Tensor:
    j = float(_get(cfg, "amplitude_jitter", 0.3))
    return 1.0 + j * (2 * torch.rand(n, generator=g) - 1)


def _unit(p: torch.Tensor) -> torch.Tensor:
    """Each pattern to zero mean and unit std, so `noise` means the same for every shape."""
    flat = p.flatten(1)
    # correction=0: a one-element pattern gets std 0 (then clamped), not NaN
    std, mean = torch.std_mean(flat, 1, correction=0, keepdim=True)
    flat = (flat - mean) / std.clamp_min(1e-6)
    return flat.view_as(p)


def _standardise(x: torch.Tensor, n_train: int, per_channel: bool) -> torch.Tensor:
    """Zero mean, unit variance (per channel = dim 1, or overall), with train-split statistics."""
    train = x[:n_train]
    dims = [d for d in range(x.dim()) if d != 1] if per_channel else list(range(x.dim()))
    std, mean = torch.std_mean(train, dims, correction=0, keepdim=True)
    return x.sub_(mean).div_(std.clamp_min(1e-6))


def _check(cfg, shape) -> None:
    """The shape; every other knob's range is checked when the set is built (its schema's
    ranges: framework.registry.build)."""
    if not shape or any(d < 1 for d in shape):
        raise ConfigError("dataset.shape", f"must be a non-empty list of positive sizes, got {shape}")


def _get(cfg, key, default=None):
    """A field of a DictConfig, dataclass or plain dict, so factories accept any of them."""
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)
