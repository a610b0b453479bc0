"""A private mosquitto broker for one run, or the address of an existing one.

`transport.broker.spawn`:
- `auto` (default): with `transport.broker.host` and `port` both unset (port 0 counts as
  unset), start a private mosquitto on a free loopback port and stop it after the run.
  Setting either names a broker: the run joins it (host defaults to 127.0.0.1, port to 1883).
  A broker that merely happens to listen on 1883 is never joined unless named.
- `always`: always start a private broker (on `transport.broker.port` if set), on loopback.
- `never`: always join the named broker (127.0.0.1:1883 unless set).

A private broker started for a run admits only that run: `allow_anonymous false`, one user
per role with a random password (a mosquitto password file, PBKDF2-SHA512 hashes as
`mosquitto_passwd` writes them) and an ACL per user (`run_acl`).

A broker the run starts is the broker it uses, never one that merely listens on the same port:
`Broker.start` waits until the listener on host:port is its own mosquitto process (the kernel's
socket tables; a probe login where there are none: broker_check.py). With a port the config
names, another process there fails the run in one line (a ConfigError) and our mosquitto is
stopped; with a free port we picked (someone can bind it between our choice and mosquitto's
bind), mosquitto's "Address already in use" or a foreign listener makes it pick another.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from framework.config import knobs
from framework.errors import ConfigError
from framework.runtime.parent_death import die_with_parent
from framework.tracking import faults
from plugins.transports import broker_check
from plugins.transports.mqtt_config import BrokerConfig
from plugins.transports.mqtt_credentials import PASSWORD_ENV

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 1883
PROBE_USER = "_probe"  # a role name never starts with `_` (framework.runtime.transport.check_name)
PORT_TRIES = 5

INSTALL_HINT = (
    "the MQTT transport needs the mosquitto broker, and no `{binary}` was found on PATH. Install it: "
    "Debian/Ubuntu `sudo apt-get install mosquitto`, macOS `brew install mosquitto`, or run `bash setup.sh`; "
    "or point transport.broker.host/port at a running broker with transport.broker.spawn=never"
)


def _broker_env() -> dict[str, str]:
    """mosquitto needs no password of ours: the user's broker password stays out of its environment."""
    return {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now. Someone may bind it before our broker does: Broker.start picks again then."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def password_line(user: str, password: str, iterations: int = 1000) -> str:
    """One line of a mosquitto 2 password file: what `mosquitto_passwd` writes, without the
    password ever being an argument of a process."""
    salt = secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return f"{user}:$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def run_acl(prefix: str, run_id: str, roles) -> str:
    """What each user (one per role, the coordinator included) may do on a run's broker: publish
    as itself (topics `<prefix>/<run>/<dst>/<itself>/<tag>` and its own status), read its own
    inbox and the run's statuses. Nothing else: no other role's inbox, no other sender's name,
    no other run, no `#`."""
    base = f"{prefix}/{run_id}"
    out = []
    for r in roles:
        out += [f"user {r}", f"topic write {base}/+/{r}/+", f"topic write {base}/_status/{r}", f"topic read {base}/{r}/+/+", f"topic read {base}/_status/+", ""]
    return "\n".join(out)


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
                 extra_conf: list[str] | None = None, users: dict[str, str] | None = None, acl: str | None = None):
        """`users` (name -> password) and `acl` (mosquitto ACL file text): a broker that admits
        only them; without, `extra_conf` (default: anonymous clients allowed, for tests)."""
        self.binary = binary
        exe = shutil.which(binary)
        if exe is None:
            raise ConfigError("transport.broker.binary", INSTALL_HINT.format(binary=binary))
        self.exe = exe
        self.host = "127.0.0.1"
        self._pick_port = port is None  # a port we picked may be taken before mosquitto binds it: pick again
        self.port = port or free_port(self.host)
        self.persistence = persistence
        self.max_inflight = max_inflight
        if workdir is None:  # the folders of runs killed with SIGKILL (they could not clean up)
            faults.remove_stale_dirs("pipelab-mosquitto-")
        self._tmp = tempfile.TemporaryDirectory(prefix="pipelab-mosquitto-", dir=workdir)
        self.dir = Path(self._tmp.name)
        faults.own_dir(self.dir)
        self.conf = self.dir / "mosquitto.conf"
        self.access = list(extra_conf or ["allow_anonymous true"])
        # a user only this object knows, allowed nothing by the ACL: where the kernel cannot say
        # which process listens (no /proc), logging in as it tells our broker from another
        self._probe: tuple[str, str] | None = None
        if users is not None:
            self._probe = (PROBE_USER, secrets.token_urlsafe(24))
            every = {**users, PROBE_USER: self._probe[1]}
            self._private_file("passwd", "".join(password_line(u, p) + "\n" for u, p in every.items()))
            self.access = ["allow_anonymous false", f"password_file {self.dir / 'passwd'}"]
            if acl is not None:
                self._private_file("acl", acl + "\n")
                self.access.append(f"acl_file {self.dir / 'acl'}")
        self._write_conf()
        self.proc: subprocess.Popen | None = None

    def _write_conf(self) -> None:
        lines = [
            f"listener {self.port} {self.host}",
            *self.access,
            f"max_inflight_messages {self.max_inflight}",
            "max_queued_messages 0",  # unbounded queue per client: QoS-1 data is never dropped
            "max_queued_bytes 0",
            # started as root, mosquitto switches to the `mosquitto` user, which cannot write
            # this private directory (log, persistence) or read a password file made here
            *(["user root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            f"persistence {'true' if self.persistence else 'false'}",
            f"persistence_location {self.dir}/",
            "autosave_interval 1",
            f"log_dest file {self.dir / 'mosquitto.log'}",
            "log_type error",
            "log_type warning",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _private_file(self, name: str, text: str) -> None:
        fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def start(self, timeout: float = 10.0) -> "Broker":
        """Start mosquitto and make sure the broker on host:port is this process (broker_check):
        never hand a run to a broker that merely listens there. A port we picked that someone
        took first is replaced by another free one (PORT_TRIES times); a port the config named
        that someone else holds is a ConfigError, and our mosquitto is stopped."""
        for _ in range(PORT_TRIES):
            taken = self._start_once(timeout)
            if taken is None:
                self._pick_port = False  # clients know this port now: a restart keeps it
                return self
            if not self._pick_port:
                raise ConfigError("transport.broker.port", f"{taken} on {self.host}:{self.port}, so this run cannot start its own broker there: "
                                  "free the port, pick another transport.broker.port, or leave it unset for a free one (transport.broker.spawn=never joins that broker)")
            self.port = free_port(self.host)
            self._write_conf()
        raise ConfigError("transport.broker.port", f"{PORT_TRIES} free ports in a row were taken by other processes before this run's broker could listen on them; "
                          "set transport.broker.port to a port kept free for it")

    def _start_once(self, timeout: float) -> str | None:
        """None once our mosquitto serves host:port; what holds the port if another process does
        (our mosquitto is then stopped). RuntimeError if mosquitto fails for another reason."""
        # its own session: a Ctrl-C for the run must not stop the broker before the roles say goodbye
        self.proc = subprocess.Popen([self.exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=die_with_parent, env=_broker_env())
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log = self.dir / "mosquitto.log"
                err += log.read_text(errors="replace") if log.exists() else ""
                code, self.proc = self.proc.returncode, None
                if "Address already in use" in err:
                    return "another process already listens"
                raise RuntimeError(f"mosquitto exited at start (code {code}): {err.strip()[-1000:]}")
            state = broker_check.listener(self.proc.pid, self.host, self.port)
            if state == "ours":
                return None
            if state == "foreign":
                self.stop()
                return "another process already listens"
            if state is None and listening(self.host, self.port):  # no /proc to ask: ask the broker
                if self._probe is None or broker_check.answers_as_ours(self.host, self.port, *self._probe):
                    return None  # (a broker for anonymous clients cannot be told from another here)
                self.stop()
                return "another broker answers"
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mosquitto did not listen on {self.host}:{self.port} within {timeout:.0f}s")
            time.sleep(0.02)

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


def named(broker_cfg) -> bool:
    """Whether the config names a broker (host or port set) rather than leaving it to the run."""
    return broker_cfg.get("host") is not None or broker_cfg.get("port") not in (None, 0)


def resolve(broker_cfg, *, users: dict[str, str] | None = None, acl: str | None = None) -> tuple[BrokerAddress, Broker | None]:
    """Where to connect, and the broker we started for it (stop it after the run), if any.
    `users`/`acl` lock a broker we start to the run (see Broker)."""
    spawn = broker_cfg.spawn
    knobs.check({"spawn": spawn}, BrokerConfig, "transport.broker")  # also when called from code
    host, port = broker_cfg.get("host"), broker_cfg.get("port")
    if spawn == "always" or (spawn == "auto" and not named(broker_cfg)):
        if host is not None and host not in LOCAL_HOSTS:
            raise ConfigError("transport.broker.host", f"a broker this run starts listens on loopback only; got host {host!r} with spawn={spawn} (spawn=never joins a broker there)")
        b = Broker(broker_cfg.binary, port=int(port) if port else None, persistence=bool(broker_cfg.persistence), users=users, acl=acl)
        try:
            b.start()
        except BaseException:
            b.close()
            raise
        return b.address, b
    return BrokerAddress(host or DEFAULT_HOST, int(port) if port else DEFAULT_PORT), None
