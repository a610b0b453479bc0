"""The compressors a user picks with `compressor=<name>`: codec pairs with the papers' defaults,
declared (framework.registry.declare). All but `minmax_ef` and `uniform` are the core
`Compressor` with other defaults (plugins/compressors/schemas.py); the codecs they name are
imported when first looked up (framework.codec)."""

from framework.registry import declare, defer_import
from plugins.compressors.schemas import FP16Config, MBQConfig, MinMaxEFConfig, NoneConfig, OneBitEFConfig, UniformConfig, UniformStochasticConfig

defer_import("plugins.compressors.accept_codecs")
defer_import("plugins.compressors.ef_codecs")
defer_import("plugins.compressors.lsq")  # codec uniform_lsq (wire id 7): decodable without its compressor

CORE = "framework.compression:Compressor"
declare("compressor", "fp16", CORE, schema=FP16Config, doc="Half precision both ways (2x).")
declare("compressor", "mbq", CORE, schema=MBQConfig, doc="AccEPT: MBQ activations (k=2 to start), stochastic uniform gradients (8 bits to start).")
declare("compressor", "minmax_ef", "plugins.compressors.minmax_ef:MinMaxEFCompressor", schema=MinMaxEFConfig,
        doc="Feature replay: n-bit min-max features up, fp32 gradients down, edge-side error feedback.")
declare("compressor", "none", CORE, schema=NoneConfig, doc="No compression: tensors cross links as raw fp32 wire packets.")
declare("compressor", "onebit_ef", CORE, schema=OneBitEFConfig,
        doc="AdaLearner: 1-bit sign gradients with per-unit positive/negative means and error feedback.")
declare("compressor", "uniform", "plugins.compressors.lsq:LSQCompressor", schema=UniformConfig,
        doc="Uniform activations with a learned (LSQ) scale, initialised at 0.25: AccEPT's Table 4 baseline.")
declare("compressor", "uniform_stochastic", CORE, schema=UniformStochasticConfig,
        doc="Symmetric uniform quantization both ways (max-abs scale, unbiased stochastic rounding).")
