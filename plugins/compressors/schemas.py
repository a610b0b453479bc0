"""The config schemas of the built-in compressor presets (dataclasses only: importing this
imports no torch; see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass

from framework.config.knobs import Range, knob, knob_factory
from framework.config.schemas import CodecTimeConfig, CompressionConfig, DirectionConfig


def _dir(doc: str, codec="none", bits=32, **options):
    return knob_factory(lambda: DirectionConfig(codec=codec, bits=bits, options=dict(options)), doc)


@dataclass
class NoneConfig(CompressionConfig):
    """No compression: tensors cross links as raw fp32 wire packets."""

    name: str = "none"
    time: CodecTimeConfig = knob_factory(lambda: CodecTimeConfig(model="none"), "what encoding and decoding cost on the devices (none: nothing to code)")


@dataclass
class MBQConfig(CompressionConfig):
    """AccEPT: MBQ activations (k=2 to start), stochastic uniform gradients (8 bits to start)."""

    name: str = "mbq"
    forward: DirectionConfig = _dir("activations: codec mbq (bit-packed) | mbq_unpacked (no bit packing: 'w/o enc.' rows of Table 3); bits: k binary bases, 1..4", "mbq", 2)
    backward: DirectionConfig = _dir("gradients: stochastic uniform; bits: 8 (int8) | 4 (two per byte) | 2", "stochastic_uniform", 8)


@dataclass
class UniformStochasticConfig(CompressionConfig):
    """Symmetric uniform quantization both ways (max-abs scale, unbiased stochastic rounding)."""

    name: str = "uniform_stochastic"
    forward: DirectionConfig = _dir("activations: stochastic uniform", "stochastic_uniform", 2)
    backward: DirectionConfig = _dir("gradients: stochastic uniform", "stochastic_uniform", 8)


@dataclass
class UniformConfig(CompressionConfig):
    """Uniform activations with a learned (LSQ) scale, initialised at 0.25: AccEPT's Table 4 baseline."""

    name: str = "uniform"
    forward: DirectionConfig = _dir("activations: round-to-nearest uniform with a learned (LSQ) scale", "uniform_lsq", 2)
    backward: DirectionConfig = _dir("gradients: stochastic uniform", "stochastic_uniform", 8)
    # a scale of 0 quantizes to nothing the receiver can decode
    init_scale: float = knob(0.25, "the activations' first quantization step", range=Range(0, low_open=True, note="the activations' first quantization step"))
    scale_lr: float = knob(0.01, "the scale's learning rate, from the returned gradients (0 keeps init_scale)", range=Range(0, note="0 keeps init_scale"))


@dataclass
class FP16Config(CompressionConfig):
    """Half precision both ways (2x)."""

    name: str = "fp16"
    forward: DirectionConfig = _dir("activations: half precision", "fp16", 16)
    backward: DirectionConfig = _dir("gradients: half precision", "fp16", 16)


@dataclass
class MinMaxEFConfig(CompressionConfig):
    """Feature replay: n-bit min-max features up, fp32 gradients down, edge-side error feedback.

    The edge corrects each returned gradient with the quantization error it stored."""

    name: str = "minmax_ef"
    forward: DirectionConfig = _dir("features up: min-max; bits: 1 | 2 | 4 | 8 | 16", "minmax", 8)
    backward: DirectionConfig = _dir("gradients down: none (the paper compresses the uplink only)", "none", 32)
    error_feedback: bool = knob(True, "the edge corrects each returned gradient with the quantization error it stored")


@dataclass
class OneBitEFConfig(CompressionConfig):
    """AdaLearner: 1-bit sign gradients with per-unit positive/negative means and error feedback."""

    name: str = "onebit_ef"
    forward: DirectionConfig = _dir("activations: uncompressed fp32", "none", 32)
    backward: DirectionConfig = _dir(
        "gradients: 1-bit signs with error feedback; options.granularity: per_output_unit | per_tensor; options.ef_variant: seide | literal_eq6 (the paper's Eq. 6 as printed)",
        "onebit", 1, granularity="per_output_unit", ef_variant="seide",
    )
