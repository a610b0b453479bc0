"""The bytes of `transport=mqtt`: frame and status layouts, and how they are authenticated.

A data frame (one MQTT payload, little-endian) on topic `<prefix>/<run>/<dst>/<src>/<tag>`:

    magic "PLMQ" | version u8 | flags u8 | reserved u16 | session u64 | counter u32 | chunk u32
    | n_chunks u32 | seq u64 | total u64 | offset u64 | digest u64 | body | [mac 16 bytes]

`session` is a random number the sending endpoint draws when it starts and `counter` counts its
frames, so (session, counter) names one frame of one sender; `digest` is the XXH3-64 of the
whole message in unauthenticated mode (multi-chunk messages only), 0 otherwise.

With the run's key (flag MAC) every frame ends with a 16-byte tag over everything that makes
it what it is: the run, src, dst and tag (taken from the topic, never sent twice), the whole
header and the body. It is the tag of an AEAD under a frame key derived from the run key,
with (session, counter) as its 96-bit nonce, run | src | dst | tag | header as the (discarded)
plaintext and the body as associated data: AES-256-GCM (GMAC over the body; the default) or
ChaCha20-Poly1305 (`transport.mac=poly1305`); or truncated HMAC-SHA256 over all of it
(`hmac-sha256`). A sender never repeats a nonce with other bytes (a new session per endpoint,
a counter per frame; a frame sent again after a reconnect is the same bytes), the condition
under which both AEADs are secure MACs; a forger may pick any nonce and still has to guess the
tag. Per MiB on the development machine (x86 with AES-NI, PCLMULQDQ and SHA-NI): GMAC 0.07
ms, Poly1305 0.13-0.15 ms, HMAC-SHA256 0.73 ms, keyed BLAKE2b 1.9 ms; with four passes per round
trip (sign, check, sign, check) HMAC-SHA256 costs a third of the transport's throughput
(README, benchmarks). On a CPU without AES instructions (Raspberry Pi 4) Poly1305 is the fast
one.

A status (topic `<prefix>/<run>/_status/<role>`):

    magic "PLMS" | version u8 | flags u8 | reserved u16 | session u64 | counter u32 | state utf-8
    | [mac 16 bytes: HMAC-SHA256(status_key, run | role | everything before it), truncated]

A role's last will (`lost`) is fixed when it connects: it carries the endpoint's session and
the next status counter, and a MAC like any status, so only the run's own broker connection
can publish it. Statuses from one (role, session) must count up: a replayed older one is
rejected, and what a role says after reconnecting (`back`) is newer than the will that the
broker published when it went down (mqtt_delivery.py).
"""

from __future__ import annotations

import hmac
import struct

MAGIC = b"PLMQ"
VERSION = 3
HEADER = struct.Struct("<4sBBHQIIIQQQQ")
# where each field is, for tools and tests: name -> (offset, struct format)
FIELDS = {"session": (8, "<Q"), "counter": (16, "<I"), "chunk": (20, "<I"), "n_chunks": (24, "<I"), "seq": (28, "<Q"), "total": (36, "<Q"),
          "offset": (44, "<Q"), "digest": (52, "<Q")}
NONCE = slice(8, 20)  # session and counter: an AEAD's 96-bit nonce
MAX_COUNTER = 0xFFFFFFFF
FLAG_MAC = 1
MAC_LEN = 16
STATUS_MAGIC = b"PLMS"
STATUS_HEAD = struct.Struct("<4sBBHQI")
MAX_STATE = 64
MACS = ("gmac", "poly1305", "hmac-sha256")


def pack_head(flags: int, seq: int, chunk: int, n_chunks: int, total: int, offset: int, session: int, digest: int, counter: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, flags, 0, session, counter, chunk, n_chunks, seq, total, offset, digest)


def context(run_id: str, src: str, dst: str, tag: str) -> bytes:
    """What a frame's MAC binds besides its own bytes: whose it is and where it goes."""
    return f"{run_id}\0{src}\0{dst}\0{tag}\0".encode()


class Authenticator:
    """The run key, turned into frame and status MACs. Both ends of a run hold the same key."""

    def __init__(self, key: bytes, algorithm: str = "gmac"):
        if len(key) < 16:
            raise ValueError("a run key has at least 16 bytes")
        if algorithm not in MACS:
            raise ValueError(f"unknown MAC {algorithm!r}; choices: {', '.join(MACS)}")
        self.algorithm = algorithm
        # separate keys for separate jobs: a status tag can never pass for a frame tag
        frame_key = hmac.digest(key, b"pipelab mqtt frame key v3", "sha256")
        self._status_key = hmac.digest(key, b"pipelab mqtt status key v3", "sha256")
        self._aead = self._hmac = None
        if algorithm == "gmac":
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # cryptography: start-up (the CLI imports this module; only a run whose frames carry MACs uses it)

            self._aead = AESGCM(frame_key)  # one object: no key setup per frame
        elif algorithm == "poly1305":
            from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305  # cryptography: start-up

            self._aead = ChaCha20Poly1305(frame_key)
        else:
            self._hmac = hmac.new(frame_key, digestmod="sha256")

    def frame_tag(self, ctx: bytes, head: bytes, body) -> bytes:
        """`ctx`: context(run, src, dst, tag); `head`: the frame's header (its nonce inside)."""
        if self._aead is not None:
            return self._aead.encrypt(head[NONCE], ctx + head, body)[-MAC_LEN:]
        h = self._hmac.copy()
        h.update(ctx + head)
        h.update(body)
        return h.digest()[:MAC_LEN]

    def frame_ok(self, ctx: bytes, head: bytes, body, tag) -> bool:
        return hmac.compare_digest(self.frame_tag(ctx, head, body), tag)

    def status_tag(self, run_id: str, role: str, signed: bytes) -> bytes:
        return hmac.digest(self._status_key, f"{run_id}\0{role}\0".encode() + signed, "sha256")[:MAC_LEN]


def pack_status(state: str, session: int, counter: int, auth: Authenticator | None, run_id: str, role: str) -> bytes:
    s = state.encode()
    if len(s) > MAX_STATE:
        raise ValueError(f"status {state!r} is longer than {MAX_STATE} bytes")
    body = STATUS_HEAD.pack(STATUS_MAGIC, VERSION, FLAG_MAC if auth else 0, 0, session, counter) + s
    return body + auth.status_tag(run_id, role, body) if auth else body


def parse_status(payload, auth: Authenticator | None, run_id: str, role: str) -> tuple[str, str | None, int, int]:
    """(verdict, state, session, counter): verdict is "ok", "malformed" or "unauthenticated"."""
    if not isinstance(payload, (bytes, bytearray)) or len(payload) < STATUS_HEAD.size:
        return "malformed", None, 0, 0
    magic, version, flags, _r, session, counter = STATUS_HEAD.unpack_from(payload)
    if magic != STATUS_MAGIC or version != VERSION or flags & ~FLAG_MAC:
        return "malformed", None, 0, 0
    if bool(flags & FLAG_MAC) != (auth is not None):
        return "unauthenticated", None, 0, 0
    end = len(payload) - (MAC_LEN if auth else 0)
    if end < STATUS_HEAD.size or end - STATUS_HEAD.size > MAX_STATE:
        return "malformed", None, 0, 0
    if auth is not None and not hmac.compare_digest(auth.status_tag(run_id, role, bytes(payload[:end])), bytes(payload[end:])):
        return "unauthenticated", None, 0, 0
    try:
        state = bytes(payload[STATUS_HEAD.size : end]).decode()
    except UnicodeDecodeError:
        return "malformed", None, 0, 0
    return "ok", state, session, counter
