"""The MLP as EdgePipe sees it: one dense layer per unit, split by neurons into super neurons.
Used by the scheduler (planning, evaluation) and by the roles (their layer's weights)."""

from __future__ import annotations

import math

import torch
from torch import nn

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
