"""Fashion-MNIST read from the four IDX files on disk (nothing is downloaded).

Debian/Ubuntu's `dataset-fashion-mnist` package installs them in /usr/share/datasets/fashion-mnist.
The IDX format is tiny, so it is parsed here rather than pulling in torchvision: a 4-byte magic
(two zero bytes, a type code, the number of dims), one big-endian uint32 per dim, then the data.
Files may be gzip-compressed or not; the gzip magic decides, not the file name.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
import struct
import zlib
from typing import Optional

import torch

from framework.data import Dataset
from framework.errors import ConfigError, DataError
from plugins.datasets.schemas import DEFAULT_ROOT, FashionMnistConfig  # noqa: F401  (the schemas live in a light module: registry.declare)

MEAN, STD = 0.2860, 0.3530  # of the training images scaled to [0, 1]
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
HOW_TO_GET = (
    f"`sudo apt-get install dataset-fashion-mnist` puts it in {DEFAULT_ROOT}, or download its IDX files "
    "from https://github.com/zalandoresearch/fashion-mnist into dataset.root=<folder>"
)


def fashion_mnist(cfg) -> Dataset:
    """Real Fashion-MNIST (1x28x28, 10 classes) from IDX files in `root`."""
    root = os.path.expanduser(str(_get(cfg, "root", DEFAULT_ROOT)))
    paths = {key: _find(root, base) for key, base in FILES.items()}
    missing = [FILES[k] for k, p in paths.items() if p is None]
    if missing:
        some = "no IDX files" if len(missing) == len(FILES) else "missing " + ", ".join(missing)
        raise DataError(f"dataset.root: no Fashion-MNIST in {root!r} ({some}, .gz or not); {HOW_TO_GET}")

    x_tr, y_tr = _pair(paths["train_images"], paths["train_labels"])
    x_te, y_te = _pair(paths["test_images"], paths["test_labels"])

    n_val = int(_get(cfg, "n_val", 5000))
    if not 0 <= n_val < len(x_tr):
        raise ConfigError("dataset.n_val", f"must be in [0, {len(x_tr)}), got {n_val}")
    cut = len(x_tr) - n_val
    n_train = _cap(_get(cfg, "n_train"), cut, "dataset.n_train")
    n_test = _cap(_get(cfg, "n_test"), len(x_te), "dataset.n_test")

    return Dataset(
        "fashion_mnist",
        _normalise(x_tr[:n_train]),
        y_tr[:n_train].clone(),
        _normalise(x_tr[cut:]),
        y_tr[cut:].clone(),
        _normalise(x_te[:n_test]),
        y_te[:n_test].clone(),
        10,
        # the validation split is the tail of the training images
        {"train": os.path.abspath(paths["train_images"]), "val": os.path.abspath(paths["train_images"]), "test": os.path.abspath(paths["test_images"])},
    )


def _pair(images_path: str, labels_path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images [N, 28, 28] and int64 labels [N], checked against each other."""
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28):
        raise DataError(f"{images_path}: expected images of shape [N, 28, 28], got {list(images.shape)}")
    if labels.dim() != 1:
        raise DataError(f"{labels_path}: expected a 1-D label file, got shape {list(labels.shape)}")
    if len(images) != len(labels):
        raise DataError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
    if len(labels) and int(labels.max()) > 9:
        raise DataError(f"{labels_path}: labels must be in 0..9, found {int(labels.max())}")
    return images, labels.long()


def _normalise(images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 28, 28] to float32 [N, 1, 28, 28], (x / 255 - MEAN) / STD in one fused pass."""
    return images.float().mul_(1.0 / (255.0 * STD)).sub_(MEAN / STD).unsqueeze(1)


def read_idx(path: str) -> torch.Tensor:
    """The uint8 tensor stored in an IDX file; cached per (path, size, mtime) in this process."""
    st = os.stat(path)
    return _read_idx_cached(os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_idx_cached(path: str, size: int, mtime_ns: int) -> torch.Tensor:
    # size and mtime are part of the key so a file replaced on disk is read again
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic number {data[:4].hex() or 'empty'}). {HOW_TO_GET}")
    dtype, ndim = data[2], data[3]
    if dtype != 0x08:  # Fashion-MNIST only uses unsigned bytes
        raise DataError(f"{path}: IDX type code 0x{dtype:02x} is not supported (expected 0x08, unsigned byte)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes for {ndim} dims)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    expected = header + math.prod(dims)
    if len(data) != expected:
        raise DataError(
            f"{path}: IDX dims {list(dims)} need {expected} bytes but the file holds {len(data)} "
            f"(truncated or corrupted). {HOW_TO_GET}"
        )
    # bytearray: a writable buffer, so torch does not warn and the tensor owns its memory
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).reshape(dims)


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({e}); the file looks corrupted. {HOW_TO_GET}") from e
    return data


def _find(root: str, base: str) -> Optional[str]:
    for name in (base, base + ".gz"):
        path = os.path.join(root, name)
        if os.path.isfile(path):
            return path
    return None


def _cap(value, available: int, key: str) -> int:
    if value is None:
        return available
    value = int(value)
    if value < 0:
        raise ConfigError(key, f"must be >= 0 or null, got {value}")
    return min(value, available)


def _get(cfg, key, default=None):
    """A field of a DictConfig, dataclass or plain dict, so the factory accepts any of them."""
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)
