"""What a run leaves behind when it is stopped from outside, and how the next one cleans it up.

- SIGTERM (a scheduler's time limit, `kill`, `docker stop`) is handled like Ctrl-C: the run writes
  its summary, its MLflow run ends FAILED, the process exits 143 (`Terminated` is a
  KeyboardInterrupt, so every `finally` and `except KeyboardInterrupt` on the way runs).
- Either waits for an MLflow write under way (`shielded`): interrupted inside SQLAlchemy, a write
  left its SQLite transaction open and the store locked, so the run's own closing writes waited
  on it for ever (seen once in CI). A second signal does not wait.
- SIGKILL cannot be handled. Every MLflow run records the host, pid and the process's start time
  (`pipelab.host`, `pipelab.pid`, `pipelab.pid_start`); the next run that opens the same store marks
  runs still RUNNING whose process on this host is gone as FAILED (`pipelab.reaped` says why). Runs
  started on other hosts are left alone: from here nobody can tell whether they still run.
- An interrupted sweep closes its parent run and any child still RUNNING as FAILED.
- Private temporary folders (a run's broker, its credential files) carry their owner's pid; the
  next run removes those whose owner was killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

SIGTERM_EXIT = 143  # 128 + SIGTERM, what shells report for a terminated process


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, handled as an interruption."""


_shield_depth = 0  # shielded blocks the main thread is in (signal handlers run there)
_pending: KeyboardInterrupt | None = None


def _interrupt(kind: type[KeyboardInterrupt]):
    def handler(signum, frame):
        global _pending
        if _shield_depth and _pending is None:
            _pending = kind()  # raised when the shielded block ends
            return
        raise kind()

    return handler


_defer_sigint = _interrupt(KeyboardInterrupt)


@contextmanager
def shielded():
    """A block of the main thread that SIGTERM (once `handle_sigterm` ran) and Ctrl-C wait for:
    the interruption is raised when it ends. Elsewhere a signal interrupts nothing but the main
    thread, so the block is left alone. Ctrl-C is deferred only where Python's own handler was in
    place (inside asyncio.run, asyncio's handler cancels the main task at its next await)."""
    global _shield_depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    swap = _shield_depth == 0 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if swap:
        signal.signal(signal.SIGINT, _defer_sigint)
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
        if swap:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if not _shield_depth and _pending is not None:
            stop, _pending = _pending, None
            raise stop


def handle_sigterm() -> None:
    """Turn SIGTERM into `Terminated` in this process (the main thread only, as Python allows);
    it waits for a shielded block."""
    try:
        signal.signal(signal.SIGTERM, _interrupt(Terminated))
    except ValueError:  # not the main thread (an embedding application): leave its handler
        pass


def exit_code(interruption: BaseException) -> int:
    return SIGTERM_EXIT if isinstance(interruption, Terminated) else 130


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not taken
    for the process that started the run."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_tags() -> dict[str, str]:
    pid = os.getpid()
    tags = {"pipelab.host": socket.gethostname(), "pipelab.pid": str(pid)}
    start = _start_time(pid)
    if start is not None:
        tags["pipelab.pid_start"] = start
    return tags


def _alive(tags: dict) -> bool:
    try:
        pid = int(tags["pipelab.pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (KeyError, ValueError, PermissionError, OverflowError):
        return True  # no pid recorded, or a process we may not signal: assume it runs
    start = tags.get("pipelab.pid_start")
    return start is None or _start_time(pid) in (None, start)


def reap_orphans(client, experiment_id: str) -> list[str]:
    """Mark FAILED the runs of `experiment_id` still RUNNING whose process on this host is gone
    (killed with SIGKILL, or the machine lost power). Returns their ids."""
    host = socket.gethostname()
    try:
        runs = client.search_runs([experiment_id], filter_string=f"attributes.status = 'RUNNING' and tags.`pipelab.host` = '{host}'", max_results=1000)
    except Exception:  # a store that cannot filter this way: nothing reaped, the run goes on
        return []
    reaped = []
    for run in runs:
        tags = run.data.tags
        if _alive(tags):
            continue
        try:
            client.set_tag(run.info.run_id, "pipelab.reaped", f"process {tags.get('pipelab.pid')} on {host} had ended without closing the run (killed?)")
            client.set_terminated(run.info.run_id, status="FAILED")
            reaped.append(run.info.run_id)
        except Exception as e:  # another process reaped it first, or the store is read-only
            print(f"warning: could not close orphaned run {run.info.run_id}: {e}", file=sys.stderr)
    if reaped:
        print(f"note: marked {len(reaped)} MLflow run(s) FAILED whose process had been killed: {', '.join(r[:8] for r in reaped)}", file=sys.stderr)
    return reaped


def close_sweep(client, experiment_id: str, parent_id: str, status: str = "FAILED") -> None:
    """End a sweep's parent run and whatever child is still RUNNING (jobs killed with it)."""
    try:
        children = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}' and attributes.status = 'RUNNING'", max_results=5000)
        for run in children:
            client.set_terminated(run.info.run_id, status="FAILED")
        client.set_terminated(parent_id, status=status)
    except Exception as e:  # the sweep's own outcome matters more than its bookkeeping
        print(f"warning: could not close the sweep's MLflow runs: {e}", file=sys.stderr)


# ---- temporary folders of a killed run -------------------------------------------------------------

OWNER_FILE = ".pipelab-owner"


def own_dir(path) -> None:
    """Mark a private temporary folder with this process (pid and start time), so that after a
    SIGKILL the next run can tell it is nobody's and remove it (`remove_stale_dirs`)."""
    tags = process_tags()
    (Path(path) / OWNER_FILE).write_text(f"{tags['pipelab.pid']} {tags.get('pipelab.pid_start', '')}\n")


def remove_stale_dirs(prefix: str) -> list[str]:
    """Remove the temp folders named `prefix*` whose owner process is gone (a run killed with
    SIGKILL cannot clean up after itself). Folders without an owner mark are left alone."""
    removed = []
    root = Path(tempfile.gettempdir())
    for d in root.glob(prefix + "*"):
        try:
            pid, *start = (d / OWNER_FILE).read_text().split()
        except (OSError, ValueError):
            continue
        tags = {"pipelab.pid": pid, **({"pipelab.pid_start": start[0]} if start else {})}
        if not _alive(tags):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
    return removed
