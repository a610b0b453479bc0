"""A private mosquitto broker for one run, or the address of an existing one.

`transport.broker.spawn`:
- `auto` (default): when the configured host is this machine and nothing listens on the
  configured port, start a private mosquitto on a free loopback port and stop it after the run;
  otherwise connect to the configured broker.
- `always`: always start a private broker (tests, benchmarks).
- `never`: always connect to the configured broker.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from framework.errors import ConfigError

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
SPAWN_CHOICES = ("auto", "always", "never")

INSTALL_HINT = (
    "the MQTT transport needs the mosquitto broker, and no `{binary}` was found on PATH. Install it: "
    "Debian/Ubuntu `sudo apt-get install mosquitto`, macOS `brew install mosquitto`, or run `bash setup.sh`; "
    "or point transport.broker.host/port at a running broker with transport.broker.spawn=never"
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class BrokerAddress:
    host: str
    port: int
    spawned: bool = False


class Broker:
    """A mosquitto process on a free loopback port; `stop()` (or the context manager) ends it.

    `persistence=True` keeps sessions and queued QoS-1 messages across a broker restart
    (`restart()`), which is how a run survives one."""

    def __init__(self, binary: str = "mosquitto", *, port: int | None = None, persistence: bool = False, max_inflight: int = 64, workdir: str | None = None,
                 extra_conf: list[str] | None = None):
        self.binary = binary
        exe = shutil.which(binary)
        if exe is None:
            raise ConfigError("transport.broker.binary", INSTALL_HINT.format(binary=binary))
        self.exe = exe
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.persistence = persistence
        self._tmp = tempfile.TemporaryDirectory(prefix="pipelab-mosquitto-", dir=workdir)
        self.dir = Path(self._tmp.name)
        self.conf = self.dir / "mosquitto.conf"
        lines = [
            f"listener {self.port} {self.host}",
            *(extra_conf or ["allow_anonymous true"]),
            f"max_inflight_messages {max_inflight}",
            "max_queued_messages 0",  # unbounded queue per client: QoS-1 data is never dropped
            "max_queued_bytes 0",
            # started as root, mosquitto switches to the `mosquitto` user, which cannot write
            # this private directory (log, persistence) or read a password file made here
            *(["user root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            f"persistence {'true' if persistence else 'false'}",
            f"persistence_location {self.dir}/",
            "autosave_interval 1",
            f"log_dest file {self.dir / 'mosquitto.log'}",
            "log_type error",
            "log_type warning",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "Broker":
        from framework.runtime.local import die_with_parent

        # its own session: a Ctrl-C for the run must not stop the broker before the roles say goodbye
        self.proc = subprocess.Popen([self.exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while not listening(self.host, self.port):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log = self.dir / "mosquitto.log"
                err += log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"mosquitto exited at start (code {self.proc.returncode}): {err.strip()[-1000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mosquitto did not listen on {self.host}:{self.port} within {timeout:.0f}s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)  # mosquitto saves its persistence file on SIGTERM
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def kill(self) -> None:
        """Die at once, as a crashed broker would (persistence keeps what was autosaved)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress(self.host, self.port, spawned=True)

    def __enter__(self) -> "Broker":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # never leave a broker behind, even on an unexpected exit
        try:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        except Exception:
            pass


def resolve(broker_cfg) -> tuple[BrokerAddress, Broker | None]:
    """Where to connect, and the broker we started for it (stop it after the run), if any."""
    spawn = broker_cfg.spawn
    if spawn not in SPAWN_CHOICES:
        raise ConfigError("transport.broker.spawn", f"{spawn!r} is not a choice; choices: {', '.join(SPAWN_CHOICES)}")
    host, port = broker_cfg.host, int(broker_cfg.port)
    local = host in LOCAL_HOSTS
    if spawn == "always" or (spawn == "auto" and local and not listening("127.0.0.1" if host == "0.0.0.0" else host, port)):
        b = Broker(broker_cfg.binary, persistence=bool(broker_cfg.persistence)).start()
        return b.address, b
    return BrokerAddress(host, port), None
