"""MobileNetV2 (AccEPT's 20-unit split) and MobileNetV3-Small (PiPar's 15-unit split).

One unit per block: the stem conv, each inverted-residual / bottleneck block, the final 1x1
conv(s) and the classifier. Written here rather than imported from torchvision (not a
dependency); block configurations follow torchvision's reference models.
"""

from __future__ import annotations


import torch
from torch import nn

from framework.errors import ConfigError
from plugins.models.schemas import MobileNetV2Config, MobileNetV3SmallConfig  # noqa: F401  (the schemas live in a light module: registry.declare)


def _image_input(name: str, input_shape: tuple) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"{name} needs image input (C, H, W), got shape {tuple(input_shape)}")
    return tuple(int(d) for d in input_shape)


def _conv_bn_act(cin, cout, kernel, stride=1, groups=1, act=None, bn=nn.BatchNorm2d) -> nn.Sequential:
    """Conv (no bias: the BN that follows has one) + BN + optional activation."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        bn(cout),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------------------------------
# MobileNetV2 (Sandler et al., 2018), as split by AccEPT
# ---------------------------------------------------------------------------------------------

# (expansion t, output channels c, repeats n, first stride s), width 1.0
MOBILENETV2_SETTINGS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand -> 3x3 depthwise -> 1x1 linear projection (+ identity)."""

    def __init__(self, cin: int, cout: int, stride: int, expansion: int):
        super().__init__()
        hidden = cin * expansion
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expansion != 1:  # t=1 has nothing to expand; the reference skips the 1x1 conv
            layers.append(_conv_bn_act(cin, hidden, 1, act=nn.ReLU6))
        layers.append(_conv_bn_act(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6))
        layers.append(_conv_bn_act(hidden, cout, 1))  # linear bottleneck: no activation
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


def mobilenetv2(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """MobileNetV2 (AccEPT): stem, 17 inverted residuals, conv1x1-1280, classifier; 20 units."""
    c, _, _ = _image_input("mobilenetv2", input_shape)
    units: list[tuple[str, nn.Module]] = [("stem", _conv_bn_act(c, 32, 3, stride=2, act=nn.ReLU6))]
    cin = 32
    for t, cout, n, s in MOBILENETV2_SETTINGS:
        for i in range(n):
            units.append((f"ir{len(units)}", InvertedResidual(cin, cout, s if i == 0 else 1, t)))
            cin = cout
    units.append(("conv1280", _conv_bn_act(cin, 1280, 1, act=nn.ReLU6)))
    units.append(
        ("classifier", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, num_classes)))
    )
    return units


# ---------------------------------------------------------------------------------------------
# MobileNetV3-Small (Howard et al., 2019), as split by PiPar
# ---------------------------------------------------------------------------------------------


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of `divisor` without dropping more than 10% (reference rule)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def _bn_v3(channels: int) -> nn.BatchNorm2d:
    # MobileNetV3's reference BN settings (TF-style), kept so trained numbers are comparable
    return nn.BatchNorm2d(channels, eps=0.001, momentum=0.01)


class SqueezeExcitation(nn.Module):
    """Channel attention: global pool -> 1x1 squeeze + ReLU -> 1x1 excite + hard-sigmoid -> scale."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class Bottleneck(nn.Module):
    """MobileNetV3 bneck: [1x1 expand] -> kxk depthwise -> [SE] -> 1x1 projection (+ identity)."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act: type, stride: int):
        super().__init__()
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expanded != cin:  # the first block (16 -> 16) has no expansion conv
            layers.append(_conv_bn_act(cin, expanded, 1, act=act, bn=_bn_v3))
        layers.append(_conv_bn_act(expanded, expanded, kernel, stride, groups=expanded, act=act, bn=_bn_v3))
        if se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4)))
        layers.append(_conv_bn_act(expanded, cout, 1, bn=_bn_v3))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


RE, HS = nn.ReLU, nn.Hardswish
# (kernel, expanded, out, SE, activation, stride), torchvision's mobilenet_v3_small config
MOBILENETV3_SMALL_SETTINGS = [
    (3, 16, 16, True, RE, 2),
    (3, 72, 24, False, RE, 2),
    (3, 88, 24, False, RE, 1),
    (5, 96, 40, True, HS, 2),
    (5, 240, 40, True, HS, 1),
    (5, 240, 40, True, HS, 1),
    (5, 120, 48, True, HS, 1),
    (5, 144, 48, True, HS, 1),
    (5, 288, 96, True, HS, 2),
    (5, 576, 96, True, HS, 1),
    (5, 576, 96, True, HS, 1),
]


def mobilenetv3_small(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """MobileNetV3-Small (PiPar): CONV-3-16, 11 bnecks, CONV-1-576, CONV-1-1024, FC-X; 15 units."""
    c, _, _ = _image_input("mobilenetv3_small", input_shape)
    p = float(cfg.dropout)
    if not 0.0 <= p < 1.0:
        raise ConfigError("model.dropout", f"{p} must be in [0, 1)")
    units: list[tuple[str, nn.Module]] = [("stem", _conv_bn_act(c, 16, 3, stride=2, act=HS, bn=_bn_v3))]
    cin = 16
    for i, (k, exp, cout, se, act, s) in enumerate(MOBILENETV3_SMALL_SETTINGS, start=1):
        units.append((f"bneck{i}", Bottleneck(cin, k, exp, cout, se, act, s)))
        cin = cout
    units.append(("conv576", _conv_bn_act(cin, 576, 1, act=HS, bn=_bn_v3)))
    # PiPar's "CONV-1-1024" is, as in torchvision, global pooling then a dense 576 -> 1024 layer
    # (a 1x1 conv on a 1x1 map); pooling lives here so the unit before it still ships feature maps.
    conv1024: list[nn.Module] = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(576, 1024), nn.Hardswish()]
    if p > 0:
        conv1024.append(nn.Dropout(p))
    units.append(("conv1024", nn.Sequential(*conv1024)))
    units.append(("fc", nn.Linear(1024, num_classes)))
    return units
