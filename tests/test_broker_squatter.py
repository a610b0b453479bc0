"""A run never joins a broker it did not start unless told to: another broker already listening
on the port a run's own broker should use (a squatter) gets no credentials and no message.
Against real mosquitto processes on free loopback ports."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiomqtt
import pytest
from omegaconf import OmegaConf

from framework.errors import ConfigError
from plugins.transports import broker as broker_mod
from plugins.transports import broker_check
from plugins.transports.broker import Broker, free_port, resolve
from plugins.transports.mqtt import MqttConfig, MqttNetwork

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed (bash setup.sh)")
ROOT = Path(__file__).resolve().parents[1]
ROLES = ["a", "coordinator"]


def mqtt_cfg(**kw):
    return OmegaConf.merge(OmegaConf.structured(MqttConfig()), kw)


class Spy(threading.Thread):
    """An anonymous client of the squatter that subscribes to everything (`#`) and keeps what it reads."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.seen = port, []
        self.ready, self.stop = threading.Event(), threading.Event()

    def run(self):
        async def main():
            async with aiomqtt.Client("127.0.0.1", self.port) as c:
                await c.subscribe("#", qos=1)
                self.ready.set()
                it = c.messages.__aiter__()
                while not self.stop.is_set():
                    try:
                        m = await asyncio.wait_for(it.__anext__(), 0.1)
                    except asyncio.TimeoutError:
                        continue
                    self.seen.append((str(m.topic), bytes(m.payload)))

        asyncio.run(main())

    def __enter__(self) -> "Spy":
        self.start()
        assert self.ready.wait(10), "the spy did not subscribe"
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.3)  # anything in flight to the spy
        self.stop.set()
        self.join(10)


@pytest.fixture
def squatter():
    """Someone else's broker, anonymous clients welcome, with a spy subscribed to everything on it."""
    with Broker() as b, Spy(b.port) as spy:
        yield b, spy


@pytest.fixture(params=["sockets", "probe"])
def check(request, monkeypatch):
    """Both ownership checks: the kernel's socket tables, and the probe login used without them."""
    if request.param == "probe":
        monkeypatch.setattr(broker_check, "listener", lambda pid, host, port: None)
    return request.param


def _mosquittos_of_this_process() -> set[int]:
    out = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for k in kids:
            try:
                if b"mosquitto" in Path(f"/proc/{k}/cmdline").read_bytes():
                    out.add(int(k))
            except OSError:
                pass
    return out


async def _round_trip(net: MqttNetwork) -> None:
    a, c = net.endpoint("a"), net.endpoint("coordinator")
    await a.start(net.secrets.run_id, "a")
    await c.start(net.secrets.run_id, "coordinator")
    await a.send("coordinator", "x", b"private")
    assert bytes(await c.recv("a", "x", timeout=10)) == b"private"
    await a.close()
    await c.close()


def test_the_listener_check_tells_our_socket_from_another_process_s():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert broker_check.listener(os.getpid(), "127.0.0.1", port) == "none"  # bound, not listening
        s.listen()
        assert broker_check.listener(os.getpid(), "127.0.0.1", port) == "ours"
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert broker_check.listener(other.pid, "127.0.0.1", port) == "foreign"
        finally:
            other.kill()
            other.wait()
    with socket.socket() as w:  # a wildcard listener does not serve 127.0.0.1 before an exact one
        w.bind(("0.0.0.0", 0))
        w.listen()
        assert broker_check.listener(os.getpid(), "127.0.0.1", w.getsockname()[1]) == "none"


def test_the_probe_login_tells_our_broker_from_an_anonymous_one():
    with Broker(users={"a": "pw"}) as ours, Broker() as anonymous:
        user, password = ours._probe
        assert broker_check.login_code(ours.host, ours.port, "a", "pw") == 0
        assert broker_check.login_code(ours.host, ours.port, "a", "wrong") in (4, 5)
        assert broker_check.answers_as_ours(ours.host, ours.port, user, password)
        assert not broker_check.answers_as_ours(ours.host, ours.port, user, "not the password")
        # an anonymous broker accepts the right password, and every wrong one too
        assert broker_check.login_code(anonymous.host, anonymous.port, user, password) == 0
        assert not broker_check.answers_as_ours(anonymous.host, anonymous.port, user, password)
    assert broker_check.login_code("127.0.0.1", free_port(), "a", "pw") is None  # nobody there


def test_spawn_always_on_a_taken_port_fails_in_one_line_and_the_squatter_sees_nothing(squatter, check):
    b, spy = squatter
    before = _mosquittos_of_this_process()
    net = MqttNetwork(mqtt_cfg(broker={"spawn": "always", "port": b.port}))
    with pytest.raises(ConfigError) as e:
        net.open("r1", ROLES)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("transport.broker.port: another ") and f"on 127.0.0.1:{b.port}" in msg, msg
    assert "transport.broker.spawn=never" in msg  # and what to do
    assert net.broker is None and net.address is None
    assert _mosquittos_of_this_process() == before  # ours was stopped (only the squatter is left)
    with pytest.raises(ConfigError, match=f"127.0.0.1:{b.port}"):  # at the Broker level too
        Broker(port=b.port, users={"a": "pw"}).start()
    assert spy.seen == []


def test_spawn_auto_moves_to_another_port_when_the_free_one_is_taken(squatter, check, monkeypatch):
    b, spy = squatter
    picked = []

    def free_port_taken_first(host="127.0.0.1"):  # someone binds our free port before mosquitto does
        picked.append(b.port if not picked else free_port(host))
        return picked[-1]

    monkeypatch.setattr(broker_mod, "free_port", free_port_taken_first)
    for spawn in ("auto", "always"):  # no port named: a free one, ours
        picked.clear()
        net = MqttNetwork(mqtt_cfg(broker={"spawn": spawn}))
        net.open("r1", ROLES)
        try:
            assert picked[0] == b.port and net.address.port == picked[-1] != b.port
            assert broker_check.listener(net.broker.proc.pid, "127.0.0.1", net.address.port) in ("ours", None)
            asyncio.run(_round_trip(net))
        finally:
            net.close()
    if check == "sockets":  # a broker for anonymous clients (no probe user) can be told apart only by the kernel's tables
        picked.clear()
        addr, ours = resolve(mqtt_cfg().broker)
        try:
            assert ours is not None and addr.port == picked[-1] != b.port
        finally:
            ours.close()
    assert spy.seen == []


def test_a_broker_restart_keeps_its_port(monkeypatch):
    with Broker() as b:
        port = b.port
        monkeypatch.setattr(broker_mod, "free_port", lambda host="127.0.0.1": pytest.fail("a restarted broker must keep its port"))
        b.restart()
        assert b.port == port and broker_check.listener(b.proc.pid, b.host, port) == "ours"


def test_a_run_told_to_start_its_broker_on_a_taken_port_exits_with_one_line(squatter, tmp_path):
    b, spy = squatter
    cmd = [sys.executable, "-m", "framework", "runtime=local", "transport=mqtt", "transport.broker.spawn=always", f"transport.broker.port={b.port}",
           "scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2", "model=mlp", "dataset=synthetic_mnist", "tracking=none", "runtime.progress=false",
           "train.epochs=1", "train.iterations_per_epoch=2", "dataset.n_train=256", "dataset.n_val=64", "dataset.n_test=64", f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2, p.stderr
    assert last.startswith(f"error: transport.broker.port: another process already listens on 127.0.0.1:{b.port}, "), p.stderr
    assert "private mosquitto" not in p.stderr and "role processes" not in p.stderr
    assert spy.seen == []
