"""Control messages between the coordinator and role processes: a JSON header and, optionally,
wire-format tensors. Never pickles: a malformed message raises WireError and nothing else."""

from __future__ import annotations

import json
import struct

from framework import wire
from framework.errors import WireError

COORDINATOR = "coordinator"
CTL = "ctl"  # role -> coordinator: progress, epoch arrival, result, error
_LEN = struct.Struct("<I")


def ctl_pack(header: dict, tensors: dict | None = None) -> bytes:
    head = json.dumps(header).encode()
    body = wire.encode(tensors) if tensors is not None else b""
    return b"".join((_LEN.pack(len(head)), head, body))


def ctl_unpack(data) -> tuple[dict, dict | None]:
    """Raises WireError on anything malformed."""
    if len(data) < _LEN.size:
        raise WireError("control message shorter than its header length")
    (n,) = _LEN.unpack_from(data)
    if _LEN.size + n > len(data):
        raise WireError("control message header runs past its end")
    try:
        header = json.loads(bytes(data[_LEN.size : _LEN.size + n]))
    except ValueError as e:
        raise WireError(f"control message header is not JSON: {e}") from None
    if not isinstance(header, dict) or "kind" not in header:
        raise WireError("control message header has no kind")
    rest = memoryview(data)[_LEN.size + n :]
    return header, (wire.decode(rest).tensors if len(rest) else None)
