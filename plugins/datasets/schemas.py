"""The config schemas of the built-in datasets (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from framework.config.knobs import Range, knob
from framework.config.schemas import DatasetConfig

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


@dataclass
class SyntheticConfig(DatasetConfig):
    shape: List[int] = knob([1, 28, 28], "per-sample input shape")
    num_classes: int = knob(10, "classes to tell apart", range=Range(2, integer=True, note="a classifier needs two: with one, every guess is right"))
    n_train: int = knob(6000, "training samples", range=Range(1, integer=True, note="normalisation uses train statistics"))
    n_val: int = knob(1000, "validation samples", range=Range(0, integer=True))
    n_test: int = knob(1000, "test samples", range=Range(0, integer=True))
    noise: float = knob(3.0, "std of the Gaussian noise, relative to a unit-std class pattern", range=Range(0, note="std of the noise, relative to a class pattern's"))
    prototypes: int = knob(3, "modes per class (images/vectors): classes are not one blob each", range=Range(1, integer=True, note="modes per class"))
    grid: int = knob(4, "images: prototype resolution before upsampling (smaller = smoother)", range=Range(1, integer=True, note="the prototypes' resolution before upsampling"))
    max_shift: int = knob(2, "images: random circular translation, in pixels, per axis (HAR: a random time shift, in steps)", range=Range(0, integer=True, note="pixels, or time steps"))
    amplitude_jitter: float = knob(0.3, "a sample's amplitude is uniform in 1 +- this", range=Range(0, 1, high_open=True, note="a sample's amplitude is uniform in 1 +- this"))


@dataclass
class SyntheticMnistConfig(SyntheticConfig):
    name: str = "synthetic_mnist"


@dataclass
class SyntheticCifar10Config(SyntheticConfig):
    name: str = "synthetic_cifar10"
    shape: List[int] = knob([3, 32, 32], "per-sample input shape")
    n_train: int = 5000
    noise: float = 6.0  # 3 independent channels separate classes better: more noise, similar difficulty


@dataclass
class SyntheticHarConfig(SyntheticConfig):
    # the sinusoid generator ignores `prototypes` and `grid`; `max_shift` is in time steps
    name: str = "synthetic_har"
    shape: List[int] = knob([9, 128], "per-sample input shape")
    num_classes: int = 6
    n_train: int = 4000
    noise: float = 4.0
    max_shift: int = 16
    freq_jitter: float = knob(0.05, "relative per-sample frequency jitter", range=Range(0, 1, high_open=True, note="relative frequency jitter"))


@dataclass
class FashionMnistConfig(DatasetConfig):
    name: str = "fashion_mnist"
    root: str = knob(DEFAULT_ROOT, "folder holding the four IDX files (.gz or not)")
    n_val: int = knob(5000, "held out from the end of the 60k training images")
    n_train: Optional[int] = knob(None, "cap on the remaining training images; null = all")
    n_test: Optional[int] = knob(None, "cap on the 10k test images; null = all")
