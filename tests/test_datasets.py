"""Dataset plugins (synthetic sets, Fashion-MNIST from IDX files) and framework.data's sharding/batching."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import plugins.datasets  # noqa: F401  (registers the datasets)
from framework import registry
from framework.data import batches, build_dataset, epoch_order, shard_indices, split_microbatches
from framework.errors import DataError
from plugins.datasets import fashion_mnist as fm
from plugins.datasets import synthetic

CONF = Path(__file__).resolve().parents[1] / "conf"
SYNTHETIC = {
    "synthetic_mnist": ((1, 28, 28), 10, (6000, 1000, 1000)),
    "synthetic_cifar10": ((3, 32, 32), 10, (5000, 1000, 1000)),
    "synthetic_har": ((9, 128), 6, (4000, 1000, 1000)),
}
SCHEMAS = {
    "synthetic_mnist": synthetic.SyntheticMnistConfig,
    "synthetic_cifar10": synthetic.SyntheticCifar10Config,
    "synthetic_har": synthetic.SyntheticHarConfig,
    "fashion_mnist": fm.FashionMnistConfig,
}


def build(name: str, **overrides):
    """Build through the registry from the typed schema, as a composed config would."""
    cfg = OmegaConf.merge(OmegaConf.structured(SCHEMAS[name]), overrides)
    return registry.build("dataset", cfg)


@pytest.fixture(scope="module")
def default_sets():
    # generated once: every default-size test below shares them
    return {name: build(name) for name in SYNTHETIC}


def splits(ds):
    return [ds.split(s) for s in ("train", "val", "test")]


def assert_balanced(y: torch.Tensor, k: int):
    counts = torch.bincount(y, minlength=k)
    assert len(counts) == k and int(counts.max() - counts.min()) <= 1, counts


# ---------------------------------------------------------------------------------------------
# synthetic sets


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_shapes_dtypes_and_balance(default_sets, name):
    shape, k, sizes = SYNTHETIC[name]
    ds = default_sets[name]
    assert ds.name == name and ds.num_classes == k and ds.input_shape == shape
    for (x, y), n in zip(splits(ds), sizes):
        assert x.shape == (n, *shape) and x.dtype == torch.float32 and torch.isfinite(x).all()
        assert y.shape == (n,) and y.dtype == torch.int64
        assert_balanced(y, k)
    # standardised with train statistics
    assert abs(float(ds.x_train.mean())) < 0.05 and abs(float(ds.x_train.std()) - 1) < 0.05


@pytest.mark.parametrize(
    "name, shape, k",
    [
        ("synthetic_mnist", [64], 64),  # vector-shaped: prototypes in input space
        ("synthetic_mnist", [28, 28], 10),  # images without a channel axis
        ("synthetic_cifar10", [2, 3, 8, 8], 5),  # extra leading dims are channels
        ("synthetic_har", [128], 6),  # a single-channel signal
    ],
)
def test_synthetic_any_shape(name, shape, k):
    ds = build(name, shape=shape, num_classes=k, n_train=320, n_val=64, n_test=64)
    assert ds.input_shape == tuple(shape) and ds.num_classes == k
    for (x, y), n in zip(splits(ds), (320, 64, 64)):
        assert x.shape == (n, *shape) and x.dtype == torch.float32 and torch.isfinite(x).all()
        assert_balanced(y, k)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_is_deterministic_in_seed(name):
    small = dict(n_train=200, n_val=50, n_test=50)
    a, b, c = build(name, seed=7, **small), build(name, seed=7, **small), build(name, seed=8, **small)
    for (xa, ya), (xb, yb) in zip(splits(a), splits(b)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)  # bit-identical
    assert not torch.equal(a.x_train, c.x_train)
    assert not torch.equal(a.y_train, c.y_train)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_a_timing_only_build_draws_the_labels_alone(default_sets, name):
    """`inputs=False` (runtime.numerics=false): the same labels as the full set, and inputs that
    are meta tensors of the same shapes and dtype; the digest says so and differs."""
    full = default_sets[name]
    shapes = build_dataset(OmegaConf.structured(SCHEMAS[name]), inputs=False)
    assert full.has_inputs and not shapes.has_inputs
    for (x, y), (fx, fy) in zip(splits(shapes), splits(full)):
        assert x.device.type == "meta" and x.shape == fx.shape and x.dtype == fx.dtype
        assert torch.equal(y, fy)
    for split in ("train", "val", "test"):
        assert shapes.digest(split) != full.digest(split)
        assert shapes.profile(split) == {**full.profile(split), "input_values": False}
    assert shapes.to(torch.float64).x_train.device.type == "meta"  # a cast keeps no values
    assert shapes.without_inputs() is shapes


def test_synthetic_mnist_is_learnable_but_not_trivial(default_sets):
    # nearest class mean: well above chance (0.1), yet the noise and the several modes per class
    # keep it far from perfect
    ds = default_sets["synthetic_mnist"]
    means = torch.stack([ds.x_train[ds.y_train == c].flatten(1).mean(0) for c in range(ds.num_classes)])
    pred = torch.cdist(ds.x_val.flatten(1), means).argmin(1)
    acc = float((pred == ds.y_val).float().mean())
    assert 0.5 < acc < 0.99, acc


def test_synthetic_bad_config_is_a_config_error():
    from framework.errors import ConfigError

    with pytest.raises(ConfigError, match="dataset.num_classes"):
        build("synthetic_mnist", num_classes=0)
    with pytest.raises(ConfigError, match="dataset.shape"):
        build("synthetic_mnist", shape=[0, 4])


# ---------------------------------------------------------------------------------------------
# registration and YAML


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_yaml_composes_to_the_schema_defaults(name):
    from hydra import compose, initialize_config_dir

    assert registry.entry("dataset", name).schema is SCHEMAS[name]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name=f"dataset/{name}").dataset
    # the YAML lists every schema field, each at the schema's default
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(OmegaConf.structured(SCHEMAS[name]))


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST


def write_idx(path: Path, tensor: torch.Tensor, *, compress: bool, magic: bytes | None = None):
    dims = list(tensor.shape)
    header = (magic or bytes([0, 0, 0x08, len(dims)])) + struct.pack(f">{len(dims)}I", *dims)
    data = header + tensor.to(torch.uint8).numpy().tobytes()
    path = path.with_name(path.name + ".gz") if compress else path
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def tiny_fashion(root: Path, *, compress=True, n_train=30, n_test=12) -> dict[str, Path]:
    g = torch.Generator().manual_seed(0)
    parts = {
        "train_images": torch.randint(256, (n_train, 28, 28), generator=g),
        "train_labels": torch.arange(n_train) % 10,
        "test_images": torch.randint(256, (n_test, 28, 28), generator=g),
        "test_labels": torch.arange(n_test) % 10,
    }
    return {k: write_idx(root / fm.FILES[k], t, compress=compress) for k, t in parts.items()}


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_parses_tiny_idx_files(tmp_path, compress):
    tiny_fashion(tmp_path, compress=compress)
    ds = build("fashion_mnist", root=str(tmp_path), n_val=5, n_test=10)
    assert [len(x) for x, _ in splits(ds)] == [25, 5, 10]
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert ds.y_val.tolist() == [5, 6, 7, 8, 9]  # held out from the end of the training file
    assert float(ds.x_train.min()) >= (0 - fm.MEAN) / fm.STD - 1e-6
    assert float(ds.x_train.max()) <= (1 - fm.MEAN) / fm.STD + 1e-6


def test_a_plugin_without_the_inputs_keyword_is_built_and_stripped(tmp_path):
    # fashion_mnist is not registered with keywords=("inputs",): it reads its files and the
    # values are dropped, so a timing-only run of any dataset plugin holds no input values
    assert "inputs" not in registry.entry("dataset", "fashion_mnist").keywords
    assert registry.entry("dataset", "synthetic_mnist").keywords == {"inputs"} == registry.declared("dataset", "synthetic_mnist").keywords  # kept when the code is imported
    tiny_fashion(tmp_path)
    cfg = OmegaConf.merge(OmegaConf.structured(fm.FashionMnistConfig), {"root": str(tmp_path), "n_val": 5, "n_test": 10})
    full, shapes = build_dataset(cfg), build_dataset(cfg, inputs=False)
    for (x, y), (fx, fy) in zip(splits(shapes), splits(full)):
        assert x.device.type == "meta" and x.shape == fx.shape and torch.equal(y, fy)


def test_fashion_mnist_missing_root_names_the_fix(tmp_path):
    with pytest.raises(DataError) as e:
        build("fashion_mnist", root=str(tmp_path / "nowhere"))
    msg = str(e.value)
    assert "apt-get install dataset-fashion-mnist" in msg and "dataset.root=" in msg
    assert "zalandoresearch/fashion-mnist" in msg


@pytest.mark.parametrize(
    "corrupt, match",
    [
        ("bad_gzip", "corrupted"),
        ("bad_magic", "magic"),
        ("truncated", "truncated"),
        ("count_mismatch", "labels"),
        ("label_range", "0..9"),
    ],
)
def test_fashion_mnist_malformed_files_are_data_errors(tmp_path, corrupt, match):
    files = tiny_fashion(tmp_path)
    images, labels = files["train_images"], files["train_labels"]
    if corrupt == "bad_gzip":
        images.write_bytes(b"\x1f\x8b" + os.urandom(64))
    elif corrupt == "bad_magic":
        write_idx(images.with_suffix(""), torch.zeros(30, 28, 28), compress=True, magic=b"\x12\x34\x08\x03")
    elif corrupt == "truncated":
        images.write_bytes(gzip.compress(gzip.decompress(images.read_bytes())[:-100]))
    elif corrupt == "count_mismatch":
        write_idx(labels.with_suffix(""), torch.arange(29) % 10, compress=True)
    elif corrupt == "label_range":
        write_idx(labels.with_suffix(""), torch.full((30,), 12), compress=True)
    with pytest.raises(DataError, match=match):
        build("fashion_mnist", root=str(tmp_path), n_val=5)


def test_fashion_mnist_real_files():
    root = fm.DEFAULT_ROOT
    if not os.path.isdir(root):
        pytest.skip(f"{root} missing (apt-get install dataset-fashion-mnist)")
    ds = build("fashion_mnist")
    assert [len(x) for x, _ in splits(ds)] == [55000, 5000, 10000]
    assert ds.input_shape == (1, 28, 28) and ds.x_train.dtype == torch.float32
    for _, y in splits(ds):
        assert y.dtype == torch.int64 and int(y.min()) == 0 and int(y.max()) == 9
    assert abs(float(ds.x_train.mean())) < 0.05 and abs(float(ds.x_train.std()) - 1) < 0.05
    # the second build reuses the decoded files and honours the caps
    hits = fm._read_idx_cached.cache_info().hits
    small = build("fashion_mnist", n_train=1000, n_val=500, n_test=200)
    assert [len(x) for x, _ in splits(small)] == [1000, 500, 200]
    assert fm._read_idx_cached.cache_info().hits >= hits + 4
    assert torch.equal(small.x_val, ds.x_val[-500:])


# ---------------------------------------------------------------------------------------------
# framework.data: sharding and batching


def labels(n=2000, k=10, seed=0):
    return (torch.arange(n) % k)[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]


def assert_partition(shards, n):
    allidx = torch.cat(shards)
    assert len(allidx) == n and torch.equal(torch.sort(allidx).values, torch.arange(n))


def test_contiguous_shards_cover_every_index_once():
    shards = shard_indices(labels(1003), 4, "contiguous")
    assert_partition(shards, 1003)
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    assert all(torch.equal(s, torch.arange(int(s[0]), int(s[-1]) + 1)) for s in shards)


def skew(y, shards, k=10):
    """Mean over non-empty shards of the largest class fraction (1/k = IID, 1 = one class each)."""
    fracs = [torch.bincount(y[s], minlength=k).max().item() / len(s) for s in shards if len(s)]
    return sum(fracs) / len(fracs)


def test_dirichlet_shards_partition_deterministically_and_skew_with_alpha():
    y = labels()
    a = shard_indices(y, 5, "dirichlet", alpha=0.1, seed=3)
    assert_partition(a, len(y))
    assert all(torch.equal(s, t) for s, t in zip(a, shard_indices(y, 5, "dirichlet", alpha=0.1, seed=3)))
    assert not all(torch.equal(s, t) for s, t in zip(a, shard_indices(y, 5, "dirichlet", alpha=0.1, seed=4)))
    iid = shard_indices(y, 5, "dirichlet", alpha=100.0, seed=3)
    assert_partition(iid, len(y))
    assert skew(y, a) > skew(y, iid) + 0.2, (skew(y, a), skew(y, iid))


def test_batches_are_the_rows_of_the_epoch_order_and_limit_stops_early():
    """One gather per epoch, sliced: the same batches as indexing the epoch's order batch by
    batch, with a short last batch unless dropped, and `limit` keeps the first batches only."""
    x, y = torch.randn(50, 3, 2), torch.arange(50) % 7
    shard = torch.arange(5, 48)

    def by_index(bs, drop_last):
        order = shard[epoch_order(len(shard), 4, 2)]
        stop = len(order) - (len(order) % bs if drop_last else 0)
        return [(x[order[i : i + bs]], y[order[i : i + bs]]) for i in range(0, stop, bs)]

    for drop_last in (False, True):
        want = by_index(8, drop_last)
        got = list(batches(x, y, 8, 4, 2, indices=shard, drop_last=drop_last))
        assert [len(b) for _, b in got] == [len(b) for _, b in want] == ([8] * 5 + ([] if drop_last else [3]))
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, want))
        for limit, n in ((0, 0), (2, 2), (100, len(want))):
            part = list(batches(x, y, 8, 4, 2, indices=shard, drop_last=drop_last, limit=limit))
            assert len(part) == n and all(torch.equal(a, c) for (a, _), (c, _) in zip(part, want))
    meta = list(batches(x.to("meta"), y, 8, 4, 2, indices=shard, limit=3))  # timing-only: shapes
    assert [tuple(a.shape) for a, _ in meta] == [(8, 3, 2)] * 3 and all(torch.equal(b, d) for (_, b), (_, d) in zip(meta, want))
    assert split_microbatches(x, 1)[0] is x and [len(p) for p in split_microbatches(x, 3)] == [17, 17, 16]


def test_batches_order_depends_on_seed_and_epoch_only():
    x, y = torch.arange(100).float().unsqueeze(1), torch.arange(100)

    def order(seed, epoch, **kw):
        return torch.cat([yb for _, yb in batches(x, y, 16, seed, epoch, **kw)])

    assert torch.equal(order(1, 0), order(1, 0))
    assert not torch.equal(order(1, 0), order(1, 1))
    assert not torch.equal(order(1, 0), order(2, 0))
    assert torch.equal(torch.sort(order(1, 0)).values, torch.arange(100))  # a permutation
    assert len(order(1, 0, drop_last=True)) == 96
    shard = torch.arange(10, 30)
    assert torch.equal(torch.sort(order(1, 0, indices=shard)).values, shard)
