"""`transport=mqtt`: role messages through an MQTT broker, the way IoT devices talk.

Topics: `<prefix>/<run_id>/<dst_role>/<tag>` for data and `<prefix>/<run_id>/_status/<role>`
for role states (each client's last will there says `lost`). QoS 1 throughout.

Every MQTT message is one frame (little-endian):

    magic "PLMQ" | version u8 | flags u8 | src_len u8 | tag_len u8 | seq u64 | chunk u32
    | n_chunks u32 | total_len u64 | offset u64 | xxh3_64 u64 | src | tag | chunk bytes

A message larger than `chunk_bytes` travels as several frames (brokers and clients handle
megabyte messages much better than hundred-megabyte ones). The receiver writes each chunk into
one preallocated buffer and checks that every chunk came, the total length and the XXH3-64
hash of the whole message (0.14 ms per MiB here; zlib's CRC-32 took 0.55 ms, a quarter of a
16 MiB round trip's time across its four passes). A message of one frame is checked by its
length alone and delivered without a copy: like every MQTT payload it is protected by TCP's
checksum, and with nothing to reassemble a hash would only cost time. Messages are
delivered per (src, tag) in `seq` order exactly once: QoS 1 is at-least-once, and a
publish retried after a reconnect may repeat or reorder frames. Anything else on the run's
topics (foreign bytes, a frame whose fields disagree, a failed checksum) is dropped and counted.

Memory is bounded: at most `max_inflight` chunks are published and unacknowledged at once
(`send` waits for a slot: back-pressure), a message is encoded once and sliced, never copied
whole, and a message larger than `max_message_bytes` is refused at both ends.

The connection is supervised: if it drops, the client reconnects with exponential backoff
(a persistent session, `clean_session=False`, so the broker keeps this role's QoS-1 messages
while it is away) and unacknowledged chunks are published again. After
`reconnect_timeout_s` without a connection the transport fails with TransportError.

All aiomqtt use is in this module (aiomqtt 2.x), so moving to aiomqtt 3 touches one file.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import struct
from dataclasses import dataclass, field
from typing import Optional

import aiomqtt
import xxhash
from aiomqtt.exceptions import MqttConnectError

from framework.config import TransportConfig
from framework.errors import ConfigError
from framework.registry import register
from framework.transport import Mailboxes, Network, Transport, TransportError, check_name

MAGIC = b"PLMQ"
VERSION = 2
_FRAME = struct.Struct("<4sBBBBQIIQQQ")
checksum = xxhash.xxh3_64_intdigest
STATUS = "_status"
SOCKET_BUFFER = 4 << 20

log = logging.getLogger("pipelab.mqtt")
# aiomqtt warns whenever more than 10 publishes await their acknowledgement; our window allows
# `max_inflight` of them on purpose
_client_log = logging.getLogger("pipelab.mqtt.client")
_client_log.setLevel(logging.ERROR)


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 1883
    spawn: str = "auto"  # auto | always | never (see plugins/transports/broker.py)
    binary: str = "mosquitto"
    persistence: bool = False  # a spawned broker keeps sessions across its own restart


@dataclass
class MqttConfig(TransportConfig):
    """Role messages through an MQTT broker (mosquitto): chunked, ordered, QoS 1."""

    name: str = "mqtt"
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    topic_prefix: str = "pipelab"
    chunk_bytes: int = 1 << 20  # frames above this are split
    max_inflight: int = 16  # chunks published and not yet acknowledged (back-pressure)
    max_message_bytes: int = 1 << 31  # larger messages are refused (both ends)
    keepalive_s: int = 5  # a dead peer is noticed within ~1.5x this (its last will)
    connect_timeout_s: float = 15.0
    reconnect_initial_s: float = 0.1
    reconnect_max_s: float = 5.0
    reconnect_timeout_s: float = 60.0  # give up after this long without a connection
    username: Optional[str] = None
    password: Optional[str] = None
    tls: bool = False
    tls_ca_certs: Optional[str] = None
    tls_certfile: Optional[str] = None
    tls_keyfile: Optional[str] = None
    tls_insecure: bool = False  # accept a certificate whose host name does not match


def validate_config(cfg) -> None:
    if cfg.chunk_bytes < 1024:
        raise ConfigError("transport.chunk_bytes", f"must be >= 1024, got {cfg.chunk_bytes}")
    if cfg.max_inflight < 1:
        raise ConfigError("transport.max_inflight", f"must be >= 1, got {cfg.max_inflight}")
    if cfg.keepalive_s < 1:
        raise ConfigError("transport.keepalive_s", f"must be >= 1 s, got {cfg.keepalive_s}")
    if "/" in cfg.topic_prefix or "+" in cfg.topic_prefix or "#" in cfg.topic_prefix or not cfg.topic_prefix:
        raise ConfigError("transport.topic_prefix", f"{cfg.topic_prefix!r} must be one non-empty topic level without / + #")
    if (cfg.password is not None) and cfg.username is None:
        raise ConfigError("transport.username", "a password needs a username")


def frame(src: bytes, tag: bytes, seq: int, chunk: int, n_chunks: int, total: int, offset: int, digest: int, body) -> bytes:
    head = _FRAME.pack(MAGIC, VERSION, 0, len(src), len(tag), seq, chunk, n_chunks, total, offset, digest)
    return b"".join((head, src, tag, body))


class _Partial:
    """One message being reassembled."""

    __slots__ = ("buf", "have", "n_chunks", "digest", "size", "filled")

    def __init__(self, total: int, n_chunks: int, digest: int):
        self.buf = bytearray(total)
        self.have: set[int] = set()
        self.n_chunks, self.digest, self.size = n_chunks, digest, total
        self.filled = 0


class _Stream:
    """Messages from one (src, tag): what is being reassembled, and what comes next."""

    __slots__ = ("next_seq", "partial", "done")

    def __init__(self):
        self.next_seq = 0
        self.partial: dict[int, _Partial] = {}
        self.done: dict[int, bytearray] = {}  # complete but waiting for an earlier seq


class _Handled(asyncio.Queue):
    """aiomqtt's incoming-message queue, replaced by a call: each message is placed (chunk
    copied into its message's buffer, whole messages into mailboxes) the moment the client
    reads it, so no queue of raw frames grows on a receiver that is busy."""

    handler = None  # set per transport through a subclass

    def put_nowait(self, item) -> None:
        self.handler(item)


class MqttTransport(Transport):
    def __init__(self, cfg, address=None):
        super().__init__()
        validate_config(cfg)
        self.cfg = cfg
        # read per message: plain ints, not config lookups
        self._chunk_bytes, self._max_bytes = int(cfg.chunk_bytes), int(cfg.max_message_bytes)
        self._topics: dict[tuple[str, str], str] = {}
        self.address = address  # BrokerAddress; None: cfg.broker.host/port
        self.mail = Mailboxes()
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._seq: dict[tuple[str, str], int] = {}
        self._window: asyncio.Semaphore | None = None
        self._pending: set[asyncio.Task] = set()
        self._connected: asyncio.Event | None = None
        self._closing = False
        self._error: BaseException | None = None
        self._supervisor: asyncio.Task | None = None
        self._client: aiomqtt.Client | None = None

    # ---- connection ---------------------------------------------------------------------

    def _topic(self, *levels: str) -> str:
        return "/".join((self.cfg.topic_prefix, self.run_id, *levels))

    def _make_client(self, clean: bool) -> aiomqtt.Client:
        cfg = self.cfg
        host, port = (self.address.host, self.address.port) if self.address else (cfg.broker.host, int(cfg.broker.port))
        tls = None
        if cfg.tls:
            tls = aiomqtt.TLSParameters(ca_certs=cfg.tls_ca_certs, certfile=cfg.tls_certfile, keyfile=cfg.tls_keyfile)
        handled = type("_HandledQueue", (_Handled,), {"handler": staticmethod(lambda m: self._on_message(str(m.topic), m.payload))})
        return aiomqtt.Client(
            host,
            port,
            username=cfg.username,
            password=cfg.password,
            identifier=f"{cfg.topic_prefix}-{self.run_id}-{self.role}",
            clean_session=clean,
            keepalive=int(cfg.keepalive_s),
            will=aiomqtt.Will(self._topic(STATUS, self.role), b"lost", qos=1),
            max_inflight_messages=max(20, int(cfg.max_inflight)),
            queue_type=handled,
            # room for a whole chunk in the kernel: fewer wake-ups per megabyte
            socket_options=[(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER), (socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)],
            tls_params=tls,
            tls_insecure=cfg.tls_insecure if cfg.tls else None,
            timeout=cfg.connect_timeout_s,
            logger=_client_log,
        )

    async def start(self, run_id: str, role: str) -> None:
        self.run_id, self.role = check_name("run", run_id), check_name("role", role)
        self._window = asyncio.Semaphore(int(self.cfg.max_inflight))
        self._connected = asyncio.Event()
        self._client = self._make_client(clean=False)
        first = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.create_task(self._supervise(first), name=f"mqtt-{role}")
        try:
            await asyncio.wait_for(asyncio.shield(first), self.cfg.connect_timeout_s)
        except asyncio.TimeoutError:
            await self._abort()
            raise TransportError(f"cannot reach the MQTT broker at {self._where()} within {self.cfg.connect_timeout_s:.0f}s (transport.broker.host/port)") from None
        except BaseException:
            await self._abort()
            raise

    def _where(self) -> str:
        a = self.address or self.cfg.broker
        return f"{a.host}:{a.port}"

    async def _supervise(self, first: asyncio.Future) -> None:
        """Stay connected: (re)connect with backoff, subscribe, hand every frame to `_on_frame`."""
        delay = self.cfg.reconnect_initial_s
        lost_at = None
        loop = asyncio.get_running_loop()
        while not self._closing:
            try:
                async with self._client as client:
                    await client.subscribe(self._topic(self.role, "#"), qos=1)
                    await client.subscribe(self._topic(STATUS, "+"), qos=1)
                    if lost_at is not None:
                        self.stats["reconnects"] += 1
                    lost_at = None
                    delay = self.cfg.reconnect_initial_s
                    self._connected.set()
                    if not first.done():
                        first.set_result(None)
                    async for _ in client.messages:  # never yields (see _Handled); ends when the connection drops
                        pass
            except aiomqtt.MqttError as e:
                self._connected.clear()
                if self._closing:
                    return
                now = loop.time()
                lost_at = lost_at if lost_at is not None else now
                if not first.done():
                    if isinstance(e, MqttConnectError):  # the broker answered no (credentials): retrying won't help
                        first.set_exception(TransportError(f"the MQTT broker at {self._where()} refused the connection: {e}"))
                        return
                elif now - lost_at > self.cfg.reconnect_timeout_s:
                    self._fail(TransportError(f"lost the MQTT broker at {self._where()} for more than {self.cfg.reconnect_timeout_s:.0f}s: {e}"))
                    return
                log.debug("mqtt %s: connection lost (%s); retrying in %.2fs", self.role, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.reconnect_max_s)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # a bug here must not leave the role waiting forever
                self._fail(e)
                if not first.done():
                    first.set_exception(e)
                return

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
            self.mail.fail(error)
            if self._connected is not None:
                self._connected.set()  # wake publishers so they see the error

    # ---- receiving ----------------------------------------------------------------------

    def _on_message(self, topic: str, payload) -> None:
        levels = topic.split("/")
        if len(levels) != 4:
            self.stats["dropped"] += 1
            return
        _, _, dst, tag = levels
        if dst == STATUS:
            state = bytes(payload).decode(errors="replace") if payload else ""
            self._status(tag, state)
            return
        if dst != self.role or not self._on_frame(tag, payload):
            self.stats["dropped"] += 1

    def _on_frame(self, topic_tag: str, payload) -> bool:
        """Place one frame; False if it is not a well-formed frame of this run."""
        if not isinstance(payload, (bytes, bytearray)) or len(payload) < _FRAME.size:
            return False
        magic, version, _flags, src_len, tag_len, seq, chunk, n_chunks, total, offset, digest = _FRAME.unpack_from(payload)
        if magic != MAGIC or version != VERSION or n_chunks < 1 or chunk >= n_chunks or total > self._max_bytes:
            return False
        head = _FRAME.size + src_len + tag_len
        if len(payload) < head or offset + len(payload) - head > total:
            return False
        try:
            src = payload[_FRAME.size : _FRAME.size + src_len].decode()
            tag = payload[_FRAME.size + src_len : head].decode()
        except UnicodeDecodeError:
            return False
        if tag != topic_tag:
            return False
        body = memoryview(payload)[head:]
        stream = self._streams.get((src, tag))
        if stream is None:
            stream = self._streams[(src, tag)] = _Stream()
        if seq < stream.next_seq or seq in stream.done:
            return True  # a duplicate of something delivered: at-least-once delivery
        if n_chunks == 1:  # whole in one frame: deliver a view of it, no copy
            if len(body) != total:
                return False
            self._complete(stream, src, tag, seq, body)
            return True
        part = stream.partial.get(seq)
        if part is None:
            part = stream.partial[seq] = _Partial(total, n_chunks, digest)
        elif (part.size, part.n_chunks, part.digest) != (total, n_chunks, digest):
            return False
        if chunk in part.have:
            return True
        part.buf[offset : offset + len(body)] = body
        part.have.add(chunk)
        part.filled += len(body)
        if len(part.have) < n_chunks:
            return True
        del stream.partial[seq]
        if part.filled != total or checksum(part.buf) != digest:
            self.stats["dropped"] += 1  # corrupted: the sender does not know; count it loudly
            log.warning("mqtt %s: message %d from %s/%s failed its checksum and was dropped", self.role, seq, src, tag)
            return True
        self._complete(stream, src, tag, seq, part.buf)
        return True

    def _complete(self, stream: _Stream, src: str, tag: str, seq: int, buf) -> None:
        """A whole message has arrived: deliver it and whatever waited for it, in seq order."""
        stream.done[seq] = buf
        while stream.next_seq in stream.done:
            buf = stream.done.pop(stream.next_seq)
            stream.next_seq += 1
            self.stats["received"] += 1
            self.stats["received_bytes"] += len(buf)
            self.mail.put(src, tag, buf)

    async def recv(self, src: str, tag: str, timeout: float | None = None):
        return await self.mail.get(src, tag, timeout)

    # ---- sending ------------------------------------------------------------------------

    async def send(self, dst: str, tag: str, data) -> None:
        if self._error is not None:
            raise self._error
        key = (dst, tag)
        topic = self._topics.get(key)
        if topic is None:
            topic = self._topics[key] = self._topic(check_name("role", dst), check_name("tag", tag))
        mv = memoryview(data).cast("B")
        total = len(mv)
        if total > self._max_bytes:
            raise TransportError(f"a {total}-byte message to {dst}/{tag} exceeds transport.max_message_bytes={self.cfg.max_message_bytes}")
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        n = max(1, math.ceil(total / self._chunk_bytes))
        c = max(1, math.ceil(total / n))  # equal chunks: 1 MiB + a header is two halves, not 1 MiB and a sliver
        digest = checksum(mv) if n > 1 else 0
        src_b, tag_b = self.role.encode(), tag.encode()
        for i in range(n):
            await self._window.acquire()
            if self._error is not None:
                self._window.release()
                raise self._error
            payload = frame(src_b, tag_b, seq, i, n, total, i * c, digest, mv[i * c : (i + 1) * c])
            task = asyncio.create_task(self._publish(topic, payload))
            self._pending.add(task)
            task.add_done_callback(self._published)
        self.stats["sent"] += 1
        self.stats["sent_bytes"] += total

    def _published(self, task: asyncio.Task) -> None:
        self._pending.discard(task)
        self._window.release()
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())

    async def _publish(self, topic: str, payload: bytes) -> None:
        """Publish until the broker acknowledges it, across reconnects."""
        while True:
            await self._connected.wait()
            if self._error is not None:
                raise self._error
            try:
                await self._client.publish(topic, payload, qos=1, timeout=math.inf)
                return
            except aiomqtt.MqttError:
                if self._closing:
                    raise
                self._connected.clear()  # the supervisor reconnects; publish again then
                await asyncio.sleep(0)

    async def flush(self) -> None:
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self._error is not None:
            raise self._error

    async def publish_status(self, state: str) -> None:
        await self._connected.wait()
        if self._error is not None:
            raise self._error
        await self._client.publish(self._topic(STATUS, self.role), state.encode(), qos=1, timeout=self.cfg.connect_timeout_s)

    # ---- ending -------------------------------------------------------------------------

    async def close(self) -> None:
        if self._supervisor is None:
            return
        try:
            if self._error is None:
                await self.flush()
                await self.publish_status("done")
        finally:
            await self._abort()
            await self._forget_session()

    async def _abort(self) -> None:
        self._closing = True
        for t in list(self._pending):
            t.cancel()
        sup, self._supervisor = self._supervisor, None
        if sup is not None:
            sup.cancel()
            try:
                await sup
            except (asyncio.CancelledError, Exception):
                pass

    async def _forget_session(self) -> None:
        """Connect once with a clean session, so the broker drops what it kept for this role."""
        async def goodbye():
            client = self._make_client(clean=True)
            client._client.will_clear()  # a clean goodbye: no last will
            async with client:
                pass

        try:
            await asyncio.wait_for(goodbye(), 3.0)
        except (Exception, asyncio.CancelledError):
            pass  # the broker expires the session anyway; never fail a finished run for it


class MqttNetwork(Network):
    """The broker a run's roles meet at: a private mosquitto (spawn=auto/always) or a given one."""

    def __init__(self, cfg):
        validate_config(cfg)
        self.cfg = cfg
        self.address = None
        self.broker = None

    def open(self) -> None:
        from plugins.transports.broker import resolve

        self.address, self.broker = resolve(self.cfg.broker)

    def close(self) -> None:
        b, self.broker = self.broker, None
        if b is not None:
            b.close()

    def endpoint(self) -> MqttTransport:
        return MqttTransport(self.cfg, self.address)

    def worker_args(self) -> list[str]:
        from omegaconf import OmegaConf

        a = self.address or self.cfg.broker
        out = ["transport=mqtt"]
        for k, v in OmegaConf.to_container(self.cfg, resolve=True).items():
            if k not in ("name", "broker") and v is not None:
                out.append(f"transport.{k}={v}")
        return out + [f"transport.broker.host={a.host}", f"transport.broker.port={a.port}", "transport.broker.spawn=never"]

    def describe(self) -> str:
        a = self.address or self.cfg.broker
        return f"MQTT broker {a.host}:{a.port}" + (" (private mosquitto)" if self.broker else "")


@register("transport", "mqtt", schema=MqttConfig)
def build_mqtt(cfg) -> MqttNetwork:
    return MqttNetwork(cfg)
