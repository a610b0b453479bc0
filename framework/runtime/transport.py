"""What the real runtimes need of a transport: move opaque messages between the roles of a run.

A message is bytes (a wire-format packet, see framework.runtime.wire) addressed to a role under a tag.
The contract every transport keeps:

- ordered and exactly once per (src, dst, tag), whatever the network below does (duplicates
  from at-least-once delivery are dropped, reordered pieces are put back in order);
- `send` applies back-pressure: it returns once the message is handed to the network, and
  waits while the transport's bounded window of unacknowledged data is full;
- anything arriving on the run's channels that is not a well-formed, authentic message of
  this run is dropped and counted, never delivered: `stats["dropped"]` counts every such frame,
  and one of the `FAULTS` counters says why (a repeat of something already delivered counts
  as `replayed` only: QoS-1 redelivery after a reconnect looks like that too);
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
# why a frame or status was not delivered (Transport.stats; summary.json `processes.<role>.transport`)
FAULTS = (
    "malformed",  # not a frame or status of this transport's format, or fields that disagree
    "foreign",  # a topic that is not one of this run's for this role
    "unauthenticated",  # no MAC, or a MAC that fails: not from a member of this run
    "replayed",  # a frame or status already seen (a replay, or QoS-1 redelivery)
    "out_of_window",  # a sequence number too far ahead of what was delivered
    "over_budget",  # a message larger than allowed, or more buffered than a peer may hold
    "expired",  # messages dropped half-received after waiting too long for their other chunks
)


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
        self.stats = {"sent": 0, "sent_bytes": 0, "received": 0, "received_bytes": 0, "dropped": 0, "reconnects": 0, **{k: 0 for k in FAULTS}}
        self.status_callbacks: list[Callable[[str, str], None]] = []

    def _reject(self, why: str, n: int = 1) -> None:
        """Count `n` frames (or messages, for `expired`) not delivered, and why (one of FAULTS)."""
        self.stats[why] += n
        if why != "replayed":
            self.stats["dropped"] += n

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
        elif timeout <= 0:  # a poll: Python 3.11's wait_for(get(), 0) cancels the get before it looks
            try:
                item = q.get_nowait()
            except asyncio.QueueEmpty:
                raise asyncio.TimeoutError from None
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

    The coordinator calls `open(run_id, roles)` (e.g. start a private broker that admits only
    those roles, draw the run's secrets), gives every role process `worker_args()` (the
    overrides that reach the same network, never a secret) and `worker_secret(role)` (its
    secrets, as bytes the runtime hands over through an inherited pipe: framework.runtime.secret_pipe;
    `worker_secret_args(role)` instead for a role started by hand elsewhere), makes its own
    `endpoint(role)`, and calls `close()` after the run. In a role process, `endpoint()` finds
    the role's secrets where those put them. Role processes do not inherit the variables of
    this process's environment named in `secret_env`."""

    # environment variables that may hold a secret of the user's (a broker password): a role
    # process started here gets its secrets from worker_secret, so it does not inherit these
    secret_env: tuple[str, ...] = ()

    @abstractmethod
    def open(self, run_id: str, roles: list[str]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def endpoint(self, role: str | None = None) -> Transport: ...

    @abstractmethod
    def worker_args(self) -> list[str]: ...

    def worker_secret(self, role: str) -> bytes | None:
        """`role`'s secrets for a process started on this machine (None: it needs none)."""
        return None

    def worker_secret_args(self, role: str) -> list[str]:
        """Overrides that tell a role started by hand where its secrets are (no secret itself)."""
        return []

    def check_coordinator(self, runtime: str) -> None:
        """ConfigError for a setting only a role process reads, given to the coordinator of
        `runtime` (which would ignore it): a role started by hand's secrets, say."""

    def describe(self) -> str:
        return type(self).__name__

    def give_up_s(self) -> float:
        """How long an endpoint that lost the network keeps trying before its transport fails."""
        return 0.0
