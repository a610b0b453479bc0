"""AccEPT's link codecs (notes section 2.2): MBQ for activations, stochastic uniform for gradients.

Wire layouts (all little-endian):

- mbq (id 2): meta = k u8 | alpha f32 x k | m_q f32. payload = the k bits of every element
  (bit i = basis i, 1 for +1 and 0 for -1) as a (*shape, k) array packed 8 samples per byte along
  dim 0, sample 0 in the most significant bit, n zero-padded to a multiple of 8 (numpy.packbits
  (axis=0, bitorder='big')): ceil(n/8) * prod(shape[1:]) * k bytes.
- mbq_unpacked (id 3): the same meta and quantizer ("MBQ without the encoder"); payload = the same
  (*shape, k) bits, one byte (0 or 1) each: N * k bytes.
- stochastic_uniform (id 4): meta = k u8 | s f32. payload = q in [-2^(k-1), 2^(k-1)-1]: k=8 as
  int8; k=4 as q+8, two samples per byte along dim 0 (2i in the high nibble, 2i+1 in the low one);
  k=2 as q+2, four samples per byte along dim 0, the first in the highest bits. n is zero-padded
  to a multiple of 8/k. The receiver rebuilds q * s.

A 0-dim tensor travels as shape (1,). There is no error feedback: the only de-biasing is MBQ's mean
error m_q and the unbiased stochastic rounding of the gradients.

MBQ stream state: alpha (float32 tensor, the alpha sent last), k, t (batch index since the last
initialisation), reset (set by the compressor at each epoch; MBQ clears it). Both codecs record
the relative L2 error of what the receiver rebuilds in stream["rel_err"].
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from framework.codec import Codec, Encoded, expect_len, numel, register_codec
from framework.errors import WireError
from plugins.compressors.lazy_kernels import kernels

_U8 = struct.Struct("<B")


def _split_shape(shape: tuple) -> tuple[int, int]:
    """(n, rest): the batch dim that gets packed and the product of the others; () is (1,)."""
    shape = tuple(shape) or (1,)
    return int(shape[0]), numel(shape[1:])


def _flat_f32(x: torch.Tensor) -> np.ndarray:
    """x as a flat float32 numpy array. It may alias x, so callers never write into it."""
    return x.detach().reshape(-1).to("cpu", torch.float32).numpy()


def _bytes_view(arr: np.ndarray) -> memoryview:
    """The array's bytes without a copy: the wire encoder copies each payload exactly once."""
    if arr.size == 0:
        return memoryview(b"")  # memoryview cannot cast an empty n-d view
    return memoryview(np.ascontiguousarray(arr)).cast("B")


def _check_float(name: str, dtype: torch.dtype) -> None:
    if not dtype.is_floating_point:
        raise WireError(f"{name}: dtype {dtype} is not a floating type")


# ---- MBQ: the quantizer -----------------------------------------------------------------------
#
# An element's row of B is held as a k-bit code: bit i is 1 where b_i = +1. Codes are uint8
# (k <= 4), so the (N, k) matrix B never exists; the k x k normal equations and every error term
# follow from the count of each code and the k sums sum(x over bit i set).

MBQ_BITS = (1, 2, 3, 4)


def _signs(k: int) -> np.ndarray:
    """(2^k, k) float64: row c is code c's sign pattern (+1 where bit i of c is set)."""
    c = np.arange(1 << k)[:, None]
    return np.where((c >> np.arange(k)) & 1, 1.0, -1.0)


def _greedy_codes(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Network Sketching's residue-based init: b_i = sign(r) (sign(0) = +1), alpha_i = mean|r|,
    r -= alpha_i b_i. Returns (codes, alpha float64)."""
    codes = np.zeros(x.size, np.uint8)
    r = x.copy()
    alpha = np.zeros(k)
    for i in range(k):
        a = np.float32(alpha[i - 1]) if i else np.float32(0)
        alpha[i] = np.float32(kernels.greedy_pass(r, a, i == 0, np.uint8(1 << i), codes) / x.size)
    return codes, alpha


def _nearest_codes(x: np.ndarray, signs: np.ndarray, alpha: np.ndarray, sum_x: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LQ-Nets' B-step: each element gets the code of its nearest level sum_i sign_i alpha_i.

    The levels are sorted and an element's bucket is the number of midpoints at or below it (the
    notes' bucketize on midpoints; a tie goes to the upper level, so at k=1 this is sign(x) with
    sign(0) = +1, as in the initialisation). One pass per midpoint adds the step from one
    bucket's code to the next (mod 256) to a uint8 code array, which turns the bucket index into
    the code without a lookup, and counts and sums the elements at or above the midpoint.
    Returns (codes, count of each code, sum of x for each code)."""
    levels = signs @ alpha
    order = np.argsort(levels, kind="stable")
    mids = (levels[order[:-1]] + levels[order[1:]]) / 2
    codes = np.full(x.size, order[0], np.uint8)
    above = np.zeros(len(order) + 1, np.int64)  # elements at or above each midpoint, n first
    above_sum = np.zeros(len(order) + 1)
    above[0], above_sum[0] = x.size, sum_x
    for j, m in enumerate(mids):
        step = np.uint8((order[j + 1] - order[j]) % 256)
        above[j + 1], above_sum[j + 1] = kernels.above_midpoint(x, np.float32(m), step, codes)
    counts = np.zeros(len(order), np.int64)
    sums = np.zeros(len(order))
    counts[order] = -np.diff(above)
    sums[order] = -np.diff(above_sum)
    return codes, counts, sums


def _alpha_step(counts: np.ndarray, btx: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Eq. 3: alpha = (B^T B)^-1 B^T x, with a 1e-8 N ridge [our choice] so that a constant basis
    column (B^T B singular) still solves; lstsq if even that fails."""
    n = counts.sum()
    btb = signs.T @ (counts[:, None] * signs) + 1e-8 * n * np.eye(signs.shape[1])
    try:
        return np.linalg.solve(btb, btx)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(btb, btx, rcond=None)[0]


def mbq_quantize(x: torch.Tensor, k: int, stream: dict) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """AccEPT's forward quantizer, shared by mbq and mbq_unpacked.

    Initialises (greedy) on a fresh or reset stream or when k changed; otherwise one alternating
    step from the stream's alpha with the moving average of Eq. 4. Returns (codes (N,) uint8,
    alpha float32 (k,), m_q float32) and updates the stream."""
    xv = _flat_f32(x)
    n_el = xv.size
    signs = _signs(k)
    prev = stream.get("alpha")
    if n_el == 0:  # nothing to fit: send zeros and leave the alpha state as it was
        stream["rel_err"] = 0.0
        return np.zeros(0, np.uint8), np.zeros(k, np.float32), np.float32(0)
    sum_x, sum_x2 = kernels.sum_and_squares(xv)
    if not math.isfinite(sum_x2):
        raise ValueError("mbq: cannot quantise a tensor holding inf or nan (or |x| beyond ~1e19)")

    fresh = stream.get("reset") or prev is None or stream.get("k") != k
    if fresh:
        codes, alpha = _greedy_codes(xv, k)
        counts, code_sums = kernels.code_stats(xv, codes, 1 << k)
        btx = signs.T @ code_sums  # B^T x
        t = 0
    else:
        t = int(stream.get("t", 0)) + 1
        prev = torch.as_tensor(prev).detach().cpu().double().numpy()
        codes, counts, code_sums = _nearest_codes(xv, signs, prev, sum_x)
        btx = signs.T @ code_sums
        beta = min(0.9, (1 + t) / (10 + t))  # Eq. 4
        alpha = beta * prev + (1 - beta) * _alpha_step(counts, btx, signs)

    # The receiver sees float32 alpha and m_q: compute the bias and the error with those.
    alpha = alpha.astype(np.float32)
    a = alpha.astype(np.float64)
    levels = signs @ a
    bias_sum = float(counts @ levels) - sum_x  # sum(xhat - x)
    m_q = np.float32(bias_sum / n_el)  # Eq. 5
    m = float(m_q)
    # ||xhat - m - x||^2 = ||x||^2 - 2 alpha.B^T x + ||B alpha||^2 - 2 m sum(xhat - x) + N m^2
    err2 = sum_x2 - 2 * float(a @ btx) + float(counts @ levels**2) - 2 * m * bias_sum + n_el * m * m
    stream["rel_err"] = math.sqrt(max(err2, 0.0) / sum_x2) if sum_x2 > 0 else 0.0
    stream.update(alpha=torch.from_numpy(alpha), k=k, t=t, reset=False)
    return codes, alpha, m_q


def _level_parts(alpha: np.ndarray, m_q: np.float32) -> np.ndarray:
    """(k, 2) float32: entry [i, bit] is basis i's contribution (-alpha_i or +alpha_i), with -m_q
    folded into basis 0. Both decoders sum these in float32 in the order i = 0..k-1, so mbq and
    mbq_unpacked rebuild bit-identical tensors."""
    parts = np.stack([-alpha, alpha], axis=1).astype(np.float32)
    parts[0] -= np.float32(m_q)
    return parts


# ---- MBQ: bit packing along dim 0 -------------------------------------------------------------

def pack_codes(codes: np.ndarray, k: int) -> np.ndarray:
    """(n, R) uint8 k-bit codes -> (ceil(n/8), R, k) uint8: for each basis i, 8 consecutive
    samples along dim 0 per byte, sample 0 in the most significant bit, zero padded (the bytes of
    numpy.packbits(bits, axis=0, bitorder='big') on the (n, R, k) bit array)."""
    n, rest = codes.shape
    out = np.empty(-(-n // 8) * rest * k, np.uint8)
    kernels.pack_codes_dim0(np.ascontiguousarray(codes).reshape(-1), n, rest, k, out)
    return out.reshape(-(-n // 8), rest, k)


# ---- MBQ: the codecs --------------------------------------------------------------------------


@register_codec
class MBQ(Codec):
    """AccEPT multi-bit quantization (ABC-Net bases, LQ-Nets updates) with the bit-packing
    encoder. Compression ~32/k."""

    codec_id = 2
    name = "mbq"
    bits_choices = MBQ_BITS

    def __init__(self, bits: int = 2, **options):
        super().__init__(bits, **options)

    # payload layout hooks: mbq packs 8 samples per byte, mbq_unpacked stores a byte per bit
    @staticmethod
    def _pack(codes: np.ndarray, n: int, rest: int, k: int) -> np.ndarray:
        return pack_codes(codes.reshape(n, rest), k)

    @staticmethod
    def _payload_len(n: int, rest: int, k: int) -> int:
        return -(-n // 8) * rest * k

    @staticmethod
    def _unpack(payload: np.ndarray, parts: np.ndarray, n: int, rest: int, k: int) -> np.ndarray:
        out = np.empty(n * rest, np.float32)
        kernels.unpack_mbq(payload, parts, n, rest, k, out)
        return out

    def encode(self, x: torch.Tensor, stream: dict) -> Encoded:
        k = self.bits
        n, rest = _split_shape(tuple(x.shape))
        codes, alpha, m_q = mbq_quantize(x, k, stream)
        meta = struct.pack(f"<B{k + 1}f", k, *alpha.tolist(), float(m_q))
        return Encoded(self.codec_id, x.dtype, tuple(x.shape), meta, _bytes_view(self._pack(codes, n, rest, k)))

    @classmethod
    def decode(cls, meta: bytes, payload: memoryview, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        _check_float(cls.name, dtype)
        if len(meta) < 1:
            raise WireError(f"{cls.name} metadata: empty")
        (k,) = _U8.unpack_from(meta)
        if k not in MBQ_BITS:
            raise WireError(f"{cls.name}: k={k}, expected one of {MBQ_BITS}")
        expect_len(meta, 1 + 4 * (k + 1), f"{cls.name} metadata")
        values = struct.unpack_from(f"<{k + 1}f", meta, 1)
        if not all(math.isfinite(v) for v in values):
            raise WireError(f"{cls.name}: non-finite alpha or m_q")  # the encoder never sends one
        n, rest = _split_shape(shape)
        expect_len(payload, cls._payload_len(n, rest, k), f"{cls.name} payload")
        parts = _level_parts(np.array(values[:k], np.float32), np.float32(values[k]))
        out = cls._unpack(np.frombuffer(payload, np.uint8), parts, n, rest, k)
        return torch.from_numpy(out).reshape(shape).to(dtype)

    def wire_size(self, shape: tuple) -> tuple[int, int]:
        n, rest = _split_shape(shape)
        return 1 + 4 * (self.bits + 1), self._payload_len(n, rest, self.bits)

    @classmethod
    def prepare(cls) -> None:
        kernels.warm()


@register_codec
class MBQUnpacked(MBQ):
    """MBQ without the encoder: the same quantizer and metadata, each of the k bits in its own
    byte (the paper's ablation: 4/k, i.e. 2.00 / 1.33 / 1.00 for k = 2 / 3 / 4)."""

    codec_id = 3
    name = "mbq_unpacked"

    @staticmethod
    def _pack(codes: np.ndarray, n: int, rest: int, k: int) -> np.ndarray:
        bits = np.empty((codes.size, k), np.uint8)
        for i in range(k):  # one plane at a time: numpy broadcasts over a tiny last axis slowly
            np.bitwise_and(codes >> np.uint8(i), np.uint8(1), out=bits[:, i])
        return bits

    @staticmethod
    def _payload_len(n: int, rest: int, k: int) -> int:
        return n * rest * k

    @staticmethod
    def _unpack(payload: np.ndarray, parts: np.ndarray, n: int, rest: int, k: int) -> np.ndarray:
        bits = payload.reshape(n * rest, k)
        if bits.size and bits.max() > 1:
            raise WireError("mbq_unpacked: a bit byte is neither 0 nor 1")
        codes = np.zeros(n * rest, np.uint8)
        for i in range(k):
            codes |= bits[:, i] << np.uint8(i)
        # the 2^k levels summed in the same float32 order as mbq's decoder
        signs = (np.arange(1 << k)[:, None] >> np.arange(k)) & 1
        levels = parts[0][signs[:, 0]].copy()
        for i in range(1, k):
            levels += parts[i][signs[:, i]]
        return np.take(levels, codes)


# ---- stochastic uniform (gradients) -----------------------------------------------------------

_SU_META = struct.Struct("<Bf")
SU_BITS = (2, 4, 8)


def _su_call_key(stream: dict) -> np.uint64:
    """A fresh key for each encode of the stream: its seed (stream["seed"], default 0) and how
    many draws it made (stream["draws"], a JSON integer, so checkpoints and resumes keep it)."""
    draws = int(stream.get("draws", 0))
    stream["draws"] = draws + 1
    return np.uint64(kernels.call_key(int(stream.get("seed", 0)), draws))


@register_codec
class StochasticUniform(Codec):
    """AccEPT's backward quantizer: max-abs scale, unbiased stochastic rounding (Eq. 7), packed
    8/k samples per byte along dim 0. Compression ~32/k."""

    codec_id = 4
    name = "stochastic_uniform"
    bits_choices = SU_BITS

    def __init__(self, bits: int = 8, **options):
        super().__init__(bits, **options)

    def encode(self, x: torch.Tensor, stream: dict) -> Encoded:
        k = self.bits
        qmax = (1 << (k - 1)) - 1
        g = x.detach().reshape(-1).to("cpu", torch.float32)  # may alias x: never written
        c = float(g.abs().max()) if g.numel() else 0.0
        if not math.isfinite(c):
            raise ValueError("stochastic_uniform: cannot quantise a gradient holding inf or nan")
        # s travels as float32, so scale with the float32 value; a subnormal c could round s to
        # 0, so s is at least the smallest float32 (the clamp then bounds q)
        s = float(max(np.float32(c / qmax), np.finfo(np.float32).smallest_subnormal)) if c > 0 else 1.0
        n, rest = _split_shape(tuple(x.shape))
        q = np.empty(g.numel(), np.int8) if c > 0 else np.zeros(g.numel(), np.int8)  # 0: zeros, s = 1
        if c > 0:  # Eq. 7, clamped to [our choice] the paper's stated range
            err2, den = kernels.su_quantize(g.numpy(), np.float32(s), qmax, _su_call_key(stream), q)
            stream["rel_err"] = math.sqrt(err2 / den) if den > 0 else 0.0
        else:
            stream["rel_err"] = 0.0
        payload = q if k == 8 else _pack_nibbles(q.reshape(n, rest), k)
        return Encoded(self.codec_id, x.dtype, tuple(x.shape), _SU_META.pack(k, s), _bytes_view(payload))

    @classmethod
    def decode(cls, meta: bytes, payload: memoryview, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        _check_float(cls.name, dtype)
        expect_len(meta, _SU_META.size, f"{cls.name} metadata")
        k, s = _SU_META.unpack(meta)
        if k not in SU_BITS:
            raise WireError(f"{cls.name}: k={k}, expected one of {SU_BITS}")
        if not (math.isfinite(s) and s > 0):
            raise WireError(f"{cls.name}: bad scale {s}")  # the encoder never sends one
        n, rest = _split_shape(shape)
        expect_len(payload, _su_payload_len(n, rest, k), f"{cls.name} payload")
        raw = np.frombuffer(payload, np.uint8)
        out = np.empty(n * rest, np.float32)
        if k == 8:
            kernels.scale_int8(raw, np.float32(s), out)
        else:
            kernels.unpack_nibbles_dim0(raw, n, rest, k, np.float32(s), out)
        return torch.from_numpy(out).reshape(shape).to(dtype)

    def wire_size(self, shape: tuple) -> tuple[int, int]:
        n, rest = _split_shape(shape)
        return _SU_META.size, _su_payload_len(n, rest, self.bits)

    @classmethod
    def prepare(cls) -> None:
        kernels.warm()


def _su_payload_len(n: int, rest: int, k: int) -> int:
    per_byte = 8 // k
    return -(-n // per_byte) * rest


def _pack_nibbles(q: np.ndarray, k: int) -> np.ndarray:
    """(n, R) int8 q -> (ceil(n/p), R) uint8 with p = 8/k consecutive samples along dim 0 per
    byte, offset by 2^(k-1) to be non-negative, the first sample in the highest bits."""
    n, rest = q.shape
    out = np.empty(_su_payload_len(n, rest, k), np.uint8)
    kernels.pack_nibbles_dim0(np.ascontiguousarray(q).reshape(-1), n, rest, k, out)
    return out.reshape(-1, rest) if rest else out


def _rel_err(approx: np.ndarray, exact: np.ndarray) -> float:
    """||approx - exact|| / ||exact|| of float32 arrays; 0 for an all-zero tensor. np.dot, as
    torch.linalg.vector_norm is ~5x slower on one core; approx is overwritten."""
    denom = float(np.dot(exact, exact))
    approx -= exact
    return math.sqrt(float(np.dot(approx, approx)) / denom) if denom > 0 else 0.0
