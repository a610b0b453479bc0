"""`transport=mqtt`: role messages through an MQTT broker, the way IoT devices talk.

Topics: `<prefix>/<run_id>/<dst>/<src>/<tag>` for data (the sender's name is a topic level, so
a broker ACL can hold each role to its own name) and `<prefix>/<run_id>/_status/<role>` for
role states (each client's last will there says `lost`). QoS 1 throughout. The bytes of frames
and statuses, and their authentication, are in mqtt_frame.py; putting messages back together
in bounded memory is mqtt_reassembly.py; the run's secrets and how they reach role processes
are mqtt_credentials.py; the config is mqtt_config.py; the private broker is broker.py. This
module is the client (MqttTransport) and the run's network (MqttNetwork).

A message larger than `chunk_bytes` travels as several frames (brokers and clients handle
megabyte messages much better than hundred-megabyte ones). A message of one frame is delivered
without a copy. Messages are delivered per (src, tag) in `seq` order exactly once: QoS 1 is
at-least-once, and a publish retried after a reconnect may repeat or reorder frames.

Authenticated mode (every run of `runtime=local`/`remote`: the endpoint has the run's
credentials): every frame carries a MAC under the run key, checked before anything else is
done with it, so a frame from anyone who does not hold the key is counted (`unauthenticated`)
and dropped without touching a sequence number or allocating a buffer; statuses (the last
will included) are authenticated too. Without credentials (tests, benchmarks, an API user)
frames carry an XXH3-64 of each multi-chunk message instead, and nothing is authenticated;
an authenticated endpoint rejects such frames, and the reverse.

Memory is bounded: at most `max_inflight` chunks are published and unacknowledged at once
(`send` waits for a slot: back-pressure), a message is encoded once and sliced, never copied
whole, a message larger than `max_message_bytes` is refused at both ends, and the receiving
side bounds what each peer can make it hold (mqtt_reassembly.py).

The connection is supervised: if it drops, the client reconnects with exponential backoff
(a persistent session, `clean_session=False`, so the broker keeps this role's QoS-1 messages
while it is away) and unacknowledged chunks are published again. After
`reconnect_timeout_s` without a connection the transport fails with TransportError.

Delivery is end to end, so a broker restart loses nothing, with or without persistence
(mqtt_delivery.py): every message is kept until its receiver acknowledges it and is sent
again after a reconnect (this endpoint's, or the receiver's `back` status); a `lost` status
is believed only once it cannot be the broker going down. `close` waits for the
acknowledgements of what it sent, up to `reconnect_timeout_s`.

All aiomqtt use is in this module (aiomqtt 2.x), so moving to aiomqtt 3 touches one file.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import secrets
import socket
import time

import aiomqtt
import xxhash
from aiomqtt.exceptions import MqttConnectError
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.runtime.transport import NAME_RE, Mailboxes, Network, Transport, TransportError, check_name
from plugins.transports.broker import DEFAULT_HOST, DEFAULT_PORT, named, resolve, run_acl
from plugins.transports.mqtt_config import BrokerConfig, MqttConfig, check_link, is_loopback, validate_config  # noqa: F401  (re-exported)
from plugins.transports.mqtt_credentials import PASSWORD_ENV, RoleCredentials, RunSecrets, broker_password, load
from plugins.transports.mqtt_delivery import ACK_INTERVAL_S, ACK_TAG, LostFilter, Outbox, decode_acks, encode_acks
from plugins.transports.mqtt_frame import FLAG_MAC, HEADER, MAC_LEN, MAGIC, MAX_COUNTER, VERSION, Authenticator, context, pack_head, pack_status, parse_status
from plugins.transports.mqtt_reassembly import OK, REPLAYED, Reassembly, layout_ok

checksum = xxhash.xxh3_64_intdigest
_WILL = (1 << 20) - 1  # the last will's number within its connection (see _next_will)
_MAX_CONNECTIONS = (1 << 12) - 1
STATUS = "_status"
SOCKET_BUFFER = 4 << 20
_NO_TAG = bytes(MAC_LEN)

log = logging.getLogger("pipelab.mqtt")
# aiomqtt warns whenever more than 10 publishes await their acknowledgement; our window allows
# `max_inflight` of them on purpose
_client_log = logging.getLogger("pipelab.mqtt.client")
_client_log.setLevel(logging.CRITICAL)  # and paho's socket errors as a connection drops: the supervisor says it once


def _quiet_closed_sockets(loop: asyncio.AbstractEventLoop) -> None:
    """paho asks the loop to watch a socket it has just closed when a connection drops (aiomqtt
    2.x): asyncio would print that harmless EBADF as an error with two tracebacks."""
    previous = loop.get_exception_handler()
    if getattr(previous, "pipelab_quiet", False):
        return

    def handler(loop, ctx):
        exc, what = ctx.get("exception"), repr(ctx.get("handle", ""))
        if isinstance(exc, OSError) and exc.errno == errno.EBADF and ("add_writer" in what or "add_reader" in what):
            log.debug("mqtt: ignored a watch on a closed socket (%s)", what[:120])
        elif previous is not None:
            previous(loop, ctx)
        else:
            loop.default_exception_handler(ctx)

    handler.pipelab_quiet = True
    loop.set_exception_handler(handler)


def frame(src: bytes, tag: bytes, seq: int, chunk: int, n_chunks: int, total: int, offset: int, digest: int, body, *, session: int = 0) -> bytes:
    """An unauthenticated frame (tests, tools). `src` and `tag` travel in the topic, not here."""
    return b"".join((pack_head(0, seq, chunk, n_chunks, total, offset, session, digest), body))


def _stopping(task: asyncio.Task | None) -> bool:
    """The task ended or was asked to (Task.cancelling is Python 3.11+; 3.10 sees only ended tasks)."""
    if task is None or task.done():
        return True
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling and cancelling())


class _Handled(asyncio.Queue):
    """aiomqtt's incoming-message queue, replaced by a call: each message is placed (chunk
    copied into its message's buffer, whole messages into mailboxes) the moment the client
    reads it, so no queue of raw frames grows on a receiver that is busy."""

    handler = None  # set per transport through a subclass

    def put_nowait(self, item) -> None:
        self.handler(item)


class MqttTransport(Transport):
    def __init__(self, cfg, address=None, credentials: RoleCredentials | None = None):
        super().__init__()
        validate_config(cfg)
        self.cfg = cfg
        # read per message: plain ints, not config lookups
        self._chunk_bytes, self._max_bytes = int(cfg.chunk_bytes), int(cfg.max_message_bytes)
        self._topics: dict[tuple[str, str], tuple[str, bytes]] = {}
        self.address = address  # BrokerAddress; None: cfg.broker.host/port
        self.credentials = credentials
        self.auth = Authenticator(credentials.key, credentials.mac) if credentials is not None else None
        self.session = secrets.randbits(64)  # this endpoint's frames and statuses, told apart from any other's
        self._counter = 0  # frames this endpoint made: with the session, each frame's MAC nonce
        self._connection = 0  # connections that carried a will
        self._status_counter = 0  # statuses on the current connection
        self._will_armed = True  # the will set for the next connection has not been used yet
        self._status_seen: dict[tuple[str, int], int] = {}  # (role, session) -> last counter
        self.mail = Mailboxes()
        self._reasm = Reassembly(max_message_bytes=self._max_bytes, window=4 * int(cfg.max_inflight) + 64, peer_budget=2 * self._max_bytes,
                                 stale_s=float(cfg.partial_timeout_s), max_streams=None if self.auth else 4096, checksum=None if self.auth else checksum)
        self._seq: dict[tuple[str, str], int] = {}
        self._window: asyncio.Semaphore | None = None
        self._pending: set[asyncio.Task] = set()
        self._background: set[asyncio.Task] = set()  # resends, acknowledgements, `back`
        self._outbox = Outbox()  # sent, not yet acknowledged by the receiver
        self.stats["resent"] = 0  # messages sent again after a reconnect (theirs or ours)
        self._ack_due: dict[str, dict[str, int]] = {}  # src -> {tag: next seq}: acknowledgements to send
        self._ack_timer: asyncio.TimerHandle | None = None
        self._alive_due = False
        self._gone: set[str] = set()  # peers that said goodbye or were lost: they acknowledge nothing more
        # a will is believed after 0.5 s, or once this endpoint has been back long enough for the
        # role to have reconnected too (its backoff is at most reconnect_max_s)
        self._lost = LostFilter(settle_s=0.5, grace_s=2 * float(cfg.reconnect_max_s) + 2.0)
        self._connected: asyncio.Event | None = None
        self._closing = False
        self._error: BaseException | None = None
        self._supervisor: asyncio.Task | None = None
        self._expirer: asyncio.Task | None = None
        self._client: aiomqtt.Client | None = None

    # ---- connection ---------------------------------------------------------------------

    def _topic(self, *levels: str) -> str:
        return "/".join((self.cfg.topic_prefix, self.run_id, *levels))

    def _host_port(self) -> tuple[str, int]:
        if self.address:
            return self.address.host, self.address.port
        b = self.cfg.broker
        return b.host or DEFAULT_HOST, int(b.port) if b.port else DEFAULT_PORT

    def _make_client(self, clean: bool) -> aiomqtt.Client:
        cfg = self.cfg
        host, port = self._host_port()
        tls = None
        if cfg.tls:
            tls = aiomqtt.TLSParameters(ca_certs=cfg.tls_ca_certs, certfile=cfg.tls_certfile, keyfile=cfg.tls_keyfile)
        if self.credentials is not None:
            username, password = self.credentials.username, self.credentials.password
        else:
            username, password = cfg.username, broker_password(cfg.password)
        handled = type("_HandledQueue", (_Handled,), {"handler": staticmethod(lambda m: self._on_message(str(m.topic), m.payload))})
        return aiomqtt.Client(
            host,
            port,
            username=username,
            password=password,
            identifier=f"{cfg.topic_prefix}-{self.run_id}-{self.role}",
            clean_session=clean,
            keepalive=int(cfg.keepalive_s),
            will=aiomqtt.Will(self._topic(STATUS, self.role), self._next_will(), qos=1),
            max_inflight_messages=max(20, int(cfg.max_inflight)),
            queue_type=handled,
            # room for a whole chunk in the kernel: fewer wake-ups per megabyte
            socket_options=[(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER), (socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)],
            tls_params=tls,
            tls_insecure=cfg.tls_insecure if cfg.tls else None,
            timeout=cfg.connect_timeout_s,
            logger=_client_log,
        )

    def _next_will(self) -> bytes:
        """The next connection's last will. A status counter is (connection << 20) + n: the will
        of connection k is newer than anything said on it, and older than anything said after
        the reconnect (`back`), so a will the broker published while going down is superseded
        and a replay of it is rejected."""
        self._connection = min(self._connection + 1, _MAX_CONNECTIONS)
        self._status_counter = 0
        return pack_status("lost", self.session, self._connection << 20 | _WILL, self.auth, self.run_id, self.role)

    async def start(self, run_id: str, role: str) -> None:
        self.run_id, self.role = check_name("run", run_id), check_name("role", role)
        c = self.credentials
        if c is not None and (c.run_id, c.role) != (run_id, role):
            raise TransportError(f"these credentials are for role {c.role} of run {c.run_id}, not role {role} of run {run_id}")
        check_link(self.cfg, self._host_port()[0])
        _quiet_closed_sockets(asyncio.get_running_loop())
        self._window = asyncio.Semaphore(int(self.cfg.max_inflight))
        self._connected = asyncio.Event()
        self._client = self._make_client(clean=False)
        first = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.create_task(self._supervise(first), name=f"mqtt-{role}")
        self._expirer = asyncio.create_task(self._housekeeping(), name=f"mqtt-housekeeping-{role}")
        try:
            await asyncio.wait_for(asyncio.shield(first), self.cfg.connect_timeout_s)
        except asyncio.TimeoutError:
            await self._abort()
            raise TransportError(f"cannot reach the MQTT broker at {self._where()} within {self.cfg.connect_timeout_s:.0f}s (transport.broker.host/port)") from None
        except BaseException:
            await self._abort()
            raise

    def _where(self) -> str:
        return "%s:%d" % self._host_port()

    async def _subscribe(self, client: aiomqtt.Client, topic: str) -> None:
        granted = await client.subscribe(topic, qos=1)
        if any(getattr(g, "is_failure", False) or g == 0x80 for g in granted):
            raise TransportError(f"the MQTT broker at {self._where()} refused the subscription to {topic} (its ACL)")

    async def _supervise(self, first: asyncio.Future) -> None:
        """Stay connected: (re)connect with backoff, subscribe, hand every frame to `_on_message`."""
        delay = self.cfg.reconnect_initial_s
        lost_at = None
        loop = asyncio.get_running_loop()
        while not self._closing:
            try:
                if not self._will_armed:  # a new connection, a new will (see _next_will)
                    self._client._client.will_set(self._topic(STATUS, self.role), self._next_will(), qos=1)
                    self._will_armed = True
                async with self._client as client:
                    self._will_armed = False
                    await self._subscribe(client, self._topic(self.role, "+", "+"))
                    await self._subscribe(client, self._topic(STATUS, "+"))
                    self._lost.connected(time.monotonic())
                    if lost_at is not None:
                        self.stats["reconnects"] += 1
                        log.warning("mqtt %s: reconnected after %.1fs", self.role, loop.time() - lost_at)
                        self._spawn(self._back(), "back")
                    lost_at = None
                    delay = self.cfg.reconnect_initial_s
                    self._connected.set()
                    if not first.done():
                        first.set_result(None)
                    async for _ in client.messages:  # never yields (see _Handled); ends when the connection drops
                        pass
            except aiomqtt.MqttError as e:
                self._connected.clear()
                self._lost.disconnected()
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
                if delay == self.cfg.reconnect_initial_s:
                    log.warning("mqtt %s: lost the broker at %s (%s); reconnecting for up to %.0fs", self.role, self._where(), e, self.cfg.reconnect_timeout_s)
                log.debug("mqtt %s: connection lost (%s); retrying in %.2fs", self.role, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.reconnect_max_s)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # a bug (or a refused subscription) must not leave the role waiting forever
                self._fail(e)
                if not first.done():
                    first.set_exception(e)
                return

    async def _back(self) -> None:
        """After a reconnect: tell the peers (they send again what this endpoint may have missed
        while the broker was away), and send again what they have not acknowledged."""
        await self._publish_status("back")
        await self._resend()

    async def _say_alive(self) -> None:
        await asyncio.sleep(ACK_INTERVAL_S)  # one answer to the `back`s of several roles
        self._alive_due = False
        await self._publish_status("alive")

    async def _resend(self, dst: str | None = None) -> None:
        for d, tag, seq, data in self._outbox.unacknowledged(dst):
            if d not in self._gone:
                self.stats["resent"] += 1
                await self._transmit(d, tag, seq, data)

    def _spawn(self, coro, what: str) -> None:
        """A background task whose failure fails the transport (never a silent loss)."""
        task = asyncio.create_task(coro, name=f"mqtt-{what}-{self.role}")
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._closing:
            self._fail(task.exception())

    async def _housekeeping(self) -> None:
        """Expire stale partial messages; report the losses that can now be believed."""
        period = max(0.05, min(5.0, self.cfg.partial_timeout_s / 4))
        loop = asyncio.get_running_loop()
        next_expiry = loop.time() + period
        while True:
            await asyncio.sleep(0.1)
            for role in self._lost.believed(time.monotonic()):
                self._gone.add(role)
                self._outbox.forget(role)
                self._status(role, "lost")
            if loop.time() >= next_expiry:
                next_expiry = loop.time() + period
                n = self._reasm.expire(time.monotonic())
                if n:
                    self._reject("expired", n)
                    log.warning("mqtt %s: dropped %d half-received message(s) after %.0fs without a chunk", self.role, n, self.cfg.partial_timeout_s)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
            self.mail.fail(error)
            if self._connected is not None:
                self._connected.set()  # wake publishers so they see the error

    # ---- receiving ----------------------------------------------------------------------

    def _on_message(self, topic: str, payload) -> None:
        """Everything the broker delivers comes here; nothing it holds may raise out of it."""
        try:
            levels = topic.split("/")
            if len(levels) < 4 or levels[0] != self.cfg.topic_prefix or levels[1] != self.run_id:
                self._reject("foreign")
            elif len(levels) == 4 and levels[2] == STATUS:
                self._on_status(levels[3], payload)
            elif len(levels) == 5 and levels[2] == self.role:
                self._on_frame(levels[3], levels[4], payload)
            else:
                self._reject("foreign")
        except Exception:  # a bug here must cost one frame, not the connection
            log.exception("mqtt %s: a frame on %s could not be handled", self.role, topic[:200])
            self._reject("malformed")

    def _on_status(self, role: str, payload) -> None:
        if not NAME_RE.match(role):
            self._reject("foreign")
            return
        verdict, state, session, counter = parse_status(payload, self.auth, self.run_id, role)
        if verdict != OK:
            self._reject(verdict)
            return
        key = (role, session)
        if counter <= self._status_seen.get(key, -1):
            self._reject("replayed")
            return
        if len(self._status_seen) > 4096:  # unauthenticated mode: anyone can invent sessions
            self._status_seen.clear()
        self._status_seen[key] = counter
        if role == self.role:
            return  # this endpoint's own statuses (the broker echoes them)
        if state == "lost":
            self._lost.lost(role, time.monotonic())  # reported once believed (_housekeeping)
            return
        self._lost.alive(role)
        if state == "back":  # it reconnected: what it may have missed goes again, and it may have
            self._spawn(self._resend(role), "resend")  # missed this endpoint's `back` too
            if not self._alive_due:
                self._alive_due = True
                self._spawn(self._say_alive(), "alive")
            return
        if state == "alive":
            return
        if state == "done":
            self._gone.add(role)
            self._outbox.forget(role)
        self._status(role, state)

    def _on_frame(self, src: str, tag: str, payload) -> None:
        """Check and place one frame: structure, then MAC, then sequence and memory bounds."""
        if not (NAME_RE.match(src) and (NAME_RE.match(tag) or tag == ACK_TAG)):
            self._reject("foreign")
            return
        if not isinstance(payload, (bytes, bytearray)) or len(payload) < HEADER.size:
            self._reject("malformed")
            return
        magic, version, flags, _reserved, session, _counter, chunk, n_chunks, seq, total, offset, digest = HEADER.unpack_from(payload)
        if magic != MAGIC or version != VERSION or flags & ~FLAG_MAC:
            self._reject("malformed")
            return
        auth = self.auth
        if bool(flags & FLAG_MAC) != (auth is not None):
            self._reject("unauthenticated")
            return
        end = len(payload) - (MAC_LEN if auth is not None else 0)
        if end < HEADER.size:
            self._reject("malformed")
            return
        body = memoryview(payload)[HEADER.size : end]
        if not layout_ok(chunk, n_chunks, total, offset, len(body)):
            self._reject("malformed")
            return
        if auth is not None and not auth.frame_ok(context(self.run_id, src, self.role, tag), payload[: HEADER.size], body, payload[end:]):
            self._reject("unauthenticated")  # before anything is allocated or any sequence number is looked at
            return
        self._lost.alive(src)  # authentic (or, without a key, plausible): it is not dead
        if tag == ACK_TAG:
            self._on_ack(src, body)
            return
        if total > self._max_bytes:
            self._reject("over_budget")
            return
        verdict, ready = self._reasm.place(src, tag, seq, chunk, n_chunks, total, offset, session, digest, body, time.monotonic())
        if verdict != OK:
            self._reject(verdict)
            if verdict == REPLAYED:  # sent again: its acknowledgement may have been lost
                self._acknowledge(src, tag)
            elif verdict == "malformed" and n_chunks > 1 and auth is None:
                log.warning("mqtt %s: message %d from %s/%s failed its checksum and was dropped", self.role, seq, src, tag)
            return
        for buf in ready:
            self.stats["received"] += 1
            self.stats["received_bytes"] += len(buf)
            self.mail.put(src, tag, buf)
        if ready:
            self._acknowledge(src, tag)

    # ---- acknowledgements ---------------------------------------------------------------

    def _on_ack(self, src: str, body) -> None:
        try:
            acks = decode_acks(body)
        except (ValueError, UnicodeDecodeError):
            self._reject("malformed")
            return
        for tag, nxt in acks.items():
            self._outbox.ack(src, tag, nxt)

    def _acknowledge(self, src: str, tag: str) -> None:
        if self._supervisor is None:
            return  # not started (tests that hand frames to a bare endpoint)
        self._ack_due.setdefault(src, {})[tag] = self._reasm.next_seq(src, tag)
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_INTERVAL_S, self._send_acks)

    def _send_acks(self) -> None:
        self._ack_timer = None
        due, self._ack_due = self._ack_due, {}
        for src, acks in due.items():
            if src in self._gone:
                continue
            body = encode_acks(acks)
            topic = self._topic(src, self.role, ACK_TAG)
            self._spawn(self._publish(topic, self._frame(context(self.run_id, self.role, src, ACK_TAG), 0, 0, 1, len(body), 0, 0, body)), "ack")

    async def recv(self, src: str, tag: str, timeout: float | None = None):
        return await self.mail.get(src, tag, timeout)

    # ---- sending ------------------------------------------------------------------------

    async def send(self, dst: str, tag: str, data) -> None:
        """Send `data` (kept by reference until the receiver acknowledges it: do not change it)."""
        if self._error is not None:
            raise self._error
        key = (dst, tag)
        if key not in self._topics:
            check_name("role", dst), check_name("tag", tag)
        mv = memoryview(data).cast("B")
        total = len(mv)
        if total > self._max_bytes:
            raise TransportError(f"a {total}-byte message to {dst}/{tag} exceeds transport.max_message_bytes={self.cfg.max_message_bytes}")
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        if dst not in self._gone:
            self._outbox.keep(dst, tag, seq, mv)
        await self._transmit(dst, tag, seq, mv)
        self.stats["sent"] += 1
        self.stats["sent_bytes"] += total

    def _frame(self, ctx: bytes, seq: int, chunk: int, n: int, total: int, offset: int, digest: int, body):
        if self._counter >= MAX_COUNTER:  # a nonce must never repeat: 4 billion frames per endpoint
            raise TransportError(f"role {self.role} sent {MAX_COUNTER} frames on one connection; start a new run")
        self._counter += 1
        auth = self.auth
        head = pack_head(FLAG_MAC if auth is not None else 0, seq, chunk, n, total, offset, self.session, digest, self._counter)
        if auth is None:
            return b"".join((head, body))
        # copied first, then MAC'd where it lies, still in cache; paho takes a bytearray as it is
        payload = bytearray().join((head, body, _NO_TAG))
        payload[-MAC_LEN:] = auth.frame_tag(ctx, head, memoryview(payload)[len(head) : -MAC_LEN])
        return payload

    async def _transmit(self, dst: str, tag: str, seq: int, mv: memoryview) -> None:
        """Publish message `seq` of (dst, tag) as its frames, each when the window has room."""
        route = self._topics.get((dst, tag))
        if route is None:
            route = self._topics[(dst, tag)] = (self._topic(dst, self.role, tag), context(self.run_id, self.role, dst, tag))
        topic, ctx = route
        total = len(mv)
        n = max(1, math.ceil(total / self._chunk_bytes))
        c = max(1, math.ceil(total / n))  # equal chunks: 1 MiB + a header is two halves, not 1 MiB and a sliver
        digest = checksum(mv) if n > 1 and self.auth is None else 0  # authenticated: every chunk has its MAC
        for i in range(n):
            await self._window.acquire()
            try:
                if self._error is not None:
                    raise self._error
                payload = self._frame(ctx, seq, i, n, total, i * c, digest, mv[i * c : (i + 1) * c])
            except BaseException:
                self._window.release()
                raise
            task = asyncio.create_task(self._publish(topic, payload))
            self._pending.add(task)
            task.add_done_callback(self._published)

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
        """Wait until the broker has every frame sent so far."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self._error is not None:
            raise self._error

    async def _delivered(self, timeout: float) -> None:
        """Send the acknowledgements due, then wait until every live receiver has acknowledged
        what it was sent (a broker restart meanwhile: it is sent again), at most `timeout`."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._send_acks()
        deadline = time.monotonic() + timeout
        while (self._outbox.waiting_for() - self._gone or self._background) and time.monotonic() < deadline and self._error is None:
            await asyncio.sleep(0.01)
        if self._error is not None:
            raise self._error
        missing = self._outbox.waiting_for() - self._gone
        if missing:
            log.warning("mqtt %s: closing without acknowledgements from %s after %.0fs", self.role, ", ".join(sorted(missing)), timeout)

    async def publish_status(self, state: str) -> None:
        await self._publish_status(state)

    async def _publish_status(self, state: str) -> None:
        """Publish until the broker has it, numbered on the connection that carries it."""
        while True:
            await self._connected.wait()
            if self._error is not None:
                raise self._error
            self._status_counter = min(self._status_counter + 1, _WILL - 1)
            payload = pack_status(state, self.session, self._connection << 20 | self._status_counter, self.auth, self.run_id, self.role)
            try:
                await self._client.publish(self._topic(STATUS, self.role), payload, qos=1, timeout=math.inf)
                return
            except aiomqtt.MqttError:
                if self._closing:
                    raise
                self._connected.clear()
                await asyncio.sleep(0)

    # ---- ending -------------------------------------------------------------------------

    async def close(self) -> None:
        if self._supervisor is None:
            return
        try:
            # A clean goodbye waits for every receiver's acknowledgement; a cancelled close (an
            # interrupted run: asyncio cancels every task at once, this endpoint's reader
            # included) would wait reconnect_timeout_s for acknowledgements nobody reads.
            if self._error is None and not _stopping(self._supervisor) and not _stopping(asyncio.current_task()):
                await self.flush()
                await self._delivered(float(self.cfg.reconnect_timeout_s))
                await self.publish_status("done")
        finally:
            await self._abort()
            await self._forget_session()

    async def _abort(self) -> None:
        self._closing = True
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        for t in [*self._pending, *self._background]:
            t.cancel()
        for attr in ("_expirer", "_supervisor"):
            task = getattr(self, attr)
            setattr(self, attr, None)
            if task is not None:
                task.cancel()
                try:
                    await task
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
    """The broker a run's roles meet at: a private mosquitto that admits only the run
    (spawn=auto/always), or a named one; and the run's secrets."""

    secret_env = (PASSWORD_ENV,)  # a role gets the broker password in its token (worker_secret)

    def __init__(self, cfg):
        validate_config(cfg)
        self.cfg = cfg
        self.address = None
        self.broker = None
        self.secrets: RunSecrets | None = None

    def private(self) -> bool:
        b = self.cfg.broker
        return b.spawn == "always" or (b.spawn == "auto" and not named(b))

    def open(self, run_id: str, roles) -> None:
        cfg = self.cfg
        roles = list(roles)
        if self.private():
            self.secrets = RunSecrets(run_id, roles, cfg.mac, broker_users=True)
            self.address, self.broker = resolve(cfg.broker, users=self.secrets.passwords, acl=run_acl(cfg.topic_prefix, run_id, roles))
        else:
            self.address, _ = resolve(cfg.broker)
            check_link(cfg, self.address.host)
            self.secrets = RunSecrets(run_id, roles, cfg.mac, broker_users=False, username=cfg.username, password=broker_password(cfg.password))

    def close(self) -> None:
        b, self.broker = self.broker, None
        if b is not None:
            b.close()
        if self.secrets is not None:
            self.secrets.close()

    def endpoint(self, role: str | None = None) -> MqttTransport:
        """The coordinator's (after `open`), or, in a role process, the one its credentials name."""
        if self.secrets is not None:
            return MqttTransport(self.cfg, self.address, self.secrets.for_role(role))
        creds = load(self.cfg.credentials_file)
        if creds is None:
            raise ConfigError("transport.credentials_file", "a role needs its run's credentials: runtime=local hands them over through a pipe; "
                              "for runtime=remote the coordinator prints each role's command with transport.credentials_file=<file it wrote>")
        return MqttTransport(self.cfg, self.address, creds)

    def check_coordinator(self, runtime: str) -> None:
        if self.cfg.credentials_file:
            hands = "hands every role its credentials itself" if runtime == "local" else "writes each role's credentials file itself"
            raise ConfigError("transport.credentials_file", f"runtime={runtime} {hands}; the key is for a role started by hand (python -m framework.worker role=... "
                              "transport.credentials_file=<the file a runtime=remote coordinator wrote>): leave it null here")

    def worker_args(self) -> list[str]:
        a = self.address or self.cfg.broker
        out = ["transport=mqtt"]
        for k, v in OmegaConf.to_container(self.cfg, resolve=True).items():
            # secrets travel in worker_secret / worker_secret_args, never in a command line
            if k not in ("name", "broker", "username", "password", "credentials_file", "mac") and v is not None:
                out.append(f"transport.{k}={v}")
        host, port = a.host or DEFAULT_HOST, a.port or DEFAULT_PORT
        return out + [f"transport.broker.host={host}", f"transport.broker.port={port}", "transport.broker.spawn=never"]

    def worker_secret(self, role: str) -> bytes:
        return self.secrets.for_role(role).token().encode()

    def worker_secret_args(self, role: str) -> list[str]:
        return [f"transport.credentials_file={self.secrets.write_file(role)}"]

    def give_up_s(self) -> float:
        return float(self.cfg.reconnect_timeout_s)

    def describe(self) -> str:
        a = self.address or self.cfg.broker
        return f"MQTT broker {a.host}:{a.port}" + (" (private mosquitto, this run only)" if self.broker else "")


def build_mqtt(cfg) -> MqttNetwork:
    return MqttNetwork(cfg)
