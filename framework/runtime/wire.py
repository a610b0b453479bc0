"""The wire format: what crosses a link is bytes, never pickles.

A packet (version 1, little-endian):

    magic "PLAB" | version u8 | flags u8 | n_tensors u16 | iteration u32 | microbatch u32
    | weight_version u32 | then n_tensors records:
    name_len u16 | name utf-8 | codec u8 | dtype u8 | ndim u8 | shape u32 x ndim
    | meta_len u32 | meta bytes | payload_len u64 | payload

Codec 0 is raw (the tensor's bytes); other codecs (framework.codec) register their ids and
carry their own metadata; the packet names the codec, so a receiver decodes without state. Flag bit 0 marks a timing-only packet (`runtime.numerics=false`): shapes travel,
payloads are counted but not carried. `decode` checks every field and length before it
allocates anything and raises `WireError`, and only `WireError`, on malformed input.

Bounds on untrusted input, all checked in O(fields), never O(data): at most MAX_TENSORS tensors
of at most MAX_NDIM dims; the product of a shape's non-zero dims at most MAX_ELEMENTS (a zero
dim makes the element count 0, but torch's strides still multiply the others); codec metadata
at most MAX_META bytes; and the tensors a packet decodes to at most `max_bytes` in all
(MAX_DECODED_BYTES unless the caller says: runs pass `compressor.max_decoded_bytes`), checked
against the declared shape before a codec allocates anything, because a codec's output may be
64x its payload (1 bit per element decoded to float64). Timing-only tensors allocate nothing
and are not counted.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import numpy as np
import torch

from framework.codec import Encoded, decoder, numel
from framework.errors import WireError

MAGIC = b"PLAB"
VERSION = 1
FLAG_TIMING_ONLY = 1
MAX_NDIM = 8
MAX_TENSORS = 4096
MAX_ELEMENTS = 1 << 34  # 16 Gi elements: anything larger is not a tensor we sent
MAX_META = 1 << 20  # codec metadata per tensor
# Decoded bytes per packet: the default of transport.max_message_bytes, so any raw packet a
# transport accepts decodes, and a compressed one never decodes to more than a raw one could.
MAX_DECODED_BYTES = 1 << 31

_HEAD = struct.Struct("<4sBBHIII")
_U64 = struct.Struct("<Q")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
_DTYPE_ID = {d: i for i, d in enumerate(DTYPES)}
CODEC_RAW = 0
_NP_DTYPE = {d: torch.empty((), dtype=d).numpy().dtype for d in DTYPES if d != torch.bfloat16}


@dataclass
class Packet:
    tensors: dict[str, torch.Tensor]
    iteration: int = 0
    microbatch: int = 0
    weight_version: int = 0
    timing_only: bool = False


_ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in DTYPES}


@functools.lru_cache(maxsize=256)
def _tensor_head(name_len: int, ndim: int) -> struct.Struct:
    """name_len u16 | name | codec u8 | dtype u8 | ndim u8 | shape u32 x ndim | meta_len u32
    (then the meta bytes, payload_len u64 and the payload)"""
    return struct.Struct(f"<H{name_len}sBBB{ndim}II")


def _u32(x: int, what: str) -> int:
    if not 0 <= int(x) < 1 << 32:
        raise WireError(f"{what} {x} does not fit in u32")
    return int(x)


def encode(tensors: dict, *, iteration=0, microbatch=0, weight_version=0) -> bytearray:
    """A packet of named tensors. Each value is a tensor (raw codec) or an `Encoded` one (any
    codec). Meta-device tensors give a timing-only packet. Each payload is copied exactly once."""
    if len(tensors) > MAX_TENSORS:
        raise WireError(f"{len(tensors)} tensors in one packet (max {MAX_TENSORS})")
    timing_only = any((t.payload is None) if isinstance(t, Encoded) else (t.device.type == "meta") for t in tensors.values())
    parts: list = [_HEAD.pack(MAGIC, VERSION, FLAG_TIMING_ONLY if timing_only else 0, len(tensors), _u32(iteration, "iteration"), _u32(microbatch, "microbatch"), _u32(weight_version, "weight_version"))]
    for name, t in tensors.items():
        nb = name.encode()
        if isinstance(t, Encoded):
            codec_id, dtype, shape, meta, payload = t.codec_id, t.dtype, tuple(t.shape), t.meta, t.payload
        else:
            codec_id, dtype, shape, meta, payload = CODEC_RAW, t.dtype, tuple(t.shape), b"", None
        dtype_id = _DTYPE_ID.get(dtype)
        if dtype_id is None:
            raise WireError(f"tensor {name!r}: dtype {dtype} has no wire id")
        if len(shape) > MAX_NDIM or len(nb) >= 1 << 16 or (shape and max(shape) >= 1 << 32) or len(meta) > MAX_META:
            raise WireError(f"tensor {name!r}: shape {shape}, name or metadata does not fit the wire format")
        if codec_id == CODEC_RAW:
            nbytes = numel(shape) * _ITEMSIZE[dtype]
        else:
            nbytes = len(payload) if payload is not None else 0
        parts.append(_tensor_head(len(nb), len(shape)).pack(len(nb), nb, codec_id, dtype_id, len(shape), *shape, len(meta)))
        parts.append(meta)
        parts.append(_U64.pack(nbytes))
        if timing_only:
            continue
        if codec_id == CODEC_RAW:
            if t.numel():
                src = t.detach().contiguous().cpu()
                if src.dtype == torch.bfloat16:
                    src = src.view(torch.int16)
                parts.append(memoryview(src.numpy()).cast("B"))  # a view: join copies it once
        else:
            parts.append(payload)
    return bytearray().join(parts)


def encoded_size(tensors: dict) -> int:
    """Bytes `encode` would produce with the payloads included (timing-only packets count them)."""
    n = _HEAD.size
    for name, t in tensors.items():
        if isinstance(t, Encoded):
            n += _tensor_head(len(name.encode()), len(t.shape)).size + len(t.meta) + _U64.size + len(t.payload)
        else:
            n += _tensor_head(len(name.encode()), t.dim()).size + _U64.size + t.numel() * _ITEMSIZE[t.dtype]
    return n


class _Reader:
    def __init__(self, buf):
        self.buf = memoryview(buf)
        self.pos = 0

    def need(self, n: int, what: str) -> int:
        """Claim n bytes at the cursor; returns their offset."""
        pos = self.pos
        if n < 0 or pos + n > len(self.buf):
            raise WireError(f"truncated packet: {what} needs {n} bytes at offset {pos}, {len(self.buf) - pos} left")
        self.pos = pos + n
        return pos

    def unpack(self, st: struct.Struct, what: str):
        return st.unpack_from(self.buf, self.need(st.size, what))


_NAME_LEN = struct.Struct("<H")
_TENSOR_FIXED = struct.Struct("<BBB")
_META_LEN = struct.Struct("<I")


def decode(buf, *, copy: bool = True, max_bytes: int = MAX_DECODED_BYTES) -> Packet:
    """Parse a packet; raise WireError on anything malformed, or if its tensors would take more
    than `max_bytes` once decoded.

    Payloads are copied out into fresh tensors. With `copy=False` and a bytearray packet the
    tensors are views into it instead: only for a caller that owns the buffer and drops it (the
    simulator's in-process links), since the views alias it."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise WireError(f"a packet is bytes, not {type(buf).__name__}")
    r = _Reader(buf)
    magic, version, flags, n, it, mb, wv = r.unpack(_HEAD, "header")
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise WireError(f"unsupported wire version {version} (this build reads {VERSION})")
    if flags & ~FLAG_TIMING_ONLY:
        raise WireError(f"unknown flags {flags:#x}")
    if n > MAX_TENSORS:
        raise WireError(f"{n} tensors in one packet (max {MAX_TENSORS})")
    timing_only = bool(flags & FLAG_TIMING_ONLY)
    views = not copy and isinstance(buf, bytearray)
    tensors: dict[str, torch.Tensor] = {}
    decoded = 0
    for _ in range(n):
        (name_len,) = r.unpack(_NAME_LEN, "name length")
        at = r.need(name_len, "name")
        try:
            name = bytes(r.buf[at : at + name_len]).decode()
        except UnicodeDecodeError:
            raise WireError("tensor name is not UTF-8") from None
        if name in tensors:
            raise WireError(f"duplicate tensor name {name!r}")
        codec, dtype_id, ndim = r.unpack(_TENSOR_FIXED, "tensor header")
        if codec != CODEC_RAW:
            codec_cls = decoder(codec)  # WireError for an unknown id
        if dtype_id >= len(DTYPES):
            raise WireError(f"tensor {name!r}: unknown dtype id {dtype_id}")
        if ndim > MAX_NDIM:
            raise WireError(f"tensor {name!r}: {ndim} dims (max {MAX_NDIM})")
        shape = struct.unpack_from(f"<{ndim}I", r.buf, r.need(4 * ndim, "shape"))
        n_el = span = 1
        for d in shape:
            n_el *= d
            span *= d or 1  # torch multiplies the other dims into strides even when one is 0
        if span > MAX_ELEMENTS:
            raise WireError(f"tensor {name!r}: absurd shape {shape}")
        dtype = DTYPES[dtype_id]
        if not timing_only:
            decoded += n_el * _ITEMSIZE[dtype]
            if decoded > max_bytes:
                raise WireError(f"tensor {name!r}: shape {shape} {dtype} takes the packet to {decoded} decoded bytes, over its bound of {max_bytes} (compressor.max_decoded_bytes)")
        (meta_len,) = r.unpack(_META_LEN, "meta length")
        if meta_len > MAX_META:
            raise WireError(f"tensor {name!r}: {meta_len} bytes of codec metadata (max {MAX_META})")
        meta_at = r.need(meta_len, "codec metadata")
        (payload_len,) = r.unpack(_U64, "payload length")
        if payload_len > n_el * 8 + MAX_META:  # no codec spends more than 8 bytes per element
            raise WireError(f"tensor {name!r}: payload of {payload_len} bytes for shape {shape} {dtype}")
        if codec == CODEC_RAW and payload_len != n_el * _ITEMSIZE[dtype]:
            raise WireError(f"tensor {name!r}: payload of {payload_len} bytes for shape {shape} {dtype}")
        if timing_only:
            tensors[name] = torch.empty(shape, dtype=dtype, device="meta")
            continue
        at = r.need(payload_len, "payload")
        if codec != CODEC_RAW:
            out = codec_cls.decode(bytes(r.buf[meta_at : meta_at + meta_len]), r.buf[at : at + payload_len], shape, dtype)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape):
                raise WireError(f"tensor {name!r}: codec {codec_cls.name} rebuilt the wrong shape")
            tensors[name] = out
            continue
        np_dtype = np.int16 if dtype == torch.bfloat16 else _NP_DTYPE[dtype]
        arr = np.frombuffer(r.buf, dtype=np_dtype, count=n_el, offset=at)
        t = torch.from_numpy(arr if views else arr.copy())
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        tensors[name] = t.reshape(shape)
    if r.pos != len(r.buf):
        raise WireError(f"{len(r.buf) - r.pos} trailing bytes after the last tensor")
    return Packet(tensors, it, mb, wv, timing_only)
