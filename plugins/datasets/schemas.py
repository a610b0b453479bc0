"""The config schemas of the built-in datasets (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from framework.config import DatasetConfig
from framework.validate_numbers import Range

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


# the ranges of the synthetic sets' knobs, checked when a set is built (plugins/datasets/synthetic.py)
SYNTHETIC_RANGES = {
    "num_classes": Range(2, integer=True, note="a classifier needs two: with one, every guess is right"),
    "n_train": Range(1, integer=True, note="normalisation uses train statistics"),
    "n_val": Range(0, integer=True),
    "n_test": Range(0, integer=True),
    "noise": Range(0, note="std of the noise, relative to a class pattern's"),
    "prototypes": Range(1, integer=True, note="modes per class"),
    "grid": Range(1, integer=True, note="the prototypes' resolution before upsampling"),
    "max_shift": Range(0, integer=True, note="pixels, or time steps"),
    "amplitude_jitter": Range(0, 1, high_open=True, note="a sample's amplitude is uniform in 1 +- this"),
    "freq_jitter": Range(0, 1, high_open=True, note="relative frequency jitter"),
}


@dataclass
class SyntheticConfig(DatasetConfig):
    shape: List[int] = field(default_factory=lambda: [1, 28, 28])  # per-sample input shape
    num_classes: int = 10
    n_train: int = 6000
    n_val: int = 1000
    n_test: int = 1000
    noise: float = 3.0  # std of the Gaussian noise, relative to a unit-std class pattern
    prototypes: int = 3  # modes per class (images/vectors): classes are not one blob each
    grid: int = 4  # images: prototype resolution before upsampling (smaller = smoother)
    max_shift: int = 2  # images: random circular translation, in pixels, per axis
    amplitude_jitter: float = 0.3  # a sample's amplitude is uniform in 1 +- this


@dataclass
class SyntheticMnistConfig(SyntheticConfig):
    name: str = "synthetic_mnist"


@dataclass
class SyntheticCifar10Config(SyntheticConfig):
    name: str = "synthetic_cifar10"
    shape: List[int] = field(default_factory=lambda: [3, 32, 32])
    n_train: int = 5000
    noise: float = 6.0  # 3 independent channels separate classes better: more noise, similar difficulty


@dataclass
class SyntheticHarConfig(SyntheticConfig):
    # the sinusoid generator ignores `prototypes` and `grid`; `max_shift` is in time steps
    name: str = "synthetic_har"
    shape: List[int] = field(default_factory=lambda: [9, 128])
    num_classes: int = 6
    n_train: int = 4000
    noise: float = 4.0
    max_shift: int = 16  # HAR: random time shift, in steps
    freq_jitter: float = 0.05  # HAR: relative per-sample frequency jitter


@dataclass
class FashionMnistConfig(DatasetConfig):
    name: str = "fashion_mnist"
    root: str = DEFAULT_ROOT  # folder holding the four IDX files (.gz or not)
    n_val: int = 5000  # held out from the end of the 60k training images
    n_train: Optional[int] = None  # cap on the remaining training images; null = all
    n_test: Optional[int] = None  # cap on the 10k test images; null = all
