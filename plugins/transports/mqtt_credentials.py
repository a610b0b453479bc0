"""A run's secrets for `transport=mqtt`, and how they reach the role processes.

The coordinator draws them once per run (`RunSecrets`): a 256-bit run key (every frame and
status is authenticated under it, see mqtt_frame.py) and, for the private broker it starts,
one random password per role. Each role gets its own `RoleCredentials`: the run key, the MAC
algorithm, and its broker user name and password. They never appear on a command line or in a
process's environment:

- `runtime=local` hands each role process its token through an inherited pipe
  (framework.runtime.secret_pipe: `Network.worker_secret`); the role reads it once and closes the
  pipe. Not the environment: /proc/<pid>/environ shows a process's starting environment for
  its whole life, whatever it removes from `os.environ` later. Role processes do not inherit
  `PIPELAB_MQTT_PASSWORD` either (their broker password, if any, is in the token);
- `runtime=remote` writes one file per role, mode 0600, in a private (0700) directory that is
  deleted when the run ends, and prints `transport.credentials_file=<path>` in that role's
  command: copy the file to the device (`scp`) and keep its mode. A credentials file that
  others can read is refused.

The broker password of a broker the run did not start comes from `transport.password` or,
better (a config value is recorded in config.yaml and MLflow), `PIPELAB_MQTT_PASSWORD`.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from framework.errors import ConfigError
from framework.runtime import secret_pipe
from framework.tracking import faults

PASSWORD_ENV = "PIPELAB_MQTT_PASSWORD"
_VERSION = 1


@dataclass(frozen=True)
class RoleCredentials:
    run_id: str
    role: str
    key: bytes
    mac: str
    username: Optional[str] = None
    password: Optional[str] = None

    def token(self) -> str:
        return json.dumps({"v": _VERSION, "run_id": self.run_id, "role": self.role, "key": base64.b64encode(self.key).decode(), "mac": self.mac,
                           "username": self.username, "password": self.password})

    @classmethod
    def from_token(cls, text: str, where: str) -> "RoleCredentials":
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("v") != _VERSION:
                raise ValueError("not a version-1 credentials object")
            key = base64.b64decode(d["key"], validate=True)
            if len(key) < 16:
                raise ValueError("key too short")
            return cls(str(d["run_id"]), str(d["role"]), key, str(d["mac"]), d.get("username"), d.get("password"))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError("transport.credentials_file", f"{where} does not hold a run's credentials ({e}); use the file the coordinator wrote for this role") from None

    def __repr__(self) -> str:  # never print a secret by accident
        return f"RoleCredentials(run_id={self.run_id!r}, role={self.role!r}, mac={self.mac!r}, username={self.username!r})"


class RunSecrets:
    """Drawn by the coordinator for one run: the run key, and a broker password per role when
    the run has a private broker (`broker_users`); else every role uses `username`/`password`."""

    def __init__(self, run_id: str, roles, mac: str, *, broker_users: bool, username: str | None = None, password: str | None = None):
        self.run_id, self.mac = run_id, mac
        self.key = secrets.token_bytes(32)
        self.roles = list(roles)
        self.passwords = {r: secrets.token_urlsafe(24) for r in self.roles} if broker_users else {}
        self.username, self.password = username, password
        self._dir: tempfile.TemporaryDirectory | None = None

    def for_role(self, role: str) -> RoleCredentials:
        if self.passwords:
            if role not in self.passwords:
                raise KeyError(f"no credentials for role {role!r} in this run")
            return RoleCredentials(self.run_id, role, self.key, self.mac, role, self.passwords[role])
        return RoleCredentials(self.run_id, role, self.key, self.mac, self.username, self.password)

    def write_file(self, role: str) -> Path:
        """This role's credentials in a 0600 file (for `runtime=remote`); removed by `close()`."""
        if self._dir is None:
            faults.remove_stale_dirs("pipelab-credentials-")  # a killed run's files
            self._dir = tempfile.TemporaryDirectory(prefix=f"pipelab-credentials-{self.run_id}-")
            os.chmod(self._dir.name, 0o700)
            faults.own_dir(self._dir.name)
        path = Path(self._dir.name) / f"{role}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.for_role(role).token())
        return path

    def close(self) -> None:
        d, self._dir = self._dir, None
        if d is not None:
            d.cleanup()


def load(credentials_file: str | None) -> RoleCredentials | None:
    """This process's credentials: the token its parent left in a pipe (runtime=local), or the
    file (runtime=remote)."""
    try:
        token = secret_pipe.take()
    except (OSError, ValueError) as e:
        raise ConfigError("transport.credentials_file", f"cannot read the credentials the coordinator handed over (${secret_pipe.ENV}): {e}") from None
    if token is not None:
        return RoleCredentials.from_token(token.decode(errors="replace"), "the coordinator's pipe")
    if not credentials_file:
        return None
    path = Path(credentials_file).expanduser()
    try:
        st = path.stat()
    except OSError as e:
        raise ConfigError("transport.credentials_file", f"cannot read {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("transport.credentials_file", f"{path} is not a regular file")
    if os.name == "posix" and st.st_mode & 0o077:
        raise ConfigError("transport.credentials_file", f"{path} can be read by others (mode {stat.S_IMODE(st.st_mode):o}); `chmod 600 {path}`")
    return RoleCredentials.from_token(path.read_text(), str(path))


def broker_password(cfg_password: str | None) -> str | None:
    return cfg_password if cfg_password is not None else os.environ.get(PASSWORD_ENV)
