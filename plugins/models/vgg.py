"""PiPar's VGG-5 (Zhang et al., PiPar, Table II): CONV-3-32, CONV-3-64, CONV-3-64, FC-128, FC-X.

Layer details follow PiPar's code: conv + BN + ReLU + maxpool2 twice, conv + BN + ReLU, then
FC(64*(H/4)*(W/4) -> 128) and FC(128 -> X). CIFAR: 32x16x16 -> 64x8x8 -> 64x8x8;
MNIST: 32x14x14 -> 64x7x7 -> 64x7x7.
"""

from __future__ import annotations


from torch import nn

from framework.errors import ConfigError
from plugins.models.schemas import VGG5Config  # noqa: F401  (the schemas live in a light module: registry.declare)


def _conv(cin: int, cout: int, batchnorm: bool, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1)]
    if batchnorm:
        layers.append(nn.BatchNorm2d(cout))
    layers.append(nn.ReLU())
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


def vgg5(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """VGG-5 (PiPar): three 3x3 convs and two dense layers, 5 units."""
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"vgg5 needs image input (C, H, W), got shape {tuple(input_shape)}")
    c, h, w = input_shape
    if h < 4 or w < 4:
        raise ConfigError("model.name", f"vgg5 input {h}x{w} is too small (two 2x2 poolings need >= 4x4)")
    bn = bool(cfg.batchnorm)
    return [
        ("conv1", _conv(c, 32, bn, pool=True)),
        ("conv2", _conv(32, 64, bn, pool=True)),
        ("conv3", _conv(64, 64, bn, pool=False)),
        ("fc1", nn.Sequential(nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), 128), nn.ReLU())),
        ("fc2", nn.Linear(128, num_classes)),
    ]
