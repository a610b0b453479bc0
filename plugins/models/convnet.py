"""AdaLearner's ConvNet (notes section 3: the paper names only "ConvNet" and cites Krizhevsky; the
notes' guess is cuda-convnet's layers-18pct, Caffe's cifar10_full, about 81 % on CIFAR-10):

    conv5x5x32 pad 2, max-pool 3/2, ReLU, LRN | conv5x5x32 pad 2, ReLU, avg-pool 3/2, LRN |
    conv5x5x64 pad 2, ReLU, avg-pool 3/2 | fc-X

Pooling rounds up as Caffe's does (32 -> 16 -> 8 -> 4), and the LRN is Caffe's WITHIN_CHANNEL
kind (3x3 neighbourhood, alpha 5e-5, beta 0.75), which torch.nn.LocalResponseNorm (across
channels) is not. On 3x32x32 input: 89,578 parameters, as the notes count.
"""

from __future__ import annotations

import torch
from torch import nn

from framework.errors import ConfigError
from plugins.models.schemas import ConvNetConfig  # noqa: F401  (the schemas live in a light module: registry.declare)


class WithinChannelLRN(nn.Module):
    """x / (1 + alpha * mean of x^2 over the size x size neighbourhood)^beta, per channel (Caffe)."""

    def __init__(self, size: int = 3, alpha: float = 5e-5, beta: float = 0.75):
        super().__init__()
        self.size, self.alpha, self.beta = size, alpha, beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean_sq = nn.functional.avg_pool2d(x * x, self.size, stride=1, padding=self.size // 2, count_include_pad=True)
        return x / (1.0 + self.alpha * mean_sq).pow(self.beta)


def convnet(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """cifar10_full: three 5x5 convs with pooling and LRN, one dense layer; 4 units."""
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"convnet needs image input (C, H, W), got shape {tuple(input_shape)}")
    c, h, w = input_shape

    def pooled(size: int) -> int:  # three 3/2 poolings, rounding up
        for _ in range(3):
            size = -(-(size - 3) // 2) + 1
        return size

    if min(h, w) < 7:
        raise ConfigError("model.name", f"convnet input {h}x{w} is too small (three 3x3 poolings need at least 7x7)")
    return [
        ("conv1", nn.Sequential(nn.Conv2d(c, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(), WithinChannelLRN())),
        ("conv2", nn.Sequential(nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True), WithinChannelLRN())),
        ("conv3", nn.Sequential(nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True))),
        ("fc", nn.Sequential(nn.Flatten(), nn.Linear(64 * pooled(h) * pooled(w), num_classes))),
    ]
