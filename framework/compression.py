"""The compressor interface: how tensors become bytes on a link.

The base class is `compressor=none`: raw tensors in the wire format. Compressor plugins
override `encode`/`decode` with their codecs (and keep their own state); the runtime only
calls these three methods, and counts `size()` bytes on the link.
"""

from __future__ import annotations

import torch

from framework import wire


class Compressor:
    """No compression: tensors cross links as raw wire packets."""

    def __init__(self, cfg=None):
        self.cfg = cfg

    def encode(self, tensors: dict[str, torch.Tensor], *, iteration: int = 0, microbatch: int = 0) -> bytes:
        return wire.encode(tensors, iteration=iteration, microbatch=microbatch)

    def decode(self, data: bytes, *, copy: bool = True) -> wire.Packet:
        return wire.decode(data, copy=copy)

    def size(self, tensors: dict[str, torch.Tensor], data: bytes) -> int:
        """Bytes on the link; timing-only packets count the payload they stand for."""
        if any(t.device.type == "meta" for t in tensors.values()):
            return wire.encoded_size(tensors)
        return len(data)
