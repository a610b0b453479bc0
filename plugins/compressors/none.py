"""`compressor=none`: raw tensors in the wire format (the uncompressed baseline)."""

from framework.compression import Compressor
from framework.config import CompressorConfig
from framework.registry import register

register("compressor", "none", schema=CompressorConfig)(Compressor)
