"""Control messages between the coordinator and role processes: a JSON header and, optionally,
wire-format tensors. Never pickles: a malformed message raises WireError and nothing else.

Anyone on the broker can publish one, so `ctl_unpack` bounds what it parses: a header of at most
MAX_HEADER_BYTES, nested at most MAX_DEPTH deep (counted on the bytes first: json.loads recurses
once per level), of a kind the receiver expects, with the fields SCHEMA lists for it. The
receiver counts a rejected message and goes on; `ctl_pack` checks the same, so a message its
receiver would reject fails loudly at the sender instead of vanishing. A number SCHEMA reads is
finite (JSON as Python reads it has NaN, Infinity and 1e999) and in its field's range: counts
>= 0, a timeline's indices >= -1 (none), a batch's correct answers at most its samples."""

from __future__ import annotations

import json
import math
import re
import struct

import numpy as np

from framework.errors import WireError
from framework.runtime import wire

COORDINATOR = "coordinator"
CTL = "ctl"  # role -> coordinator: progress, epoch arrival, result, error
_LEN = struct.Struct("<I")
MAX_HEADER_BYTES = 64 << 20  # the largest, an epoch's timeline, is ~80 bytes per interval
MAX_DEPTH = 32  # a config and a plan nest about 10 deep


def _int(v) -> bool:
    return type(v) is int and -(1 << 63) <= v < 1 << 63  # not bool; 10**400 overflows float arithmetic


def _count(v) -> bool:
    """An epoch, an iteration, a number of samples or bytes: an integer >= 0."""
    return _int(v) and v >= 0


def _index(v) -> bool:
    """A timeline interval's iteration, micro-batch or group: >= 0, or -1 for none."""
    return _int(v) and v >= -1


def _num(v) -> bool:
    """A finite number: json.loads reads NaN, Infinity and 1e999 (inf) too, and a time or a loss
    of that would poison every sum and maximum the coordinator takes of it."""
    return (type(v) is float and math.isfinite(v)) or _int(v)


def _loss(v) -> bool:
    """A loss: a number, or the name of a non-finite one (JSON has none; train.on_nonfinite=warn
    or ignore lets a run go on with one)."""
    return _num(v) or v in ("nan", "inf", "-inf")


def _str(v) -> bool:
    return type(v) is str


def _obj(v) -> bool:
    return type(v) is dict


def _counters(v) -> bool:
    """A role's message counters: the coordinator adds up `lost` and `dropped`."""
    return type(v) is dict and all(_int(v.get(k, 0)) for k in ("lost", "dropped"))


_INTERVAL = {  # role_process timeline entries, as Timeline.compute / Timeline.transfer take them
    "c": (_str, _str, _num, _num, _index, _index, _index),  # role, work kind, start, end, iteration, microbatch, group
    "t": (_str, _num, _num, _count, _index, _index, _str, lambda v: v is None or _count(v)),  # link, start, end, bytes, it, mb, kind, raw bytes
}


def _intervals(v) -> bool:
    if type(v) is not list:
        return False
    for iv in v:
        spec = _INTERVAL.get(iv[0]) if type(iv) is list and iv and type(iv[0]) is str else None
        if spec is None or len(iv) != len(spec) + 1 or not all(ok(x) for ok, x in zip(spec, iv[1:])):
            return False
    return True


# kind -> {field: check}: what the receiver reads of each kind (other fields pass unread)
SCHEMA = {
    # coordinator -> role, each on the tag of its kind
    "setup": {"config": _obj, "plan": _obj, "specs": _obj, "run_id": _str},
    "start": {"t_ref": _num},
    "go": {"epoch": _count, "t": _num},
    # role -> coordinator, on CTL
    "built": {},
    "it": {"epoch": _count, "iteration": _count, "samples": _count, "now": _num},
    "train": {"loss_sum": _loss, "correct": _count, "n": _count},
    "epoch": {"epoch": _count, "now": _num, "timeline": _intervals},
    "result": {"timeline": _intervals, "stats": _counters, "role_stats": _obj, "process": _obj, "end": _num},
    "error": {"traceback": _str},
}
TO_COORDINATOR = ("built", "it", "train", "epoch", "result", "error")
# kind -> (check of the whole header, what it requires): ranges that span fields
ACROSS = {"train": (lambda h: h["correct"] <= h["n"], "correct <= n")}


def check_header(header, kinds=tuple(SCHEMA)) -> dict:
    """`header` if it is one of `kinds` with the fields SCHEMA names; WireError otherwise."""
    kind = header.get("kind") if type(header) is dict else None
    if type(kind) is not str or kind not in kinds:
        raise WireError(f"control message of kind {str(kind)[:40]!r}; expected {' or '.join(kinds)}")
    for field, ok in SCHEMA[kind].items():
        if field not in header or not ok(header[field]):
            raise WireError(f"control message {kind!r}: field {field!r} is missing or malformed")
    across = ACROSS.get(kind)
    if across is not None and not across[0](header):
        raise WireError(f"control message {kind!r}: needs {across[1]}")
    return header


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")
_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def _depth(head: bytes) -> int:
    """How deep the brackets of a JSON text nest outside its strings, in C loops (no recursion).
    Never less than json.loads would reach before it fails; more only on text it rejects."""
    opening = head.count(b"[") + head.count(b"{")
    if opening <= MAX_DEPTH:
        return opening  # cannot nest deeper: the common case costs two counts
    steps = _STEP[np.frombuffer(_STRING.sub(b"", _ESCAPE.sub(b"", head)).translate(None, _NOT_BRACKET), np.uint8)]
    depth = peak = 0
    for i in range(0, len(steps), 1 << 20):  # in slices: a cumsum of 64 MiB would take 512 MiB
        run = np.cumsum(steps[i : i + (1 << 20)], dtype=np.int64) + depth
        peak, depth = max(peak, int(run.max())), int(run[-1])
    return peak


def _check_head(head: bytes) -> None:
    if len(head) > MAX_HEADER_BYTES:
        raise WireError(f"control message header of {len(head)} bytes (max {MAX_HEADER_BYTES})")
    if _depth(head) > MAX_DEPTH:
        raise WireError(f"control message header nests deeper than {MAX_DEPTH}")


def ctl_pack(header: dict, tensors: dict | None = None) -> bytes:
    head = json.dumps(check_header(header)).encode()
    _check_head(head)
    body = wire.encode(tensors) if tensors is not None else b""
    return b"".join((_LEN.pack(len(head)), head, body))


def ctl_unpack(data, kinds=tuple(SCHEMA)) -> tuple[dict, dict | None]:
    """(header, tensors) of a control message of one of `kinds`; WireError on anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"a control message is bytes, not {type(data).__name__}")
    if len(data) < _LEN.size:
        raise WireError("control message shorter than its header length")
    (n,) = _LEN.unpack_from(data)
    if _LEN.size + n > len(data):
        raise WireError("control message header runs past its end")
    head = bytes(memoryview(data)[_LEN.size : _LEN.size + n])
    _check_head(head)
    try:
        header = json.loads(head)
    except (ValueError, RecursionError) as e:
        raise WireError(f"control message header is not JSON: {str(e)[:200]}") from None
    check_header(header, kinds)
    rest = memoryview(data)[_LEN.size + n :]
    return header, (wire.decode(rest).tensors if len(rest) else None)
