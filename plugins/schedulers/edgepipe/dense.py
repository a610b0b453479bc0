"""The MLP as EdgePipe sees it: one dense layer per unit, split by neurons into super neurons.
Used by the scheduler (planning, evaluation) and by the roles (their layer's weights, their ops'
work)."""

from __future__ import annotations

import math

import torch
from torch import nn

from framework.cluster import Work
from framework.errors import ConfigError


def linear_of(unit: nn.Module) -> nn.Linear:
    """The one nn.Linear of an MLP unit."""
    found = [m for m in unit.modules() if isinstance(m, nn.Linear)]
    if len(found) != 1:
        raise ConfigError("model.name", f"super_neuron splits dense layers by neurons; a unit has {len(found)} Linear layers (use model=mlp)")
    return found[0]


def mlp_sizes(model) -> tuple[int, ...]:
    """Neurons per layer, the input layer first (the paper counts it): [784, 128, ..., 10]."""
    linears = [linear_of(u) for u in model.units]
    sizes = [math.prod(model.input_shape)] + [lin.out_features for lin in linears]
    for i, lin in enumerate(linears):
        if lin.in_features != sizes[i]:
            raise ConfigError("model.name", f"unit {i} takes {lin.in_features} inputs after a layer of {sizes[i]}: not a plain MLP (use model=mlp)")
    return tuple(sizes)


@torch.no_grad()
def glorot_init(model, seed: int) -> None:
    """Glorot-uniform weights and zero biases in every dense layer (notes section 8 item 17: TF
    1.15's default), drawn from a generator of the run's seed: the same in every process."""
    g = torch.Generator().manual_seed(seed)
    for unit in model.units:
        lin = linear_of(unit)
        bound = math.sqrt(6.0 / (lin.in_features + lin.out_features))
        w = torch.rand(lin.weight.shape, generator=g, dtype=torch.float64) * (2 * bound) - bound
        lin.weight.copy_(w.to(lin.weight.dtype))
        lin.bias.zero_()


def op_works(chunks, sizes, batch: int) -> dict:
    """{(op, layer): [Work, ...]} of a super neuron with `chunks` ((layer, lo, hi), ...) of an MLP
    of `sizes` neurons per layer: FW = its chunk's forward; BW = the chunk's backward (weight
    gradient, partial products), then its SGD step. A chunk of layer l is `share` = its neurons /
    the layer's of unit l - 2, priced as layer work is (the input layer, l = 1, computes nothing)."""
    out = {}
    for layer, lo, hi in chunks:
        if layer < 2:
            out[("FW", layer)], out[("BW", layer)] = [], []
            continue
        u, share = layer - 2, (hi - lo) / sizes[layer - 1]
        out[("FW", layer)] = [Work("fwd", u, u + 1, batch, share=share)]
        out[("BW", layer)] = [Work("bwd", u, u + 1, batch, share=share), Work("step", u, u + 1, 0, share=share)]
    return out
