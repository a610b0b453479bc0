"""The config schemas of the built-in compressor presets (dataclasses only: importing this
imports no torch; see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass, field

from framework.config import CodecTimeConfig, CompressionConfig, DirectionConfig


def _dir(codec="none", bits=32, **options):
    return field(default_factory=lambda: DirectionConfig(codec=codec, bits=bits, options=dict(options)))


@dataclass
class NoneConfig(CompressionConfig):
    """No compression: tensors cross links as raw fp32 wire packets."""

    name: str = "none"
    time: CodecTimeConfig = field(default_factory=lambda: CodecTimeConfig(model="none"))


@dataclass
class MBQConfig(CompressionConfig):
    """AccEPT: MBQ activations (k=2 to start), stochastic uniform gradients (8 bits to start)."""

    name: str = "mbq"
    forward: DirectionConfig = _dir("mbq", 2)
    backward: DirectionConfig = _dir("stochastic_uniform", 8)


@dataclass
class UniformStochasticConfig(CompressionConfig):
    """Symmetric uniform quantization both ways (max-abs scale, unbiased stochastic rounding)."""

    name: str = "uniform_stochastic"
    forward: DirectionConfig = _dir("stochastic_uniform", 2)
    backward: DirectionConfig = _dir("stochastic_uniform", 8)


@dataclass
class UniformConfig(CompressionConfig):
    """Uniform activations with a learned (LSQ) scale, initialised at 0.25: AccEPT's Table 4 baseline."""

    name: str = "uniform"
    forward: DirectionConfig = _dir("uniform_lsq", 2)
    backward: DirectionConfig = _dir("stochastic_uniform", 8)
    init_scale: float = 0.25
    scale_lr: float = 0.01


@dataclass
class FP16Config(CompressionConfig):
    """Half precision both ways (2x)."""

    name: str = "fp16"
    forward: DirectionConfig = _dir("fp16", 16)
    backward: DirectionConfig = _dir("fp16", 16)


@dataclass
class MinMaxEFConfig(CompressionConfig):
    """Feature replay: n-bit min-max features up, fp32 gradients down, edge-side error feedback.

    The edge corrects each returned gradient with the quantization error it stored."""

    name: str = "minmax_ef"
    forward: DirectionConfig = _dir("minmax", 8)
    backward: DirectionConfig = _dir("none", 32)
    error_feedback: bool = True


@dataclass
class OneBitEFConfig(CompressionConfig):
    """AdaLearner: 1-bit sign gradients with per-unit positive/negative means and error feedback."""

    name: str = "onebit_ef"
    forward: DirectionConfig = _dir("none", 32)
    backward: DirectionConfig = _dir("onebit", 1, granularity="per_output_unit", ef_variant="seide")
