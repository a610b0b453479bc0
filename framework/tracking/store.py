"""An MLflow store as pipelab opens it: the client and the experiment, shared by a run's
tracker (framework.tracking.tracker), a sweep's parent run (framework.tracking.multirun) and the report.

- SQLite store under `outputs/` (the file store is deprecated); artifacts beside it.
- Independent processes opening a fresh store at once take turns (`_store_creation_lock`), and a
  SQLite write locked out past MLflow's own 20 s wait is tried again (`RetryingClient`).
- `tracking.uri=http://...`: a tracking server, for jobs on several machines; it chooses where
  artifacts go.
- `mlflow_name`, `flatten`: the metric and param names MLflow accepts, a config as params.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from framework.tracking.faults import shielded

# MLflow's kind of experiment: model training ("Machine learning" in the UI's kind selector), not
# a GenAI app (traces, evaluations). MLflow 3.17's UI picks the tab an experiment opens on from
# its sidebar switch *GenAI | Model training* (or `?workflowType=machine_learning` in the URL),
# not from this tag; the tag is the experiment's own record of what it is (README: MLflow UI).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def quiet_mlflow() -> None:
    for name in ("mlflow", "alembic", "mlflow.store", "mlflow.tracking"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _ensure_sqlite_dir(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)


def is_server(uri: str) -> bool:
    """A tracking server (`http://host:5000`): it chooses where artifacts go, and every machine
    that reaches it can log there."""
    return uri.startswith(("http://", "https://"))


@contextmanager
def _store_creation_lock(uri: str):
    """One process at a time opens a SQLite store for the first time. MLflow creates a fresh
    store's tables on first access; two processes doing it at once fail ("table experiments already
    exists", "duplicate column name", a half-migrated alembic_version: seen with 4 processes
    starting together). An exclusive flock on the store's folder, POSIX only; nothing for servers."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    try:
        import fcntl  # POSIX only (ImportError below)
    except ImportError:  # not POSIX: no lock (start one process first to create the store)
        yield
        return
    fd = os.open(Path(uri[len("sqlite:///") :]).absolute().parent, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some NFS mounts): go on without
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


LOCK_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def retry_when_locked(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, called again after a pause (0.5 s, doubling, 6 times) while SQLite
    says "database is locked". MLflow already waits up to 20 s for a lock (its busy_timeout), which
    covers ordinary contention: 8 processes x 200 batch writes at once never met it. This covers a
    lock held longer than that (a backup, a VACUUM, `mlflow gc`, a stalled reader on a loaded disk).
    A locked write is rolled back whole, so calling it again cannot write anything twice."""
    for delay in LOCK_RETRY_DELAYS_S + (None,):
        try:
            with shielded():  # Ctrl-C or SIGTERM waits for the write: cut short, it would keep the store locked
                return fn(*args, **kwargs)
        except Exception as e:
            if delay is None or "database is locked" not in str(e):
                raise
            print(f"warning: MLflow store busy for over 20 s ({getattr(fn, '__name__', 'call')}); trying again in {delay:g} s", file=sys.stderr)
            time.sleep(delay)


class RetryingClient:
    """An MlflowClient on a SQLite store whose calls go through `retry_when_locked`."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        if name.startswith("__") or name == "_client":  # unpickling (a joblib job's copy of the callback) asks before _client is set
            raise AttributeError(name)
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            return retry_when_locked(attr, *args, **kwargs)

        return call


def client_and_experiment(cfg) -> tuple[Any, str]:
    """An MlflowClient on `cfg.uri` and the id of experiment `cfg.experiment` (created if new)."""
    quiet_mlflow()
    from mlflow.tracking import MlflowClient  # mlflow: start-up

    _ensure_sqlite_dir(cfg.uri)
    with _store_creation_lock(cfg.uri):  # the first access creates a fresh SQLite store's tables
        client = MlflowClient(tracking_uri=cfg.uri)
        if cfg.uri.startswith("sqlite:"):
            client = RetryingClient(client)
        exp = client.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        _declare_kind(client, exp)
        return client, exp.experiment_id
    location = None  # a tracking server puts artifacts where it was told (--artifacts-destination)
    if not is_server(cfg.uri):
        root = Path(cfg.artifact_root).absolute()
        root.mkdir(parents=True, exist_ok=True)
        location = root.as_uri()
    try:
        return client, client.create_experiment(cfg.experiment, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:  # another process created it first
        exp = client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            raise
        return client, exp.experiment_id


def _declare_kind(client, exp) -> None:
    """Tag an experiment made without a kind (by an older pipelab, or by hand) as model training;
    a kind someone already chose is left alone."""
    if exp.tags.get(EXPERIMENT_KIND_TAG):
        return
    try:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    except Exception as e:  # a store we may not write experiment tags to: the run still goes on
        print(f"warning: could not tag experiment {exp.name!r} as model training: {e}", file=sys.stderr)


def mlflow_name(name: str) -> str:
    """A metric or param name MLflow accepts (letters, digits, `_-. :/`): `dev0->dev1` becomes
    `dev0_to_dev1`, any other character (`*` of a link pattern, say) `_`."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name.replace("->", "_to_"))[:250]


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(d, (list, tuple)):
        out[prefix[:-1]] = str(list(d))
    else:
        out[prefix[:-1]] = d
    return out
