"""MLflow tracking: one run per job, nested under one parent run per multirun.

- SQLite store under `outputs/` (the file store is deprecated); artifacts beside it.
- Metrics are buffered and written with `log_batch` (one SQLite write costs ~20 ms).
- The run ends FINISHED, or FAILED on any exception or Ctrl-C: never left RUNNING.
- Parallel multirun jobs would race to create a fresh store, so the launching process creates
  it, with the parent run, in a Hydra callback (`framework.multirun.MultirunParent`) and leaves
  the parent's id in the sweep directory for the jobs to find. Independent processes opening a fresh store at once
  take turns (`_store_creation_lock`), and a SQLite write locked out past MLflow's own 20 s wait is
  tried again (`RetryingClient`).
- `tracking.uri=http://...`: a tracking server, for jobs on several machines; it chooses where
  artifacts go.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from framework.config import TrackingConfig
from framework.registry import register

# MLflow's kind of experiment: model training ("Machine learning" in the UI's kind selector), not
# a GenAI app (traces, evaluations). MLflow 3.17's UI picks the tab an experiment opens on from
# its sidebar switch *GenAI | Model training* (or `?workflowType=machine_learning` in the URL),
# not from this tag; the tag is the experiment's own record of what it is (README: MLflow UI).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def _quiet_mlflow() -> None:
    import logging

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
        import fcntl
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
    from framework.faults import shielded

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
    _quiet_mlflow()
    from mlflow.tracking import MlflowClient

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


def dataset_records(dataset) -> list[dict]:
    """A `framework.data.Dataset` as plain data, one record per split, ready for `dataset_inputs`
    (in this process or in the recorder, `framework.tracking_process`): its name, the digest of the
    split's tensors (`Dataset.digest`), its source, the numpy dtypes and shapes of features and
    targets, and a profile (split, sizes, shapes, classes). An empty split (`dataset.n_val=0`) has
    no record: it holds no data to record."""
    from framework.data import SPLITS

    out = []
    for split in SPLITS:
        x, y = dataset.split(split)
        if len(x) == 0:
            continue
        out.append({
            "split": split,
            "name": dataset.name,
            "digest": dataset.digest(split),
            "source": dataset.source(split),
            "features": [_numpy_dtype(x), [-1, *x.shape[1:]]],
            "targets": [_numpy_dtype(y), [-1, *y.shape[1:]]],
            "profile": {"split": split, **dataset.profile(split)},
        })
    return out


def _numpy_dtype(t) -> str:
    import torch

    return str(torch.empty(0, dtype=t.dtype).numpy().dtype)  # also for a meta tensor (no values)


def dataset_inputs(records: list[dict]) -> list:
    """`dataset_records` as MLflow dataset inputs, each tagged with its context
    (`mlflow.data.context`: `train`, `val`, `test`): the source as MLflow's `{"uri": ...}` JSON
    (type `local` for a file, `code` for generated data such as `synthetic:seed=0`) and a tensor
    schema as `mlflow.data.from_numpy` writes one (`mlflow_tensorspec`)."""
    import numpy as np
    from mlflow.data.schema import TensorDatasetSchema
    from mlflow.entities import Dataset as MlflowDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.types.schema import Schema, TensorSpec
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    out = []
    for r in records:
        (x_dtype, x_shape), (y_dtype, y_shape) = r["features"], r["targets"]
        schema = TensorDatasetSchema(
            features=Schema([TensorSpec(np.dtype(x_dtype), tuple(x_shape))]),
            targets=Schema([TensorSpec(np.dtype(y_dtype), tuple(y_shape))]),
        )
        entity = MlflowDataset(
            name=r["name"],
            digest=r["digest"],
            source_type="local" if os.path.isabs(r["source"]) else "code",
            source=json.dumps({"uri": r["source"]}),
            schema=json.dumps(schema.to_dict()),
            profile=json.dumps(r["profile"]),
        )
        out.append(DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, r["split"])]))
    return out


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


@register("tracking", "mlflow", schema=TrackingConfig)
def mlflow_tracker(cfg, parent_run_id: str | None = None, run_name: str | None = None, tags: dict | None = None, resume_run_id: str | None = None):
    """MLflow on a SQLite store; metrics batched.

    Where the CLI started a recorder for this run (framework.tracking_process), MLflow works there,
    beside the run; otherwise in this process (`MlflowTracker`). Both write the same records."""
    from framework import tracking_process

    recorder = tracking_process.take_recorder()
    if recorder is not None:
        return tracking_process.RemoteTracker(recorder, cfg, parent_run_id, run_name, tags, resume_run_id)
    return MlflowTracker(cfg, parent_run_id, run_name, tags, resume_run_id)


class MlflowTracker:
    """MLflow on a SQLite store; metrics batched."""

    def __init__(self, cfg, parent_run_id: str | None = None, run_name: str | None = None, tags: dict | None = None, resume_run_id: str | None = None, process: dict | None = None):
        """`resume_run_id`: a stopped run that this one continues (`train.resume`); it goes on
        as the same MLflow run if the store has it, else a new run is made. `process`: the tags
        naming the run's process (`faults.process_tags`), when that is not this one."""
        from mlflow.entities import Metric

        self._Metric = Metric
        self.cfg = cfg
        self.client, self.experiment_id = client_and_experiment(cfg)
        from framework import faults

        faults.reap_orphans(self.client, self.experiment_id)  # runs left RUNNING by a SIGKILL
        all_tags = {**(tags or {}), **(process or faults.process_tags())}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
            from framework.multirun import job_num

            num = job_num()
            if num is not None:  # the sweep's order (parallel jobs start in any order): ties go to the first
                all_tags["pipelab.job_num"] = str(num)
        self._logged_params: dict = {}
        run = self._continued(resume_run_id)
        if run is not None:
            self.client.update_run(run.info.run_id, status="RUNNING")
            for k, v in all_tags.items():
                self.client.set_tag(run.info.run_id, k, v)
            self._logged_params = dict(run.data.params)
        else:
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        self.run_id = run.info.run_id
        self._buffer: list = []
        self.ended = False

    @property
    def known_run_id(self) -> str | None:
        """The run's id, if known without waiting (here it always is)."""
        return self.run_id

    def _continued(self, run_id: str | None):
        if not run_id:
            return None
        try:
            return self.client.get_run(run_id)
        except Exception:  # not in this store (another store, or deleted): a new run
            return None

    def log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        # a continued run keeps the params it has (MLflow never changes one; a resume may raise
        # train.epochs, which the run's tags then say)
        items = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in self._logged_params]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_dataset(self, dataset) -> None:
        """The run's data (`framework.data.Dataset`) as MLflow dataset inputs, one per split."""
        self.log_dataset_records(dataset_records(dataset))

    def log_dataset_records(self, records: list[dict]) -> None:
        self.client.log_inputs(self.run_id, datasets=dataset_inputs(records))

    def log_metric(self, key: str, value: float, step: int = 0) -> None:
        self.log_metric_records([(key, value, int(time.time() * 1000), step)])

    def log_metric_records(self, records) -> None:
        """Metrics as (key, value, timestamp in ms, step), logged when they were measured."""
        self._buffer.extend(self._Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in records)
        if len(self._buffer) >= self.cfg.flush_every:
            self.flush()

    def flush(self) -> None:
        while self._buffer:
            chunk, self._buffer = self._buffer[:900], self._buffer[900:]
            self.client.log_batch(self.run_id, metrics=chunk)

    def log_artifact(self, path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def log_artifacts(self, folder, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def end(self, status: str = "FINISHED") -> None:
        if self.ended:
            return
        self.ended = True
        try:
            self.flush()
        finally:
            self.client.set_terminated(self.run_id, status=status)


@register("tracking", "none", schema=TrackingConfig)
class NullTracker:
    """No tracking (the run still writes summary.json and its artifacts to the run directory)."""

    run_id = None
    known_run_id = None

    def __init__(self, cfg, parent_run_id=None, run_name=None, tags=None, resume_run_id=None):
        self.cfg = cfg

    def log_params(self, params):
        pass

    def log_dataset(self, dataset):
        pass

    def log_metric(self, key, value, step=0):
        pass

    def flush(self):
        pass

    def log_artifact(self, path):
        pass

    def log_artifacts(self, folder, artifact_path):
        pass

    def set_tag(self, key, value):
        pass

    def end(self, status="FINISHED"):
        pass
