"""MLflow tracking: one run per job, nested under one parent run per multirun.

- Metrics are buffered and written with `log_batch` (one SQLite write costs ~20 ms).
- The run ends FINISHED, or FAILED on any exception or Ctrl-C: never left RUNNING.
- Parallel multirun jobs would race to create a fresh store, so the launching process creates
  it, with the parent run, in a Hydra callback (`framework.tracking.multirun.MultirunParent`) and leaves
  the parent's id in the sweep directory for the jobs to find.
- Opening the store (SQLite or a tracking server), its locks and retries: framework.tracking.store.
- `tracking=mlflow` builds `framework.tracking.recorder.mlflow_tracker`: an `MlflowTracker` here,
  or in a recorder process beside the run.
"""

from __future__ import annotations

import json
import os
import time

from framework.tracking import faults
from framework.tracking.multirun import job_num
from framework.tracking.store import client_and_experiment


def dataset_records(dataset) -> list[dict]:
    """A `framework.data.Dataset` as plain data, one record per split, ready for `dataset_inputs`
    (in this process or in the recorder, `framework.tracking.recorder`): its name, the digest of the
    split's tensors (`Dataset.digest`), its source, the numpy dtypes and shapes of features and
    targets, and a profile (split, sizes, shapes, classes). An empty split (`dataset.n_val=0`) has
    no record: it holds no data to record."""
    from framework.data import SPLITS  # torch: start-up (the CLI and the recorder import this module)

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
    import torch  # torch: start-up (the CLI and the recorder import this module)

    return str(torch.empty(0, dtype=t.dtype).numpy().dtype)  # also for a meta tensor (no values)


def dataset_inputs(records: list[dict]) -> list:
    """`dataset_records` as MLflow dataset inputs, each tagged with its context
    (`mlflow.data.context`: `train`, `val`, `test`): the source as MLflow's `{"uri": ...}` JSON
    (type `local` for a file, `code` for generated data such as `synthetic:seed=0`) and a tensor
    schema as `mlflow.data.from_numpy` writes one (`mlflow_tensorspec`)."""
    import numpy as np  # mlflow, numpy: start-up (the recorder imports them beside the run)
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


class MlflowTracker:
    """MLflow on a SQLite store; metrics batched."""

    def __init__(self, cfg, parent_run_id: str | None = None, run_name: str | None = None, tags: dict | None = None, resume_run_id: str | None = None, process: dict | None = None):
        """`resume_run_id`: a stopped run that this one continues (`train.resume`); it goes on
        as the same MLflow run if the store has it, else a new run is made. `process`: the tags
        naming the run's process (`faults.process_tags`), when that is not this one."""
        from mlflow.entities import Metric  # mlflow: start-up

        self._Metric = Metric
        self.cfg = cfg
        self.client, self.experiment_id = client_and_experiment(cfg)
        faults.reap_orphans(self.client, self.experiment_id)  # runs left RUNNING by a SIGKILL
        all_tags = {**(tags or {}), **(process or faults.process_tags())}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
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
        from mlflow.entities import Param  # mlflow: start-up

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


class NullTracker:
    """No tracking (the run still writes summary.json and its artifacts to the run directory)."""

    run_id = None
    known_run_id = None
    experiment_id = None

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
