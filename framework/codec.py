"""Tensor codecs: how one tensor becomes (metadata, payload) bytes on the wire, and back.

A codec is one direction of a compressor (activations forward, or gradients backward). Its
`encode` may keep per-stream state (MBQ's smoothed alpha, an error-feedback residual) in the
`stream` dict the compressor hands it: one dict per (src, dst, tag) stream, reset with
`stream.clear()` when the codec's schedule says so. `decode` is a classmethod and must be pure:
the wire decoder dispatches on the codec id alone, so a receiver needs no sender state.

`decode` receives untrusted bytes: it checks the metadata and the payload length against the
shape before it allocates anything and raises `WireError` on any mismatch. The shape itself is
already bounded when `decode` is called: the wire decoder checks the output it declares
(numel x the dtype's size) against the packet's decoded-size bound (`compressor.max_decoded_bytes`)
first, so a codec allocates its output, and scratch of a small multiple of it, only within that.

Codec ids are part of the wire format: never reuse one. Registered ids:
0 raw (framework.runtime.wire), 1 fp16, 2 mbq, 3 mbq_unpacked, 4 stochastic_uniform, 5 minmax, 6 onebit,
7 uniform_lsq.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from framework import registry
from framework.errors import ConfigError, WireError

_DECODERS: dict[int, type["Codec"]] = {}
_BY_NAME: dict[str, type["Codec"]] = {}


@dataclass
class Encoded:
    """One tensor as it travels: the codec's metadata and payload bytes."""

    codec_id: int
    dtype: torch.dtype  # the dtype the receiver reconstructs
    shape: tuple
    meta: bytes
    payload: bytes | bytearray | memoryview | None  # None: a timing-only stand-in


class Codec:
    """Base class. Subclasses set `codec_id` and `name` and implement the four methods."""

    codec_id: ClassVar[int] = -1
    name: ClassVar[str] = ""
    bits_choices: ClassVar[tuple[int, ...]] = ()  # allowed bit widths; empty = any

    def __init__(self, bits: int = 32, **options):
        if self.bits_choices and bits not in self.bits_choices:
            raise ConfigError("compressor.bits", f"{self.name} supports {', '.join(map(str, self.bits_choices))} bits, got {bits}")
        self.bits = int(bits)
        self.options = options

    def encode(self, x: torch.Tensor, stream: dict) -> Encoded:
        """Encode x (any shape, float); may read and update `stream` (this stream's state)."""
        raise NotImplementedError

    @classmethod
    def decode(cls, meta: bytes, payload: memoryview, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Rebuild the tensor; raise WireError on malformed meta or payload."""
        raise NotImplementedError

    def wire_size(self, shape: tuple) -> tuple[int, int]:
        """(meta bytes, payload bytes) `encode` would produce for this shape at the current bits,
        without data: timing-only runs count these."""
        raise NotImplementedError

    @classmethod
    def prepare(cls) -> None:
        """Make the first encode and decode as cheap as the rest (compiled codecs load or compile
        their kernels here). Real runtimes call it while a role builds, before the clock starts
        and off the event loop; codecs that need nothing keep this no-op."""


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Class decorator: make `cls` decodable by its wire id and buildable by name."""
    if cls.codec_id in _DECODERS and _DECODERS[cls.codec_id] is not cls:
        raise ValueError(f"codec id {cls.codec_id} is taken by {_DECODERS[cls.codec_id].name}")
    _DECODERS[cls.codec_id] = cls
    _BY_NAME[cls.name] = cls
    return cls


def _load_codecs() -> None:
    """Codecs live in plugins, imported on first need (framework.registry.defer_import)."""
    registry.import_deferred()


def decoder(codec_id: int) -> type[Codec]:
    if codec_id not in _DECODERS:
        _load_codecs()
    try:
        return _DECODERS[codec_id]
    except KeyError:
        raise WireError(f"unknown codec id {codec_id}") from None


def codec_class(name: str) -> type[Codec]:
    if name not in _BY_NAME:
        _load_codecs()
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError("compressor.codec", f"unknown codec {name!r}; codecs: {', '.join(sorted(_BY_NAME))}") from None


def codec_names() -> list[str]:
    _load_codecs()
    return sorted(_BY_NAME)


# ---- helpers every codec needs ---------------------------------------------------------------


def expect_len(buf, n: int, what: str) -> None:
    if len(buf) != n:
        raise WireError(f"{what}: {len(buf)} bytes, expected {n}")


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
