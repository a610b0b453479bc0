"""Putting messages back together on the receiving side of `transport=mqtt`, in bounded memory.

Pure bookkeeping, no I/O: the transport hands it frames that passed their structural checks
(and their MAC, when the run has a key), it answers with a verdict and the messages that are
now deliverable, in order. Messages are delivered per (src, tag) in `seq` order exactly once.

Bounds, for a peer that is buggy or, in unauthenticated mode, anyone who can publish:
- a message announces its total length; more than `max_message_bytes` is refused;
- a sequence number at or beyond `next_seq + window` is refused and changes nothing (a
  sender never runs that far ahead: it has at most `max_inflight` chunks unacknowledged,
  and only those can arrive out of order);
- a buffer is allocated whole only up to `PREALLOC_BYTES`; above that it starts at that size
  and grows as chunks arrive, so an announced total costs nothing until the bytes come;
- what one peer has buffered (partial messages, and whole ones waiting for an earlier seq)
  may not exceed `peer_budget` bytes, and without authentication at most `max_streams`
  (src, tag) streams are kept (anyone could invent senders);
- a partial message that received nothing for `stale_s` seconds is dropped (`expire`), and so
  is a whole one that waited that long for an earlier one.
"""

from __future__ import annotations

from typing import Callable, Optional

# whole up to this (a message that small is written into one buffer allocated at once); larger
# ones grow as their chunks come. 32 MiB is where tuned glibc (framework/runtime/allocator.py)
# switches to mmap, so growing beyond it remaps pages instead of copying the buffer.
PREALLOC_BYTES = 32 << 20

OK, REPLAYED, MALFORMED, OUT_OF_WINDOW, OVER_BUDGET = "ok", "replayed", "malformed", "out_of_window", "over_budget"


def layout_ok(chunk: int, n_chunks: int, total: int, offset: int, n: int) -> bool:
    """The sender's layout, exactly: n_chunks equal chunks of ceil(total / n_chunks) bytes (the
    last one shorter, none empty), so distinct chunks never overlap and all of them fill the
    message without a gap."""
    if n_chunks < 1 or chunk >= n_chunks:
        return False
    if n_chunks == 1:
        return offset == 0 and n == total
    c = -(-total // n_chunks)
    return offset == chunk * c and 0 < n == min(c, total - offset)


class _Partial:
    """One message being reassembled."""

    __slots__ = ("buf", "have", "n_chunks", "total", "session", "digest", "last")

    def __init__(self, total: int, n_chunks: int, session: int, digest: int, now: float):
        self.buf = bytearray(min(total, PREALLOC_BYTES))
        self.have: set[int] = set()
        self.n_chunks, self.total, self.session, self.digest = n_chunks, total, session, digest
        self.last = now


class _Stream:
    """Messages from one (src, tag): what is being reassembled, and what comes next."""

    __slots__ = ("next_seq", "partial", "done")

    def __init__(self):
        self.next_seq = 0
        self.partial: dict[int, _Partial] = {}
        self.done: dict[int, tuple] = {}  # seq -> (buffer, arrival time): whole, waiting for an earlier seq


class Reassembly:
    def __init__(self, *, max_message_bytes: int, window: int, peer_budget: int, stale_s: float, max_streams: Optional[int] = 4096,
                 checksum: Optional[Callable] = None):
        """`max_streams`: None when only authenticated frames get here (a stream's state is what
        rejects replays of its old messages, so it is kept for the whole run: a role that
        barriers under a fresh tag each epoch opens a new stream each epoch)."""
        self.max_message_bytes, self.window, self.peer_budget = max_message_bytes, window, peer_budget
        self.stale_s, self.max_streams = stale_s, max_streams
        self.checksum = checksum  # unauthenticated mode: the whole-message hash in `digest`
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._held: dict[str, int] = {}  # src -> bytes buffered for it

    def next_seq(self, src: str, tag: str) -> int:
        """The sequence number of the next message to deliver from (src, tag): what the
        receiver acknowledges (everything below it was delivered)."""
        stream = self._streams.get((src, tag))
        return stream.next_seq if stream is not None else 0

    def held(self, src: str | None = None) -> int:
        return sum(self._held.values()) if src is None else self._held.get(src, 0)

    def _hold(self, src: str, n: int) -> None:
        self._held[src] = self._held.get(src, 0) + n

    def place(self, src: str, tag: str, seq: int, chunk: int, n_chunks: int, total: int, offset: int, session: int, digest: int, body,
              now: float) -> tuple[str, list]:
        """Place one frame. Returns (verdict, deliverable messages in order). A verdict other
        than OK changes nothing, but for the last chunk of a message that fails its
        whole-message hash (unauthenticated mode): that message is dropped."""
        if not layout_ok(chunk, n_chunks, total, offset, len(body)):
            return MALFORMED, []
        if total > self.max_message_bytes:
            return OVER_BUDGET, []
        key = (src, tag)
        stream = self._streams.get(key)
        if stream is None:
            if self.max_streams is not None and len(self._streams) >= self.max_streams:
                return OVER_BUDGET, []
            stream = _Stream()
        if seq < stream.next_seq or seq in stream.done:
            return REPLAYED, []
        if seq >= stream.next_seq + self.window:
            return OUT_OF_WINDOW, []
        if n_chunks == 1:
            if self.held(src) + total > self.peer_budget and seq != stream.next_seq:
                return OVER_BUDGET, []
            self._streams[key] = stream
            return OK, self._complete(stream, src, seq, body, now)
        part = stream.partial.get(seq)
        if part is None:
            if self.held(src) + min(total, PREALLOC_BYTES) > self.peer_budget:
                return OVER_BUDGET, []
            part = _Partial(total, n_chunks, session, digest, now)
            stream.partial[seq] = part
            self._streams[key] = stream
            self._hold(src, len(part.buf))
        elif (part.total, part.n_chunks, part.session, part.digest) != (total, n_chunks, session, digest):
            return MALFORMED, []
        if chunk in part.have:
            return REPLAYED, []
        n = len(body)
        buf = part.buf
        end = offset + n
        grow = end - len(buf)
        if grow > 0:  # only messages above PREALLOC_BYTES grow, as their chunks come
            if self.held(src) + grow > self.peer_budget:
                return OVER_BUDGET, []
            if offset > len(buf):  # a chunk ahead of the others: zeros up to it
                buf.extend(bytes(offset - len(buf)))
            self._hold(src, grow)
        buf[offset:end] = body
        part.have.add(chunk)
        part.last = now
        if len(part.have) < n_chunks:
            return OK, []
        del stream.partial[seq]
        self._hold(src, -len(buf))
        if self.checksum is not None and self.checksum(buf) != digest:
            return MALFORMED, []
        return OK, self._complete(stream, src, seq, buf, now)

    def _complete(self, stream: _Stream, src: str, seq: int, buf, now: float) -> list:
        if seq != stream.next_seq:  # an earlier one is still on its way
            stream.done[seq] = (buf, now)
            self._hold(src, len(buf))
            return []
        out = [buf]
        stream.next_seq += 1
        while stream.next_seq in stream.done:
            b, _ = stream.done.pop(stream.next_seq)
            self._hold(src, -len(b))
            out.append(b)
            stream.next_seq += 1
        return out

    def expire(self, now: float) -> int:
        """Drop what waited more than `stale_s`; returns how many messages were dropped."""
        n = 0
        for (src, _tag), stream in self._streams.items():
            for seq in [s for s, p in stream.partial.items() if now - p.last > self.stale_s]:
                self._hold(src, -len(stream.partial.pop(seq).buf))
                n += 1
            for seq in [s for s, (_, t) in stream.done.items() if now - t > self.stale_s]:
                self._hold(src, -len(stream.done.pop(seq)[0]))
                n += 1
        return n
