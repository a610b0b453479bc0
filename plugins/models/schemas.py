"""The config schemas of the built-in models (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from framework.config.knobs import knob
from framework.config.schemas import ModelConfig


@dataclass
class MLPConfig(ModelConfig):
    name: str = "mlp"
    hidden: int = knob(128, "width of every hidden layer")
    depth: int = knob(4, "number of units (Linear layers), >= 2")
    widths: Optional[List[int]] = knob(None, "each hidden layer's width (overrides hidden and depth), e.g. [128, 64]: AdaLearner's 784-128-64-10")


@dataclass
class LeNetConfig(ModelConfig):
    name: str = "lenet"
    variant: str = knob("lecun", "lecun (LeNet-5: conv6, conv16, fc120, fc84; ReLU) | mxnet (MXNet's example: conv20, conv50, fc500; tanh; AdaLearner)", choices=("lecun", "mxnet"))


@dataclass
class VGG5Config(ModelConfig):
    name: str = "vgg5"
    batchnorm: bool = knob(True, "false drops BN, so float64 pipeline runs match a single device exactly")


@dataclass
class ResNet18Config(ModelConfig):
    name: str = "resnet18"
    small_input: bool = knob(True, "inputs <= 32x32 get the CIFAR stem (3x3, stride 1, no maxpool)")


@dataclass
class ResNet50Config(ModelConfig):
    name: str = "resnet50"
    small_input: bool = knob(True, "inputs <= 32x32 get the CIFAR stem (3x3, stride 1, no maxpool)")
    width: int = knob(64, "channels of the stem and of the first stage's bottleneck (64 = ResNet-50)")


@dataclass
class HARCNNConfig(ModelConfig):
    name: str = "har_cnn"
    dropout: float = knob(0.6, "dropout after the second conv, as in the reference code")


@dataclass
class MobileNetV2Config(ModelConfig):
    name: str = "mobilenetv2"


@dataclass
class MobileNetV3SmallConfig(ModelConfig):
    name: str = "mobilenetv3_small"
    dropout: float = knob(0.0, "dropout before FC-X")  # torchvision uses 0.2, PiPar's split is timed without it


@dataclass
class ConvNetConfig(ModelConfig):
    name: str = "convnet"
