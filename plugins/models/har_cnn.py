"""AccEPT's "simple five-layer CNN" for UCI-HAR (from FedHealth), 5 units on 9x128 windows.

Conv1d(9,64,k3)+ReLU -> 64x126; Conv1d(64,64,k3)+ReLU+Dropout -> 64x124; MaxPool1d(2)+Flatten
-> 3968; Linear(3968,100)+ReLU -> 100; Linear(100,X). At batch 64 the first and fourth outputs
are 2016 KiB and 25 KiB, the sizes AccEPT's Table 3 reports.
"""

from __future__ import annotations


from torch import nn

from framework.errors import ConfigError
from plugins.models.schemas import HARCNNConfig  # noqa: F401  (the schemas live in a light module: registry.declare)


def har_cnn(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """HAR CNN (AccEPT): two 1-D convs, max-pool, two dense layers."""
    if len(input_shape) != 2:
        raise ConfigError("model.name", f"har_cnn needs sequence input (channels, steps), got {tuple(input_shape)}")
    channels, steps = input_shape
    pooled = (steps - 4) // 2  # two valid k3 convs, then a 2/2 pool
    if pooled < 1:
        raise ConfigError("model.name", f"har_cnn needs at least 6 time steps, got {steps}")
    p = float(cfg.dropout)
    if not 0.0 <= p < 1.0:
        raise ConfigError("model.dropout", f"{p} must be in [0, 1)")
    return [
        ("conv1", nn.Sequential(nn.Conv1d(channels, 64, 3), nn.ReLU())),
        ("conv2", nn.Sequential(nn.Conv1d(64, 64, 3), nn.ReLU(), nn.Dropout(p))),
        ("pool", nn.Sequential(nn.MaxPool1d(2, 2), nn.Flatten())),
        ("fc1", nn.Sequential(nn.Linear(64 * pooled, 100), nn.ReLU())),
        ("fc2", nn.Linear(100, num_classes)),
    ]
