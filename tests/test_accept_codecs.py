"""AccEPT's codecs (plugins/compressors/accept_codecs.py) against the notes, section 2.2: MBQ's
bit packing and quantizer, the stochastic uniform gradient quantizer, Table 3's compression
ratios, and decoding of malformed input."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from framework.codec import Encoded, codec_class
from framework.errors import ConfigError, WireError
from framework.runtime import wire
from plugins.compressors.accept_codecs import MBQ, MBQUnpacked, StochasticUniform, pack_codes

ALL = [(MBQ, 1), (MBQ, 2), (MBQ, 3), (MBQ, 4), (MBQUnpacked, 2), (MBQUnpacked, 4), (StochasticUniform, 2), (StochasticUniform, 4), (StochasticUniform, 8)]


def roundtrip(enc: Encoded) -> torch.Tensor:
    return wire.decode(wire.encode({"x": enc})).tensors["x"]


def mbq_meta(enc: Encoded) -> tuple[int, np.ndarray, float]:
    k = enc.meta[0]
    vals = struct.unpack(f"<{k + 1}f", enc.meta[1:])
    return k, np.array(vals[:k], np.float64), vals[k]


def mbq_bits(enc: Encoded) -> np.ndarray:
    """The (n, ..., k) 0/1 bits of an mbq payload, unpacked with numpy's reference."""
    k, shape = enc.meta[0], tuple(enc.shape) or (1,)
    packed = np.frombuffer(enc.payload, np.uint8).reshape(-(-shape[0] // 8), *shape[1:], k)
    bits = np.unpackbits(packed, axis=0, bitorder="big")
    assert not bits[shape[0] :].any(), "the padding bits must be zero"
    return bits[: shape[0]]


def signs_of(bits: np.ndarray, k: int) -> np.ndarray:
    """B: (N, k) in {-1, +1}."""
    return bits.reshape(-1, k).astype(np.float64) * 2 - 1


# ---- registry ---------------------------------------------------------------------------------


def test_codecs_are_registered_with_their_wire_ids_and_bit_widths():
    assert (codec_class("mbq"), codec_class("mbq_unpacked"), codec_class("stochastic_uniform")) == (MBQ, MBQUnpacked, StochasticUniform)
    assert (MBQ.codec_id, MBQUnpacked.codec_id, StochasticUniform.codec_id) == (2, 3, 4)
    for cls, bad in [(MBQ, 5), (MBQ, 0), (StochasticUniform, 3), (StochasticUniform, 16)]:
        with pytest.raises(ConfigError):
            cls(bits=bad)


# ---- bit packing (notes 2.2.3, Fig. 6) --------------------------------------------------------


def test_fig6_packing_example_gives_54():
    # an 8x1x1x1 tensor at k=4: basis 2's column is 0,0,1,1,0,1,1,0 (batch index 0 first)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, (8, 1, 1, 1, 4), dtype=np.uint8)
    bits[:, 0, 0, 0, 2] = [0, 0, 1, 1, 0, 1, 1, 0]
    codes = (bits << np.arange(4, dtype=np.uint8)).sum(-1, dtype=np.uint8).reshape(8, 1)
    packed = pack_codes(codes, 4).reshape(1, 1, 1, 1, 4)  # ceil(8/8) x w x h x c x k
    assert packed[0, 0, 0, 0, 2] == 54 == 0b00110110
    assert np.array_equal(packed, np.packbits(bits, axis=0, bitorder="big"))

    # the same column through the encoder: at k=1 the bit is the sign of x
    x = torch.tensor([-1.0, -1, 1, 1, -1, 1, 1, -1]).reshape(8, 1, 1, 1)
    enc = MBQ(bits=1).encode(x, {})
    assert bytes(enc.payload) == bytes([54])
    zeros = torch.tensor([0.0, -0.0, -1, -1, -1, -1, -1, -1])  # sign(0) := +1, also for -0.0
    assert bytes(MBQ(bits=1).encode(zeros, {}).payload) == bytes([0b11000000])
    enc4 = MBQ(bits=4).encode(torch.randn(8, 1, 1, 1), {})
    assert len(enc4.payload) == 4 and mbq_bits(enc4).shape == (8, 1, 1, 1, 4)


@pytest.mark.parametrize("n", [1, 3, 8, 41])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_pack_codes_matches_numpy_packbits(n, k):
    rng = np.random.default_rng(n * 10 + k)
    codes = rng.integers(0, 1 << k, (n, 7), dtype=np.uint8)
    bits = (codes[:, :, None] >> np.arange(k, dtype=np.uint8)) & 1
    assert np.array_equal(pack_codes(codes, k), np.packbits(bits, axis=0, bitorder="big"))


# ---- wire sizes (notes 2.2.5, Table 3) --------------------------------------------------------


def _ratio(codec, x: torch.Tensor) -> float:
    enc = codec.encode(x, {})
    assert (len(enc.meta), len(enc.payload)) == codec.wire_size(tuple(x.shape))
    return len(wire.encode({"x": x})) / len(wire.encode({"x": enc}))


@pytest.mark.parametrize(
    "shape, expected",
    [
        # MobileNetV2 / CIFAR10, the largest output: 128x32x16x16 float32 = 4096 KiB
        ((128, 32, 16, 16), {("mbq", 2): 15.93, ("mbq", 3): 10.63, ("mbq", 4): 7.98, ("stochastic_uniform", 4): 7.99, ("stochastic_uniform", 8): 4.00, ("mbq_unpacked", 2): 2.00, ("mbq_unpacked", 3): 1.33, ("mbq_unpacked", 4): 1.00}),
        # simple CNN / UCI-HAR, the largest output
        ((64, 64, 126), {("mbq", 2): 15.86, ("mbq", 3): 10.61, ("mbq", 4): 7.97}),
    ],
)
def test_table3_ratios_of_large_outputs(shape, expected):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    for (name, bits), paper in expected.items():
        r = _ratio(codec_class(name)(bits=bits), x)
        assert abs(r / paper - 1) < 0.02, f"{name} k={bits}: ratio {r:.3f}, paper {paper}"


@pytest.mark.parametrize("shape", [(128, 160, 1, 1), (64, 100)])
def test_small_outputs_payload_sizes_are_exact(shape):
    # Table 3's total ratios for these small outputs are dominated by the paper's HTTP/JSON
    # framing (~0.5-1.1 KB per message), which our wire format does not replicate: check the
    # payload and metadata bytes exactly instead (Eq. 8 and the backward size formula).
    x = torch.randn(shape)
    n, rest = shape[0], math.prod(shape[1:])
    for k in (1, 2, 3, 4):
        enc = MBQ(bits=k).encode(x, {})
        assert (len(enc.meta), len(enc.payload)) == (4 * (k + 1) + 1, math.ceil(n / 8) * rest * k)
        enc = MBQUnpacked(bits=k).encode(x, {})
        assert (len(enc.meta), len(enc.payload)) == (4 * (k + 1) + 1, n * rest * k)
    for k, per_byte in [(8, 1), (4, 2), (2, 4)]:
        enc = StochasticUniform(bits=k).encode(x, {})
        assert (len(enc.meta), len(enc.payload)) == (5, math.ceil(n / per_byte) * rest)


# ---- MBQ round trips (notes 2.2.2) ------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_mbq_decode_is_B_alpha_minus_mq(k):
    x = torch.randn(41, 6, 5, generator=torch.Generator().manual_seed(k)) * 2 + 0.5
    codec, stream = MBQ(bits=k), {}
    unpacked_codec, unpacked_stream = MBQUnpacked(bits=k), {}
    for step in range(3):  # the initialisation, then two steady-state messages
        enc = codec.encode(x + 0.1 * step, stream)
        kk, alpha, m_q = mbq_meta(enc)
        assert kk == k and np.allclose(alpha, stream["alpha"].numpy())
        bits = mbq_bits(enc)
        expected = signs_of(bits, k) @ alpha - m_q
        got = roundtrip(enc)
        assert got.shape == x.shape and got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy().reshape(-1), expected, rtol=0, atol=1e-5)
        # mbq_unpacked: the same quantizer, the bits one per byte, the same tensor bit for bit
        unpacked = unpacked_codec.encode(x + 0.1 * step, unpacked_stream)
        assert unpacked.meta == enc.meta
        assert np.array_equal(np.frombuffer(unpacked.payload, np.uint8).reshape(bits.shape), bits)
        assert torch.equal(roundtrip(unpacked), got)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_mbq_bias_correction_zeroes_the_mean_error(k):
    x = torch.randn(64, 16, 8, 8, generator=torch.Generator().manual_seed(k)).exp()  # skewed, mean > 0
    codec, stream = MBQ(bits=k), {}
    for step in range(3):
        xt = x * (1 + 0.05 * step)
        got = roundtrip(codec.encode(xt, stream)).double()
        assert abs(float((got - xt.double()).mean())) <= 1e-6 * float(xt.double().std())


def test_mbq_error_decreases_with_k_and_is_recorded():
    x = torch.randn(32, 8, 6, 6, generator=torch.Generator().manual_seed(3))
    errs = []
    for k in (1, 2, 3, 4):
        stream = {}
        got = roundtrip(MBQ(bits=k).encode(x, stream))
        err = float((got - x).norm() / x.norm())
        assert stream["rel_err"] == pytest.approx(err, rel=1e-4)
        errs.append(err)
    assert errs[0] > errs[1] > errs[2] > errs[3], errs


def test_mbq_steady_state_is_nearest_level_plus_smoothed_least_squares():
    g = torch.Generator().manual_seed(4)
    x1, x2, x3 = (torch.randn(40, 10, 10, generator=g) * s for s in (1.0, 1.5, 0.7))
    codec, stream = MBQ(bits=3), {}
    codec.encode(x1, stream)
    assert stream["t"] == 0 and stream["reset"] is False
    alpha1 = stream["alpha"].double().numpy()

    enc = codec.encode(x2, stream)
    assert stream["t"] == 1
    B = signs_of(mbq_bits(enc), 3)
    xv = x2.double().numpy().reshape(-1)
    # B-step: every element took (one of) the levels of alpha1 nearest to it
    levels = np.array([[s1, s2, s3] for s1 in (-1, 1) for s2 in (-1, 1) for s3 in (-1, 1)]) @ alpha1
    nearest = np.abs(xv[:, None] - levels[None, :]).min(1)
    assert np.all(np.abs(xv - B @ alpha1) <= nearest + 1e-5)
    # alpha-step and Eq. 4: alpha = beta alpha1 + (1 - beta) lstsq(B, x), beta = min(0.9, 2/11)
    beta = 2 / 11
    alpha_cur = np.linalg.lstsq(B, xv, rcond=None)[0]
    _, alpha2, _ = mbq_meta(enc)
    np.testing.assert_allclose(alpha2, beta * alpha1 + (1 - beta) * alpha_cur, rtol=1e-4)
    # ... which is not what a fresh stream (greedy init) sends for the same tensor
    _, fresh, _ = mbq_meta(MBQ(bits=3).encode(x2, {}))
    assert not np.allclose(alpha2, fresh, rtol=1e-3)

    codec.encode(x3, stream)
    assert stream["t"] == 2


def _reference_mbq(xs, k):
    """The notes' pseudo-code (mbq_compress / mbq_decompress) in float64, literally: greedy init,
    argmin over all levels, lstsq, Eq. 4, bias correction. Returns each message's (alpha, x~)."""
    codes = torch.tensor([[1.0 if (c >> i) & 1 else -1.0 for i in range(k)] for c in range(1 << k)], dtype=torch.float64)
    alpha, t, out = None, 0, []
    for x in xs:
        xv = x.reshape(-1).double()
        if alpha is None:
            r, cols, al = xv.clone(), [], []
            for _ in range(k):
                b = torch.where(r >= 0, 1.0, -1.0).double()
                a = r.abs().mean()
                r -= a * b
                cols.append(b)
                al.append(a)
            B, alpha = torch.stack(cols, 1), torch.stack(al)
        else:
            t += 1
            B = codes[(xv[:, None] - (codes @ alpha)[None, :]).abs().argmin(1)]
            alpha_cur = torch.linalg.lstsq(B, xv[:, None]).solution[:, 0]
            beta = min(0.9, (1 + t) / (10 + t))
            alpha = beta * alpha + (1 - beta) * alpha_cur
        xhat = B @ alpha
        out.append((alpha.clone(), (xhat - (xhat - xv).mean()).reshape(x.shape)))
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_mbq_matches_the_notes_pseudo_code(k):
    g = torch.Generator().manual_seed(10 + k)
    xs = [torch.randn(24, 5, 7, generator=g) * (1 + 0.3 * i) + 0.2 * i for i in range(6)]
    codec, stream = MBQ(bits=k), {}
    for x, (alpha_ref, x_ref) in zip(xs, _reference_mbq(xs, k)):
        enc = codec.encode(x, stream)
        _, alpha, _ = mbq_meta(enc)
        np.testing.assert_allclose(alpha, alpha_ref.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(roundtrip(enc).double().numpy(), x_ref.numpy(), rtol=0, atol=2e-5)


def test_mbq_reset_and_bit_change_reinitialise():
    g = torch.Generator().manual_seed(5)
    x1, x2 = torch.randn(16, 50, generator=g), torch.randn(16, 50, generator=g) * 3
    codec, stream = MBQ(bits=2), {"seed": 7}
    codec.encode(x1, stream)
    codec.encode(x1, stream)
    assert stream["t"] == 1
    stream["reset"] = True  # what the compressor does at each epoch
    enc = codec.encode(x2, stream)
    assert stream["t"] == 0 and stream["reset"] is False
    assert enc.meta == MBQ(bits=2).encode(x2, {}).meta
    codec.encode(x2, stream)
    codec.bits = 3  # the schedule moved on: a new k starts over
    enc = codec.encode(x2, stream)
    assert stream["t"] == 0 and stream["k"] == 3 and enc.meta == MBQ(bits=3).encode(x2, {}).meta


def test_mbq_constant_and_zero_tensors():
    for value in (0.0, 2.5):
        x = torch.full((9, 4), value)
        codec, stream = MBQ(bits=2), {}
        for _ in range(3):  # the steady state hits a singular B^T B: the ridge keeps it solvable
            got = roundtrip(codec.encode(x, stream))
            assert torch.allclose(got, x, atol=1e-6) and stream["rel_err"] < 1e-6


# ---- stochastic uniform (notes 2.2.4) ---------------------------------------------------------


def test_stochastic_uniform_is_unbiased():
    g = torch.randn(64, generator=torch.Generator().manual_seed(6))
    codec, stream = StochasticUniform(bits=4), {}  # the generator's default seed, 0
    draws = torch.stack([roundtrip(codec.encode(g, stream)) for _ in range(2000)]).double()
    mean, se = draws.mean(0), draws.std(0) / math.sqrt(2000)
    # Elements on the grid (the max) come back exactly, with se = 0. The fixed seed makes this
    # deterministic; over random seeds some element of 64 exceeds 3 se about a third of the time
    # (near-grid elements are heavily skewed Bernoullis), so the seed is not a free parameter.
    assert torch.all((mean - g.double()).abs() <= 3 * se + 1e-6)


def test_stochastic_uniform_error_shrinks_with_bits_and_is_reproducible():
    g = torch.randn(41, 7, 3, generator=torch.Generator().manual_seed(7))
    errs = {}
    for k in (2, 4, 8):
        stream = {"seed": 3}
        got = roundtrip(StochasticUniform(bits=k).encode(g, stream))
        errs[k] = float((got - g).norm() / g.norm())
        assert stream["rel_err"] == pytest.approx(errs[k], rel=1e-5)
        q = got / struct.unpack("<f", StochasticUniform(bits=k).encode(g, {"seed": 3}).meta[1:])[0]
        assert torch.allclose(q, q.round(), atol=1e-4) and q.min() >= -(2 ** (k - 1)) and q.max() <= 2 ** (k - 1) - 1
    assert errs[8] < errs[4] < errs[2], errs
    same = [bytes(StochasticUniform(bits=4).encode(g, {"seed": 3}).payload) for _ in range(2)]
    assert same[0] == same[1] != bytes(StochasticUniform(bits=4).encode(g, {"seed": 4}).payload)


def test_stochastic_uniform_packing_layout():
    # k=4: consecutive pairs along dim 0, the first in the high nibble, odd n zero padded
    s = 1.0 / 7
    g = (torch.tensor([[7.0], [-7.0], [3.0]]) * s).float()  # on the grid: no randomness
    enc = StochasticUniform(bits=4).encode(g, {})
    assert bytes(enc.payload) == bytes([((7 + 8) << 4) | (-7 + 8), (3 + 8) << 4])
    # k=2: four consecutive samples per byte, the first in the highest bits
    g = torch.tensor([1.0, -1.0, 0.0, 1.0, -1.0])
    enc = StochasticUniform(bits=2).encode(g, {})
    assert bytes(enc.payload) == bytes([(3 << 6) | (1 << 4) | (2 << 2) | 3, 1 << 6])
    assert struct.unpack("<Bf", enc.meta) == (2, 1.0)


def test_stochastic_uniform_zero_tensor():
    for k in (2, 4, 8):
        enc = StochasticUniform(bits=k).encode(torch.zeros(5, 3), {})
        assert struct.unpack("<Bf", enc.meta) == (k, 1.0)
        assert torch.equal(roundtrip(enc), torch.zeros(5, 3))


# ---- shapes and dtypes ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(41, 3, 2), (1, 5), (3,), (1,), ()])
@pytest.mark.parametrize("cls, bits", ALL)
def test_odd_batches_round_trip(cls, bits, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(8))
    codec, stream = cls(bits=bits), {}
    for _ in range(2):
        enc = codec.encode(x, stream)
        assert (len(enc.meta), len(enc.payload)) == codec.wire_size(shape)
        got = roundtrip(enc)
        assert got.shape == x.shape and got.dtype == x.dtype
        assert float((got - x).norm()) <= 2 * float(x.norm()) + 1e-6


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0)])
@pytest.mark.parametrize("cls, bits", ALL)
def test_empty_tensors_round_trip(cls, bits, shape):
    codec, stream = cls(bits=bits), {}
    enc = codec.encode(torch.zeros(shape), stream)
    assert (len(enc.meta), len(enc.payload)) == codec.wire_size(shape) and len(enc.payload) == 0
    assert roundtrip(enc).shape == shape and stream["rel_err"] == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_come_back_as_themselves(dtype):
    x = torch.randn(9, 4).to(dtype)
    for cls, bits in [(MBQ, 2), (MBQUnpacked, 2), (StochasticUniform, 8)]:
        got = roundtrip(cls(bits=bits).encode(x, {}))
        assert got.dtype == dtype and got.shape == x.shape


# ---- malformed input --------------------------------------------------------------------------


def _bad_variants(cls, enc: Encoded):
    meta, payload = bytes(enc.meta), bytes(enc.payload)
    yield "meta too long", meta + b"\0", payload
    yield "meta too short", meta[:-1], payload
    yield "no meta", b"", payload
    yield "payload one byte short", meta, payload[:-1]
    yield "payload one byte long", meta, payload + b"\0"
    if cls is StochasticUniform:
        yield "k=3", bytes([3]) + meta[1:], payload
        yield "k=0", bytes([0]) + meta[1:], payload
        for s in (0.0, -1.0, float("nan"), float("inf")):
            yield f"scale {s}", struct.pack("<Bf", meta[0], s), payload
    else:
        k = meta[0]
        yield "k=0", struct.pack("<Bf", 0, 0.0), payload
        yield "k=5", struct.pack("<B6f", 5, *[1.0] * 6), payload
        yield "k one more than the alphas", bytes([k + 1]) + meta[1:], payload
        yield "k one less than the alphas", bytes([k - 1]) + meta[1:], payload
        yield "nan alpha", meta[:1] + struct.pack("<f", float("nan")) + meta[5:], payload
        yield "inf m_q", meta[:-4] + struct.pack("<f", float("inf")), payload


@pytest.mark.parametrize("cls, bits", [(MBQ, 1), (MBQ, 2), (MBQ, 4), (MBQUnpacked, 3), (StochasticUniform, 2), (StochasticUniform, 4), (StochasticUniform, 8)])
def test_malformed_input_raises_wire_error(cls, bits):
    x = torch.randn(11, 3)
    enc = cls(bits=bits).encode(x, {})
    for what, meta, payload in _bad_variants(cls, enc):
        with pytest.raises(WireError):
            cls.decode(meta, memoryview(payload), enc.shape, enc.dtype)
        bad = Encoded(enc.codec_id, enc.dtype, enc.shape, meta, payload)
        with pytest.raises(WireError):
            wire.decode(wire.encode({"x": bad}))
    with pytest.raises(WireError):  # these codecs carry floating tensors only
        cls.decode(enc.meta, memoryview(bytes(enc.payload)), enc.shape, torch.int32)


def test_mbq_unpacked_rejects_bytes_that_are_not_bits():
    enc = MBQUnpacked(bits=2).encode(torch.randn(4, 3), {})
    payload = bytearray(enc.payload)
    payload[5] = 2
    with pytest.raises(WireError):
        wire.decode(wire.encode({"x": Encoded(enc.codec_id, enc.dtype, enc.shape, enc.meta, payload)}))


# ---- compiled kernels (plugins/compressors/kernels.py) -------------------------------------


def test_stochastic_uniform_stream_state_is_two_json_integers_and_resumes():
    """A checkpoint holds seed and draws; a stream rebuilt from them continues the same draws."""
    g = torch.randn(33, 5, generator=torch.Generator().manual_seed(8))
    codec, stream = StochasticUniform(bits=4), {"seed": 11}
    for _ in range(3):
        codec.encode(g, stream)
    saved = {k: v for k, v in stream.items() if k in ("seed", "draws")}
    assert saved == {"seed": 11, "draws": 3}
    nxt = bytes(codec.encode(g, stream).payload)
    assert bytes(codec.encode(g, dict(saved)).payload) == nxt
    assert bytes(codec.encode(g, {"seed": 11}).payload) != nxt  # draw 0 differs from draw 3


def test_stochastic_uniform_draws_are_uniform():
    """Where x/s sits at fraction f above a level, it rounds up with probability f, at every f:
    the counter-based draws have no visible bias across positions or calls."""
    n = 4096
    frac = (torch.arange(n) % 64 + 0.5) / 64  # 64 fractions, 64 elements each
    g = torch.cat([torch.tensor([127.0]), frac])  # max 127 -> s = 1 at 8 bits
    codec, stream = StochasticUniform(bits=8), {}
    ups = torch.zeros(n)
    calls = 200
    for _ in range(calls):
        ups += roundtrip(codec.encode(g, stream))[1:]  # q = floor(f) + up = up
    rate = (ups.view(64, 64).sum(0) / (64 * calls)).double()  # element i has fraction i % 64: 12,800 draws each
    expected = (torch.arange(64) + 0.5).double() / 64
    se = (expected * (1 - expected) / (64 * calls)).sqrt()
    assert torch.all((rate - expected).abs() <= 5 * se), (rate - expected).abs().max()


@pytest.mark.parametrize("shape", [(8, 3), (13, 2, 5), (1,), (7,)])
def test_onebit_kernel_matches_its_definition(shape):
    """Per output unit: bit = v >= 0, levels = means of the non-negative and negative v, Seide
    residual v - deq; the kernel's float64 sums agree with a float64 reference to float32."""
    from plugins.compressors.ef_codecs import OneBit

    g = torch.Generator().manual_seed(9)
    x, r0 = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g) * 0.1
    stream = {"residual": r0.clone()}
    enc = OneBit().encode(x, stream)
    v = (x + r0).double().reshape(shape[0] if len(shape) >= 2 else 1, -1)
    pos = torch.where(v >= 0, v, 0).sum(1) / (v >= 0).sum(1).clamp(min=1)
    neg = torch.where(v < 0, v, 0).sum(1) / (v < 0).sum(1).clamp(min=1)
    deq = torch.where(v >= 0, pos[:, None], neg[:, None])
    got = roundtrip(enc).double().reshape(deq.shape)
    torch.testing.assert_close(got, deq, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stream["residual"].double().reshape(deq.shape), v - got, rtol=0, atol=1e-6)
    assert np.array_equal(np.frombuffer(enc.payload, np.uint8), np.packbits((v >= 0).reshape(-1).numpy()))
