"""ResNets (He et al., 2016): ResNet-18 as split by PiPar (CONV-7-64, 8 BasicBlocks, FC-X; 10 units)
and ResNet-50 as the feature-replay paper slices it (stem, 16 Bottlenecks, pool, FC-X; 19 units)."""

from __future__ import annotations


import torch
from torch import nn

from framework.errors import ConfigError
from plugins.models.schemas import ResNet18Config  # noqa: F401  (the schemas live in a light module: registry.declare)


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN layers with an identity shortcut (1x1 conv + BN when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()  # separate module so the FLOP hooks see both activations
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


def resnet18(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """ResNet-18 (PiPar): stem, 8 BasicBlocks (64, 64, 128, 128, 256, 256, 512, 512), FC-X."""
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"resnet18 needs image input (C, H, W), got shape {tuple(input_shape)}")
    c, h, w = input_shape
    if cfg.small_input and max(h, w) <= 32:
        # The ImageNet stem (7x7/2 conv + 3x3/2 maxpool) shrinks a 32x32 image to 8x8 before the
        # first block and to 1x1 by the 256-channel stage, which wastes most of the network and
        # hurts accuracy; the standard CIFAR variant (He et al., Sec. 4.2) keeps full resolution.
        # The unit is still PiPar's first split unit ("CONV-7-64"), only with a 3x3 kernel.
        stem = nn.Sequential(nn.Conv2d(c, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
    else:
        # PiPar's code: CONV-7-64 with stride 2, BN, ReLU and a 3x3/2 maxpool
        stem = nn.Sequential(
            nn.Conv2d(c, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
    units: list[tuple[str, nn.Module]] = [("stem", stem)]
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for b in range(2):
            stride = 2 if (b == 0 and stage > 1) else 1  # first block of 128/256/512 halves the map
            units.append((f"layer{stage}.{b}", BasicBlock(cin, cout, stride)))
            cin = cout
    units.append(("fc", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))))
    return units


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (with the stride), 1x1 expand (x4), each with BN; identity or projection shortcut."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu3 = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu3(out + self.shortcut(x))


def resnet50(cfg, input_shape: tuple, num_classes: int) -> list[tuple[str, nn.Module]]:
    """ResNet-50 as the feature-replay paper slices it (notes section 3.3): stem, 16 Bottlenecks
    (3, 4, 6, 3), average pool, FC-X; 19 units. With `small_input` (inputs <= 32x32) the CIFAR
    stem (3x3 conv, stride 1, BN, ReLU) keeps full resolution, so the features at the cuts have
    the paper's Table 3 sizes (64x32x32 after the stem, 256x32x32 in layer1, ...). `width`
    (the paper: 64) scales every stage, for small studies on this machine."""
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"resnet50 needs image input (C, H, W), got shape {tuple(input_shape)}")
    c, h, w = input_shape
    base = int(cfg.width)
    if base < 1:
        raise ConfigError("model.width", f"must be >= 1, got {base}")
    if cfg.small_input and max(h, w) <= 32:
        stem = nn.Sequential(nn.Conv2d(c, base, 3, 1, 1, bias=False), nn.BatchNorm2d(base), nn.ReLU())
    else:
        stem = nn.Sequential(nn.Conv2d(c, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    units: list[tuple[str, nn.Module]] = [("stem", stem)]
    cin = base
    for stage, (blocks, mult) in enumerate(zip((3, 4, 6, 3), (1, 2, 4, 8)), start=1):
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 1) else 1
            units.append((f"layer{stage}.{b}", Bottleneck(cin, base * mult, stride)))
            cin = base * mult * Bottleneck.expansion
    units.append(("pool", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())))
    units.append(("fc", nn.Linear(cin, num_classes)))
    return units
