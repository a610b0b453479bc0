"""Codecs for the error-feedback compressors: fp16, min-max n-bit (feature replay) and 1-bit sign
with error feedback (AdaLearner).

Wire layouts (all little-endian):

- fp16 (id 1): meta empty; payload = the tensor as float16, N*2 bytes.
- minmax (id 5): meta = n u8 | min f32 | max f32; payload = the n-bit codes packed densely along the
  flattened tensor (n in 1, 2, 4: 8/n codes per byte, first element in the highest bits; n=8: one
  byte per code; n=16: u16 per code), ceil(N*n/8) bytes.
- onebit (id 6): meta = granularity u8 | G u32 | G x (pos f32, neg f32); payload = one sign bit per
  element, 8 per byte, first element in the most significant bit, zero padded: ceil(N/8) bytes.

Error feedback differs between the two quantisers, as in their papers:
- minmax (feature replay, Alg. 1) corrects on the *edge*, after the fact: the compressor keeps
  E = C(h) - h (e.g. `MinMax.decode(...) - h`) and applies `minmax_error_feedback` to the gradient
  that comes back. The codec itself is stateless.
- onebit (AdaLearner Eq. 5-6, Seide form) corrects on the *sender*: the codec keeps the residual in
  `stream["residual"]` and adds it to the next tensor before quantising.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from framework.codec import Codec, Encoded, expect_len, numel, register_codec
from framework.errors import ConfigError, WireError
from plugins.compressors.lazy_kernels import kernels


def _rel_err(err: torch.Tensor, exact: torch.Tensor) -> float:
    """||err|| / ||exact||; 0 for an all-zero tensor, which every codec here sends exactly."""
    denom = float(torch.linalg.vector_norm(exact))
    return float(torch.linalg.vector_norm(err)) / denom if denom > 0 else 0.0


def _bytes_view(arr: np.ndarray) -> memoryview:
    """The array's bytes without a copy: the wire encoder copies each payload exactly once."""
    return memoryview(np.ascontiguousarray(arr)).cast("B")


# ---- fp16 -------------------------------------------------------------------------------------


@register_codec
class FP16(Codec):
    """Half precision. Values beyond fp16's range (|x| > 65504) become inf, as with `.half()`."""

    codec_id = 1
    name = "fp16"

    def __init__(self, bits: int = 16, **options):
        super().__init__(bits, **options)  # fp16 is always 16 bits; `bits` is accepted and ignored

    def encode(self, x: torch.Tensor, stream: dict) -> Encoded:
        half = x.detach().to(device="cpu", dtype=torch.float16).reshape(-1)
        return Encoded(self.codec_id, x.dtype, tuple(x.shape), b"", _bytes_view(half.numpy()))

    @classmethod
    def decode(cls, meta: bytes, payload: memoryview, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        expect_len(meta, 0, "fp16 metadata")
        n = numel(shape)
        expect_len(payload, 2 * n, "fp16 payload")
        # copy: the packet buffer may be read-only bytes; torch widens fp16 3x faster than numpy
        half = torch.from_numpy(np.frombuffer(payload, dtype="<f2", count=n).copy())
        return half.to(dtype).reshape(shape)

    def wire_size(self, shape: tuple) -> tuple[int, int]:
        return 0, 2 * numel(shape)


# ---- min-max n-bit (feature replay, Eq. 2) ----------------------------------------------------

_MINMAX_META = struct.Struct("<Bff")
_F32_MAX = float(np.finfo(np.float32).max)


def _pack_codes(codes: np.ndarray, n: int) -> np.ndarray:
    """uint8 codes < 2**n (n in 1, 2, 4) packed 8/n per byte, the first code in the highest bits."""
    if n == 1:
        return np.packbits(codes)
    per_byte = 8 // n
    codes = np.pad(codes, (0, -len(codes) % per_byte)).reshape(-1, per_byte)
    packed = codes[:, 0] << (8 - n)
    for j in range(1, per_byte):  # over the 2 or 4 slots of a byte; each step is one array op
        packed |= codes[:, j] << (8 - n * (j + 1))
    return packed


def _unpack_codes(packed: np.ndarray, n: int, count: int) -> np.ndarray:
    if n == 1:
        return np.unpackbits(packed, count=count)
    per_byte = 8 // n
    codes = np.empty((len(packed), per_byte), dtype=np.uint8)
    for j in range(per_byte):  # over the 2 or 4 slots of a byte: 10x faster than a broadcast shift
        codes[:, j] = (packed >> (8 - n * (j + 1))) & ((1 << n) - 1)
    return codes.reshape(-1)[:count]


def _minmax_dequantize_(q: torch.Tensor, n: int, lo: float, hi: float) -> torch.Tensor:
    """deq(q) = q / (2^n - 1) * (max - min) + min, in place on the float32 codes q. Encode and
    decode both use this one function, so the encoder's rel_err is exactly the receiver's error."""
    return q.div_((1 << n) - 1).mul_(hi - lo).add_(lo)


@register_codec
class MinMax(Codec):
    """Per-tensor min-max uniform quantiser, round to nearest (feature-replay paper, Eq. 2)."""

    codec_id = 5
    name = "minmax"
    bits_choices = (1, 2, 4, 8, 16)

    def __init__(self, bits: int = 8, **options):
        super().__init__(bits, **options)

    def encode(self, x: torch.Tensor, stream: dict) -> Encoded:
        n, levels = self.bits, (1 << self.bits) - 1
        h = x.detach().reshape(-1).to("cpu", torch.float32)  # may alias x: never written in place
        lo, hi = (float(m) for m in torch.aminmax(h)) if h.numel() else (0.0, 0.0)
        if not (np.isfinite(lo) and np.isfinite(hi) and hi - lo <= _F32_MAX):
            # inf or nan (or a range beyond float32) has no grid to quantise on: fail loudly
            # rather than send codes the receiver would turn into garbage
            raise ValueError(f"minmax: cannot quantise a tensor with range [{lo}, {hi}]")
        if hi > lo:
            q = (h - lo).div_(hi - lo).mul_(levels).round_().clamp_(0, levels)
        else:  # a constant tensor: all codes 0, the constant travels as min (= max)
            q = torch.zeros_like(h)
        # numpy casts float32 -> uint8/uint16 several times faster than torch on one thread
        codes = q.numpy().astype("<u2" if n == 16 else np.uint8)
        payload = codes if n >= 8 else _pack_codes(codes, n)
        err = _minmax_dequantize_(q, n, lo, hi).sub_(h)
        stream["rel_err"] = _rel_err(err, h)
        meta = _MINMAX_META.pack(n, lo, hi)
        return Encoded(self.codec_id, x.dtype, tuple(x.shape), meta, _bytes_view(payload))

    @classmethod
    def decode(cls, meta: bytes, payload: memoryview, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        expect_len(meta, _MINMAX_META.size, "minmax metadata")
        n, lo, hi = _MINMAX_META.unpack(meta)
        if n not in cls.bits_choices:
            raise WireError(f"minmax: {n} bits, expected one of {cls.bits_choices}")
        if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi and hi - lo <= _F32_MAX):
            raise WireError(f"minmax: bad range [{lo}, {hi}]")  # the encoder never sends one
        count = numel(shape)
        expect_len(payload, -(-count * n // 8), f"minmax {n}-bit payload")
        if n == 16:
            codes = np.frombuffer(payload, dtype="<u2", count=count)
        else:
            codes = np.frombuffer(payload, dtype=np.uint8)
            codes = codes if n == 8 else _unpack_codes(codes, n, count)
        q = torch.from_numpy(codes.astype(np.float32))  # a fresh array: the packet may be read-only
        return _minmax_dequantize_(q, n, lo, hi).to(dtype).reshape(shape)

    def wire_size(self, shape: tuple) -> tuple[int, int]:
        return _MINMAX_META.size, -(-numel(shape) * self.bits // 8)


def minmax_error_feedback(delta_hat: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """Feature replay Alg. 1 line 5, on the edge: delta = delta_hat - E * delta_hat * delta_hat.

    `delta_hat` is the gradient the cloud returned for the quantised feature C(h), `E = C(h) - h`
    the quantisation error the edge kept. This is the diagonal of the second-order correction of
    Eq. 7 with the Hessian estimated by the gradient outer product (Eq. 8)."""
    return delta_hat - E * delta_hat * delta_hat


# ---- 1-bit sign with error feedback (AdaLearner Sec. VI) --------------------------------------

_ONEBIT_HEAD = struct.Struct("<BI")
_GRANULARITY = {"per_output_unit": 0, "per_tensor": 1}
_EF_VARIANTS = ("seide", "literal_eq6")


def _onebit_groups(shape: tuple, per_output_unit: bool) -> int:
    """Number of groups sharing one (pos, neg) pair: one per output unit (dim 0: a Linear row, a
    conv filter) for a tensor of 2+ dims; a bias (1-D) or scalar is one group."""
    return int(shape[0]) if per_output_unit and len(shape) >= 2 else 1


@register_codec
class OneBit(Codec):
    """Threshold 0, one bit per element, per-group mean of the positive and of the negative values
    as the two reconstruction levels, and sender-side error feedback.

    Options: granularity "per_output_unit" (default) or "per_tensor"; ef_variant "seide" (default,
    residual = v - Qinv(Q(v)) with v = g + residual) or "literal_eq6" (the paper's Eq. 6 as printed,
    residual = g - Qinv(Q(v)), kept as an ablation)."""

    codec_id = 6
    name = "onebit"
    bits_choices = (1,)

    def __init__(self, bits: int = 1, **options):
        super().__init__(bits, **options)
        self.granularity = options.get("granularity", "per_output_unit")
        if self.granularity not in _GRANULARITY:
            raise ConfigError("compressor.granularity", f"expected one of {', '.join(_GRANULARITY)}, got {self.granularity!r}")
        self.ef_variant = options.get("ef_variant", "seide")
        if self.ef_variant not in _EF_VARIANTS:
            raise ConfigError("compressor.ef_variant", f"expected one of {', '.join(_EF_VARIANTS)}, got {self.ef_variant!r}")

    def encode(self, x: torch.Tensor, stream: dict) -> Encoded:
        shape = tuple(x.shape)
        # may alias x: never written in place. Contiguous, so that the residual made below is too:
        # the kernel writes it through `reshape(-1)`, which of a strided tensor (a transposed
        # gradient, as a batched backward gives) is a copy, and the residual was left unwritten
        g = x.detach().to("cpu", torch.float32).contiguous()
        residual = stream.get("residual")
        if residual is None or tuple(residual.shape) != shape:
            residual = torch.zeros_like(g)  # a new stream, or the tensor changed: start afresh
        groups = _onebit_groups(shape, self.granularity == "per_output_unit")
        pos = np.empty(groups, np.float32)
        neg = np.empty(groups, np.float32)
        packed = np.empty(-(-g.numel() // 8), np.uint8)
        new_residual = torch.empty_like(g)
        # v = G[k] + Delta[k-1] is quantised (Eq. 5); one compiled pass per group (kernels.py)
        v_norm2, err2 = kernels.onebit_encode(
            g.reshape(-1).numpy(), residual.reshape(-1).numpy(), groups, self.ef_variant == "seide",
            packed, pos, neg, new_residual.reshape(-1).numpy(),
        )
        stream["residual"] = new_residual
        stream["rel_err"] = math.sqrt(err2 / v_norm2) if v_norm2 > 0 else 0.0

        scalars = np.stack([pos, neg], axis=1).astype("<f4")  # pos, neg per group
        meta = _ONEBIT_HEAD.pack(_GRANULARITY[self.granularity], groups) + scalars.tobytes()
        return Encoded(self.codec_id, x.dtype, shape, meta, _bytes_view(packed))

    @classmethod
    def decode(cls, meta: bytes, payload: memoryview, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        if len(meta) < _ONEBIT_HEAD.size:
            raise WireError(f"onebit metadata: {len(meta)} bytes, expected at least {_ONEBIT_HEAD.size}")
        flag, groups = _ONEBIT_HEAD.unpack_from(meta)
        if flag not in _GRANULARITY.values():
            raise WireError(f"onebit: unknown granularity flag {flag}")
        expected = _onebit_groups(shape, flag == _GRANULARITY["per_output_unit"])
        if groups != expected:
            raise WireError(f"onebit: {groups} groups for shape {tuple(shape)}, expected {expected}")
        expect_len(meta, _ONEBIT_HEAD.size + 8 * groups, "onebit metadata")
        count = numel(shape)
        expect_len(payload, -(-count // 8), "onebit payload")

        scalars = np.frombuffer(meta, dtype="<f4", offset=_ONEBIT_HEAD.size).reshape(groups, 2)
        out = np.empty(count, np.float32)
        kernels.onebit_decode(np.frombuffer(payload, np.uint8), scalars[:, 0].copy(), scalars[:, 1].copy(), count, groups, out)
        return torch.from_numpy(out).to(dtype).reshape(shape)

    def wire_size(self, shape: tuple) -> tuple[int, int]:
        groups = _onebit_groups(tuple(shape), self.granularity == "per_output_unit")
        return _ONEBIT_HEAD.size + 8 * groups, -(-numel(shape) // 8)

    @classmethod
    def prepare(cls) -> None:
        kernels.warm()
