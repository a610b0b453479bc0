"""Datasets as in-memory tensors, seeded mini-batches and sharding across devices.

A dataset plugin returns a `Dataset`: train/val/test splits as tensors (inputs already
normalised, labels int64). Everything downstream is deterministic in the seed: the order of
mini-batches in epoch e comes from a generator seeded with (seed, e), so every role of a
distributed run draws the same batches without talking to the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import xxhash

from framework import registry

SPLITS = ("train", "val", "test")


@dataclass
class Dataset:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    # where each split's data came from (a file path, `synthetic:seed=0`): provenance for the
    # run's records (MLflow dataset inputs); a split not named here is recorded as `plugin:<name>`
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def has_inputs(self) -> bool:
        """False for a timing-only run's data (`without_inputs`): inputs are shapes, labels real."""
        return self.x_train.device.type != "meta"

    def without_inputs(self) -> "Dataset":
        """The same splits with each input tensor replaced by a meta tensor of its shape and dtype;
        labels stay real (sharding and class counts read them). A timing-only run
        (`runtime.numerics=false`) reads no input values: its forwards return shapes and its
        messages carry shapes. At K = 10,000 devices the values would be 3 GB."""
        if not self.has_inputs:
            return self
        meta = lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta")  # noqa: E731
        return Dataset(self.name, meta(self.x_train), self.y_train, meta(self.x_val), self.y_val, meta(self.x_test), self.y_test, self.num_classes, dict(self.sources))

    def source(self, split: str) -> str:
        self.split(split)  # an unknown split is an error here too
        return self.sources.get(split) or f"plugin:{self.name}"

    def digest(self, split: str) -> str:
        """XXH3-64 (hex) of one split's inputs and labels: their dtypes, shapes and bytes. Equal
        data give equal digests in every process; a cast (float64) or one changed sample does not.
        Cheap: one pass over the bytes, no copy for the contiguous CPU tensors datasets hold.
        Inputs without values (`without_inputs`) add their dtype and shape alone, marked as such:
        such a digest names the labels and shapes a timing-only run read, and never equals a
        digest of values."""
        h = xxhash.xxh3_64()
        for t in self.split(split):
            h.update(f"{t.dtype}{list(t.shape)};".encode())
            if t.device.type == "meta":
                h.update(b"no values;")
                continue
            t = t.detach().cpu().contiguous()
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, whatever the dtype
        return h.hexdigest()

    def profile(self, split: str) -> dict:
        """What one split holds: sample count, per-sample input shape and dtype, classes and the
        samples per class."""
        x, y = self.split(split)
        out = {
            "num_samples": len(x),
            "input_shape": list(x.shape[1:]),
            "input_dtype": str(x.dtype).removeprefix("torch."),
            "num_classes": self.num_classes,
            "class_counts": torch.bincount(y.long(), minlength=self.num_classes).tolist(),
        }
        if x.device.type == "meta":
            out["input_values"] = False  # a timing-only run's data: shapes and labels
        return out

    def to(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> "Dataset":
        """Inputs cast to `dtype` (labels stay int64), everything moved to `device`; inputs
        without values stay meta tensors."""
        device = torch.device(device)
        x_device = device if self.has_inputs else self.x_train.device
        if self.x_train.dtype == dtype and self.x_train.device == x_device and self.y_train.device == device:
            return self
        return Dataset(
            self.name,
            self.x_train.to(x_device, dtype),
            self.y_train.to(device),
            self.x_val.to(x_device, dtype),
            self.y_val.to(device),
            self.x_test.to(x_device, dtype),
            self.y_test.to(device),
            self.num_classes,
            dict(self.sources),
        )

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return {"train": (self.x_train, self.y_train), "val": (self.x_val, self.y_val), "test": (self.x_test, self.y_test)}[which]
        except KeyError:
            raise ValueError(f"unknown split {which!r}; choices: train, val, test") from None


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The sample order of one epoch: the same for every process given (seed, epoch)."""
    if not shuffle:
        return torch.arange(n)
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(n, generator=g)


def batches(x, y, batch_size: int, seed: int, epoch: int, *, shuffle=True, drop_last=False, indices=None, limit: int | None = None):
    """Yield (x, y) mini-batches of one epoch; `indices` restricts to a shard, `limit` to the
    first `limit` batches.

    The rows of all the batches to yield are gathered at once and each batch is a slice of them
    (the same values as indexing batch by batch): one gather per epoch instead of two per batch,
    which on a GPU were two kernel launches per device per iteration (1,024 in one epoch of 64
    simulated devices at eight iterations each). The callers keep every batch of the epoch
    anyway, so the block costs no more memory than the batches did."""
    base = torch.arange(len(x)) if indices is None else torch.as_tensor(indices)
    order = base[epoch_order(len(base), seed, epoch, shuffle)]
    stop = len(order) - (len(order) % batch_size if drop_last else 0)
    if limit is not None:
        stop = min(stop, max(0, limit) * batch_size)
    if stop <= 0:
        return
    order = order[:stop]
    if x.device.type not in ("cpu", "meta") and y.device == x.device:  # one copy to the GPU, not one (and a wait for it) per batch
        order = order.to(x.device)
    # inputs without values (Dataset.without_inputs): a batch is its shape; indexing a meta
    # tensor runs torch's Python meta kernels (0.15 ms a batch, and 0.7 s to import them)
    xs = None if x.device.type == "meta" else x[order]
    ys = y[order]
    for i in range(0, stop, batch_size):
        n = min(batch_size, stop - i)
        xb = x.new_empty((n, *x.shape[1:])) if xs is None else xs[i : i + n]
        yield xb, ys[i : i + n]


def num_batches(n: int, batch_size: int, drop_last=False) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


def split_microbatches(x: torch.Tensor, m: int) -> list[torch.Tensor]:
    """Split a batch into m micro-batches along dim 0, sizes differing by at most one."""
    if m == 1:  # the batch itself (a view of it is the same values, at a torch call per batch)
        return [x]
    return list(torch.tensor_split(x, m, dim=0))


def shard_indices(labels: torch.Tensor, k: int, mode: str = "contiguous", *, alpha: float = 0.5, seed: int = 0) -> list[torch.Tensor]:
    """Split sample indices across k devices.

    - `contiguous`: k nearly equal consecutive blocks (the papers' default);
    - `dirichlet`: label-skewed non-IID shards; for each class, its samples are divided among
      devices in proportions drawn from Dirichlet(alpha) (smaller alpha, more skew).
    """
    n = len(labels)
    labels = labels.cpu()  # index bookkeeping stays on the CPU wherever the samples live
    if k < 1:
        raise ValueError(f"cannot shard across {k} devices")
    if mode == "contiguous":
        return [t.clone() for t in torch.tensor_split(torch.arange(n), k)]
    if mode == "dirichlet":
        if alpha <= 0:
            raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
        g = torch.Generator().manual_seed(seed)
        conc = torch.full((k,), float(alpha), dtype=torch.float64)
        shards: list[list[torch.Tensor]] = [[] for _ in range(k)]
        for c in torch.unique(labels).tolist():
            idx = torch.nonzero(labels == c).flatten()
            idx = idx[torch.randperm(len(idx), generator=g)]
            # torch's Dirichlet sampler takes no generator: draw it from seeded gammas instead
            gam = _gamma(conc, g)
            props = gam / gam.sum()
            cuts = (torch.cumsum(props, 0)[:-1] * len(idx)).round().long().tolist()
            for dev, part in enumerate(torch.tensor_split(idx, cuts)):
                shards[dev].append(part)
        return [torch.sort(torch.cat(s)).values if s else torch.empty(0, dtype=torch.long) for s in shards]
    raise ValueError(f"unknown shard mode {mode!r}; choices: contiguous, dirichlet")


def _gamma(conc: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Gamma(conc, 1) samples from a seeded generator (Marsaglia-Tsang, with the alpha<1 boost)."""
    out = torch.empty_like(conc)
    for i, a in enumerate(conc.tolist()):
        boost = 1.0
        if a < 1.0:
            boost = float(torch.rand((), generator=g, dtype=torch.float64)) ** (1.0 / a)
            a += 1.0
        d = a - 1.0 / 3.0
        c = 1.0 / (9.0 * d) ** 0.5
        while True:
            z = float(torch.randn((), generator=g, dtype=torch.float64))
            v = (1.0 + c * z) ** 3
            if v <= 0:
                continue
            u = float(torch.rand((), generator=g, dtype=torch.float64))
            if math.log(u) < 0.5 * z * z + d - d * v + d * math.log(v):
                out[i] = d * v * boost
                break
    return out


def build_dataset(cfg, *, inputs: bool = True) -> Dataset:
    """The `cfg.name` dataset plugin's data. `inputs=False` (timing-only runs) gives the data
    `without_inputs`; a plugin registered with `keywords=("inputs",)` is asked for it, and then
    need not make the values at all (the synthetic sets draw the labels alone)."""
    if inputs:
        return registry.build("dataset", cfg)
    if "inputs" in registry.declared("dataset", cfg.name).keywords:
        return registry.build("dataset", cfg, inputs=False).without_inputs()
    return registry.build("dataset", cfg).without_inputs()
