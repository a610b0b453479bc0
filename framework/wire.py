"""The wire format: what crosses a link is bytes, never pickles.

A packet (version 1, little-endian):

    magic "PLAB" | version u8 | flags u8 | n_tensors u16 | iteration u32 | microbatch u32
    | weight_version u32 | then n_tensors records:
    name_len u16 | name utf-8 | codec u8 | dtype u8 | ndim u8 | shape u32 x ndim
    | meta_len u32 | meta bytes | payload_len u64 | payload

Codec 0 is raw (the tensor's bytes); compressors register other codec ids with their own
metadata. Flag bit 0 marks a timing-only packet (`runtime.numerics=false`): shapes travel,
payloads are counted but not carried. `decode` checks every field and length before it
allocates anything and raises `WireError`, and only `WireError`, on malformed input.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import torch

from framework.errors import WireError

MAGIC = b"PLAB"
VERSION = 1
FLAG_TIMING_ONLY = 1
MAX_NDIM = 8
MAX_TENSORS = 4096
MAX_ELEMENTS = 1 << 34  # 16 Gi elements: anything larger is not a tensor we sent

_HEAD = struct.Struct("<4sBBHIII")
_U16 = struct.Struct("<H")
_TENSOR_HEAD = struct.Struct("<BBB")
_U32 = struct.Struct("<I")
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
    meta: dict[str, bytes] = field(default_factory=dict)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _u32(x: int, what: str) -> int:
    if not 0 <= int(x) < 1 << 32:
        raise WireError(f"{what} {x} does not fit in u32")
    return int(x)


def encode(tensors: dict[str, torch.Tensor], *, iteration=0, microbatch=0, weight_version=0) -> bytearray:
    """Raw-codec packet of named tensors. Meta-device tensors give a timing-only packet.

    Each payload is copied exactly once, into the packet."""
    if len(tensors) > MAX_TENSORS:
        raise WireError(f"{len(tensors)} tensors in one packet (max {MAX_TENSORS})")
    timing_only = any(t.device.type == "meta" for t in tensors.values())
    heads: list[bytes] = []
    payloads: list = []
    for name, t in tensors.items():
        nb = name.encode()
        if t.dtype not in _DTYPE_ID:
            raise WireError(f"tensor {name!r}: dtype {t.dtype} has no wire id")
        if t.dim() > MAX_NDIM:
            raise WireError(f"tensor {name!r}: {t.dim()} dims (max {MAX_NDIM})")
        nbytes = t.numel() * t.element_size()
        heads.append(
            _U16.pack(len(nb)) + nb
            + _TENSOR_HEAD.pack(CODEC_RAW, _DTYPE_ID[t.dtype], t.dim())
            + struct.pack(f"<{t.dim()}I", *[_u32(d, "dimension") for d in t.shape])
            + _U32.pack(0)
            + _U64.pack(nbytes)
        )
        payloads.append(None if timing_only else t)
    parts: list = [_HEAD.pack(MAGIC, VERSION, FLAG_TIMING_ONLY if timing_only else 0, len(tensors), _u32(iteration, "iteration"), _u32(microbatch, "microbatch"), _u32(weight_version, "weight_version"))]
    for h, t in zip(heads, payloads):
        parts.append(h)
        if t is not None and t.numel():
            src = t.detach().contiguous().cpu()
            if src.dtype == torch.bfloat16:
                src = src.view(torch.int16)
            parts.append(memoryview(src.numpy()).cast("B"))  # a view: join copies it once
    return bytearray().join(parts)


def encoded_size(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes `encode` would produce with the payloads included (timing-only packets count them)."""
    n = _HEAD.size
    for name, t in tensors.items():
        n += _U16.size + len(name.encode()) + _TENSOR_HEAD.size + 4 * t.dim() + _U32.size + _U64.size
        n += t.numel() * t.element_size()
    return n


class _Reader:
    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise WireError(f"truncated packet: {what} needs {n} bytes at offset {self.pos}, {len(self.buf) - self.pos} left")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct, what: str):
        return st.unpack(self.take(st.size, what))


def decode(buf) -> Packet:
    """Parse a packet; raise WireError on anything malformed.

    Payloads are copied out into fresh tensors: views into the packet would alias the caller's
    buffer and sit at unaligned offsets, which slows CPU kernels down by a third and more."""
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
    tensors: dict[str, torch.Tensor] = {}
    for _ in range(n):
        (name_len,) = r.unpack(_U16, "name length")
        try:
            name = bytes(r.take(name_len, "name")).decode()
        except UnicodeDecodeError:
            raise WireError("tensor name is not UTF-8") from None
        if name in tensors:
            raise WireError(f"duplicate tensor name {name!r}")
        codec, dtype_id, ndim = r.unpack(_TENSOR_HEAD, "tensor header")
        if codec != CODEC_RAW:
            raise WireError(f"tensor {name!r}: unknown codec id {codec}")
        if dtype_id >= len(DTYPES):
            raise WireError(f"tensor {name!r}: unknown dtype id {dtype_id}")
        if ndim > MAX_NDIM:
            raise WireError(f"tensor {name!r}: {ndim} dims (max {MAX_NDIM})")
        shape = struct.unpack(f"<{ndim}I", r.take(4 * ndim, "shape"))
        numel = 1
        for s in shape:
            numel *= s
        if numel > MAX_ELEMENTS:
            raise WireError(f"tensor {name!r}: absurd shape {shape}")
        (meta_len,) = r.unpack(_U32, "meta length")
        r.take(meta_len, "codec metadata")  # raw tensors carry none; other codecs read theirs
        (payload_len,) = r.unpack(_U64, "payload length")
        dtype = DTYPES[dtype_id]
        if payload_len != numel * _itemsize(dtype):
            raise WireError(f"tensor {name!r}: payload of {payload_len} bytes for shape {shape} {dtype}")
        if timing_only:
            tensors[name] = torch.empty(shape, dtype=dtype, device="meta")
            continue
        raw = r.take(payload_len, "payload")
        np_dtype = np.int16 if dtype == torch.bfloat16 else _NP_DTYPE[dtype]
        t = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).copy())
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        tensors[name] = t.reshape(shape)
    if r.pos != len(r.buf):
        raise WireError(f"{len(r.buf) - r.pos} trailing bytes after the last tensor")
    return Packet(tensors, it, mb, wv, timing_only)
