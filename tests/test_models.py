"""Model zoo: unit counts, per-unit shapes from the papers, FLOP/param bookkeeping, and that
every model runs forward and backward as a chain of units."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.models import UnitModel, build_model
from plugins.models import convnet, har_cnn, lenet, mlp, mobilenet, resnet, vgg  # (importing the package registers every model)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
BATCH = 2

# name -> (factory, schema)
MODELS = {
    "mlp": (mlp.mlp, mlp.MLPConfig),
    "lenet": (lenet.lenet, lenet.LeNetConfig),
    "convnet": (convnet.convnet, convnet.ConvNetConfig),
    "vgg5": (vgg.vgg5, vgg.VGG5Config),
    "har_cnn": (har_cnn.har_cnn, har_cnn.HARCNNConfig),
    "mobilenetv2": (mobilenet.mobilenetv2, mobilenet.MobileNetV2Config),
    "mobilenetv3_small": (mobilenet.mobilenetv3_small, mobilenet.MobileNetV3SmallConfig),
    "resnet18": (resnet.resnet18, resnet.ResNet18Config),
}

# (name, input shape, classes, expected number of units)
CASES = [
    ("mlp", (1, 28, 28), 10, 4),
    ("lenet", (1, 28, 28), 10, 5),
    ("lenet", (3, 32, 32), 10, 5),
    ("convnet", (3, 32, 32), 10, 4),
    ("vgg5", (1, 28, 28), 10, 5),
    ("vgg5", (3, 32, 32), 10, 5),
    ("har_cnn", (9, 128), 6, 5),
    ("mobilenetv2", (3, 32, 32), 10, 20),
    ("mobilenetv2", (1, 28, 28), 10, 20),
    ("mobilenetv3_small", (3, 32, 32), 10, 15),
    ("mobilenetv3_small", (1, 28, 28), 10, 15),
    ("resnet18", (3, 32, 32), 10, 10),
    ("resnet18", (1, 28, 28), 10, 10),
]
CASE_IDS = [f"{n}-{'x'.join(map(str, s))}" for n, s, _, _ in CASES]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Batch-2 tensors gain nothing from intra-op threads, and on a busy CPU the thread pool's
    contention makes these tests ~100x slower; restore the setting for other modules."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build(name: str, shape, classes: int = 10, **overrides) -> UnitModel:
    factory, schema = MODELS[name]
    cfg = OmegaConf.structured(schema)
    for k, v in overrides.items():
        cfg[k] = v
    torch.manual_seed(0)
    return UnitModel(name, factory(cfg, tuple(shape), classes), shape, classes)


def test_variants_build_the_papers_layers():
    """lenet.variant=mxnet (AdaLearner's LeNet: 20 and 50 filters, fc500, tanh) and mlp.widths."""
    m = build("lenet", (1, 28, 28), variant="mxnet")
    assert out_shapes(m) == [(20, 12, 12), (50, 4, 4), (500,), (10,)]
    assert any(isinstance(x, torch.nn.Tanh) for x in m.modules())
    m = build("mlp", (1, 28, 28), widths=[128, 64])
    assert out_shapes(m) == [(128,), (64,), (10,)]
    with pytest.raises(ConfigError, match="model.variant.*lecun, mxnet"):
        build("lenet", (1, 28, 28), variant="caffe")
    with pytest.raises(ConfigError, match="model.widths"):
        build("mlp", (1, 28, 28), widths=[])


def out_shapes(model: UnitModel) -> list[tuple[int, ...]]:
    return [info.out_shape for info in model.infos]


# --------------------------------------------------------------------------------------------
# properties every model must have
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,shape,classes,units", CASES, ids=CASE_IDS)
def test_units_chain_and_bookkeeping(name, shape, classes, units):
    model = build(name, shape, classes)
    assert len(model) == units
    assert model.infos[0].in_shape == tuple(shape)
    for prev, info in zip(model.infos, model.infos[1:]):
        assert info.in_shape == prev.out_shape
    assert model.infos[-1].out_shape == (classes,)
    for unit, info in zip(model.units, model.infos):
        assert info.flops > 0, info.name
        assert info.params == sum(p.numel() for p in unit.parameters()), info.name
        assert math.isclose(info.flops, sum(info.flops_by_kind.values()))


@pytest.mark.parametrize("name,shape,classes,units", CASES, ids=CASE_IDS)
def test_units_in_sequence_equal_forward(name, shape, classes, units):
    model = build(name, shape, classes).eval()  # eval: BN uses running stats, dropout is off
    x = torch.randn(BATCH, *shape)
    with torch.no_grad():
        y = model(x)
        h = x
        for unit in model.units:
            h = unit(h)
        # two halves, as a two-stage pipeline would run them
        cut = len(model) // 2
        z = model.slice(cut, len(model))(model.slice(0, cut)(x))
    assert y.shape == (BATCH, classes)
    assert torch.equal(h, y)
    assert torch.equal(z, y)


@pytest.mark.parametrize("name,shape,classes,units", CASES, ids=CASE_IDS)
def test_backward_reaches_every_parameter(name, shape, classes, units):
    model = build(name, shape, classes).train()
    x = torch.randn(BATCH, *shape)
    loss = F.cross_entropy(model(x), torch.arange(BATCH) % classes)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", sorted(MODELS))
def test_registered_and_built_from_config(name):
    shape, classes = ((9, 128), 6) if name == "har_cnn" else ((3, 32, 32), 10)
    cfg = OmegaConf.structured(MODELS[name][1])
    assert cfg.name == name
    model = build_model(cfg, shape, classes)  # goes through the registry
    assert model.infos[-1].out_shape == (classes,)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_yaml_matches_schema(name):
    """conf/model/<name>.yaml extends the registered schema and composes to its defaults, which
live in the schema's fields alone: the preset sets nothing but its name."""
    with initialize_config_dir(config_dir=str(CONF_DIR / "model"), version_base="1.3"):
        cfg = compose(config_name=name)
    assert OmegaConf.get_type(cfg) is MODELS[name][1]
    assert cfg == OmegaConf.structured(MODELS[name][1])
    assert set(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")) == {"defaults", "name"}, f"{name}.yaml restates a default"


def test_yaml_rejects_wrong_type():
    with initialize_config_dir(config_dir=str(CONF_DIR / "model"), version_base="1.3"):
        with pytest.raises(Exception):
            compose(config_name="mlp", overrides=["depth=many"])


# --------------------------------------------------------------------------------------------
# per-model layouts from the papers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [2, 3, 6])
def test_mlp_depth_and_layout(depth):
    model = build("mlp", (1, 28, 28), 10, depth=depth, hidden=32)
    assert len(model) == depth
    assert model.unit_names == ["fc0", *[f"fc{i}" for i in range(1, depth - 1)], "head"]
    assert out_shapes(model) == [(32,)] * (depth - 1) + [(10,)]
    assert model.infos[0].params == 28 * 28 * 32 + 32
    assert not any(isinstance(m, (torch.nn.Dropout, torch.nn.BatchNorm1d)) for m in model.modules())


def test_mlp_float64_split_is_exact():
    model = build("mlp", (1, 28, 28), 10).double()
    x = torch.randn(BATCH, 1, 28, 28, dtype=torch.float64)
    assert torch.equal(model.slice(2, 4)(model.slice(0, 2)(x)), model(x))


def test_mlp_rejects_depth_below_two():
    with pytest.raises(ConfigError):
        build("mlp", (1, 28, 28), 10, depth=1)


def test_lenet_shapes():
    mnist = [(6, 14, 14), (16, 5, 5), (120,), (84,), (10,)]
    assert out_shapes(build("lenet", (1, 28, 28))) == mnist
    assert out_shapes(build("lenet", (3, 32, 32))) == mnist


def test_vgg5_shapes():
    assert out_shapes(build("vgg5", (3, 32, 32))) == [(32, 16, 16), (64, 8, 8), (64, 8, 8), (128,), (10,)]
    assert out_shapes(build("vgg5", (1, 28, 28))) == [(32, 14, 14), (64, 7, 7), (64, 7, 7), (128,), (10,)]


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28)])
def test_vgg5_first_conv_flops_closed_form(shape):
    cin, h, w = shape
    cout = 32
    closed_form = 2 * cin * cout * 9 * h * w + cout * h * w  # 2 x MACs of a padded 3x3 conv + bias adds
    info = build("vgg5", shape).infos[0]
    assert info.flops_by_kind["conv"] == closed_form
    assert info.flops_by_kind["norm"] == 2 * cout * h * w


def test_vgg5_without_batchnorm():
    model = build("vgg5", (3, 32, 32), batchnorm=False)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert all("norm" not in info.flops_by_kind for info in model.infos)
    assert out_shapes(model)[:3] == [(32, 16, 16), (64, 8, 8), (64, 8, 8)]


def test_har_cnn_shapes():
    model = build("har_cnn", (9, 128), 6)
    assert out_shapes(model) == [(64, 126), (64, 124), (3968,), (100,), (6,)]
    assert model.units[1][-1].p == 0.6


# AccEPT notes, Sec. 3.2: MobileNetV2 at 3x32x32, (out shape, conv MACs per sample)
MOBILENETV2_TABLE = [
    ((32, 16, 16), 221_184),
    ((16, 16, 16), 204_800),
    ((24, 8, 8), 595_968),
    ((24, 8, 8), 525_312),
    ((32, 4, 4), 315_648),
    ((32, 4, 4), 224_256),
    ((32, 4, 4), 224_256),
    ((64, 2, 2), 154_368),
    ((64, 2, 2), 210_432),
    ((64, 2, 2), 210_432),
    ((64, 2, 2), 210_432),
    ((96, 2, 2), 259_584),
    ((96, 2, 2), 463_104),
    ((96, 2, 2), 463_104),
    ((160, 1, 1), 318_528),
    ((160, 1, 1), 315_840),
    ((160, 1, 1), 315_840),
    ((320, 1, 1), 469_440),
    ((1280, 1, 1), 409_600),
    ((10,), 12_800),
]


def test_mobilenetv2_matches_accept_table():
    model = build("mobilenetv2", (3, 32, 32))
    assert out_shapes(model) == [shape for shape, _ in MOBILENETV2_TABLE]
    for info, (_, macs) in zip(model.infos[:-1], MOBILENETV2_TABLE[:-1]):
        conv = sum(info.flops_by_kind.get(k, 0.0) for k in ("conv", "depthwise", "pointwise"))
        assert conv == 2 * macs, info.name  # convs have no bias (BN follows)
    head = model.infos[-1]
    assert head.flops_by_kind["linear"] == 2 * MOBILENETV2_TABLE[-1][1] + 10  # + bias adds
    # output KiB at batch 128 fp32: AccEPT's largest (4096) and smallest (80) transfers
    kib = [info.out_numel * 4 * 128 / 1024 for info in model.infos[:-1]]
    assert max(kib) == kib[0] == 4096 and min(kib) == 80
    assert sum(p.numel() for p in model.parameters()) == 2_236_682  # torchvision mobilenet_v2(num_classes=10)


def test_mobilenetv2_single_channel_input():
    model = build("mobilenetv2", (1, 28, 28))
    assert model.units[0][0].in_channels == 1
    assert out_shapes(model)[0] == (32, 14, 14)


def test_mobilenetv3_small_layout():
    model = build("mobilenetv3_small", (3, 32, 32))
    assert model.unit_names == ["stem", *[f"bneck{i}" for i in range(1, 12)], "conv576", "conv1024", "fc"]
    shapes = out_shapes(model)
    assert shapes[0] == (16, 16, 16)
    assert [s[0] for s in shapes[1:12]] == [16, 24, 24, 40, 40, 40, 48, 48, 96, 96, 96]
    assert shapes[9:] == [(96, 1, 1), (96, 1, 1), (96, 1, 1), (576, 1, 1), (1024,), (10,)]
    assert sum(p.numel() for p in model.parameters()) == 1_528_106  # torchvision mobilenet_v3_small(num_classes=10)


def test_resnet18_stems():
    cifar = out_shapes(build("resnet18", (3, 32, 32)))
    assert cifar[0] == (64, 32, 32)  # CIFAR stem keeps full resolution
    assert cifar[1:9] == [(64, 32, 32)] * 2 + [(128, 16, 16)] * 2 + [(256, 8, 8)] * 2 + [(512, 4, 4)] * 2
    imagenet = out_shapes(build("resnet18", (3, 32, 32), small_input=False))
    assert imagenet[0] == (64, 8, 8)  # 7x7/2 conv then 3x3/2 maxpool
    assert imagenet[8] == (512, 1, 1)
    assert out_shapes(build("resnet18", (3, 64, 64)))[0] == (64, 16, 16)  # > 32x32: PiPar's stem
    model = build("resnet18", (3, 32, 32))
    assert sum(p.numel() for p in model.parameters()) == 11_173_962  # standard CIFAR ResNet-18


@pytest.mark.parametrize("in_blocks", [False, True], ids=["per-tensor", "blocks"])
@pytest.mark.parametrize("name,shape,classes,units", CASES, ids=CASE_IDS)
def test_clone_module_is_a_deep_copy(name, shape, classes, units, in_blocks):
    """The roles' fast copy equals copy.deepcopy: same state, same outputs in train mode (BN
    statistics included), and nothing shared with the original; its tensors copied one by one
    (the CPU's default) or in blocks (a GPU's)."""
    import copy

    from framework.models import clone_module

    model = build(name, shape, classes)
    clone, deep = clone_module(model, in_blocks=in_blocks), copy.deepcopy(model)
    assert type(clone) is type(model) and clone.infos == model.infos and clone.unit_names == model.unit_names
    assert clone.unit_names is not model.unit_names and clone.infos is not model.infos
    assert all(a is b for a, b in zip(clone.infos, model.infos))  # frozen descriptions: shared, as deepcopy now shares them
    for (k, a), (_, b) in zip(clone.state_dict().items(), deep.state_dict().items()):
        assert torch.equal(a, b), k
    originals = {p.data_ptr() for p in model.parameters()} | {b.data_ptr() for b in model.buffers()}
    assert not originals & ({p.data_ptr() for p in clone.parameters()} | {b.data_ptr() for b in clone.buffers() if b.numel()})
    x = torch.randn(BATCH, *shape)
    clone.train(), deep.train()
    torch.manual_seed(0)  # dropout draws the same masks for both
    y_clone = clone(x)
    torch.manual_seed(0)
    torch.testing.assert_close(y_clone, deep(x), rtol=0, atol=0)
    for (k, a), (_, b) in zip(clone.state_dict().items(), deep.state_dict().items()):
        assert torch.equal(a, b), k  # running statistics moved alike
    clone.units[0].register_forward_hook(lambda *a: None)  # hooks of the copy stay its own
    assert not model.units[0]._forward_hooks
    clone.eval()
    assert model.training  # so do flags


def test_clone_module_copies_in_blocks_each_tensor_its_own():
    """A copy's parameters lie in one block per dtype and its buffers in another (one copy
    each, not one per tensor), yet each is a tensor of its own: an in-place change to one
    advances no other's autograd version, so two training-mode forwards through BatchNorm (which
    updates its statistics in place) and their backwards run, with deepcopy's gradients."""
    import copy

    from framework.models import clone_module

    model = build("vgg5", (3, 32, 32), 10)
    clone, deep = clone_module(model, in_blocks=True), copy.deepcopy(model)  # by default on a GPU only
    storages = lambda ts: {t.untyped_storage().data_ptr() for t in ts}  # noqa: E731
    params, buffers = list(clone.parameters()), list(clone.buffers())
    assert len(storages(params)) == 1 and len(params) > 1
    assert len(storages(b for b in buffers if b.is_floating_point())) == 1 and not storages(params) & storages(buffers)
    assert all(p._base is None and type(p) is torch.nn.Parameter and p.requires_grad for p in params)
    with torch.no_grad():
        params[0].add_(0.0)
    assert params[0]._version == 1 and all(p._version == 0 for p in params[1:])
    x = torch.randn(4, 3, 32, 32)
    for m in (clone, deep):
        m.train()
        y1, y2 = m(x).sum(), m(2 * x).sum()
        (y1 + y2).backward()
    for (k, a), b in zip(clone.named_parameters(), deep.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, msg=k)
    for (k, a), (_, b) in zip(clone.state_dict().items(), deep.state_dict().items()):
        assert torch.equal(a, b), k
    assert len(storages(clone_module(model).parameters())) == len(params)  # on the CPU: a copy each


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_model_is_copied_in_blocks():
    from framework.models import clone_module

    model = build("vgg5", (3, 32, 32), 10).cuda()
    clone = clone_module(model)
    assert len({p.untyped_storage().data_ptr() for p in clone.parameters()}) == 1
    assert all(torch.equal(a, b) for a, b in zip(clone.state_dict().values(), model.state_dict().values()))


def test_clone_module_keeps_tied_parameters_tied():
    from framework.models import clone_module

    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    b.weight = a.weight
    for in_blocks in (False, True):
        twin = clone_module(torch.nn.Sequential(a, b), in_blocks=in_blocks)
        assert twin[0].weight is twin[1].weight and twin[0].weight is not a.weight
