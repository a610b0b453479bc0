"""Models as ordered lists of partitionable units.

A *unit* is the smallest piece a planner may place on a device: a conv layer with its BN,
activation and pooling, a residual block, a MobileNet bottleneck, a dense layer (the papers'
"layer"). A model plugin returns its units as `[(name, nn.Module), ...]`; `UnitModel` adds the
metadata every planner and time model needs, measured by one dummy forward at batch 1:

- `flops`: forward FLOPs per sample (2 x multiply-accumulates for conv/linear, plus one FLOP per
  element for normalisation, activation, pooling and residual adds);
- `flops_by_kind`: the same split by layer type (`conv`, `depthwise`, `pointwise`, `linear`,
  `norm`, `act`, `pool`, `other`), so devices can carry per-type speed factors;
- `in_shape` / `out_shape` (per sample), `params` and `param_bytes`;
- `act_bytes`: the bytes its layers read and write per sample (each layer's input and output
  once), the activation traffic of a roofline: per FLOP it falls tenfold along MobileNetV2.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from framework import registry

KINDS = ("conv", "depthwise", "pointwise", "linear", "norm", "act", "pool", "other")


@dataclass(frozen=True)
class UnitInfo:
    """A unit's description, measured once and never changed: copies of a model share it."""
    name: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    flops: float
    params: int
    param_bytes: int
    flops_by_kind: dict[str, float] = field(default_factory=dict)
    act_bytes: int = 0  # per sample: what the unit's layers read and write (each layer's input and output, once)

    def __deepcopy__(self, memo):
        return self  # frozen, and nothing writes into flops_by_kind: 5 of a VGG-5 copy's 21 reconstructions

    @property
    def out_numel(self) -> int:
        n = 1
        for d in self.out_shape:
            n *= d
        return n


class UnitModel(nn.Module):
    """`units[i]` is an nn.Module; `infos[i]` its metadata. Forward runs them in order."""

    def __init__(self, name: str, units: list[tuple[str, nn.Module]], input_shape, num_classes: int):
        super().__init__()
        if not units:
            raise ValueError(f"model {name!r} has no units")
        self.name = name
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.unit_names = [n for n, _ in units]
        self.units = nn.ModuleList([m for _, m in units])
        self.infos = describe_units(self.unit_names, list(self.units), self.input_shape)

    def __len__(self) -> int:
        return len(self.units)

    def forward(self, x):
        for u in self.units:
            x = u(x)
        return x

    def slice(self, start: int, stop: int) -> nn.Sequential:
        """Units [start, stop) as one module; the modules are shared, not copied."""
        return nn.Sequential(*self.units[start:stop])

    def summary(self) -> str:
        rows = [f"{'#':>3} {'unit':<18} {'out shape':<16} {'MFLOPs':>9} {'params':>10}"]
        for i, info in enumerate(self.infos):
            rows.append(
                f"{i:>3} {info.name:<18} {str(info.out_shape):<16} {info.flops / 1e6:>9.3f} {info.params:>10,}"
            )
        return "\n".join(rows)


_ATOMS = frozenset({str, int, float, bool, type(None), torch.dtype, torch.device})
_CONTAINERS = frozenset({dict, OrderedDict, set, list})


def clone_module(module: nn.Module, memo: dict | None = None, in_blocks: bool | None = None) -> nn.Module:
    """A deep copy of `module`, as `copy.deepcopy` makes it, about 3x faster.

    Each simulated device owns its model copy, so a K-device run makes 2K copies before it
    trains; `copy.deepcopy` spends most of a small model's copy reducing and rebuilding the
    dozen empty hook dictionaries of every submodule. Here submodules are rebuilt directly,
    parameters and buffers are deep-copied (shared ones stay shared, through `memo`), atoms are
    shared and empty containers made anew; anything else, and any module type with its own
    copy or pickling hooks, goes through `copy.deepcopy`.

    `in_blocks`: the plain parameters (and, apart, the plain buffers) of each dtype are copied as
    one block (`_copy_in_blocks`); None: where the module's tensors are not on the CPU. On a GPU
    each tensor's copy is a kernel launch and an allocation; on a CPU it is a memcpy, and setting
    up each tensor in a block costs the host more (callgrind, a batched FL epoch of 64 2-wide
    MLPs: 822.6 M instructions against 794.1 M)."""
    memo = {} if memo is None else memo
    if in_blocks is None:
        first = next(module.parameters(), None)
        in_blocks = first is not None and first.device.type not in ("cpu", "meta")
    if in_blocks:
        _copy_in_blocks(module, memo)
    return _clone(module, memo)


def _copy_in_blocks(module: nn.Module, memo: dict) -> None:
    """Copies of `module`'s plain, contiguous parameters and buffers into `memo` (by id, as
    deepcopy's memo), those of each kind, device and dtype made by one `cat` into one block: one
    kernel launch and one allocation instead of one per tensor (1,625 of the 7,100 non-view
    torch calls of a batched FL epoch of 64 VGG-5s were these copies; on a GPU each is a launch
    and an allocation). Each copy lies in the block but is a tensor of its own (`.data =`),
    not a view: it has its own autograd version counter, so BatchNorm's in-place update of a
    running statistic does not mark the layer's weight as modified in a graph that saved it.
    Parameters and buffers are in separate blocks, so that a parameter moved elsewhere (a replica
    bank's row, framework/replicas/bank.py) leaves no buffer holding its old memory."""
    groups: dict = {}
    for m in module.modules():
        for kind, tensors in (("p", m._parameters), ("b", m._buffers)):
            for t in tensors.values():
                if t is not None and id(t) not in memo and _blockable(t, kind):
                    group = groups.setdefault((kind, t.device, t.dtype), {})
                    group.setdefault(id(t), t)  # tied tensors once
    for (kind, device, dtype), group in groups.items():
        ts = list(group.values())
        if len(ts) < 2:
            continue
        with torch.no_grad():
            parts = _unflatten_dense_tensors(_flatten_dense_tensors(ts), ts)
        for t, part in zip(ts, parts):
            new = torch.empty(0, dtype=dtype, device=device)
            if kind == "p":
                new = nn.Parameter(new, t.requires_grad)
            new.data = part
            memo[id(t)] = new


def _blockable(t: torch.Tensor, kind: str) -> bool:
    """Whether `_clone_tensor` would copy `t` with `clone` (a plain Parameter or tensor, in
    neither case anything deepcopy would keep), and a block copy has its layout."""
    if kind == "p":
        plain = type(t) is nn.Parameter
    else:
        plain = type(t) is torch.Tensor and not t.requires_grad and not t.__dict__
    return plain and t._base is None and t.grad is None and t.layout is torch.strided and not t.is_quantized and t.is_contiguous() and t.device.type != "meta"


def _clone(mod: nn.Module, memo: dict) -> nn.Module:
    got = memo.get(id(mod))
    if got is not None:
        return got
    cls = type(mod)
    if "__deepcopy__" in cls.__dict__ or cls.__reduce_ex__ is not nn.Module.__reduce_ex__ or "__getstate__" in cls.__dict__:
        return copy.deepcopy(mod, memo)
    new = object.__new__(cls)
    memo[id(mod)] = new
    d = {}
    for k, v in mod.__dict__.items():
        t = type(v)  # tested in the order a module's attributes are common: a model copy is mostly these tests
        if t in _ATOMS:
            d[k] = v
        elif t in _CONTAINERS and not v:
            d[k] = t()  # the dozen empty hook dictionaries
        elif k == "_modules":
            d[k] = {n: None if c is None else _clone(c, memo) for n, c in v.items()}
        elif k in ("_parameters", "_buffers"):
            d[k] = {n: None if x is None else _clone_tensor(x, memo) for n, x in v.items()}
        elif t is tuple and all(type(x) in _ATOMS for x in v):
            d[k] = v  # deepcopy returns such a tuple itself (a conv's kernel_size, stride, padding)
        elif t is list and all(type(x) in _ATOMS or type(x) is UnitInfo for x in v):
            d[k] = list(v)  # a UnitModel's unit names and infos
        else:
            d[k] = copy.deepcopy(v, memo)
    object.__setattr__(new, "__dict__", d)  # not through Module.__setattr__'s checks (70 us a model)
    return new


def _clone_tensor(t: torch.Tensor, memo: dict) -> torch.Tensor:
    """copy.deepcopy(t, memo), through `Tensor.clone` for a plain tensor: deepcopy builds a fresh
    storage, which on a GPU took 2 ms per buffer (1.2 s of the role building of 64 VGG-5
    replicas on an H200) where `clone` takes its memory from the caching allocator."""
    got = memo.get(id(t))
    if got is not None:
        return got
    if type(t) is nn.Parameter:  # what Parameter.__deepcopy__ does, without copy.deepcopy's dispatch
        new = memo[id(t)] = nn.Parameter(t.data.clone(memory_format=torch.preserve_format), t.requires_grad)
        return new
    if type(t) is not torch.Tensor or t._base is not None or t.grad is not None or t.requires_grad or t.__dict__:
        return copy.deepcopy(t, memo)  # Parameter subclasses (their own deepcopy), views, tensors with state
    new = t.clone(memory_format=torch.preserve_format)
    memo[id(t)] = new
    return new


def _leaf_kind(m: nn.Module) -> str | None:
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        if m.groups > 1 and m.groups == m.in_channels:
            return "depthwise"
        ks = m.kernel_size if isinstance(m.kernel_size, tuple) else (m.kernel_size,)
        if all(k == 1 for k in ks):
            return "pointwise"
        return "conv"
    if isinstance(m, nn.Linear):
        return "linear"
    if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
        return "norm"
    if isinstance(m, (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.GELU, nn.SiLU)):
        return "act"
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
        return "pool"
    return None


def _numel(t) -> int:
    return int(t.numel()) if isinstance(t, torch.Tensor) else 0


def _leaf_flops(m: nn.Module, kind: str, inp: torch.Tensor, out: torch.Tensor) -> float:
    if kind in ("conv", "depthwise", "pointwise"):
        kernel = 1
        for k in m.kernel_size:
            kernel *= k
        macs = _numel(out) * (m.in_channels // m.groups) * kernel
        return 2.0 * macs + (_numel(out) if m.bias is not None else 0)
    if kind == "linear":
        return 2.0 * _numel(out) * m.in_features + (_numel(out) if m.bias is not None else 0)
    if kind == "norm":
        return 2.0 * _numel(out)
    if kind == "pool":
        return float(_numel(inp))
    return float(_numel(out))  # activations


def describe_units(names, units, input_shape) -> list[UnitInfo]:
    """Measure shapes, FLOPs and parameters of each unit with one forward at batch 1."""
    infos = []
    was_training = [u.training for u in units]
    dtype = next((p.dtype for u in units for p in u.parameters()), torch.get_default_dtype())
    x = torch.zeros((1, *input_shape), dtype=dtype)
    with torch.no_grad():
        for name, unit in zip(names, units):
            unit.eval()
            by_kind: dict[str, float] = defaultdict(float)
            traffic = [0]  # bytes the layers read and write per sample (a device's activation stream)
            hooks = []
            for mod in unit.modules():
                kind = _leaf_kind(mod)
                if kind is None:
                    continue

                def hook(m, args, out, kind=kind):
                    inp = args[0] if args else None
                    by_kind[kind] += _leaf_flops(m, kind, inp, out)
                    traffic[0] += (_numel(inp) + _numel(out)) * (out.element_size() if isinstance(out, torch.Tensor) else 0)

                hooks.append(mod.register_forward_hook(hook))
            in_shape = tuple(x.shape[1:])
            try:
                y = unit(x)
            finally:
                for h in hooks:
                    h.remove()
            params = sum(p.numel() for p in unit.parameters())
            pbytes = sum(p.numel() * p.element_size() for p in unit.parameters())
            # ops the hooks cannot see (residual adds, flatten, SE products): at least 1 FLOP/output
            seen = sum(by_kind.values())
            if seen == 0:
                by_kind["other"] += float(y.numel())
            infos.append(
                UnitInfo(
                    name=name,
                    in_shape=in_shape,
                    out_shape=tuple(y.shape[1:]),
                    flops=float(sum(by_kind.values())),
                    params=int(params),
                    param_bytes=int(pbytes),
                    flops_by_kind=dict(by_kind),
                    act_bytes=int(traffic[0] or 2 * y.numel() * y.element_size()),
                )
            )
            x = y
    for u, t in zip(units, was_training):
        u.train(t)
    return infos


def build_model(cfg, input_shape, num_classes) -> UnitModel:
    """Build the model that `cfg.name` registers, as a UnitModel."""
    units = registry.build("model", cfg, tuple(input_shape), int(num_classes))
    return UnitModel(cfg.name, units, input_shape, num_classes)
