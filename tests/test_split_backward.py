"""A backward split into input gradient (I) and weight gradient (W), framework.pipeline.split_backward,
against the full backward (`loss.backward()`), float64 on the CPU.

Stage slices of LeNet, VGG-5 (with BatchNorm) and an MLP from the model zoo, cut as
`scheduler.partition=even` cuts them; every stage of the cut (the first, whose input is data; the
middle ones; the last, whose I starts from the loss). I then W gives the same input and parameter
gradients bit for bit; micro-batches interleaved between their I and W accumulate the same
`.grad`; after W nothing the micro-batch saved is alive. The corner cases: a parameter used twice,
no parameters, parameters the output does not reach, an output that does not depend on the input.
"""

from __future__ import annotations

import copy
import weakref

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.func import functional_call

from framework.models import UnitModel
from framework.pipeline.partition import balanced_bounds
from framework.pipeline.split_backward import backward_input
from plugins.models.lenet import lenet
from plugins.models.mlp import mlp
from plugins.models.schemas import LeNetConfig, MLPConfig, VGG5Config
from plugins.models.vgg import vgg5

SHAPE, CLASSES, BATCH = (1, 16, 16), 10, 4
ZOO = {"lenet": (lenet, LeNetConfig, {}), "vgg5": (vgg5, VGG5Config, {"batchnorm": True}), "mlp": (mlp, MLPConfig, {"depth": 6, "hidden": 24})}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def zoo_model(name: str, seed: int = 0, **overrides) -> UnitModel:
    factory, schema, defaults = ZOO[name]
    cfg = OmegaConf.structured(schema)
    for k, v in (defaults | overrides).items():
        cfg[k] = v
    torch.manual_seed(seed)
    return UnitModel(name, factory(cfg, SHAPE, CLASSES), SHAPE, CLASSES).to(torch.float64)


def even_cut(model: UnitModel, stages: int) -> list[tuple[int, int]]:
    """`scheduler.partition=even`'s program on FLOPs: contiguous stages of balanced work."""
    return balanced_bounds(lambda s, i: model.infos[i].flops, stages, len(model))


CASES = [(name, stages, s) for name in ZOO for stages in (2, 3) for s in range(stages)]


class Slice:
    """Stage s of a model cut into stages, with one micro-batch's input, target and output gradient."""

    def __init__(self, name: str, stages: int, s: int, seed: int = 1):
        self.model = zoo_model(name)
        self.start, self.stop = even_cut(self.model, stages)[s]
        self.first, self.last = self.start == 0, self.stop == len(self.model)
        g = torch.Generator().manual_seed(seed)
        self.samples = [self.micro_batch(g) for _ in range(2)]

    def micro_batch(self, g):
        x = torch.randn(BATCH, *self.model.infos[self.start].in_shape, generator=g, dtype=torch.float64)
        target = torch.randint(0, CLASSES, (BATCH,), generator=g)
        grad = None if self.last else torch.randn(BATCH, *self.model.infos[self.stop - 1].out_shape, generator=g, dtype=torch.float64)
        return x, target, grad

    def module(self) -> nn.Module:
        """A fresh copy of the stage (same weights and statistics each call)."""
        return copy.deepcopy(self.model.slice(self.start, self.stop))

    def forward(self, module, mb: int):
        """(input leaf, output or scaled loss, output gradient), as framework.stage.Stage.forward keeps them."""
        x, target, grad = self.samples[mb]
        x_in = x if self.first else x.detach().requires_grad_(True)
        y = module(x_in)
        out = nn.functional.cross_entropy(y, target, reduction="sum") * (1.0 / (2 * BATCH)) if self.last else y
        return x_in, out, grad


def full(sl: Slice, module, mb: int):
    x_in, out, grad = sl.forward(module, mb)
    out.backward(grad)
    return x_in.grad


def grads(module) -> list:
    return [p.grad for p in module.parameters()]


def assert_same(a, b, what: str) -> None:
    """Bit-equal: the split runs the full backward's kernels on the same gradients."""
    assert len(a) == len(b), what
    for i, (u, v) in enumerate(zip(a, b)):
        assert (u is None) == (v is None), f"{what}[{i}]: {u is None} vs {v is None}"
        if u is not None:
            assert torch.equal(u, v), f"{what}[{i}]: differs by {(u - v).abs().max().item():.3g}"


@pytest.mark.parametrize("name,stages,s", CASES)
def test_input_then_weight_equals_the_full_backward(name, stages, s):
    sl = Slice(name, stages, s)
    ref, split = sl.module(), sl.module()
    ref_gin = full(sl, ref, 0)

    x_in, out, grad = sl.forward(split, 0)
    gin, w = backward_input(out, grad, x_in, list(split.parameters()))
    assert all(g is None for g in grads(split)), "I touched a parameter's gradient"
    if sl.first:
        assert gin is None, "the first stage's input is data: no gradient"
    else:
        assert torch.equal(gin, ref_gin), f"input gradient differs by {(gin - ref_gin).abs().max().item():.3g}"
    del out
    w.accumulate()
    assert_same(grads(split), grads(ref), "parameter gradients")
    assert any(g is not None for g in grads(split))
    # BatchNorm: one forward, one update of the running statistics; the backward ran none
    assert_same(list(split.buffers()), list(ref.buffers()), "buffers")
    for m in split.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert int(m.num_batches_tracked) == 1
    with pytest.raises(RuntimeError, match="accumulated already"):
        w.accumulate()


@pytest.mark.parametrize("w_order", [(0, 1), (1, 0)], ids=["I0 I1 W0 W1", "I0 I1 W1 W0"])
@pytest.mark.parametrize("name,stages,s", [c for c in CASES if c[1] == 3])
def test_interleaved_micro_batches_accumulate_what_two_full_backwards_do(name, stages, s, w_order):
    """F0 F1 I0 I1 W.. W.. against F0 F1 B0 B1: the same input gradients and `.grad`."""
    sl = Slice(name, stages, s)
    ref, split = sl.module(), sl.module()
    held = [sl.forward(ref, 0), sl.forward(ref, 1)]
    ref_gin = []
    for x_in, out, grad in held:
        out.backward(grad)
        ref_gin.append(x_in.grad)
    del held

    fwd = [sl.forward(split, 0), sl.forward(split, 1)]
    pending, gin = [], []
    for x_in, out, grad in fwd:
        g, w = backward_input(out, grad, x_in, list(split.parameters()))
        gin.append(g)
        pending.append(w)
    del fwd
    assert all(g is None for g in grads(split))
    for m in w_order:
        pending[m].accumulate()
    if not sl.first:
        assert_same(gin, ref_gin, "input gradients")
    assert_same(grads(split), grads(ref), "accumulated parameter gradients")  # two terms: a + b == b + a exactly
    assert_same(list(split.buffers()), list(ref.buffers()), "buffers")


class SavedTensors:
    """Counts what autograd saves in a forward, per micro-batch: each saved tensor is packed in a
    holder the graph owns, so a holder is alive exactly as long as the graph keeps that tensor."""

    def __init__(self):
        self.holders: dict[int, list] = {}

    def forward(self, mb: int):
        self.holders[mb] = refs = []

        class Holder:
            def __init__(self, t):
                self.t = t.detach()  # not the tensor itself: an output saved by its own node would make a cycle with that node
                refs.append(weakref.ref(self))

        return torch.autograd.graph.saved_tensors_hooks(Holder, lambda h: h.t)

    def alive(self, mb: int) -> int:
        return sum(r() is not None for r in self.holders[mb])


@pytest.mark.parametrize("name,stages,s", [c for c in CASES if c[1] == 3])
def test_after_w_nothing_the_micro_batch_saved_is_alive(name, stages, s):
    sl = Slice(name, stages, s)
    split = sl.module()
    saved = SavedTensors()
    held = {}
    for mb in (0, 1):
        with saved.forward(mb):
            held[mb] = sl.forward(split, mb)
    n = {mb: saved.alive(mb) for mb in (0, 1)}
    assert n[0] > 0 and n[0] == n[1]
    pending = {}
    for mb in (0, 1):
        x_in, out, grad = held.pop(mb)
        _, pending[mb] = backward_input(out, grad, x_in, list(split.parameters()))
        del x_in, out, grad
    after_i = saved.alive(0)
    assert after_i <= n[0]
    if sl.last:
        assert after_i < n[0], "I released nothing above the last layer's join (the loss's saved tensors)"
    pending[1].accumulate()
    assert saved.alive(1) == 0, f"{saved.alive(1)} of micro-batch 1's {n[1]} saved tensors outlive its W"
    assert saved.alive(0) == after_i, "W of micro-batch 1 released micro-batch 0's"
    pending[0].accumulate()
    assert saved.alive(0) == 0
    assert not pending[0]._groups and pending[0]._whole is None


# ---- corner cases, on small modules of their own --------------------------------------------


class Twice(nn.Module):
    """One Linear used twice, around another layer: its gradient has two shares."""

    def __init__(self):
        super().__init__()
        self.shared, self.middle = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        return self.shared(torch.tanh(self.middle(torch.tanh(self.shared(x)))))


class Unused(nn.Module):
    """A Linear the forward never calls and a frozen one: neither gets a gradient."""

    def __init__(self):
        super().__init__()
        self.used, self.unused, self.frozen = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(torch.relu(self.used(x)))


class Constant(nn.Module):
    """An output that ignores the input: its gradient flows to the parameter alone."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(6, dtype=torch.float64))

    def forward(self, x):
        return self.bias.expand(x.shape[0], 6) * 2.0


def both_ways(make, x_needs_grad: bool = True, seed: int = 3, list_twice: bool = False):
    """(full backward's input and parameter gradients, the split's) for a fresh module from make();
    `list_twice`: every weight handed to I twice (named_parameters(remove_duplicate=False) of tied weights)."""
    torch.manual_seed(seed)
    ref = make().to(torch.float64)
    split = copy.deepcopy(ref)
    x = torch.randn(5, 6, dtype=torch.float64)
    g = torch.randn(5, 6, dtype=torch.float64)
    x_in = x.detach().requires_grad_(x_needs_grad)
    y = ref(x_in)
    if y.requires_grad:
        y.backward(g)
    x_in2 = x.detach().requires_grad_(x_needs_grad)
    gin, w = backward_input(split(x_in2), g, x_in2, list(split.parameters()) * (2 if list_twice else 1))
    w.accumulate()
    return (x_in.grad, grads(ref)), (gin, grads(split))


def test_a_parameter_used_twice_gets_both_shares_once():
    for list_twice in (False, True):
        (ref_gin, ref_g), (gin, g) = both_ways(Twice, list_twice=list_twice)
        assert torch.equal(gin, ref_gin)
        for u, v in zip(ref_g, g):
            torch.testing.assert_close(v, u, rtol=0, atol=1e-12)
    # W ran the input path between the two uses again (retaining the graph): all of it goes after W
    module, saved = Twice().to(torch.float64), SavedTensors()
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    with saved.forward(0):
        out = module(x)
    _, w = backward_input(out, torch.ones(5, 6, dtype=torch.float64), x, list(module.parameters()))
    del out
    assert saved.alive(0) > 0
    w.accumulate()
    assert saved.alive(0) == 0


def test_a_stage_without_parameters_passes_the_gradient_and_its_w_does_nothing():
    (ref_gin, _), (gin, g) = both_ways(lambda: nn.Sequential(nn.ReLU(), nn.Tanh()))
    assert torch.equal(gin, ref_gin) and g == []
    _, (gin, g) = both_ways(lambda: nn.Sequential(nn.ReLU()), x_needs_grad=False)  # on data: nothing to differentiate
    assert gin is None and g == []


def test_parameters_the_output_does_not_reach_get_no_gradient():
    (ref_gin, ref_g), (gin, g) = both_ways(Unused)
    assert torch.equal(gin, ref_gin)
    assert_same(g, ref_g, "parameter gradients")
    assert [p is None for p in g] == [False, False, True, True, True, True]  # used.{weight,bias} only


def test_an_output_that_ignores_the_input_leaves_the_whole_backward_to_w():
    (ref_gin, ref_g), (gin, g) = both_ways(Constant)
    assert ref_gin is None and gin is None
    assert_same(g, ref_g, "parameter gradients")


def test_a_weight_stashing_snapshot_takes_the_gradients():
    """With PipeDream's stash (framework.stage), the forward ran on detached copies of the weights:
    they are the weights I and W differentiate."""
    torch.manual_seed(4)
    module = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)).to(torch.float64)
    x, g = torch.randn(5, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    snaps = [{n: p.detach().clone().requires_grad_(True) for n, p in module.named_parameters()} for _ in range(2)]
    x_ref = x.detach().requires_grad_(True)
    functional_call(module, snaps[0], (x_ref,)).backward(g)
    x_in = x.detach().requires_grad_(True)
    gin, w = backward_input(functional_call(module, snaps[1], (x_in,)), g, x_in, list(snaps[1].values()))
    w.accumulate()
    assert torch.equal(gin, x_ref.grad)
    assert_same([p.grad for p in snaps[1].values()], [p.grad for p in snaps[0].values()], "snapshot gradients")
    assert all(p.grad is None for p in module.parameters())


def test_the_input_must_be_a_leaf():
    lin = nn.Linear(6, 6)
    x = torch.randn(2, 6, requires_grad=True) * 2.0
    with pytest.raises(ValueError, match="must be a leaf"):
        backward_input(lin(x), torch.ones(2, 6), x, list(lin.parameters()))
