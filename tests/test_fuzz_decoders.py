"""Untrusted bytes through the wire decoder (and the codecs it dispatches to) and the control
decoder: hostile lengths, shapes, counts and JSON raise WireError, and only WireError; what decodes
stays within the decoded-size bound; a malformed control message is counted, never fatal."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import struct
import time

import pytest
import torch
from omegaconf import OmegaConf

from framework.codec import Encoded, codec_class, codec_names
from framework.compression import Compressor
from framework.errors import WireError
from framework.runtime import wire
from framework.runtime.control import COORDINATOR, CTL, SCHEMA, TO_COORDINATOR, ctl_pack, ctl_unpack
from framework.runtime.transport import Mailboxes, Network, Transport
from framework.specs import RoleSpec
from framework.timeline import Timeline

N_INPUTS = int(os.environ.get("PIPELAB_FUZZ_N", 10_000))  # per decoder
BOUND = 1 << 20  # the fuzzed decoder's decoded-size bound: every valid packet below is smaller
HOSTILE = (0, 1, 2, 255, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1)
HOSTILE_F32 = (math.nan, math.inf, -math.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-45)


# ---- valid packets to start from -------------------------------------------------------------


def _valid_packets() -> list[bytes]:
    g = torch.Generator().manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool, torch.uint8):
        x = torch.randn(3, 5, generator=g).to(dtype)
        out.append(bytes(wire.encode({"x": x, "y": torch.arange(4)}, iteration=7, microbatch=2)))
    out.append(bytes(wire.encode({"s": torch.tensor(1.5), "e": torch.zeros(0, 3)})))
    out.append(bytes(wire.encode({"m": torch.empty(4, 8, device="meta")})))  # timing only
    for name in codec_names():
        cls = codec_class(name)
        for bits in cls.bits_choices or (16,):
            for shape in ((16, 4, 2), (3, 5), (1, 9), (7,)):
                codec = cls(bits=bits)
                enc = codec.encode(torch.randn(shape, generator=g), {"seed": 1})
                out.append(bytes(wire.encode({"x": enc, "y": torch.arange(3)})))
        meta_n, _ = cls(bits=(cls.bits_choices or (16,))[0]).wire_size((4, 4))
        out.append(bytes(wire.encode({"x": Encoded(cls.codec_id, torch.float32, (4, 4), b"\0" * meta_n, None)})))
    return out


def _fields(buf: bytes) -> list[tuple[int, str]]:
    """(offset, struct format) of every count, length, shape, codec, dtype and metadata field."""
    fields = [(6, "<H"), (8, "<I"), (12, "<I"), (16, "<I")]
    pos, n = wire._HEAD.size, struct.unpack_from("<H", buf, 6)[0]
    timing = buf[5] & wire.FLAG_TIMING_ONLY
    for _ in range(n):
        fields.append((pos, "<H"))
        pos += 2 + struct.unpack_from("<H", buf, pos)[0]
        fields += [(pos, "<B"), (pos + 1, "<B"), (pos + 2, "<B")]
        ndim = buf[pos + 2]
        pos += 3
        fields += [(pos + 4 * i, "<I") for i in range(ndim)]
        pos += 4 * ndim
        fields.append((pos, "<I"))
        meta_len = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        fields += [(pos, "<B")] + [(pos + j, f) for j in range(1, meta_len - 3, 4) for f in ("<I", "<f")]
        pos += meta_len
        fields.append((pos, "<Q"))
        payload = struct.unpack_from("<Q", buf, pos)[0]
        pos += 8 + (0 if timing else payload)
    assert pos == len(buf)
    return fields


PACKETS = _valid_packets()
FIELDS = [_fields(p) for p in PACKETS]


def _set(buf: bytearray, at: int, fmt: str, value) -> None:
    if at + struct.calcsize(fmt) > len(buf):  # cut short by an earlier mutation
        return
    if fmt == "<f":
        struct.pack_into(fmt, buf, at, value)
    else:
        struct.pack_into(fmt, buf, at, int(value) & ((1 << (8 * struct.calcsize(fmt))) - 1))


def _byte_op(rng: random.Random, buf: bytearray, insert=(b"\0", b"\xff")) -> None:
    op = rng.randrange(3)
    if op == 0 and buf:
        buf[rng.randrange(len(buf))] ^= rng.randrange(1, 256)
    elif op == 1:
        del buf[rng.randrange(len(buf) + 1) :]
    else:
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = rng.choice(insert) if rng.random() < 0.5 else rng.randbytes(rng.randrange(1, 9))


def _mutated_packet(rng: random.Random) -> bytes:
    """A valid packet with 1-3 of: a count, length, shape, codec, dtype or metadata field set to a
    hostile value (most of the time), a flipped byte, a cut, an insertion."""
    i = rng.randrange(len(PACKETS))
    buf, fields = bytearray(PACKETS[i]), FIELDS[i]
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.6:
            at, fmt = rng.choice(fields)
            value = rng.choice(HOSTILE_F32) if fmt == "<f" else rng.choice(HOSTILE) if rng.random() < 0.8 else rng.getrandbits(64)
            _set(buf, at, fmt, value)
        else:
            _byte_op(rng, buf)
    return bytes(buf)


def _forged_packet(rng: random.Random) -> bytes:
    """A header built field by field: any codec and dtype id, any rank, hostile dims, short bodies."""
    timing = rng.random() < 0.3
    ndim = rng.randrange(wire.MAX_NDIM + 2)
    shape = [rng.choice((0, 1, 3, 8, 64, 2**31 - 1, 2**31, 2**32 - 1)) for _ in range(ndim)]
    meta, payload = rng.randbytes(rng.randrange(25)), rng.randbytes(rng.randrange(65))
    payload_len = len(payload) if rng.random() < 0.5 else rng.choice(HOSTILE)
    head = wire._HEAD.pack(wire.MAGIC, wire.VERSION, timing, 1, 0, 0, 0)
    t = struct.pack("<H", 1) + b"x" + struct.pack("<BBB", rng.randrange(10), rng.randrange(12), ndim)
    t += struct.pack(f"<{ndim}I", *shape) + struct.pack("<I", len(meta)) + meta + struct.pack("<Q", payload_len)
    return head + t + (b"" if timing else payload)


def _fuzz(make, check, seed: int) -> None:
    """N_INPUTS inputs from a seeded generator (PIPELAB_FUZZ_N and PIPELAB_FUZZ_SEED fuzz longer
    or elsewhere); a failure names the input that caused it."""
    rng = random.Random(int(os.environ.get("PIPELAB_FUZZ_SEED", seed)))
    for k in range(N_INPUTS):
        item = make(rng)
        try:
            check(item)
        except Exception as e:
            raise AssertionError(f"input {k} raised {type(e).__name__}: {e}\n{repr(item)[:400]}") from e


def _decode_checked(data: bytes) -> None:
    try:
        packet = wire.decode(data, max_bytes=BOUND)
    except WireError:
        return
    decoded = sum(t.numel() * t.element_size() for t in packet.tensors.values() if t.device.type != "meta")
    assert decoded <= BOUND
    assert all((t.device.type == "meta") == packet.timing_only for t in packet.tensors.values())


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # a hostile scale may make inf: a value, not an error
def test_wire_decode_raises_only_wire_error_and_stays_bounded():
    _fuzz(lambda rng: _forged_packet(rng) if rng.random() < 0.25 else _mutated_packet(rng), _decode_checked, seed=13)


def test_the_valid_packets_decode_before_mutation():
    for p in PACKETS:
        wire.decode(p, max_bytes=BOUND)


# ---- regressions --------------------------------------------------------------------------------


def _one_tensor(codec: int, dtype: int, shape: tuple, meta: bytes = b"", payload: bytes = b"", payload_len=None, timing=False) -> bytes:
    head = wire._HEAD.pack(wire.MAGIC, wire.VERSION, wire.FLAG_TIMING_ONLY if timing else 0, 1, 0, 0, 0)
    t = struct.pack("<H", 1) + b"x" + struct.pack("<BBB", codec, dtype, len(shape)) + struct.pack(f"<{len(shape)}I", *shape)
    t += struct.pack("<I", len(meta)) + meta + struct.pack("<Q", len(payload) if payload_len is None else payload_len)
    return head + t + (b"" if timing else payload)


@pytest.mark.parametrize("codec", [0, 1, 6])
@pytest.mark.parametrize("timing", [False, True])
def test_a_zero_dim_does_not_let_huge_dims_overflow(codec, timing):
    """Shape (0, 2^32-1, 2^32-1, 2^32-1) has 0 elements, but torch's strides overflow (it once
    escaped as `RuntimeError: Storage size calculation overflowed`)."""
    with pytest.raises(WireError, match="absurd shape"):
        wire.decode(_one_tensor(codec, 0, (0, 2**32 - 1, 2**32 - 1, 2**32 - 1), timing=timing))
    packet = wire.decode(_one_tensor(codec, 0, (0, 3, 5), meta=b"" if codec != 6 else struct.pack("<BI", 0, 0), timing=timing))
    assert packet.tensors["x"].shape == (0, 3, 5)  # an empty tensor with sane dims still travels


def _onebit_packet(n: int) -> bytes:
    """A well-formed per-tensor 1-bit packet of n float32 elements: n/8 payload bytes."""
    return _one_tensor(6, 0, (n,), meta=struct.pack("<BIff", 1, 1, 1.0, -1.0), payload=bytes(-(-n // 8)))


def test_a_one_bit_packet_cannot_decode_past_the_bound(monkeypatch):
    from plugins.compressors.ef_codecs import OneBit

    data = _onebit_packet(1 << 27)  # 16 MiB on the wire, 512 MiB as float32 (32x)
    assert len(data) < (16 << 20) + 100

    def never(*a, **k):
        raise AssertionError("the codec ran: the bound must be checked before it allocates")

    monkeypatch.setattr(OneBit, "decode", classmethod(never))
    with pytest.raises(WireError, match=r"536870912 decoded bytes, over its bound of 268435456 \(compressor.max_decoded_bytes\)"):
        wire.decode(data, max_bytes=256 << 20)
    # a header alone claiming 2^32-1 float64 elements meets the default bound before its payload is read
    with pytest.raises(WireError, match="over its bound"):
        wire.decode(_one_tensor(6, 1, (2**32 - 1,), meta=struct.pack("<BIff", 1, 1, 1.0, -1.0), payload_len=2**29))


def test_the_bound_comes_from_compressor_max_decoded_bytes():
    cfg = OmegaConf.create({"name": "onebit_ef", "backward": {"codec": "onebit", "bits": 1, "schedule": [], "options": {}}, "max_decoded_bytes": 4096})
    comp = Compressor(cfg)
    small, big = torch.randn(32, 32), torch.randn(33, 32)  # 4096 and 4224 bytes as float32
    for x, ok in ((small, True), (big, False)):
        data, _, _ = comp.encode({"x": x}, src="a", dst="b", tag="grad")
        if ok:
            assert comp.decode(data, src="a", dst="b", tag="grad").tensors["x"].shape == x.shape
        else:
            with pytest.raises(WireError, match="4224 decoded bytes, over its bound of 4096"):
                comp.decode(data, src="a", dst="b", tag="grad")
    assert Compressor(OmegaConf.create({"name": "none"})).max_decoded_bytes == wire.MAX_DECODED_BYTES == 1 << 31
    from framework.errors import ConfigError

    with pytest.raises(ConfigError, match="compressor.max_decoded_bytes"):
        Compressor(OmegaConf.create({"name": "none", "max_decoded_bytes": 0}))


@pytest.mark.parametrize("name,bits,per_byte", [("mbq", 4, 8), ("mbq", 1, 8), ("stochastic_uniform", 2, 4), ("stochastic_uniform", 4, 2)])
def test_packing_codecs_decode_few_rows_without_padded_scratch(name, bits, per_byte):
    """Rows packed several per byte: a tensor with fewer rows than a byte holds decodes without
    scratch for the padding rows (it was up to 8x the output), to the same values as the padded
    tensor the same bytes describe."""
    cls = codec_class(name)
    for rows in (0, 1, 3, 7, 8, 9, 17):
        x = torch.randn(rows, 5, 3)
        enc = cls(bits=bits).encode(x, {"seed": 3})
        got = cls.decode(enc.meta, memoryview(enc.payload), enc.shape, enc.dtype)
        padded = -(-rows // per_byte) * per_byte
        full = cls.decode(enc.meta, memoryview(enc.payload), (padded, 5, 3), enc.dtype)
        assert got.shape == x.shape and torch.equal(got, full[:rows])
        if rows:
            assert got.abs().sum() > 0  # a reconstruction, not zeros


# ---- the control decoder ------------------------------------------------------------------------


def _interval_c():
    return ["c", "stage0", "fwd", 0.5, 0.75, 3, 1, 0]


def _interval_t():
    return ["t", "dev0->dev1", 0.5, 0.9, 1024, 3, 1, "send", 4096]


VALID_HEADERS = [
    {"kind": "setup", "config": {"train": {"epochs": 2, "lr": 0.1}, "model": {"name": "mlp"}}, "plan": {"stages": [[0, 2], [2, 4]]}, "specs": {"stage0": {"role": "stage0", "device": "dev0"}}, "run_id": "r1"},
    {"kind": "start", "t_ref": 1712345678.25},
    {"kind": "go", "epoch": 3, "t": 4.5},
    {"kind": "built"},
    {"kind": "it", "epoch": 0, "iteration": 5, "samples": 32, "now": 1.25},
    {"kind": "train", "loss_sum": 2.5, "correct": 7, "n": 16},
    {"kind": "epoch", "epoch": 1, "now": 3.5, "timeline": [_interval_c(), _interval_t()]},
    {"kind": "result", "timeline": [_interval_t(), _interval_c()], "stats": {"dropped": 0, "lost": 1}, "role_stats": {"peak_inflight": 2}, "process": {"joined_s": 0.5}, "end": 9.0},
    {"kind": "error", "traceback": "Traceback (most recent call last):\n  ...\nValueError: boom\n"},
]
BODY = bytes(wire.encode({"w": torch.randn(3, 2), "b": torch.zeros(2)}))
MESSAGES = [ctl_pack(h) for h in VALID_HEADERS] + [ctl_pack(VALID_HEADERS[0], {"w": torch.randn(3, 2)}), ctl_pack(VALID_HEADERS[6], {"b": torch.ones(2)})]


def _consume(header: dict, tensors) -> None:
    """What the coordinator and a role read of an accepted message (framework.runtime.local and
    role_process): none of it may fail on a header the decoder let through."""
    h = header
    kind = h["kind"]
    if kind in ("epoch", "result"):
        tl = Timeline()
        for iv in h["timeline"]:
            (tl.compute if iv[0] == "c" else tl.transfer)(*iv[1:])
        tl.role_stats(1.0), tl.link_stats(), tl.has_flushes()
    if kind == "it":
        f"{h['now']:.3g}", h["epoch"] + h["iteration"] + h["samples"]
    elif kind == "train":  # the job's accumulators (framework.job on_train, then on_iteration)
        acc = [0.0, 0, 0]
        acc[0] += h["loss_sum"]
        acc[1] += h["correct"]
        acc[2] += h["n"]
        if acc[2]:
            acc[0] / acc[2], acc[1] / acc[2]
    elif kind == "result":
        0 + h["stats"].get("lost", 0) + h["stats"].get("dropped", 0), max([h["end"], 0.0]), dict(h["process"]), dict(h["role_stats"])
    elif kind == "error":
        f"role x failed:\n{h['traceback'].rstrip()}"
    elif kind == "start":
        time.time() - h["t_ref"]
    elif kind == "go":
        max(h["t"] - 1.0, 0.0) + h["epoch"]  # the role sleeps until t
    elif kind == "setup":
        dict(h["config"]), dict(h["plan"]), dict(h["specs"]), str(h["run_id"])
    assert tensors is None or all(isinstance(t, torch.Tensor) for t in tensors.values())


def _json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth >= 3 or r < 0.6:
        return rng.choice((None, True, False, 0, -1, 2**31 - 1, 2**63 - 1, 2**64, -(2**70), 10**400, 0.5, -1e300, math.nan, math.inf, -math.inf,
                           "", "x" * rng.randrange(40), "lost", *SCHEMA, *_FIELD_NAMES))
    if r < 0.8:
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(("kind", *_FIELD_NAMES, "")): _json_value(rng, depth + 1) for _ in range(rng.randrange(4))}


_FIELD_NAMES = sorted({f for fields in SCHEMA.values() for f in fields})


def _deep(depth: int, opener: str = "[") -> str:
    """JSON text nested `depth` deep (json.dumps would recurse to write it)."""
    return "[" * depth + "]" * depth if opener == "[" else '{"a":' * depth + "1" + "}" * depth


def _same_type(rng: random.Random, v):
    """A hostile value of v's JSON type: what a schema check lets through to the receiver."""
    if type(v) is int:
        return rng.choice((0, -1, 2**31 - 1, 2**63 - 1, 2**64, -(2**70), 10**400))
    if type(v) is float:
        return rng.choice((math.nan, math.inf, -math.inf, -0.0, 1e308, -1e308, 5e-324))
    if type(v) is str:
        return rng.choice(("", "x" * 5000, "\0", "c", "t", "\u2028"))
    if type(v) is list:
        return [x if rng.random() < 0.5 else _same_type(rng, x) for x in v] if rng.random() < 0.7 else []
    if type(v) is dict:
        return rng.choice(({}, {"lost": 2**63, "dropped": -1}, {k: _same_type(rng, x) for k, x in v.items()}))
    return v


def _mutated_header(rng: random.Random) -> str:
    """A valid header's JSON with a field given a hostile value of its type or of another type,
    dropped or nested deep, its kind changed, an interval broken, or the whole header replaced."""
    h = json.loads(json.dumps(rng.choice(VALID_HEADERS)))
    for _ in range(rng.randint(1, 2)):
        op = rng.choice(("retype", "retype", "set", "drop", "kind", "interval", "deep", "whole"))
        keys = sorted(h) if isinstance(h, dict) else []
        if op == "retype" and len(keys) > 1:
            k = rng.choice([k for k in keys if k != "kind"])
            h[k] = _same_type(rng, h[k])
        elif op == "set" and keys:
            h[rng.choice(keys)] = _json_value(rng)
        elif op == "drop" and keys:
            del h[rng.choice(keys)]
        elif op == "kind" and isinstance(h, dict):
            h["kind"] = rng.choice((*SCHEMA, "lost", "", "KIND", _json_value(rng)))
        elif op == "interval" and isinstance(h, dict) and isinstance(h.get("timeline"), list) and h["timeline"] and isinstance(h["timeline"][0], list):
            iv = h["timeline"][0]
            if iv and rng.random() < 0.5:
                iv[rng.randrange(len(iv))] = _json_value(rng)
            else:
                del iv[rng.randrange(len(iv) + 1) :]
        elif op == "deep" and keys:
            h[rng.choice(keys)] = "@@deep@@"
            deep = _deep(rng.choice((30, 31, 32, 33, 64, 1000, 100_000)), rng.choice("[{"))
            return json.dumps(h, allow_nan=True).replace('"@@deep@@"', deep)
        elif op == "whole":
            h = _json_value(rng)
    return json.dumps(h, allow_nan=True)


def _control_message(rng: random.Random) -> bytes:
    if rng.random() < 0.4:  # bytes: flips, cuts, stray brackets and quotes, hostile header lengths
        buf = bytearray(rng.choice(MESSAGES))
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.3:
                _set(buf, 0, "<I", rng.choice(HOSTILE) if rng.random() < 0.5 else rng.randrange(len(buf) + 1))
            else:
                _byte_op(rng, buf, (b"[", b"{", b"]", b'"', b"\\", b"\xff", b"\0", b"9" * 20))
        return bytes(buf)
    head = _mutated_header(rng).encode()
    body = rng.choice((b"", BODY, BODY[:-3], b"PLAB\x01"))
    return struct.pack("<I", len(head)) + head + body


def _unpack_checked(item: tuple[bytes, tuple]) -> None:
    data, kinds = item
    try:
        header, tensors = ctl_unpack(data, kinds)
    except WireError:
        return
    assert header["kind"] in kinds and set(SCHEMA[header["kind"]]) <= set(header)
    _consume(header, tensors)


def test_ctl_unpack_raises_only_wire_error():
    receivers = (TO_COORDINATOR, ("go",), ("setup",), ("start",))  # as the coordinator and a role call it
    _fuzz(lambda rng: (_control_message(rng), tuple(SCHEMA) if rng.random() < 0.6 else rng.choice(receivers)), _unpack_checked, seed=31)


def test_every_valid_control_message_round_trips():
    for h in VALID_HEADERS:
        assert ctl_unpack(ctl_pack(h))[0] == h
    header, tensors = ctl_unpack(MESSAGES[-2])
    assert header == VALID_HEADERS[0] and tensors["w"].shape == (3, 2)


@pytest.mark.parametrize("opener", ["[", "{"])
def test_deep_json_is_rejected_in_well_under_a_second(opener):
    """100,000 levels once left the coordinator and every worker idle for minutes."""
    head = ('{"kind": "it", "epoch": ' + _deep(100_000, opener) + "}").encode()
    data = struct.pack("<I", len(head)) + head
    t0 = time.perf_counter()
    with pytest.raises(WireError, match="nests deeper than"):
        ctl_unpack(data, TO_COORDINATOR)
    assert time.perf_counter() - t0 < 0.2
    # brackets inside strings are text, not nesting
    text = {"kind": "error", "traceback": "[" * 5000 + '\\"{' * 100}
    assert ctl_unpack(ctl_pack(text))[0] == text


def test_forged_kinds_and_fields_are_wire_errors_not_key_errors():
    for header in ({"kind": "it"}, {"kind": "lost"}, {"kind": "go", "epoch": True}, {"kind": "error", "traceback": 5}, {"kind": ["it"]},
                   {"kind": "epoch", "epoch": 0, "now": 1.0, "timeline": [["c", "s", "fwd", "soon", 1.0, 0, 0, 0]]}, ["kind"]):
        head = json.dumps(header).encode()
        with pytest.raises(WireError):
            ctl_unpack(struct.pack("<I", len(head)) + head, TO_COORDINATOR)
    with pytest.raises(WireError, match="expected go"):
        ctl_unpack(ctl_pack({"kind": "setup", "config": {}, "plan": {}, "specs": {}, "run_id": "r"}), ("go",))
    with pytest.raises(WireError, match="field 'epoch'"):  # the sender finds out first
        ctl_pack({"kind": "it", "iteration": 1, "samples": 2, "now": 0.1})


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_non_finite_numbers_are_wire_errors(text):
    """Python's json reads NaN, Infinity and 1e999 (as inf): a time or a loss of that would
    poison every sum and maximum the coordinator takes; each numeric field the receiver reads
    must be finite, inside a timeline too."""
    heads = ['{"kind": "it", "epoch": 0, "iteration": 1, "samples": 2, "now": %s}',
             '{"kind": "train", "loss_sum": %s, "correct": 1, "n": 2}',
             '{"kind": "go", "epoch": 1, "t": %s}',
             '{"kind": "start", "t_ref": %s}',
             '{"kind": "epoch", "epoch": 0, "now": 1.0, "timeline": [["c", "dev0", "fwd", 0.5, %s, 0, 0, 0]]}',
             '{"kind": "result", "timeline": [], "stats": {}, "role_stats": {}, "process": {}, "end": %s}']
    for head in heads:
        data = (head % text).encode()
        with pytest.raises(WireError, match="missing or malformed"):
            ctl_unpack(struct.pack("<I", len(data)) + data)
    with pytest.raises(WireError):  # the sender finds out first
        ctl_pack({"kind": "it", "epoch": 0, "iteration": 1, "samples": 2, "now": float(text)})


@pytest.mark.parametrize("header", [
    {"kind": "it", "epoch": -1, "iteration": 1, "samples": 2, "now": 0.5},
    {"kind": "it", "epoch": 0, "iteration": 1, "samples": -2, "now": 0.5},
    {"kind": "go", "epoch": -3, "t": 1.0},
    {"kind": "train", "loss_sum": 1.0, "correct": -1, "n": 2},
    {"kind": "train", "loss_sum": 1.0, "correct": 3, "n": 2},  # more right than seen
    {"kind": "epoch", "epoch": 0, "now": 1.0, "timeline": [["c", "dev0", "fwd", 0.5, 0.6, -2, 0, 0]]},
    {"kind": "epoch", "epoch": 0, "now": 1.0, "timeline": [["t", "dev0->dev1", 0.5, 0.6, -10, 0, 0, "send", None]]},
    {"kind": "epoch", "epoch": 0, "now": 1.0, "timeline": [["t", "dev0->dev1", 0.5, 0.6, 10, 0, 0, "send", -1]]},
], ids=["epoch", "samples", "go_epoch", "correct", "correct_over_n", "interval_index", "bytes", "raw_bytes"])
def test_numbers_out_of_their_range_are_wire_errors(header):
    head = json.dumps(header).encode()
    with pytest.raises(WireError, match=f"control message {header['kind']!r}"):
        ctl_unpack(struct.pack("<I", len(head)) + head)
    with pytest.raises(WireError):
        ctl_pack(header)
    # the same message in range passes: none (-1) is an interval's index, and correct == n
    assert ctl_unpack(ctl_pack({"kind": "train", "loss_sum": 0.0, "correct": 2, "n": 2}))[0]["correct"] == 2
    assert ctl_unpack(ctl_pack({"kind": "epoch", "epoch": 0, "now": 1.0, "timeline": [["c", "dev0", "step", 0.5, 0.6, -1, -1, -1]]}))


# ---- rejections are counted, and the run goes on ---------------------------------------------------


class _FakeTransport(Transport):
    """An in-memory endpoint. `script[tag]`: what arrives for the coordinator from stage0 when the
    coordinator sends `tag` (forged messages first, then the real one)."""

    def __init__(self, script: dict | None = None):
        super().__init__()
        self.box, self.script, self.sent = Mailboxes(), script or {}, []

    async def start(self, run_id, role):
        pass

    def on_status(self, cb):
        cb("stage0", "ready")

    async def flush(self):
        pass

    async def publish_status(self, state):
        pass

    async def send(self, dst, tag, data):
        self.sent.append((dst, tag, ctl_unpack(data)[0]["kind"]))
        for msg in self.script.get(tag, ()):
            self.box.put("stage0", CTL, msg)

    async def recv(self, src, tag, timeout=None):
        return await self.box.get(src, tag, timeout)

    async def close(self):
        pass


def _raw(head: bytes) -> bytes:
    return struct.pack("<I", len(head)) + head


FORGED = [b"\xff", struct.pack("<I", 2**32 - 1), _raw(b"{"), _raw(b'{"kind": "it"}'), _raw(b'{"kind": "lost"}'), _raw(b'{"kind": "result"}'),
          _raw(b'{"kind": "error", "traceback": 5}'), _raw(b'{"kind": "built", "x": ' + _deep(100_000).encode() + b"}")]


@pytest.mark.slow  # a real run fed malformed control messages (about 10 s); the decoders' fuzzing stays fast
def test_the_coordinator_counts_malformed_control_messages_and_finishes():
    from framework.runtime.local import LocalConfig, RemoteRuntime

    result = {"kind": "result", "timeline": [_interval_c()], "stats": {"dropped": 0, "lost": 0}, "role_stats": {}, "process": {"joined_s": 0.1}, "end": 2.5}
    t = _FakeTransport({"setup": [*FORGED, ctl_pack({"kind": "built"})], "start": [*FORGED, ctl_pack(result)]})

    class Net(Network):
        open = close = lambda self, *a, **k: None
        endpoint = lambda self, *a, **k: t
        worker_args = lambda self, *a, **k: []

    class Sched:
        role_devices = staticmethod(lambda: {"stage0": "dev0"})
        optional_roles = staticmethod(lambda: set())
        plan = staticmethod(lambda: {})
        role_spec = staticmethod(lambda role: RoleSpec(role=role, device="dev0"))  # shipped in the setup message
        ctx = type("Ctx", (), {"model": torch.nn.Linear(2, 1)})

    rt = RemoteRuntime(LocalConfig(name="remote", run_id="rfuzz", tune_malloc=False, join_timeout_s=5), None, None, network=Net(), run_config=OmegaConf.create({}))
    assert rt.run(Sched()) == 2.5
    assert [k for _, _, k in t.sent] == ["setup", "start"]
    assert rt.process_stats["stage0"] == {"joined_s": 0.1}
    assert rt.process_stats[COORDINATOR]["rejected_control"] == 2 * len(FORGED)


def test_a_role_skips_and_counts_malformed_control_messages():
    from framework.runtime.role_process import recv_ctl

    t = _FakeTransport()
    for msg in [*FORGED, ctl_pack({"kind": "start", "t_ref": 1.0}), ctl_pack({"kind": "go", "epoch": 2, "t": 1.5})]:
        t.box.put(COORDINATOR, "go", msg)
    counts = {"rejected_control": 0}
    header, _ = asyncio.run(recv_ctl(t, "go", counts, "stage0"))
    assert header == {"kind": "go", "epoch": 2, "t": 1.5} and counts["rejected_control"] == len(FORGED) + 1  # a `start` on the go tag is rejected too
