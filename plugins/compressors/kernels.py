"""Compiled inner loops of the codecs (numba): one pass over the data where numpy needed many.

Why numba: a codec is a few passes of per-element integer and float work (compare, pick a code,
shift it into a byte, accumulate a sum). numpy runs each step as its own pass over 4 MiB with a
fresh temporary, and the stochastic quantiser was bound by torch.rand; compiled loops keep the
element in a register and reach 1-3 GB/s on one thread (experiments/bench_codecs.py). The kernels
are single-threaded, compiled on first use and cached beside this file (`cache=True`), so a
process pays the compile once per machine and ~0.1 s to load afterwards.

Numerics: sums are accumulated in float64 (numpy summed float32 pairwise), so MBQ's alpha and
m_q and onebit's group means can differ from the numpy version in the last float32 bit. Codes,
packing and every wire layout are unchanged, and decoding is bit-identical.

Randomness (stochastic uniform): counter-based, so it vectorises and a checkpoint holds two
integers. Call c of a stream seeded s gets the key SplitMix64(s + (c+1) golden); element j's
uniform is the top 24 bits of lowbias32(lowbias32(j ^ key_lo) + key_hi) (the resolution of
torch.rand's float32). A resumed run draws the same numbers.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from framework.codec import codec_class
from framework.runtime import wire

_JIT = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")
# Float64 reductions may be reordered (summed in vector lanes): the same machine always sums in
# the same order, so runs stay deterministic; another CPU may differ in the last bit.
_SUMS = dict(_JIT, fastmath={"reassoc", "nsz"})

_INV24 = np.float32(1.0 / (1 << 24))
_M64 = (1 << 64) - 1


def call_key(seed: int, call: int) -> int:
    """A uint64 key for the call-th use of a stream seeded with seed: SplitMix64 (Steele, Lea and
    Flood 2014) of seed's Weyl sequence, in plain Python (once per call)."""
    z = (int(seed) + (int(call) + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


# ---- MBQ --------------------------------------------------------------------------------------


@njit(**_SUMS)
def sum_and_squares(x):
    """(sum x, sum x^2) in float64."""
    s = 0.0
    q = 0.0
    for j in range(x.size):
        v = np.float64(x[j])
        s += v
        q += v * v
    return s, q


@njit(**_SUMS)
def greedy_pass(r, a, first, bit, codes):
    """One basis of Network Sketching's residue init. Unless first, r -= a sign(r) (sign(0) =
    +1; r never holds -0.0, so r - a sign(r) never makes one); then bit |= (r >= 0) and the sum
    of |r| is returned (float64)."""
    total = 0.0
    for j in range(r.size):
        v = r[j]
        if not first:
            v = v - a if v >= 0 else v + a
            r[j] = v
        codes[j] |= np.uint8(v >= 0) * bit
        total += abs(v)
    return total


@njit(**_SUMS)
def above_midpoint(x, m, step, codes):
    """One midpoint of the nearest-level assignment: codes += step (mod 256) where x >= m.
    Returns (count, sum of x) over the elements at or above m (float64)."""
    c = 0
    s = 0.0
    for j in range(x.size):
        ge = x[j] >= m
        codes[j] += np.uint8(ge) * step
        c += ge
        s += np.float64(x[j]) if ge else 0.0
    return c, s


@njit(**_JIT)
def code_stats(x, codes, n_codes):
    """(count of each code, sum of x for each code), accumulated in float64. Four interleaved
    accumulator sets keep the read-modify-write chains apart."""
    counts = np.zeros((4, n_codes), np.int64)
    sums = np.zeros((4, n_codes))
    n = x.size
    n4 = n - n % 4
    for j in range(0, n4, 4):
        for u in range(4):
            c = codes[j + u]
            counts[u, c] += 1
            sums[u, c] += np.float64(x[j + u])
    for j in range(n4, n):
        c = codes[j]
        counts[0, c] += 1
        sums[0, c] += np.float64(x[j])
    return counts.sum(axis=0), sums.sum(axis=0)


@njit(**_JIT)
def pack_codes_dim0(codes, n, rest, k, out):
    """(n, rest) k-bit codes -> out (ceil(n/8), rest, k) flat: for each basis i, 8 consecutive
    samples along dim 0 per byte, sample 0 in the most significant bit, zero padded (the bytes of
    numpy.packbits(bits, axis=0, bitorder='big') on the (n, rest, k) bit array)."""
    n8 = (n + 7) // 8
    word = np.empty(rest, np.uint32)
    for g in range(n8):
        word[:] = 0
        s_end = min(8, n - 8 * g)
        for s in range(s_end):
            base = (8 * g + s) * rest
            shift = np.uint32(7 - s)
            for r in range(rest):
                c = np.uint32(codes[base + r])
                # bit i of the code lands in byte i of the word (c * 0x204081 & 0x01010101)
                word[r] |= ((c * np.uint32(0x204081)) & np.uint32(0x01010101)) << shift
        o = g * rest * k
        for r in range(rest):
            w = word[r]
            for i in range(k):
                out[o + r * k + i] = np.uint8((w >> np.uint32(8 * i)) & np.uint32(0xFF))


@njit(**_JIT)
def unpack_mbq(packed, parts, n, rest, k, out):
    """Inverse of pack_codes_dim0 fused with the dequantiser: out[(8g+s)*rest + r] = sum over i
    (in order, float32) of parts[i, bit s of byte (g, r, i)]. Each group's bytes are first split
    into one plane per basis so that the inner loops run over consecutive bytes."""
    n8 = (n + 7) // 8
    plane = np.empty((k, rest), np.uint8)
    for g in range(n8):
        o = g * rest * k
        for r in range(rest):
            for i in range(k):
                plane[i, r] = packed[o + r * k + i]
        for s in range(min(8, n - 8 * g)):
            base = (8 * g + s) * rest
            shift = 7 - s
            lo = parts[0, 0]
            hi = parts[0, 1]
            p = plane[0]
            for r in range(rest):
                out[base + r] = hi if (p[r] >> shift) & 1 else lo
            for i in range(1, k):
                lo = parts[i, 0]
                hi = parts[i, 1]
                p = plane[i]
                for r in range(rest):
                    out[base + r] += hi if (p[r] >> shift) & 1 else lo


# ---- stochastic uniform -----------------------------------------------------------------------


@njit(**_JIT)
def lowbias32(x):
    """Wellons' lowbias32 integer hash (a bijection of uint32). numba widens uint32 arithmetic to
    64 bits, so every step is cut back to 32 (LLVM then emits 32-bit vector code)."""
    x = np.uint32(x ^ (x >> 16))
    x = np.uint32(x * np.uint32(0x7FEB352D))
    x = np.uint32(x ^ (x >> 15))
    x = np.uint32(x * np.uint32(0x846CA68B))
    return np.uint32(x ^ (x >> 16))


@njit(**_SUMS)
def su_quantize(g, s, qmax, call_key, q_out):
    """Eq. 7 with scale s (float32): q = floor(g/s) + [u_j < frac], clamped to [-qmax-1, qmax].
    u_j is the top 24 bits of lowbias32(lowbias32(j ^ key_lo) + key_hi), a counter-based draw
    that vectorises; call_key (uint64) is fresh for every call. Returns (||q s - g||^2, ||g||^2)
    in float64 for the relative error."""
    k_lo = np.uint32(call_key & np.uint64(0xFFFFFFFF))
    k_hi = np.uint32(call_key >> np.uint64(32))
    lo = np.float32(-qmax - 1)
    hi = np.float32(qmax)
    err2 = 0.0
    den = 0.0
    for j in range(g.size):
        h = lowbias32(np.uint32(lowbias32(np.uint32(j) ^ k_lo) + k_hi))
        u = np.float32(h >> 8) * _INV24
        v = g[j]
        f = v / s
        q = np.floor(f)
        q += np.float32(1) if u < f - q else np.float32(0)
        q = min(max(q, lo), hi)
        q_out[j] = np.int8(q)
        d = np.float64(q * s) - np.float64(v)
        err2 += d * d
        den += np.float64(v) * np.float64(v)
    return err2, den


@njit(**_JIT)
def pack_nibbles_dim0(q, n, rest, k, out):
    """(n, rest) int8 q -> (ceil(n/p), rest) bytes, p = 8/k consecutive samples along dim 0 per
    byte, offset by 2^(k-1), the first sample in the highest bits."""
    p = 8 // k
    off = 1 << (k - 1)
    nb = (n + p - 1) // p
    for b in range(nb):
        for r in range(rest):
            out[b * rest + r] = 0
        for t in range(min(p, n - b * p)):
            shift = 8 - k * (t + 1)
            base = (b * p + t) * rest
            for r in range(rest):
                out[b * rest + r] |= np.uint8((q[base + r] + off) << shift)


@njit(**_JIT)
def unpack_nibbles_dim0(raw, n, rest, k, s, out):
    """Inverse of pack_nibbles_dim0 fused with the dequantiser: q * s in float32."""
    p = 8 // k
    mask = (1 << k) - 1
    off = 1 << (k - 1)
    nb = (n + p - 1) // p
    for b in range(nb):
        for t in range(min(p, n - b * p)):
            shift = 8 - k * (t + 1)
            base = (b * p + t) * rest
            for r in range(rest):
                out[base + r] = np.float32(((raw[b * rest + r] >> shift) & mask) - off) * s


@njit(**_JIT)
def scale_int8(raw, s, out):
    for j in range(raw.size):
        out[j] = np.float32(np.int8(raw[j])) * s


# ---- onebit -----------------------------------------------------------------------------------


# The loops below are kept simple (one contiguous range, few arrays) so that LLVM vectorises
# them: a scalar float select compiles to a branch, and on the random signs of a gradient that
# branch is mispredicted half the time (16 ms instead of 1 ms per 4 MiB).


@njit(**_SUMS)
def _onebit_sums(g, residual):
    """(sum of the non-negative v, sum of the negative v, their count, ||v||^2), v = g + r."""
    sp = 0.0
    sn = 0.0
    npos = 0
    vn2 = 0.0
    for j in range(g.size):
        w = np.float64(g[j] + residual[j])
        ge = np.float64(w >= 0)
        sp += w * ge
        sn += w - w * ge
        npos += w >= 0
        vn2 += w * w
    return sp, sn, npos, vn2


@njit(**_SUMS)
def _onebit_residual(g, residual, p, q, seide, bits, residual_out):
    """bits = v >= 0; residual_out = v - deq (Seide) or g - deq (literal Eq. 6), deq = p or q.
    Returns ||v - deq||^2."""
    err2 = 0.0
    for j in range(g.size):
        v = g[j] + residual[j]
        bits[j] = v >= 0
    if seide:
        for j in range(g.size):
            v = g[j] + residual[j]
            e = v - (p if v >= 0 else q)
            err2 += np.float64(e) * np.float64(e)
            residual_out[j] = e
    else:
        for j in range(g.size):
            v = g[j] + residual[j]
            d = p if v >= 0 else q
            e = v - d
            err2 += np.float64(e) * np.float64(e)
            residual_out[j] = g[j] - d
    return err2


@njit(**_JIT)
def onebit_encode(g, residual, groups, seide, packed, pos, neg, residual_out):
    """AdaLearner's 1-bit quantiser with sender-side error feedback, per group of g.size/groups
    consecutive elements: v = g + residual, bit = v >= 0, pos/neg = mean of the non-negative /
    negative v (0 where none), deq = pos or neg; residual_out = v - deq (Seide) or g - deq
    (literal Eq. 6); bits packed 8 per byte over the flat tensor, MSB first, zero padded.
    Returns (||v||^2, ||v - deq||^2) in float64."""
    n = g.size
    per = n // groups if groups else 0
    bits = np.empty(n, np.uint8)
    vn2 = 0.0
    err2 = 0.0
    for gr in range(groups):
        a, b = gr * per, (gr + 1) * per
        sp, sn, npos, v2 = _onebit_sums(g[a:b], residual[a:b])
        p = np.float32(sp / max(npos, 1))
        q = np.float32(sn / max(per - npos, 1))
        pos[gr] = p
        neg[gr] = q
        vn2 += v2
        err2 += _onebit_residual(g[a:b], residual[a:b], p, q, seide, bits[a:b], residual_out[a:b])
    pack_msb_first(bits, packed)
    return vn2, err2


@njit(**_JIT)
def pack_msb_first(bits, packed):
    """0/1 bytes -> 8 per byte, the first in the most significant bit, zero padded."""
    n = bits.size
    full = n // 8
    for b in range(full):
        o = 8 * b
        w = np.uint8(0)
        for t in range(8):
            w |= bits[o + t] << np.uint8(7 - t)
        packed[b] = w
    if n % 8:
        w = np.uint8(0)
        for t in range(n % 8):
            w |= bits[8 * full + t] << np.uint8(7 - t)
        packed[full] = w


@njit(**_JIT)
def unpack_msb_first(packed, count, bits):
    """Inverse of pack_msb_first: count 0/1 bytes."""
    full = count // 8
    for b in range(full):
        w = packed[b]
        for t in range(8):
            bits[8 * b + t] = (w >> (7 - t)) & 1
    for t in range(count % 8):
        bits[8 * full + t] = (packed[full] >> (7 - t)) & 1


@njit(**_JIT)
def _select(bits, p, q, out):
    for j in range(bits.size):
        out[j] = p if bits[j] else q


@njit(**_JIT)
def onebit_decode(packed, pos, neg, count, groups, out):
    """out = pos[group] where the element's bit is 1, neg[group] where 0."""
    bits = np.empty(count, np.uint8)
    unpack_msb_first(packed, count, bits)
    per = count // groups if groups else 0
    for gr in range(groups):
        _select(bits[gr * per : (gr + 1) * per], pos[gr], neg[gr], out[gr * per : (gr + 1) * per])


# ---- compile ahead ----------------------------------------------------------------------------


_warm = False


def warm() -> None:
    """Compile (or load from the cache) every kernel with the argument types the codecs pass,
    by a wire round trip of each codec at each width. setup.sh runs it once per machine
    (`python -m plugins.compressors.kernels`); Codec.prepare runs it in role processes."""
    global _warm
    if _warm:
        return
    x = torch.randn(17, 3, 4, generator=torch.Generator().manual_seed(0))
    for name, widths in (("mbq", (1, 2, 3, 4)), ("mbq_unpacked", (2,)), ("stochastic_uniform", (2, 4, 8)), ("onebit", (1,))):
        for bits in widths:
            codec, stream = codec_class(name)(bits=bits), {}
            for _ in range(2):  # mbq: the initialisation, then the steady state
                enc = codec.encode(x, stream)
                wire.decode(wire.encode({"x": enc}))  # read-only packet buffers
                type(codec).decode(enc.meta, memoryview(bytearray(enc.payload)), enc.shape, enc.dtype)  # writable ones
    _warm = True


if __name__ == "__main__":
    import time

    from plugins.compressors import kernels  # the importable module (numba caches its functions)

    t0 = time.perf_counter()
    kernels.warm()
    print(f"codec kernels compiled and cached in {time.perf_counter() - t0:.1f} s")
