"""transport=mqtt against a real mosquitto on a free loopback port (installed by setup.sh)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.runtime.transport import TransportError
from plugins.transports.broker import Broker, free_port, resolve
from plugins.transports.mqtt import MqttConfig, MqttTransport, checksum, frame

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed (bash setup.sh)")
ROOT = Path(__file__).resolve().parents[1]


def mqtt_cfg(**kw):
    return OmegaConf.merge(OmegaConf.structured(MqttConfig()), kw)


@pytest.fixture
def broker():
    with Broker() as b:
        yield b


async def pair(broker, run="t1", **kw):
    cfg = mqtt_cfg(**kw)
    a, c = MqttTransport(cfg, broker.address), MqttTransport(cfg, broker.address)
    await a.start(run, "a")
    await c.start(run, "c")
    return a, c


def test_messages_arrive_whole_in_order_exactly_once(broker):
    async def main():
        a, c = await pair(broker, chunk_bytes=4096)
        sizes = [0, 1, 4095, 4096, 4097, 100_000]
        msgs = [os.urandom(n) for n in sizes]
        for m in msgs:
            await a.send("c", "act", m)
        for i in range(30):  # a second stream interleaved: order is per (src, tag)
            await a.send("c", "grad", i.to_bytes(2, "little"))
        got = [bytes(await c.recv("a", "act", timeout=10)) for _ in msgs]
        seq = [int.from_bytes(await c.recv("a", "grad", timeout=10), "little") for _ in range(30)]
        assert got == msgs and seq == list(range(30))
        assert c.stats["received"] == len(msgs) + 30 and c.stats["dropped"] == 0
        with pytest.raises(asyncio.TimeoutError):  # nothing is delivered twice
            await c.recv("a", "act", timeout=0.3)
        await a.close()
        await c.close()

    asyncio.run(main())


def test_duplicated_and_reordered_frames_are_put_back_in_order(broker):
    """QoS 1 is at-least-once and retries after a reconnect can reorder: the receiver copes."""

    async def main():
        a, c = await pair(broker, chunk_bytes=1024)
        import aiomqtt

        data = [os.urandom(2500), os.urandom(10)]
        frames = []
        for seq, d in enumerate(data):
            n = -(-len(d) // 1024)
            cs = -(-len(d) // n)  # the sender's equal chunks
            frames += [frame(b"a", b"act", seq, i, n, len(d), i * cs, checksum(d), d[i * cs : (i + 1) * cs]) for i in range(n)]
        order = [3, 1, 1, 0, 2, 3, 0]  # second message first, duplicates of both
        async with aiomqtt.Client(broker.host, broker.port) as raw:
            for k in order:
                await raw.publish("pipelab/t1/c/a/act", frames[k], qos=1)  # <prefix>/<run>/<dst>/<src>/<tag>
        assert [bytes(await c.recv("a", "act", timeout=10)) for _ in data] == data
        with pytest.raises(asyncio.TimeoutError):
            await c.recv("a", "act", timeout=0.3)
        assert c.stats["dropped"] == 0 and c.stats["replayed"] == 3  # repeats are counted, not dropped as faults
        await a.close()
        await c.close()

    asyncio.run(main())


def test_malformed_and_foreign_messages_are_dropped_and_counted(broker):
    async def main():
        a, c = await pair(broker)
        import aiomqtt

        good = b"payload"
        half = 750
        big = os.urandom(1500)  # two chunks whose reassembly fails its checksum: one drop
        bad_digest = [frame(b"a", b"act", 0, i, 2, len(big), i * half, checksum(big) ^ 1, big[i * half : (i + 1) * half]) for i in (0, 1)]
        overlapping = frame(b"a", b"act", 0, 1, 2, len(big), 100, 0, big[100:850])  # not where chunk 1 of 2 starts
        too_long = frame(b"a", b"act", 0, 0, 1, 3, 0, checksum(good), good)  # body past total
        async with aiomqtt.Client(broker.host, broker.port) as raw:
            for junk in (b"\x80\x04 pickle? never", b"PLMQ", *bad_digest, overlapping, too_long):
                await raw.publish("pipelab/t1/c/a/act", junk, qos=1)
            await raw.publish("pipelab/t1/c/a/act/extra", b"x", qos=1)  # not a run topic layout: never subscribed to
            await raw.publish("pipelab/t1/c/_bad/act", good, qos=1)  # not a role name
        await a.send("c", "act", good)
        assert bytes(await c.recv("a", "act", timeout=10)) == good
        # a failed checksum is only known when its last chunk arrives: the first chunk was placed
        assert c.stats["dropped"] == 6 and c.stats["received"] == 1
        assert (c.stats["malformed"], c.stats["foreign"]) == (5, 1), c.stats
        await a.close()
        await c.close()

    asyncio.run(main())


def test_a_killed_role_is_reported_by_its_last_will(broker):
    code = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from omegaconf import OmegaConf
        from plugins.transports.broker import BrokerAddress
        from plugins.transports.mqtt import MqttConfig, MqttTransport
        async def main():
            t = MqttTransport(OmegaConf.structured(MqttConfig()), BrokerAddress("127.0.0.1", {broker.port}))
            await t.start("t1", "victim")
            await t.publish_status("ready")
            await asyncio.sleep(3600)
        asyncio.run(main())
    """)

    async def main():
        cfg = mqtt_cfg()
        watcher = MqttTransport(cfg, broker.address)
        seen = asyncio.Queue()
        watcher.on_status(lambda role, state: seen.put_nowait((role, state)))
        await watcher.start("t1", "coordinator")
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            assert await asyncio.wait_for(seen.get(), 60) == ("victim", "ready")
            t0 = time.monotonic()
            proc.kill()
            assert await asyncio.wait_for(seen.get(), 10) == ("victim", "lost")
            assert time.monotonic() - t0 < 10
        finally:
            proc.kill()
            proc.wait()
            await watcher.close()

    asyncio.run(main())


def test_a_broker_restart_is_survived_by_reconnecting():
    with Broker(persistence=True) as b:

        async def main():
            a, c = await pair(b, reconnect_initial_s=0.05, reconnect_max_s=0.5)
            for i in range(5):
                await a.send("c", "x", bytes([i]))
            assert [bytes(await c.recv("a", "x", timeout=10)) for _ in range(5)] == [bytes([i]) for i in range(5)]
            await asyncio.get_running_loop().run_in_executor(None, b.restart)
            for i in range(5, 10):  # waits for the reconnect, then goes through
                await a.send("c", "x", bytes([i]))
            assert [bytes(await c.recv("a", "x", timeout=30)) for _ in range(5)] == [bytes([i]) for i in range(5, 10)]
            assert a.stats["reconnects"] >= 1 and c.stats["reconnects"] >= 1
            await a.close()
            await c.close()

        asyncio.run(main())


@pytest.mark.parametrize("persistence", [False, True], ids=["forgetful", "persistent"])
def test_a_broker_restart_loses_no_message_and_reports_no_loss(persistence):
    """The receiver stalls (its event loop blocked) while 300 messages are published: the broker
    has sent it what its in-flight window allows and queues the rest. Then the broker restarts.
    Without persistence it forgets the queue; with it, it publishes every client's last will as
    it goes down. Either way every message arrives once and in order (the sender keeps each
    until the receiver acknowledges it and sends the rest again), and nobody is reported lost."""
    import threading

    with Broker(persistence=persistence) as b:
        cfg = mqtt_cfg(reconnect_initial_s=0.05, reconnect_max_s=0.5)
        r_loop = asyncio.new_event_loop()
        threading.Thread(target=r_loop.run_forever, daemon=True).start()

        def on_r(coro):  # run on the receiver's loop, await from the sender's
            return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, r_loop))

        r = MqttTransport(cfg, b.address)
        seen = []
        r.on_status(lambda role, state: seen.append((role, state)))

        async def main():
            await on_r(r.start("t1", "r"))
            s = MqttTransport(cfg, b.address)
            s.on_status(lambda role, state: seen.append((role, state)))
            await s.start("t1", "s")
            await s.send("r", "x", (0).to_bytes(4, "little"))
            assert int.from_bytes(await on_r(r.recv("s", "x", timeout=10)), "little") == 0
            gate = threading.Event()
            r_loop.call_soon_threadsafe(gate.wait)  # the receiver stalls
            for i in range(1, 301):
                await s.send("r", "x", i.to_bytes(4, "little"))
            await s.flush()  # the broker has all of them (sent on, or queued for the stalled receiver)
            await asyncio.get_running_loop().run_in_executor(None, b.restart)
            gate.set()
            got = [int.from_bytes(await on_r(r.recv("s", "x", timeout=30)), "little") for _ in range(300)]
            assert got == list(range(1, 301))
            if not persistence:
                assert s.stats["resent"] > 0  # what the broker forgot went again
            await asyncio.sleep(4.0)  # past the grace a `lost` waits for the role to come back (2 x 0.5 s + 2 s)
            # Checked only now: a persistent broker may deliver everything before the sender's
            # own reconnect completes.
            assert s.stats["reconnects"] >= 1 and r.stats["reconnects"] >= 1
            assert ("s", "lost") not in seen and ("r", "lost") not in seen, seen
            await s.close()
            assert s._outbox.bytes == 0  # everything acknowledged
            await on_r(r.close())

        try:
            asyncio.run(main())
        finally:
            r_loop.call_soon_threadsafe(r_loop.stop)


@pytest.mark.slow  # 64 MiB through a real broker (about 8 s)
def test_a_64_mib_tensor_crosses_intact_with_bounded_memory(broker, tmp_path):
    """Sender and receiver are separate processes; each reports its peak memory over its
    resting level. Encoding slices one buffer and reassembly writes into one buffer, so each
    side stays near one copy of the message, not several."""
    common = textwrap.dedent(f"""
        import asyncio, json, resource, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from omegaconf import OmegaConf
        from framework.runtime import wire
        from plugins.transports.broker import BrokerAddress
        from plugins.transports.mqtt import MqttConfig, MqttTransport
        from framework.runtime.allocator import tune_malloc
        import threading, time
        tune_malloc()  # as role processes run (runtime.tune_malloc): its retained heap counts too
        def rss_mib():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * resource.getpagesize() / 2**20
        class Peak:  # the highest resident size while the transfer runs, sampled every 2 ms
            def __enter__(self):
                self.base, self.top, self.on = rss_mib(), 0.0, True
                self.t = threading.Thread(target=self.run, daemon=True)
                self.t.start()
                return self
            def run(self):
                while self.on:
                    self.top = max(self.top, rss_mib())
                    time.sleep(0.002)
            def __exit__(self, *a):
                self.on = False
                self.t.join()
                self.over = self.top - self.base
        cfg = OmegaConf.structured(MqttConfig())
        addr = BrokerAddress("127.0.0.1", {broker.port})
        N = 16 * 2**20  # float32: 64 MiB
    """)
    sender = common + textwrap.dedent("""
        async def main():
            t = MqttTransport(cfg, addr)
            await t.start("big", "tx")
            print("up", flush=True)  # subscribed: the receiver may start (nothing is queued for a role before it first connects)
            await t.recv("rx", "ready", timeout=300)
            x = torch.Generator().manual_seed(7)
            with Peak() as p:
                data = wire.encode({"x": torch.randn(N, generator=x)})
                await t.send("rx", "act", data)
                del data
                await t.flush()
            print(json.dumps({"over": p.over}))
            await t.close()
        asyncio.run(main())
    """)
    receiver = common + textwrap.dedent("""
        async def main():
            t = MqttTransport(cfg, addr)
            await t.start("big", "rx")
            expect = torch.randn(N, generator=torch.Generator().manual_seed(7))
            with Peak() as p:
                await t.send("tx", "ready", b"1")
                buf = await t.recv("tx", "act", timeout=300)
                got = wire.decode(buf, copy=False).tensors["x"]
            print(json.dumps({"over": p.over, "equal": bool(torch.equal(got, expect)), "chunks_dropped": t.stats["dropped"]}))
            await t.close()
        asyncio.run(main())
    """)
    tx = subprocess.Popen([sys.executable, "-c", sender], stdout=subprocess.PIPE, text=True)
    assert tx.stdout.readline().strip() == "up"
    rx = subprocess.Popen([sys.executable, "-c", receiver], stdout=subprocess.PIPE, text=True)
    out_tx, _ = tx.communicate(timeout=400)
    out_rx, _ = rx.communicate(timeout=400)
    assert tx.returncode == 0 and rx.returncode == 0
    r, s = json.loads(out_rx.strip().splitlines()[-1]), json.loads(out_tx.strip().splitlines()[-1])
    print("memory over resting level (MiB): sender", s, "receiver", r)
    assert r["equal"] and r["chunks_dropped"] == 0
    # one 64 MiB copy of the message (+ the tensor itself on the sender) and a window of chunks
    assert s["over"] < 2 * 64 + 48, s
    assert r["over"] < 64 + 48, r


def test_missing_broker_binary_says_how_to_install():
    with pytest.raises(ConfigError, match=r"transport.broker.binary.*apt-get install mosquitto.*brew install mosquitto"):
        Broker("no-such-mosquitto-binary")


def test_broker_resolution_joins_only_a_named_broker(broker):
    cfg = mqtt_cfg()
    cfg.broker.port = broker.port  # named: join it
    addr, spawned = resolve(cfg.broker)
    assert spawned is None and (addr.host, addr.port) == ("127.0.0.1", broker.port)
    cfg.broker.port = None  # named by nothing: a private broker on a free port, whatever listens elsewhere
    addr, spawned = resolve(cfg.broker)
    try:
        assert spawned is not None and addr.spawned and spawned.proc.poll() is None and addr.port != broker.port
    finally:
        spawned.close()
    assert spawned.proc is None
    cfg.broker.spawn = "sometimes"
    with pytest.raises(ConfigError, match=r"transport.broker.spawn.*auto, always, never"):
        resolve(cfg.broker)


def test_unreachable_broker_fails_with_a_clear_error():
    async def main():
        from plugins.transports.broker import BrokerAddress

        t = MqttTransport(mqtt_cfg(connect_timeout_s=1.0), BrokerAddress("127.0.0.1", free_port()))
        with pytest.raises(TransportError, match=r"cannot reach the MQTT broker at 127.0.0.1:\d+"):
            await t.start("t1", "a")

    asyncio.run(main())


def test_transport_config_composes_and_bad_values_name_the_key():
    from hydra import compose, initialize_config_dir

    from framework import registry
    from framework.cli import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["transport=mqtt", "transport.chunk_bytes=512"])
    assert cfg.transport.broker.spawn == "auto"
    with pytest.raises(ConfigError, match=r"transport.chunk_bytes"):
        registry.build("transport", cfg.transport)


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd not installed")
def test_username_and_password_reach_the_broker(tmp_path):
    pw = tmp_path / "passwd"
    pw.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(pw), "pi", "s3cret"], check=True, capture_output=True)
    pw.chmod(0o600)
    with Broker(extra_conf=["allow_anonymous false", f"password_file {pw}"]) as b:

        async def main():
            ok = MqttTransport(mqtt_cfg(username="pi", password="s3cret"), b.address)
            await ok.start("auth", "a")
            await ok.send("a", "self", b"hi")
            assert bytes(await ok.recv("a", "self", timeout=10)) == b"hi"
            await ok.close()
            bad = MqttTransport(mqtt_cfg(username="pi", password="wrong", connect_timeout_s=5.0), b.address)
            with pytest.raises(TransportError, match="refused the connection"):
                await bad.start("auth", "b")

        asyncio.run(main())


def make_certificates(d: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, signed by it."""
    ca, ca_key, crt, key, csr, ext = (d / n for n in ("ca.crt", "ca.key", "server.crt", "server.key", "server.csr", "san.ext"))
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "1", "-subj", "/CN=pipelab test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-out", str(crt), "-days", "1", "-extfile", str(ext))
    return ca, crt, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_options_reach_the_broker(tmp_path):
    ca, crt, key = make_certificates(tmp_path)
    with Broker(extra_conf=["allow_anonymous true", f"cafile {ca}", f"certfile {crt}", f"keyfile {key}"]) as b:

        async def main():
            ok = MqttTransport(mqtt_cfg(tls=True, tls_ca_certs=str(ca)), b.address)
            await ok.start("tls", "a")
            await ok.send("a", "self", b"over TLS")
            assert bytes(await ok.recv("a", "self", timeout=10)) == b"over TLS"
            await ok.close()
            # the broker only speaks TLS here, and a client that does not trust its CA is refused
            for kw in ({}, {"tls": True}):
                bad = MqttTransport(mqtt_cfg(connect_timeout_s=3.0, **kw), b.address)
                with pytest.raises(TransportError):
                    await bad.start("tls", "b")

        asyncio.run(main())
