"""LeNet-5 (LeCun et al., 1998): two conv layers and three dense layers, 5 units.

No BN and no dropout, as in the original. The classic net expects 32x32 inputs; MNIST's 28x28
digits get padding 2 on the first conv (the usual adaptation) so the feature maps are the same
(6x28x28 -> 6x14x14 -> 16x10x10 -> 16x5x5).
"""

from __future__ import annotations

from torch import nn

from framework.config import knobs
from framework.errors import ConfigError
from plugins.models.schemas import LeNetConfig  # the schemas live in a light module: registry.declare


def lenet(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """LeNet-5: conv6-5, conv16-5, fc120, fc84, fc-X (variant `mxnet`: see `lenet_mxnet`)."""
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"lenet needs image input (C, H, W), got shape {tuple(input_shape)}")
    variant = str(cfg.variant)
    knobs.check({"variant": variant}, LeNetConfig, "model")  # also when the factory is called directly
    if variant == "mxnet":
        return lenet_mxnet(input_shape, num_classes)
    c, h, w = input_shape
    pad = 2 if min(h, w) < 32 else 0  # bring small inputs (MNIST) up to LeNet's 32x32 receptive layout

    def after(size: int) -> int:  # conv5(pad) -> pool2 -> conv5 -> pool2
        return ((size + 2 * pad - 4) // 2 - 4) // 2

    fh, fw = after(h), after(w)
    if fh < 1 or fw < 1:
        raise ConfigError("model.name", f"lenet input {h}x{w} is too small (needs at least 12x12)")
    return [
        ("conv1", nn.Sequential(nn.Conv2d(c, 6, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2))),
        ("conv2", nn.Sequential(nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))),
        ("fc1", nn.Sequential(nn.Flatten(), nn.Linear(16 * fh * fw, 120), nn.ReLU())),
        ("fc2", nn.Sequential(nn.Linear(120, 84), nn.ReLU())),
        ("fc3", nn.Linear(84, num_classes)),
    ]


def lenet_mxnet(input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """MXNet's example LeNet (symbols/lenet.py), AdaLearner's: conv20-5 + tanh + pool2, conv50-5 +
    tanh + pool2, fc500 + tanh, fc-X; no padding. On 1x28x28 input: 431,080 parameters."""
    c, h, w = input_shape
    fh, fw = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    if fh < 1 or fw < 1:
        raise ConfigError("model.name", f"lenet (mxnet) input {h}x{w} is too small (needs at least 16x16)")
    return [
        ("conv1", nn.Sequential(nn.Conv2d(c, 20, 5), nn.Tanh(), nn.MaxPool2d(2))),
        ("conv2", nn.Sequential(nn.Conv2d(20, 50, 5), nn.Tanh(), nn.MaxPool2d(2))),
        ("fc1", nn.Sequential(nn.Flatten(), nn.Linear(50 * fh * fw, 500), nn.Tanh())),
        ("fc2", nn.Linear(500, num_classes)),
    ]
