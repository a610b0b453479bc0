"""Plain multilayer perceptron: the smallest model, used for exact-equivalence tests.

Only Linear + ReLU (no dropout, no BN), so a pipelined run in float64 must match a single-device
run bit for bit up to summation order.
"""

from __future__ import annotations

import math

from torch import nn

from framework.errors import ConfigError
from plugins.models.schemas import MLPConfig  # noqa: F401  (the schemas live in a light module: registry.declare)


def mlp(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """MLP: fc0 (flatten + Linear + ReLU), fc1..fc{depth-2}, head. `widths` gives each hidden
    layer's width (then depth = len(widths) + 1); else `depth` - 1 layers of `hidden`."""
    widths = cfg.widths
    if widths is not None:
        widths = [int(w) for w in widths]
        if not widths or min(widths) < 1:
            raise ConfigError("model.widths", f"{widths} must list at least one positive width, e.g. [128, 64]")
    else:
        depth, hidden = int(cfg.depth), int(cfg.hidden)
        if depth < 2:
            raise ConfigError("model.depth", f"{depth} is too small; an MLP needs at least 2 units (fc0 and head)")
        if hidden < 1:
            raise ConfigError("model.hidden", f"{hidden} must be positive")
        widths = [hidden] * (depth - 1)
    units: list[tuple[str, nn.Module]] = [
        ("fc0", nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), widths[0]), nn.ReLU()))
    ]
    for i in range(1, len(widths)):
        units.append((f"fc{i}", nn.Sequential(nn.Linear(widths[i - 1], widths[i]), nn.ReLU())))
    units.append(("head", nn.Linear(widths[-1], num_classes)))
    return units
