"""What the real runtimes need of a transport: move opaque messages between the roles of a run.

A message is bytes (a wire-format packet, see framework.wire) addressed to a role under a tag.
The contract every transport keeps:

- ordered and exactly once per (src, dst, tag), whatever the network below does (duplicates
  from at-least-once delivery are dropped, reordered pieces are put back in order);
- `send` applies back-pressure: it returns once the message is handed to the network, and
  waits while the transport's bounded window of unacknowledged data is full;
- anything arriving on the run's channels that is not a well-formed message of this run is
  dropped and counted in `stats["dropped"]`, never delivered;
- when a peer dies, `status` reports it (an MQTT last will), so a run can fail fast;
- `TransportError` is the one error a transport raises for a broken connection.

`runtime=sim` needs none of this (messages are priced by the link models and handed over in
memory); `transport=inproc` names that case. Network transports are plugins (`transport=mqtt`).
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from typing import Callable

from framework.errors import PipelabError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class TransportError(PipelabError):
    """The transport cannot carry messages (broker unreachable, connection lost for good)."""


def check_name(kind: str, name: str) -> str:
    """Role and tag names become topic levels: letters, digits, `_.-`, not starting with `_`."""
    if not NAME_RE.match(name):
        raise ValueError(f"{kind} name {name!r} is not allowed on a transport: use letters, digits and _.- (not first), at most 64 characters")
    return name


class Transport(ABC):
    """One role's endpoint. Use as `await t.start(run_id, role)` ... `await t.close()`."""

    role: str
    run_id: str

    def __init__(self) -> None:
        self.stats = {"sent": 0, "sent_bytes": 0, "received": 0, "received_bytes": 0, "dropped": 0, "reconnects": 0}
        self.status_callbacks: list[Callable[[str, str], None]] = []

    @abstractmethod
    async def start(self, run_id: str, role: str) -> None:
        """Connect and subscribe to this role's messages; raises TransportError if it cannot."""

    @abstractmethod
    async def send(self, dst: str, tag: str, data: bytes | bytearray | memoryview) -> None:
        """Queue one message for `dst`; waits while the in-flight window is full."""

    @abstractmethod
    async def recv(self, src: str, tag: str, timeout: float | None = None) -> bytes | bytearray:
        """The next message from `src` under `tag` (asyncio.TimeoutError after `timeout`)."""

    @abstractmethod
    async def flush(self) -> None:
        """Wait until everything sent so far is acknowledged by the network."""

    @abstractmethod
    async def publish_status(self, state: str) -> None:
        """Tell every peer this role's state (`ready`, `done`, ...); `lost` is the last will."""

    @abstractmethod
    async def close(self) -> None:
        """Flush, say `done`, disconnect."""

    def on_status(self, callback: Callable[[str, str], None]) -> None:
        """Call `callback(role, state)` for every status a peer publishes (and its last will)."""
        self.status_callbacks.append(callback)

    def _status(self, role: str, state: str) -> None:
        for cb in self.status_callbacks:
            cb(role, state)


class Mailboxes:
    """FIFO queues of delivered messages keyed by (src, tag), created on first use."""

    def __init__(self) -> None:
        self._boxes: dict[tuple[str, str], asyncio.Queue] = {}
        self.error: BaseException | None = None

    def box(self, src: str, tag: str) -> asyncio.Queue:
        q = self._boxes.get((src, tag))
        if q is None:
            q = self._boxes[(src, tag)] = asyncio.Queue()
        return q

    def put(self, src: str, tag: str, data) -> None:
        self.box(src, tag).put_nowait(data)

    async def get(self, src: str, tag: str, timeout: float | None = None):
        if self.error is not None:
            raise self.error
        q = self.box(src, tag)
        if timeout is None:
            item = await q.get()
        else:
            item = await asyncio.wait_for(q.get(), timeout)
        if isinstance(item, BaseException):  # a fatal error wakes every waiter
            raise item
        return item

    def fail(self, error: BaseException) -> None:
        """Every current and future `get` raises `error`."""
        self.error = error
        for q in self._boxes.values():
            q.put_nowait(error)


class Network(ABC):
    """What a network transport plugin builds from its config: the run's shared medium.

    The coordinator calls `open()` (e.g. start a private broker), gives every role process
    `worker_args()` (the overrides that reach the same network), makes its own `endpoint()`,
    and calls `close()` after the run."""

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def endpoint(self) -> Transport: ...

    @abstractmethod
    def worker_args(self) -> list[str]: ...

    def describe(self) -> str:
        return type(self).__name__
