"""End-to-end delivery for `transport=mqtt`: what a sender keeps until its receiver has it, the
receiver's acknowledgements, and when a `lost` status can be believed. Pure bookkeeping, no I/O.

Why: QoS 1 only promises delivery to the broker. A broker that restarts without persistence
forgets every message it queued, and every subscription; one with persistence keeps them but
publishes each client's last will (`lost`) as it goes down. So:

- a sender keeps every message (a reference to its bytes, not a copy) until the receiver
  acknowledges it, and sends whatever is unacknowledged again after its own reconnect and
  whenever the receiver announces that it reconnected (`back`); the receiver drops what it
  already has by sequence number and acknowledges it again, so a lost acknowledgement heals;
- acknowledgements are cumulative, per (src, tag) the next sequence number expected, sent in
  one small authenticated frame per peer at most every `ACK_INTERVAL_S`;
- a `lost` status is believed only once it cannot be the broker going down (LostFilter);
  every endpoint that reconnects says `back`, and every endpoint that hears a `back` answers
  `alive` (the one that came back may have missed its peers' `back`s while it was away).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Iterator

ACK_TAG = "_ack"  # a tag no role can use (role tags start with a letter or digit)
ACK_INTERVAL_S = 0.02  # acknowledgements to one peer are coalesced over this long
_ACK_ENTRY = struct.Struct("<QB")  # next seq, length of the tag that follows
MAX_ACK_ENTRIES = 4096


def encode_acks(acks: dict[str, int]) -> bytes:
    """{tag: next sequence number expected} as bytes."""
    out = bytearray()
    for tag, nxt in acks.items():
        t = tag.encode()
        out += _ACK_ENTRY.pack(nxt, len(t)) + t
    return bytes(out)


def decode_acks(body) -> dict[str, int]:
    """The inverse of encode_acks; ValueError for anything that is not exactly that."""
    body = bytes(body)
    acks, i = {}, 0
    while i < len(body):
        if len(acks) >= MAX_ACK_ENTRIES or i + _ACK_ENTRY.size > len(body):
            raise ValueError("malformed acknowledgement")
        nxt, n = _ACK_ENTRY.unpack_from(body, i)
        i += _ACK_ENTRY.size
        if n == 0 or i + n > len(body):
            raise ValueError("malformed acknowledgement")
        acks[body[i : i + n].decode("ascii", errors="strict")] = nxt
        i += n
    return acks


class Outbox:
    """Messages sent and not yet acknowledged by their receiver, per (dst, tag) in seq order."""

    def __init__(self):
        self._kept: dict[tuple[str, str], OrderedDict[int, memoryview]] = {}
        self.bytes = 0

    def keep(self, dst: str, tag: str, seq: int, data: memoryview) -> None:
        self._kept.setdefault((dst, tag), OrderedDict())[seq] = data
        self.bytes += len(data)

    def ack(self, dst: str, tag: str, next_seq: int) -> None:
        """The receiver has every message below `next_seq` (acknowledgements only grow; an old
        or repeated one changes nothing)."""
        kept = self._kept.get((dst, tag))
        while kept:
            seq = next(iter(kept))
            if seq >= next_seq:
                break
            self.bytes -= len(kept.popitem(last=False)[1])
        if kept is not None and not kept:
            del self._kept[(dst, tag)]

    def unacknowledged(self, dst: str | None = None) -> Iterator[tuple[str, str, int, memoryview]]:
        """(dst, tag, seq, data) still kept, for `dst` or every receiver, in seq order per stream."""
        for (d, tag), kept in list(self._kept.items()):
            if dst is None or d == dst:
                for seq, data in list(kept.items()):
                    yield d, tag, seq, data

    def waiting_for(self) -> set[str]:
        """The receivers that still owe an acknowledgement."""
        return {d for d, _ in self._kept}

    def forget(self, dst: str) -> None:
        """A receiver that said goodbye or was lost acknowledges nothing more."""
        for key in [k for k in self._kept if k[0] == dst]:
            self.bytes -= sum(len(v) for v in self._kept.pop(key).values())


class LostFilter:
    """Whether a `lost` status (a last will) is a role's death or the broker going down.

    A broker that stops publishes every client's last will, either at once to the clients
    still connected (which lose their own connection a moment later) or, with persistence,
    from each stored session right after the restart. Either way the role comes back and says
    `back`. So a `lost` received at time `a` is believed at the first moment that
    - nothing newer came from that role, and
    - this endpoint is connected, and either its connection never dropped since `a` and is its
      first one or dates from at least `settle_s` before `a` (a death while the broker stayed
      up: believed after `settle_s`), or it has been up for `grace_s` (long enough for the role
      to reconnect: the broker restarted and the role did not come back).
    """

    def __init__(self, settle_s: float, grace_s: float):
        self.settle_s, self.grace_s = settle_s, grace_s
        self.connected_since: float | None = None
        self.drops = 0  # connection losses so far
        self._suspects: dict[str, tuple[float, int]] = {}  # role -> (when its lost arrived, drops then)

    def connected(self, now: float) -> None:
        self.connected_since = now

    def disconnected(self) -> None:
        if self.connected_since is not None:
            self.drops += 1
        self.connected_since = None

    def lost(self, role: str, now: float) -> None:
        self._suspects.setdefault(role, (now, self.drops))

    def alive(self, role: str) -> None:
        """Something newer than its will came from `role`."""
        self._suspects.pop(role, None)

    def pending(self) -> bool:
        return bool(self._suspects)

    def believed(self, now: float) -> list[str]:
        """The suspects whose loss can now be believed (each is reported once)."""
        since = self.connected_since
        if since is None:
            return []
        out = []
        for role, (at, drops) in list(self._suspects.items()):
            if now < at + self.settle_s:
                continue
            # on the first connection a will is never a stored one: it is steady if nothing dropped since
            steady = drops == self.drops and (self.drops == 0 or since <= at - self.settle_s)
            if steady or now - since >= self.grace_s:
                out.append(role)
                del self._suspects[role]
        return out
