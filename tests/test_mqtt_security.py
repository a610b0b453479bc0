"""transport=mqtt on a broker others can reach: who may connect, what is believed, what memory a
frame can cost. Against a real mosquitto (installed by setup.sh)."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import random
import resource
import shutil
import socket
import stat
import struct
import sys
import textwrap
import threading
import time
from pathlib import Path

import aiomqtt
import pytest
import torch
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.runtime import secret_pipe, wire
from framework.runtime.transport import FAULTS, TransportError
from plugins.transports import mqtt_credentials
from plugins.transports.broker import Broker, BrokerAddress, free_port, resolve
from plugins.transports.mqtt import MqttConfig, MqttNetwork, MqttTransport, checksum, frame
from plugins.transports.mqtt_credentials import RoleCredentials, RunSecrets
from plugins.transports.mqtt_frame import FIELDS, FLAG_MAC, HEADER, Authenticator, context, pack_head, pack_status
from plugins.transports.mqtt_reassembly import PREALLOC_BYTES

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed (bash setup.sh)")
ROOT = Path(__file__).resolve().parents[1]


def mqtt_cfg(**kw):
    return OmegaConf.merge(OmegaConf.structured(MqttConfig()), kw)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


@pytest.fixture
def open_broker():
    """A broker anyone may use (anonymous clients allowed): a shared broker, as an attacker sees it."""
    with Broker() as b:
        yield b


async def _messages(client, seconds: float) -> list:
    """Everything `client` receives within `seconds`."""
    got, it = [], client.messages.__aiter__()
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            m = await asyncio.wait_for(it.__anext__(), left)
        except asyncio.TimeoutError:
            break
        got.append((str(m.topic), bytes(m.payload)))
    return got


async def _until(pred, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


# ---- 1. the private broker admits only the run ------------------------------------------------


def test_the_private_broker_admits_only_the_run():
    roles = ["stage0", "stage1", "coordinator"]
    run, other = MqttNetwork(mqtt_cfg()), MqttNetwork(mqtt_cfg())
    run.open("runA", roles)
    other.open("runB", roles)  # another run: same role names, its own credentials
    try:
        broker_dir = run.broker.dir
        assert stat.S_IMODE((broker_dir / "passwd").stat().st_mode) == 0o600 and stat.S_IMODE((broker_dir / "acl").stat().st_mode) == 0o600
        pw = run.secrets.for_role("stage0").password
        assert pw not in (broker_dir / "passwd").read_text()  # hashed, as mosquitto_passwd writes it
        # nothing secret in what a role process's command line carries
        argv = " ".join(run.worker_args())
        creds = run.secrets.for_role("stage0")
        assert "password" not in argv and pw not in argv and "credentials" not in argv
        token = run.worker_secret("stage0").decode()
        assert RoleCredentials.from_token(token, "pipe") == creds

        async def main():
            host, port = run.address.host, run.address.port
            for username, password in [(None, None), ("stage0", other.secrets.for_role("stage0").password), ("nobody", pw)]:
                with pytest.raises(aiomqtt.MqttError, match="Not authorized"):
                    async with aiomqtt.Client(host, port, username=username, password=password):
                        pass
            t0, t1, tc = (run.endpoint(r) for r in roles)
            await t0.start("runA", "stage0")
            await t1.start("runA", "stage1")
            await tc.start("runA", "coordinator")
            # a member with valid credentials (stage0's) tries to read and write what is not its own
            async with aiomqtt.Client(host, port, username="stage0", password=pw, identifier="snoop") as snoop:
                await snoop.subscribe("#", qos=1)  # mosquitto grants it, then delivers nothing the ACL forbids
                await tc.send("stage1", "setup", b"for stage1 only")
                pretend = frame(b"", b"", 0, 0, 1, 6, 0, 0, b"forged")
                for topic in ("pipelab/runA/stage1/coordinator/setup", "pipelab/runA/_status/stage1", "pipelab/runB/stage1/stage0/x"):
                    try:  # as the coordinator, as stage1, on another run: the broker drops it (and the client)
                        async with aiomqtt.Client(host, port, username="stage0", password=pw, identifier=f"forger-{len(topic)}") as forger:
                            await forger.publish(topic, pretend, qos=1)
                            await asyncio.sleep(0.2)
                    except aiomqtt.MqttError:
                        pass
                seen = await _messages(snoop, 1.0)
            assert seen == []
            assert bytes(await t1.recv("coordinator", "setup", timeout=10)) == b"for stage1 only"
            with pytest.raises(asyncio.TimeoutError):
                await t1.recv("coordinator", "setup", timeout=0.5)
            assert t1.stats["dropped"] == 0  # the broker never delivered the forgery: nothing to reject
            for t in (t0, t1, tc):
                await t.close()

        asyncio.run(main())
    finally:
        run.close()
        other.close()
    assert run.broker is None and not broker_dir.exists()


def test_a_broker_squatting_on_the_mqtt_port_is_not_used():
    """Someone else's broker listens where MQTT brokers usually do (1883 when free here): the
    default config starts a private one on a free port instead, and the squatter sees nothing."""
    port = 1883
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    except OSError:
        port = free_port()
    with Broker(port=port) as squatter:
        cfg = mqtt_cfg()
        assert cfg.broker.port is None and cfg.broker.host is None
        net = MqttNetwork(cfg)
        net.open("r1", ["a", "coordinator"])

        async def main():
            async with aiomqtt.Client("127.0.0.1", squatter.port) as spy:
                await spy.subscribe("#", qos=1)
                a, c = net.endpoint("a"), net.endpoint("coordinator")
                await a.start("r1", "a")
                await c.start("r1", "coordinator")
                await a.send("coordinator", "x", b"private")
                assert bytes(await c.recv("a", "x", timeout=10)) == b"private"
                await a.close()
                await c.close()
                return await _messages(spy, 0.5)

        try:
            assert net.broker is not None and net.address.port != squatter.port
            assert asyncio.run(main()) == []
        finally:
            net.close()
        # named explicitly, it is joined (that is what naming a broker means)
        cfg.broker.port = squatter.port
        addr, spawned = resolve(cfg.broker)
        assert spawned is None and addr.port == squatter.port


def test_a_broker_off_this_machine_without_tls_is_refused_unless_insecure():
    async def start(**kw):
        t = MqttTransport(mqtt_cfg(connect_timeout_s=0.5, **kw), BrokerAddress("192.0.2.1", 1883))
        await t.start("r1", "a")

    with pytest.raises(ConfigError, match=r"transport.insecure.*192.0.2.1.*in clear"):
        asyncio.run(start())
    with pytest.raises(TransportError, match="cannot reach"):  # allowed: it tries (TEST-NET-1 never answers)
        asyncio.run(start(insecure=True))
    net = MqttNetwork(mqtt_cfg(**{"broker": {"host": "broker.example"}}))
    with pytest.raises(ConfigError, match="transport.insecure"):
        net.open("r1", ["a"])


def test_credentials_reach_a_role_only_through_a_pipe_or_a_private_file(tmp_path, monkeypatch):
    secrets = RunSecrets("r1", ["stage0", "coordinator"], "poly1305", broker_users=True)
    creds = secrets.for_role("stage0")
    assert creds.password not in repr(creds) and "key" not in repr(creds)
    r, w = os.pipe()  # what secret_pipe.popen leaves a role process: a pipe, and its number
    os.write(w, creds.token().encode())
    os.close(w)
    monkeypatch.setenv(secret_pipe.ENV, str(r))
    assert mqtt_credentials.load(None) == creds
    assert secret_pipe.ENV not in os.environ  # read once: the pipe is closed, its number forgotten
    with pytest.raises(OSError):
        os.fstat(r)
    assert mqtt_credentials.load(None) is None
    monkeypatch.setenv(secret_pipe.ENV, "not a descriptor")
    with pytest.raises(ConfigError, match=r"cannot read the credentials the coordinator handed over"):
        mqtt_credentials.load(None)
    path = secrets.write_file("stage0")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert mqtt_credentials.load(str(path)) == creds
    loose = tmp_path / "loose.json"
    loose.write_text(creds.token())
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        mqtt_credentials.load(str(loose))
    with pytest.raises(ConfigError, match="credentials_file"):
        MqttNetwork(mqtt_cfg()).endpoint()  # a role process with no credentials says where they come from
    with pytest.raises(TransportError, match="credentials are for role stage0"):
        asyncio.run(MqttTransport(mqtt_cfg(), BrokerAddress("127.0.0.1", 1), creds).start("r1", "coordinator"))
    secrets.close()
    assert not path.exists() and not path.parent.exists()


class _ProcessWatch(threading.Thread):
    """Reads /proc/<pid>/environ and cmdline of every descendant of this process, every 20 ms,
    for as long as it runs: what anyone on the machine who may read them (`ps`, the same user
    for environ) could see of a run's processes."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.seen: dict[int, set[tuple[bytes, bytes]]] = {}
        self.parent: dict[int, int] = {}

    def _descendants(self) -> list[int]:
        out, todo = [], [os.getpid()]
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    kids = [int(k) for k in (task / "children").read_text().split()]
                except OSError:
                    continue
                self.parent.update((k, pid) for k in kids)
                out += kids
                todo += kids
        return out

    def run(self):
        while not self.stop.is_set():
            for pid in self._descendants():
                try:
                    snap = (Path(f"/proc/{pid}/environ").read_bytes(), Path(f"/proc/{pid}/cmdline").read_bytes())
                except OSError:  # gone meanwhile
                    continue
                self.seen.setdefault(pid, set()).add(snap)
            time.sleep(0.02)


def test_no_secret_of_a_local_run_is_in_any_process_environment_or_command_line(tmp_path, monkeypatch):
    """A real runtime=local run (the coordinator here, two role processes, its mosquitto): the run
    key (base64 as in the token, and hex), every role's broker password, the broker's probe
    password and the user's $PIPELAB_MQTT_PASSWORD appear in no /proc/<pid>/environ or cmdline."""
    from plugins.transports import mqtt

    drawn, brokers = [], []

    class Recorded(RunSecrets):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            drawn.append(self)

    start = Broker.start

    def recorded_start(self, *a, **kw):
        brokers.append(self)
        return start(self, *a, **kw)

    monkeypatch.setattr(mqtt, "RunSecrets", Recorded)
    monkeypatch.setattr(Broker, "start", recorded_start)
    monkeypatch.setenv(mqtt_credentials.PASSWORD_ENV, "users-own-broker-password-4f1c")  # for a broker the run does not start
    watch = _ProcessWatch()
    watch.start()
    try:
        summary, _ = _run_job([*TINY, "tracking=none", "train.iterations_per_epoch=2"], tmp_path / "run")
    finally:
        watch.stop.set()
        watch.join(10)
    assert summary["status"] == "FINISHED"
    (run,), (broker,) = drawn, brokers
    assert set(run.passwords) == {"stage0", "stage1", "coordinator"}
    run_secrets = [base64.b64encode(run.key), run.key.hex().encode(), run.key.hex().upper().encode(), run.key,
                   *(p.encode() for p in run.passwords.values()), broker._probe[1].encode()]
    snaps = [(pid, env, argv) for pid, s in watch.seen.items() for env, argv in s]
    # the processes the run starts: role processes and the broker, children of the coordinator
    # (not their own short-lived forks, e.g. a role's subprocess before it execs)
    started = {pid for pid, env, argv in snaps if watch.parent.get(pid) == os.getpid() and (b"framework.worker" in argv or b"mosquitto" in argv)}
    roles = {pid for pid, env, argv in snaps if pid in started and b"framework.worker" in argv}
    assert len(roles) == 2 and len(started) == 3, {(pid, watch.parent.get(pid)): argv[:200] for pid, _, argv in snaps}
    # the role processes did get their credentials, through the pipe the environment names
    assert all(any(p == pid and secret_pipe.ENV.encode() in env for p, env, argv in snaps) for pid in roles)
    snaps.append((os.getpid(), Path("/proc/self/environ").read_bytes(), Path("/proc/self/cmdline").read_bytes()))  # the coordinator
    # the user's own broker password stays in the coordinator's environment (and whatever it runs
    # as itself, such as `git`): the run does not copy it into its role processes or its broker
    leaks = [(pid, where, argv[:200]) for pid, env, argv in snaps for where, text in (("environ", env), ("cmdline", argv))
             for s in (*run_secrets, *([b"users-own-broker-password-4f1c"] if pid in started else [])) if s in text]
    assert leaks == []


# ---- 2. authenticated frames and statuses ------------------------------------------------------


def _raw_ctl(header: dict) -> bytes:
    """A control message as anyone can write one (ctl_pack refuses malformed ones)."""
    head = json.dumps(header).encode()
    return struct.pack("<I", len(head)) + head


def _forged(seq: int, body: bytes, *, mac: bytes | None = b"", n_chunks: int = 1, chunk: int = 0, total: int | None = None, offset: int = 0) -> bytes:
    """A frame from someone without the key: no MAC flag, or the flag and a tag of its choice."""
    total = len(body) if total is None else total
    if mac is None:
        return pack_head(0, seq, chunk, n_chunks, total, offset, 7, 0) + body
    return pack_head(FLAG_MAC, seq, chunk, n_chunks, total, offset, 7, 0) + body + (mac or os.urandom(16))


def test_forged_frames_and_statuses_are_rejected_counted_and_consume_nothing(open_broker):
    """On a broker where anyone may publish (and read): an attacker who knows the topics and sees
    the run's frames, but not its key, injects everything the issue lists."""
    b = open_broker
    secrets = RunSecrets("t1", ["a", "c"], "poly1305", broker_users=False)
    wrong_key = Authenticator(os.urandom(32), "poly1305")  # another run's key
    nan = wire.encode({"x": torch.full((8,), float("nan"))})
    grads = [wire.encode({"x": torch.full((8,), float(i))}) for i in range(4)]

    async def main():
        a, c = MqttTransport(mqtt_cfg(), b.address, secrets.for_role("a")), MqttTransport(mqtt_cfg(), b.address, secrets.for_role("c"))
        statuses = []
        c.on_status(lambda r, s: statuses.append((r, s)))
        async with aiomqtt.Client(b.host, b.port) as spy:
            await spy.subscribe("pipelab/t1/#", qos=1)
            await c.start("t1", "c")
            await a.start("t1", "a")
            await a.publish_status("ready")
            await a.send("c", "grad", grads[0])
            assert wire.decode(await c.recv("a", "grad", timeout=10)).tensors["x"][0] == 0
            seen = dict(await _messages(spy, 0.5))
            real, ready = seen["pipelab/t1/c/a/grad"], seen["pipelab/t1/_status/a"]
            changed = bytearray(real)
            changed[HEADER.size + 20] ^= 1
            inbox, ctl = "pipelab/t1/c/a/grad", "pipelab/t1/c/a/ctl"
            injected = [
                (inbox, real),  # replayed: seq 0 again
                (inbox, bytes(changed)),  # changed payload, real MAC
                *[(inbox, _forged(s, nan)) for s in range(1, 93)],  # NaN gradients, future sequence numbers
                *[(inbox, _forged(s, nan, mac=None)) for s in range(1, 4)],  # the same without a MAC
                (inbox, pack_head(FLAG_MAC, 1, 0, 1, len(nan), 0, 7, 0) + nan + wrong_key.frame_tag(context("t1", "a", "c", "grad"), pack_head(FLAG_MAC, 1, 0, 1, len(nan), 0, 7, 0), nan)),
                (inbox, _forged(1, b"xx", n_chunks=2, total=2**31 - 1)),  # the 58-byte frame
                (ctl, _forged(0, _raw_ctl({"kind": "error", "traceback": "forged"}))),
                (ctl, _forged(1, _raw_ctl({"kind": "it"}))),
                (ctl, _forged(2, struct.pack("<I", 200_001) + b"[" * 100_000 + b"]" * 100_000 + b"!")),  # deep JSON
                ("pipelab/t1/_status/a", b"lost"),  # the old plain status
                ("pipelab/t1/_status/a", pack_status("lost", 7, 99, None, "t1", "a")),  # no MAC
                ("pipelab/t1/_status/a", pack_status("lost", 7, 99, wrong_key, "t1", "a")),  # another key's
                ("pipelab/t1/_status/a", ready),  # a's real `ready`, replayed
            ]
            for topic, payload in injected:
                await spy.publish(topic, payload, qos=1)
        for g in grads[1:]:
            await a.send("c", "grad", g)
        got = [float(wire.decode(await c.recv("a", "grad", timeout=10)).tensors["x"][0]) for _ in grads[1:]]
        assert got == [1.0, 2.0, 3.0]  # the real frames with those sequence numbers, not the forged ones
        with pytest.raises(asyncio.TimeoutError):
            await c.recv("a", "ctl", timeout=0.3)
        want = {"unauthenticated": 1 + 92 + 3 + 1 + 3 + 2, "malformed": 1 + 1, "replayed": 2}
        await _until(lambda: all(c.stats[k] >= v for k, v in want.items()))
        await asyncio.sleep(0.3)
        assert {k: c.stats[k] for k in want} == want, c.stats
        assert c.stats["dropped"] == want["unauthenticated"] + want["malformed"]
        assert c.stats["received"] == 4 and statuses == [("a", "ready")]  # no forged `lost`
        await a.close()
        await c.close()

    asyncio.run(main())


def test_the_last_will_is_authenticated_and_reports_a_killed_role(open_broker):
    b = open_broker
    secrets = RunSecrets("t1", ["victim", "coordinator"], "gmac", broker_users=False)
    code = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from omegaconf import OmegaConf
        from plugins.transports.mqtt import MqttConfig, MqttNetwork
        from plugins.transports.broker import BrokerAddress
        async def main():
            net = MqttNetwork(OmegaConf.structured(MqttConfig()))
            net.address = BrokerAddress("127.0.0.1", {b.port})
            t = net.endpoint()  # its credentials from a pipe, as a role process's
            await t.start("t1", "victim")
            await t.publish_status("ready")
            await asyncio.sleep(3600)
        asyncio.run(main())
    """)

    async def main():
        watcher = MqttTransport(mqtt_cfg(), b.address, secrets.for_role("coordinator"))
        seen = asyncio.Queue()
        watcher.on_status(lambda role, state: seen.put_nowait((role, state)))
        await watcher.start("t1", "coordinator")
        proc = secret_pipe.popen([sys.executable, "-c", code], secrets.for_role("victim").token().encode(), env=dict(os.environ))
        try:
            assert await asyncio.wait_for(seen.get(), 60) == ("victim", "ready")
            for where in ("cmdline", "environ"):
                assert base64.b64encode(secrets.key) not in Path(f"/proc/{proc.pid}/{where}").read_bytes()
            proc.kill()
            assert await asyncio.wait_for(seen.get(), 10) == ("victim", "lost")
            assert watcher.stats["dropped"] == 0
        finally:
            proc.kill()
            proc.wait()
            await watcher.close()

    asyncio.run(main())


# ---- 3. bounded reassembly ----------------------------------------------------------------------


def _started(cfg=None, creds=None, role="c") -> MqttTransport:
    """An endpoint whose receiving side is driven by hand (no broker)."""
    t = MqttTransport(cfg or mqtt_cfg(), BrokerAddress("127.0.0.1", 1), creds)
    t.run_id, t.role = "t1", role
    return t


def test_a_frame_announcing_a_huge_message_allocates_nothing():
    """The issue's 58-byte frame (n_chunks=2, total=2**31-1; 62 bytes in today's layout) allocated
    2 GiB; four, 8.4 GB.
    Bounds: a frame that fails its MAC allocates nothing; a total above max_message_bytes
    (256 MiB by default) is refused before anything is allocated; a frame that passes its MAC
    commits at most min(total, 32 MiB) until its chunks come (larger buffers grow as they do)."""
    secrets = RunSecrets("t1", ["a", "c"], "poly1305", broker_users=False)
    fifty_eight = frame(b"a", b"x", 1, 0, 2, 2**31 - 1, 0, 0, b"xx")
    assert len(fifty_eight) == HEADER.size + 2
    consistent = [frame(b"a", b"x", s, 0, 2**31 - 1, 2**31 - 1, 0, 0, b"x") for s in range(4)]  # 1-byte chunks: a valid layout
    gc.collect()
    base = rss_mib()
    plain, keyed = _started(), _started(creds=secrets.for_role("c"))
    for t in (plain, keyed):
        for f in [fifty_eight] * 4 + consistent:
            t._on_frame("a", "x", f)
        for s in range(4):  # flagged as authenticated, with a MAC of the attacker's choice
            t._on_frame("a", "x", _forged(s, b"x", n_chunks=2**31 - 1, total=2**31 - 1))
    assert rss_mib() - base < 8
    assert (plain.stats["malformed"], plain.stats["over_budget"], plain.stats["unauthenticated"]) == (4, 4, 4)
    assert keyed.stats["unauthenticated"] == 12 and keyed.stats["dropped"] == 12  # no MAC, or a wrong one: before any field is believed
    assert plain._reasm.held() == keyed._reasm.held() == 0
    # a member gone bad (its frames pass the MAC) announcing 1 GiB under a 2 GiB limit: 32 MiB, not 1 GiB
    big = _started(mqtt_cfg(max_message_bytes=2**31), creds=secrets.for_role("c"))
    auth, head = big.auth, pack_head(FLAG_MAC, 0, 0, 1024, 2**30, 0, 7, 0)
    body = b"y" * (2**20)
    gc.collect()
    base = rss_mib()
    big._on_frame("a", "x", head + body + auth.frame_tag(context("t1", "a", "c", "x"), head, body))
    assert big.stats["dropped"] == 0 and big._reasm.held() == PREALLOC_BYTES
    assert rss_mib() - base < PREALLOC_BYTES / 2**20 + 8
    assert big._reasm.expire(time.monotonic() + 10**6) == 1 and big._reasm.held() == 0  # a stale half message goes


def test_large_messages_grow_as_their_chunks_come_and_arrive_whole():
    """Above 32 MiB the buffer grows with the chunks, in any arrival order."""
    t = _started(mqtt_cfg(max_message_bytes=1 << 30, chunk_bytes=8 << 20))
    data = os.urandom(40 << 20)
    n, c = 5, 8 << 20
    frames = [frame(b"a", b"x", 0, i, n, len(data), i * c, checksum(data), data[i * c : (i + 1) * c]) for i in range(n)]
    for i in (3, 0, 4, 1):
        t._on_frame("a", "x", frames[i])
        assert t.stats["dropped"] == 0 and t.mail.box("a", "x").empty()
    t._on_frame("a", "x", frames[2])
    assert bytes(t.mail.box("a", "x").get_nowait()) == data


def test_a_peer_cannot_hold_more_than_its_budget_or_run_ahead_of_the_window():
    t = _started(mqtt_cfg(max_message_bytes=1 << 20, max_inflight=1))  # window 68 messages, budget 2 MiB per peer
    window = 4 * 1 + 64
    half = os.urandom(1 << 19)
    for s in range(5):  # each leaves a 1 MiB message half-received
        t._on_frame("a", "x", frame(b"a", b"x", s, 0, 2, 1 << 20, 0, 0, half))
    assert t._reasm.held("a") == 2 << 20 and t.stats["over_budget"] == 3
    t._on_frame("b", "x", frame(b"b", b"x", 0, 0, 2, 1 << 20, 0, 0, half))  # another peer has its own budget
    assert t._reasm.held("b") == 1 << 20
    t._on_frame("a", "y", frame(b"a", b"y", window, 0, 1, 1, 0, 0, b"z"))
    assert t.stats["out_of_window"] == 1
    t._on_frame("a", "y", frame(b"a", b"y", 0, 0, 1, 1, 0, 0, b"z"))  # the real seq 0 is not taken by the rejected one
    assert bytes(t.mail.box("a", "y").get_nowait()) == b"z"
    assert t._reasm.expire(time.monotonic() + 10**6) == 3 and t._reasm.held() == 0


def test_the_frame_parser_survives_10000_fuzzed_inputs_in_bounded_memory():
    """A seeded mutator over valid frames and statuses: bit flips, truncation, extension,
    hostile length, count and offset fields, odd topics. Half the inputs to the keyed endpoint
    are signed with the run key after mutation, so the fields behind the MAC are fuzzed too
    (a member gone bad). Nothing may raise, and what is buffered stays within budget."""
    rng = random.Random(1234)
    secrets = RunSecrets("t1", ["a", "c"], "poly1305", broker_users=False)
    cfg = mqtt_cfg(max_message_bytes=1 << 20, chunk_bytes=4096)
    plain, keyed = _started(cfg), _started(cfg, secrets.for_role("c"))
    auth = keyed.auth
    hostile = [0, 1, 2, 255, 4096, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    fields = FIELDS
    counter = iter(range(1, 10**6))  # a signer never repeats a nonce

    def valid(keyed_: bool) -> tuple[str, str, bytes]:
        src, tag = rng.choice(["a", "b"]), rng.choice(["x", "ctl"])
        size = rng.choice([0, 1, 100, 4096, 5000, 20000])
        data = os.urandom(size)
        n = max(1, -(-size // 4096))
        cs = max(1, -(-size // n))
        i = rng.randrange(n)
        body = data[i * cs : (i + 1) * cs]
        head = pack_head(FLAG_MAC if keyed_ else 0, rng.randrange(80), i, n, size, i * cs, 7, 0 if keyed_ or n == 1 else checksum(data), next(counter))
        if keyed_:
            return src, tag, head + body + auth.frame_tag(context("t1", src, "c", tag), head, body)
        return src, tag, head + body

    def mutate(p: bytes) -> bytes:
        p = bytearray(p)
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(5)
            if op == 0 and p:
                p[rng.randrange(len(p))] ^= 1 << rng.randrange(8)
            elif op == 1:
                del p[rng.randrange(len(p) + 1) :]
            elif op == 2:
                p += os.urandom(rng.randrange(64))
            elif len(p) >= HEADER.size:
                off, fmt = fields[rng.choice(list(fields))]
                v = rng.choice(hostile) % (2 ** (8 * struct.calcsize(fmt)))
                struct.pack_into(fmt, p, off, v)
        return bytes(p)

    def resign(p: bytes, src: str, tag: str) -> bytes:
        if len(p) < HEADER.size + 16:
            return p
        head, body = p[: HEADER.size], p[HEADER.size : -16]
        return head + body + auth.frame_tag(context("t1", src, "c", tag), head, body)

    clean_seq = {id(plain): 0, id(keyed): 0}

    def clean(t) -> None:
        """A whole message, all its chunks in order, from a peer that sends only real traffic."""
        data = os.urandom(rng.choice([0, 10, 4096, 9000]))
        n = max(1, -(-len(data) // 4096))
        cs = max(1, -(-len(data) // n))
        seq = clean_seq[id(t)]
        clean_seq[id(t)] += 1
        for i in range(n):
            body = data[i * cs : (i + 1) * cs]
            head = pack_head(FLAG_MAC if t.auth else 0, seq, i, n, len(data), i * cs, 9, 0 if t.auth or n == 1 else checksum(data), next(counter))
            t._on_frame("k", "clean", head + body + (t.auth.frame_tag(context("t1", "k", "c", "clean"), head, body) if t.auth else b""))
        assert bytes(t.mail.box("k", "clean").get_nowait()) == data

    gc.collect()
    base = rss_mib()
    t0 = time.perf_counter()
    for i in range(10_000):
        t = keyed if i % 2 else plain
        kind = rng.random()
        if kind < 0.05:
            clean(t)
        elif kind < 0.12:  # a status, mutated
            t._on_status(rng.choice(["a", "b", "_x", "a" * 70]), mutate(pack_status(rng.choice(["ready", "lost", "done"]), 3, i, t.auth, "t1", "a")))
        elif kind < 0.16:  # a topic that is not one
            t._on_message(rng.choice(["pipelab/t1/c", "pipelab/t2/c/a/x", "x/t1/c/a/x", "pipelab/t1/c/a/x/y", "pipelab/t1/d/a/x", "pipelab/t1/_status/a/b"]), os.urandom(60))
        else:
            src, tag, p = valid(t is keyed)
            if rng.random() < 0.9:
                p = mutate(p)
                if t is keyed and rng.random() < 0.5:
                    p = resign(p, src, tag)
            t._on_frame(src, tag, p if rng.random() < 0.9 else bytearray(p))
        assert t._reasm.held("a") <= 2 * cfg.max_message_bytes and t._reasm.held("b") <= 2 * cfg.max_message_bytes
    elapsed = time.perf_counter() - t0
    for t in (plain, keyed):
        assert sum(t.stats[k] for k in FAULTS) > 1000  # the mutations were caught, and counted
        assert clean_seq[id(t)] > 200  # while real traffic went through, whole and in order (checked as it came)
        t._reasm.expire(time.monotonic() + 10**6)
        assert t._reasm.held() == 0
    assert rss_mib() - base < 64
    assert elapsed < 20, elapsed


# ---- 5. faults are visible ----------------------------------------------------------------------


def test_transport_faults_are_reported_in_one_line(capsys):
    from framework.runtime.local import LocalConfig, LocalRuntime
    from framework.runtime.transport import Network

    class Net(Network):
        open = close = lambda self, *a, **k: None
        endpoint = worker_args = lambda self, *a, **k: None

    rt = LocalRuntime(LocalConfig(tune_malloc=False), None, None, network=Net())
    rt.process_stats = {"stage1": {"transport": {"dropped": 95, "unauthenticated": 92, "malformed": 3, "replayed": 2, "received": 7}},
                        "coordinator": {"transport": {"dropped": 0, "unauthenticated": 0}}}
    rt._report_transport_faults()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["runtime=local: transport rejected frames (stage1: malformed 3, unauthenticated 92, replayed 2); per role in summary.json processes.<role>.transport"]
    rt.process_stats = {"stage1": {"transport": {"dropped": 0, "received": 7}}}
    rt._report_transport_faults()
    assert capsys.readouterr().err == ""


# ---- the whole run, attacked ---------------------------------------------------------------------

TINY = ["scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2", "model=mlp", "dataset=synthetic_mnist", "train.epochs=1", "train.iterations_per_epoch=3",
        "dataset.n_train=256", "dataset.n_val=64", "dataset.n_test=64", "runtime=local", "transport=mqtt", "runtime.dtype=float64", "runtime.progress=false"]


class _Attacker(threading.Thread):
    """Knows the run's topics and reads every frame on the shared broker, but not the run key.
    For every frame it sees it replays it, flips a byte of it, and sends NaN gradients with the
    next sequence numbers; it forges `lost` for every role whose status it sees, and control
    messages (`error`, `it`, deep JSON) for the coordinator."""

    def __init__(self, port: int, run_id: str):
        super().__init__(daemon=True)
        self.port, self.run_id = port, run_id
        self.stop = threading.Event()
        self.injected = self.replayed = 0

    def run(self):
        asyncio.run(self._main())

    async def _main(self):
        nan = wire.encode({"x": torch.full((16, 32), float("nan"), dtype=torch.float64)})
        forged_ctl = [_raw_ctl({"kind": "error", "traceback": "forged"}), _raw_ctl({"kind": "it"}), struct.pack("<I", 20_001) + b"[" * 10_000 + b"]" * 10_000 + b"!"]
        lost, mine = set(), set()
        async with aiomqtt.Client("127.0.0.1", self.port) as c:
            await c.subscribe(f"pipelab/{self.run_id}/#", qos=1)
            it = c.messages.__aiter__()
            while not self.stop.is_set():
                try:
                    m = await asyncio.wait_for(it.__anext__(), 0.2)
                except asyncio.TimeoutError:
                    continue
                topic, payload = str(m.topic), bytes(m.payload)
                if payload in mine:
                    continue  # its own injection, coming back
                levels = topic.split("/")
                out = []
                if len(levels) == 4 and levels[3] not in lost:
                    if not lost:  # the coordinator is listening by now: control messages in the roles' names
                        out += [(f"pipelab/{self.run_id}/coordinator/{r}/ctl", _forged(i, p)) for r in ("stage0", "stage1") for i, p in enumerate(forged_ctl)]
                    lost.add(levels[3])
                    out += [(topic, b"lost"), (topic, pack_status("lost", 1, 2**32 - 1, None, self.run_id, levels[3]))]
                elif len(levels) == 5 and len(payload) > HEADER.size + 16 and self.injected < 600:
                    seq = struct.unpack_from("<Q", payload, FIELDS["seq"][0])[0]
                    flipped = bytearray(payload)
                    flipped[HEADER.size] ^= 0xFF
                    out += [(topic, payload), (topic, bytes(flipped))] + [(topic, _forged(seq + k, nan)) for k in (1, 2, 3)]
                    self.replayed += 1
                for t, p in out:
                    mine.add(p)
                    await c.publish(t, p, qos=1)
                    self.injected += 1


def _run_job(overrides, out_dir):
    from hydra import compose, initialize_config_dir

    from framework.cli import CONF_DIR
    from framework.job import Job

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    job = Job(cfg, out_dir)
    summary = job.run()
    return summary, {k: v.clone() for k, v in job.final_model().state_dict().items()}


@pytest.mark.slow
def test_an_attacked_run_rejects_every_forgery_and_ends_with_the_undisturbed_weights(tmp_path, capfd, mlflow_store):
    tracking, client = mlflow_store
    clean_summary, clean = _run_job([*TINY, "tracking=none"], tmp_path / "clean")
    with Broker() as shared:  # anonymous clients welcome: the attacker publishes and reads freely
        attacker = _Attacker(shared.port, "rattack")
        attacker.start()
        time.sleep(0.5)
        try:
            summary, weights = _run_job([*TINY, *tracking, "runtime.run_id=rattack", f"transport.broker.port={shared.port}"], tmp_path / "attacked")
        finally:
            attacker.stop.set()
            attacker.join(10)
    assert attacker.injected > 50
    assert summary["status"] == clean_summary["status"] == "FINISHED"
    assert weights.keys() == clean.keys() and all(torch.equal(weights[k], clean[k]) for k in clean)
    counts = {role: p["transport"] for role, p in summary["processes"].items()}
    assert set(counts) == {"stage0", "stage1", "coordinator"}
    total = {k: sum(c[k] for c in counts.values()) for k in FAULTS}
    # the attacker lags the run (it waits for the broker on each of its publishes), so some of
    # what it sends arrives after an endpoint took its counts or closed: counted, not all of it
    assert total["replayed"] >= 2 and total["unauthenticated"] >= 10 and total["malformed"] >= 2, (counts, attacker.replayed)
    assert total["replayed"] <= attacker.replayed
    saved = json.loads((tmp_path / "attacked" / "summary.json").read_text())
    assert saved["processes"]["coordinator"]["transport"]["unauthenticated"] == counts["coordinator"]["unauthenticated"] >= 6
    err = capfd.readouterr().err
    assert "transport rejected frames (" in err and "unauthenticated" in err
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.metrics["transport/unauthenticated/coordinator"] == counts["coordinator"]["unauthenticated"]
