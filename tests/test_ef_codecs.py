"""The error-feedback codecs (plugins/compressors/ef_codecs.py): fp16, min-max n-bit, 1-bit sign.

Every round trip goes through the real wire format (wire.encode / wire.decode), so the codec ids,
metadata and payload lengths are checked as a receiver sees them.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from framework.codec import Encoded, codec_class
from framework.errors import ConfigError, WireError
from framework.runtime import wire
from plugins.compressors.ef_codecs import FP16, MinMax, OneBit, minmax_error_feedback


def round_trip(enc: Encoded) -> torch.Tensor:
    return wire.decode(wire.encode({"x": enc})).tensors["x"]


def encode_decode(codec, x, stream=None):
    """(Encoded, the receiver's tensor, the stream dict)."""
    stream = {} if stream is None else stream
    enc = codec.encode(x, stream)
    return enc, round_trip(enc), stream


def packet_with(enc: Encoded, **changes) -> bytearray:
    """A well-formed packet around a codec record with some fields replaced."""
    fields = dict(codec_id=enc.codec_id, dtype=enc.dtype, shape=enc.shape, meta=enc.meta, payload=bytes(enc.payload))
    fields.update(changes)
    return wire.encode({"x": Encoded(**fields)})


SHAPES = [(37, 19), (7,), (), (4, 3, 3, 3), (0, 5), (5, 0)]


def test_registered_by_name_and_id():
    assert (codec_class("fp16"), codec_class("minmax"), codec_class("onebit")) == (FP16, MinMax, OneBit)
    assert (FP16.codec_id, MinMax.codec_id, OneBit.codec_id) == (1, 5, 6)


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError):
        MinMax(bits=3)
    with pytest.raises(ConfigError):
        OneBit(bits=2)
    with pytest.raises(ConfigError):
        OneBit(granularity="per_column")
    with pytest.raises(ConfigError):
        OneBit(ef_variant="none")


@pytest.mark.parametrize("codec", [FP16(), MinMax(1), MinMax(2), MinMax(4), MinMax(8), MinMax(16), OneBit(), OneBit(granularity="per_tensor")], ids=lambda c: f"{c.name}{c.bits}")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_wire_size_matches_encode_and_shape_survives(codec, shape):
    x = torch.randn(shape)
    enc, y, _ = encode_decode(codec, x)
    assert codec.wire_size(shape) == (len(enc.meta), len(enc.payload))
    assert y.shape == x.shape and y.dtype == x.dtype


# ---- fp16 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fp16_round_trip(dtype):
    x = torch.randn(33, 17).to(dtype)
    enc, y, _ = encode_decode(FP16(), x)
    assert enc.meta == b"" and len(enc.payload) == 2 * x.numel()
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(y.float(), x.half().float(), rtol=0, atol=0 if dtype != torch.bfloat16 else 1e-2)


def test_fp16_non_contiguous_input():
    x = torch.randn(17, 33).t()
    _, y, _ = encode_decode(FP16(), x)
    assert torch.equal(y, x.half().float())


# ---- min-max n-bit ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_minmax_round_trip_error_bound_and_size(n, dtype):
    g = torch.Generator().manual_seed(n)  # the data must not depend on the tests that ran before
    x = (torch.randn(37, 19, generator=g) * 3 + 1).to(dtype)  # 703 elements: not a whole number of bytes at n < 8
    stream = {}
    enc, y, _ = encode_decode(MinMax(n), x, stream)
    assert y.shape == x.shape and y.dtype == dtype
    assert len(enc.payload) == math.ceil(x.numel() * n / 8)
    lo, hi = float(x.min()), float(x.max())
    bound = (hi - lo) / (2 * (2**n - 1))
    # the quantization bound, plus the rounding of dequantisation's float32 arithmetic (a few ulp
    # of the largest magnitude; it matters at 16 bits, where the bound itself is ~1e-4)
    ulps = 8 * torch.finfo(torch.float32).eps * max(abs(lo), abs(hi))
    assert float((y - x).abs().max()) <= bound + ulps
    assert stream["rel_err"] == pytest.approx(float((y.double() - x.double()).norm() / x.double().norm()), rel=1e-4)


def test_minmax_error_falls_as_bits_rise():
    x = torch.randn(64, 64)
    errors = []
    for n in MinMax.bits_choices:
        _, y, stream = encode_decode(MinMax(n), x)
        errors.append((float((y - x).abs().max()), stream["rel_err"]))
    for (max_a, rel_a), (max_b, rel_b) in zip(errors, errors[1:]):
        assert max_b < max_a and rel_b < rel_a


def test_minmax_constant_tensor_is_exact():
    x = torch.full((5, 4), -2.5)
    enc, y, stream = encode_decode(MinMax(4), x)
    assert torch.equal(y, x) and stream["rel_err"] == 0.0
    assert bytes(enc.payload) == bytes(len(enc.payload))  # all codes 0


def test_minmax_packing_layout():
    """First element in the highest bits; 16-bit codes little-endian."""
    x = torch.tensor([0.0, 1.0, 2.0, 3.0, 3.0])  # min 0, max 3: 2-bit codes 0 1 2 3 3
    assert bytes(MinMax(2).encode(x, {}).payload) == bytes([0b00011011, 0b11000000])
    x = torch.arange(16.0)  # 4-bit codes 0..15
    assert bytes(MinMax(4).encode(x, {}).payload) == bytes([0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF])
    x = torch.tensor([0.0, 1.0, 1.0])  # 1-bit codes 0 1 1
    assert bytes(MinMax(1).encode(x, {}).payload) == bytes([0b01100000])
    x = torch.tensor([0.0, 65535.0])
    assert bytes(MinMax(16).encode(x, {}).payload) == struct.pack("<HH", 0, 65535)
    enc = MinMax(8).encode(torch.tensor([-1.0, 3.0]), {})
    assert enc.meta == struct.pack("<Bff", 8, -1.0, 3.0) and bytes(enc.payload) == bytes([0, 255])


def test_minmax_rounds_to_nearest():
    # (h - min) / (max - min) * 3 = 0.4, 0.6, 1.49, 1.51 -> 0, 1, 1, 2
    x = torch.tensor([0.0, 0.4, 0.6, 1.49, 1.51, 3.0]) / 3
    _, y, _ = encode_decode(MinMax(2), x)
    torch.testing.assert_close(y * 3, torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 3.0]))


def test_minmax_rejects_non_finite_input():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            MinMax(8).encode(torch.tensor([0.0, bad]), {})


def test_minmax_error_feedback_formula():
    torch.manual_seed(0)
    delta_hat, E = torch.randn(8, 16), torch.randn(8, 16) * 0.01
    torch.testing.assert_close(minmax_error_feedback(delta_hat, E), delta_hat - E * delta_hat**2)
    assert torch.equal(minmax_error_feedback(delta_hat, torch.zeros_like(E)), delta_hat)


# ---- 1-bit sign ---------------------------------------------------------------------------------


def check_group_scalars(x: torch.Tensor, y: torch.Tensor, groups: int):
    """Each group of y holds only its pos (where x >= 0) and neg (where x < 0): the means of x's
    non-negative and negative values in that group, 0 where there are none."""
    xs, ys = x.reshape(groups, -1), y.reshape(groups, -1)
    for xg, yg in zip(xs, ys):
        nonneg = xg >= 0
        pos = xg[nonneg].mean() if nonneg.any() else torch.tensor(0.0)
        neg = xg[~nonneg].mean() if (~nonneg).any() else torch.tensor(0.0)
        assert len(torch.unique(yg[nonneg])) <= 1 and len(torch.unique(yg[~nonneg])) <= 1
        torch.testing.assert_close(yg, torch.where(nonneg, pos, neg))


@pytest.mark.parametrize(
    "shape, granularity, groups",
    [((6, 10), "per_output_unit", 6), ((4, 3, 3, 3), "per_output_unit", 4), ((13,), "per_output_unit", 1), ((6, 10), "per_tensor", 1), ((4, 3, 3, 3), "per_tensor", 1)],
)
def test_onebit_decodes_to_group_scalars(shape, granularity, groups):
    torch.manual_seed(1)
    x = torch.randn(shape)
    enc, y, stream = encode_decode(OneBit(granularity=granularity), x)
    assert len(enc.meta) == 5 + 8 * groups and len(enc.payload) == math.ceil(x.numel() / 8)
    assert struct.unpack_from("<BI", enc.meta) == (0 if granularity == "per_output_unit" else 1, groups)
    check_group_scalars(x, y, groups)
    assert stream["rel_err"] == pytest.approx(float((y - x).norm() / x.norm()), rel=1e-5)


def test_onebit_group_without_negatives_reconstructs_neg_as_zero():
    x = torch.tensor([[1.0, 2.0, 3.0], [-1.0, -2.0, 0.0]])
    _, y, _ = encode_decode(OneBit(), x)
    assert torch.equal(y, torch.tensor([[2.0, 2.0, 2.0], [-1.5, -1.5, 0.0]]))


def test_onebit_bit_packing_is_msb_first():
    x = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0])
    assert bytes(OneBit().encode(x, {}).payload) == bytes([0b10010000, 0b10000000])


def test_onebit_compresses_a_linear_weight_gradient_over_25x():
    torch.manual_seed(0)
    layer = torch.nn.Linear(784, 128)
    layer(torch.randn(32, 784)).square().mean().backward()
    grad = layer.weight.grad
    enc = OneBit().encode(grad, {})
    assert len(enc.payload) == math.ceil(784 * 128 / 8) == 12544
    ratio = len(wire.encode({"w": grad})) / len(wire.encode({"w": enc}))
    assert ratio > 25, ratio


def test_onebit_residual_is_reset_when_the_shape_changes():
    codec, stream = OneBit(), {}
    codec.encode(torch.randn(4, 8), stream)
    assert stream["residual"].shape == (4, 8)
    x = torch.randn(3, 8)
    _, y, _ = encode_decode(codec, x, stream)
    check_group_scalars(x, y, 3)  # quantised x alone, not x plus the old residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_onebit_strided_gradient_keeps_its_error_feedback(dtype):
    """A transposed gradient (a Linear weight's, out of a batched backward) encodes as its
    contiguous copy does, and so does the next one, which adds the residual: that residual was
    once written into a temporary copy and left uninitialised (AdaLearner's 1-bit runs with
    batched replicas turned to NaN)."""
    torch.manual_seed(3)
    g0, g1 = (torch.randn(24, 10, dtype=dtype).t() for _ in range(2))
    assert not g0.is_contiguous()
    strided, dense = {}, {}
    for g in (g0, g1):
        a, b = OneBit().encode(g, strided), OneBit().encode(g.contiguous(), dense)
        assert (a.meta, bytes(a.payload)) == (b.meta, bytes(b.payload))
        assert torch.equal(strided["residual"], dense["residual"])
    assert torch.isfinite(strided["residual"]).all()


def test_onebit_ef_variants():
    torch.manual_seed(2)
    g0, g1 = torch.randn(4, 8), torch.randn(4, 8)
    for variant in ("seide", "literal_eq6"):
        codec, stream = OneBit(ef_variant=variant), {}
        codec.encode(g0, stream)
        r0 = stream["residual"].clone()
        _, y, _ = encode_decode(codec, g1, stream)
        v = g1 + r0  # both variants quantise g + residual (Eq. 5) ...
        check_group_scalars(v, y, 4)
        # ... and differ in what they keep (Seide: v - Qinv; Eq. 6 as printed: g - Qinv)
        torch.testing.assert_close(stream["residual"], (v if variant == "seide" else g1) - y)


def accumulated_errors(codec, steps: int, error_feedback: bool, sender_ef_by_hand: bool = False):
    """Feed `steps` seeded random gradients through codec; returns (||sum g - sum decoded|| per
    step, ||g|| per step, the final residual)."""
    gen = torch.Generator().manual_seed(1234)
    shape = (32, 64)
    sum_g = torch.zeros(shape, dtype=torch.float64)
    sum_d = torch.zeros(shape, dtype=torch.float64)
    stream, residual = {}, torch.zeros(shape)
    acc, norms = [], []
    for _ in range(steps):
        g = torch.randn(shape, generator=gen)
        if not error_feedback:
            stream.clear()
            residual.zero_()
        v = g + residual if sender_ef_by_hand else g
        d = round_trip(codec.encode(v, stream))
        if sender_ef_by_hand:
            residual = v - d
        sum_g += g
        sum_d += d
        acc.append(float((sum_g - sum_d).norm()))
        norms.append(float(g.norm()))
    return acc, norms, stream.get("residual", residual)


def test_onebit_error_feedback_keeps_the_accumulated_error_bounded():
    acc, norms, residual = accumulated_errors(OneBit(), 1000, error_feedback=True)
    # telescoping: sum_t (g_t - decoded_t) = Delta[T] (Seide form, Delta[0] = 0)
    assert acc[-1] == pytest.approx(float(residual.norm()), rel=1e-3)
    assert all(a < 5 * n for a, n in zip(acc, norms))
    acc_no_ef, _, _ = accumulated_errors(OneBit(), 1000, error_feedback=False)
    assert acc_no_ef[-1] > 5 * acc[-1]  # a random walk: grows like sqrt(t)
    assert acc_no_ef[-1] > 10 * acc_no_ef[9]  # sqrt(1000 / 10) = 10: roughly, with slack below


def test_a_message_of_several_tensors_keeps_each_tensors_error_feedback():
    """The compressor gives every tensor of a message its own stream (AdaLearner sends a model's
    gradients as one message): the residual of a weight is not reset by its bias's shape, and
    the decoded sums telescope per tensor to 1e-4 relative."""
    from framework import registry
    from tests.conftest import compose_cfg

    registry.load_plugins()
    comp = registry.build("compressor", compose_cfg(["compressor=onebit_ef"]).compressor)
    gen = torch.Generator().manual_seed(0)
    sum_g = {"w": torch.zeros(8, 5), "b": torch.zeros(8)}
    sum_d = {"w": torch.zeros(8, 5), "b": torch.zeros(8)}
    for it in range(50):
        g = {"w": torch.randn(8, 5, generator=gen), "b": torch.randn(8, generator=gen)}
        data, _, _ = comp.encode(g, src="wn0", dst="go", tag="grad", iteration=it)
        d = comp.decode(data, src="wn0", dst="go", tag="grad").tensors
        for k in g:
            sum_g[k] += g[k]
            sum_d[k] += d[k]
    for k, key in (("w", "grad.w"), ("b", "grad.b")):
        residual = comp.stream("wn0", "go", key)["residual"]
        assert torch.allclose(sum_g[k] - sum_d[k], residual, rtol=1e-4, atol=1e-4 * float(sum_g[k].abs().max()))
        assert float(residual.norm()) < 5 * float(sum_g[k].norm()) / 50 ** 0.5  # bounded, not a random walk


def test_minmax_with_sender_error_feedback_stays_bounded():
    acc, norms, residual = accumulated_errors(MinMax(2), 1000, error_feedback=True, sender_ef_by_hand=True)
    assert acc[-1] == pytest.approx(float(residual.norm()), rel=1e-3)
    assert all(a < 5 * n for a, n in zip(acc, norms))
    acc_no_ef, _, _ = accumulated_errors(MinMax(2), 1000, error_feedback=False, sender_ef_by_hand=True)
    assert acc_no_ef[-1] > 5 * acc[-1]


# ---- malformed input: WireError, and only WireError --------------------------------------------


def _malformed_packets():
    x = torch.randn(6, 10)
    fp16, mm, ob = FP16().encode(x, {}), MinMax(4).encode(x, {}), OneBit().encode(x, {})
    ob_head = struct.Struct("<BI")
    scalars = ob.meta[ob_head.size :]
    return {
        "fp16 truncated payload": packet_with(fp16, payload=bytes(fp16.payload)[:-1]),
        "fp16 payload too long": packet_with(fp16, payload=bytes(fp16.payload) + b"\0"),
        "fp16 with meta": packet_with(fp16, meta=b"\0"),
        "minmax truncated payload": packet_with(mm, payload=bytes(mm.payload)[:-1]),
        "minmax payload too long": packet_with(mm, payload=bytes(mm.payload) + b"\0"),
        "minmax short meta": packet_with(mm, meta=mm.meta[:-1]),
        "minmax long meta": packet_with(mm, meta=mm.meta + b"\0"),
        "minmax 3 bits": packet_with(mm, meta=struct.pack("<Bff", 3, -1.0, 1.0)),
        "minmax 0 bits": packet_with(mm, meta=struct.pack("<Bff", 0, -1.0, 1.0)),
        "minmax 32 bits": packet_with(mm, meta=struct.pack("<Bff", 32, -1.0, 1.0)),
        "minmax min > max": packet_with(mm, meta=struct.pack("<Bff", 4, 1.0, -1.0)),
        "minmax nan range": packet_with(mm, meta=struct.pack("<Bff", 4, float("nan"), 1.0)),
        "minmax inf range": packet_with(mm, meta=struct.pack("<Bff", 4, 0.0, float("inf"))),
        "onebit truncated payload": packet_with(ob, payload=bytes(ob.payload)[:-1]),
        "onebit payload too long": packet_with(ob, payload=bytes(ob.payload) + b"\0"),
        "onebit empty meta": packet_with(ob, meta=b""),
        "onebit short meta": packet_with(ob, meta=ob.meta[:-1]),
        "onebit long meta": packet_with(ob, meta=ob.meta + b"\0"),
        "onebit too few groups": packet_with(ob, meta=ob_head.pack(0, 5) + scalars[:-8]),
        "onebit too many groups": packet_with(ob, meta=ob_head.pack(0, 7) + scalars + bytes(8)),
        "onebit huge group count": packet_with(ob, meta=ob_head.pack(0, 2**32 - 1) + scalars),
        "onebit per-tensor flag with 6 groups": packet_with(ob, meta=ob_head.pack(1, 6) + scalars),
        "onebit unknown granularity": packet_with(ob, meta=ob_head.pack(2, 6) + scalars),
        "onebit given minmax meta": packet_with(ob, codec_id=OneBit.codec_id, meta=mm.meta, payload=bytes(mm.payload)),
    }


@pytest.mark.parametrize("case", list(_malformed_packets()))
def test_malformed_input_is_a_wire_error(case):
    with pytest.raises(WireError):
        wire.decode(_malformed_packets()[case])


def test_random_corruption_raises_wire_error_or_decodes():
    """Flip bytes anywhere in valid packets: decoding either works or raises WireError, never
    anything else (struct.error, ValueError, RuntimeError, MemoryError)."""
    rng = np.random.default_rng(0)
    x = torch.randn(6, 10)
    packets = [wire.encode({"x": c.encode(x, {})}) for c in (FP16(), MinMax(2), MinMax(16), OneBit(), OneBit(granularity="per_tensor"))]
    for packet in packets:
        for _ in range(200):
            bad = bytearray(packet)
            for at in rng.integers(0, len(bad), size=rng.integers(1, 4)):
                bad[at] = int(rng.integers(0, 256))
            try:
                wire.decode(bad)
            except WireError:
                pass
