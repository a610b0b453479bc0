"""A throwaway PostgreSQL server for the tests: a fresh cluster (`initdb`) in a temporary folder,
started with `pg_ctl` on a free loopback port, trust authentication, removed afterwards.

PostgreSQL refuses to run as root; as root the server runs as the `postgres` user that Debian's
`postgresql` package creates (setup.sh installs it). `why_not()` says why it cannot start here
(no server binaries, no driver, root without a `postgres` user), for the tests' skip reason.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

SUPERUSER = "pipelab"  # the cluster's superuser (initdb -U), trusted on loopback


def bin_dir() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<version>/bin
    (the newest), which Debian does not put on PATH."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(versions[-1]).parent if versions else None


def server_user() -> str | None:
    """Whom the server runs as: this user, or `postgres` when this is root (None: no such user)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    try:
        return pwd.getpwnam("postgres").pw_name
    except KeyError:
        return None


def why_not() -> str | None:
    """Why no PostgreSQL server can start here, or None when one can."""
    if bin_dir() is None:
        return "PostgreSQL is not installed (no initdb/pg_ctl; setup.sh installs apt's postgresql)"
    if server_user() is None:
        return "running as root and there is no postgres user to run PostgreSQL as"
    try:
        import psycopg  # noqa: F401  (SQLAlchemy 2's driver for postgresql:// URLs)
    except ImportError:
        return "no PostgreSQL driver for Python (pip install 'psycopg[binary]'; setup.sh installs the team extra)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server(databases=("pipelab",)):
    """A running PostgreSQL with `databases` created; yields {name: URL}."""
    bins, user = bin_dir(), server_user()
    root = Path(tempfile.mkdtemp(prefix="pipelab-pg-"))  # not under pytest's tmp: the postgres user must reach it
    as_user = {}
    if os.geteuid() == 0:
        shutil.chown(root, user=user)
        as_user = {"user": user}
    data, port = root / "data", _free_port()
    env = dict(os.environ, LC_ALL="C", LANG="C")

    def run(*cmd):
        subprocess.run([str(bins / cmd[0]), *cmd[1:]], check=True, cwd=root, env=env, capture_output=True, text=True, timeout=120, **as_user)

    started = False
    try:
        run("initdb", "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
        run("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
            "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        started = True
        for name in databases:
            run("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER, name)
        yield {name: f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{name}" for name in databases}
    except subprocess.CalledProcessError as e:
        log = (root / "server.log").read_text()[-2000:] if (root / "server.log").exists() else ""
        raise RuntimeError(f"PostgreSQL: {' '.join(e.cmd)} failed: {e.stderr[-2000:]}\n{log}") from e
    finally:
        if started:
            subprocess.run([str(bins / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], cwd=root, env=env, capture_output=True, timeout=60, **as_user)
        shutil.rmtree(root, ignore_errors=True)
