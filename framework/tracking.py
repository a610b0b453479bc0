"""MLflow tracking: one run per job, nested under one parent run per multirun.

- SQLite store under `outputs/` (the file store is deprecated); artifacts beside it.
- Metrics are buffered and written with `log_batch` (one SQLite write costs ~20 ms).
- The run ends FINISHED, or FAILED on any exception or Ctrl-C: never left RUNNING.
- Parallel multirun jobs would race to create a fresh store, so the launching process creates
  it, with the parent run, in a Hydra callback (`MultirunParent`) and leaves the parent's id in
  the sweep directory for the jobs to find.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from framework.config import SWEEP_KEYS_FILE, TrackingConfig, read_sweep_keys
from framework.registry import register

PARENT_FILE = "mlflow_parent_run_id"


def _quiet_mlflow() -> None:
    import logging

    for name in ("mlflow", "alembic", "mlflow.store", "mlflow.tracking"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _ensure_sqlite_dir(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)


def client_and_experiment(cfg) -> tuple[Any, str]:
    """An MlflowClient on `cfg.uri` and the id of experiment `cfg.experiment` (created if new)."""
    _quiet_mlflow()
    from mlflow.tracking import MlflowClient

    _ensure_sqlite_dir(cfg.uri)
    client = MlflowClient(tracking_uri=cfg.uri)
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        return client, exp.experiment_id
    root = Path(cfg.artifact_root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    try:
        return client, client.create_experiment(cfg.experiment, artifact_location=root.as_uri())
    except Exception:  # another process created it first
        exp = client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            raise
        return client, exp.experiment_id


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
class MlflowTracker:
    """MLflow on a SQLite store; metrics batched."""

    def __init__(self, cfg, parent_run_id: str | None = None, run_name: str | None = None, tags: dict | None = None, resume_run_id: str | None = None):
        """`resume_run_id`: a stopped run that this one continues (`train.resume`); it goes on
        as the same MLflow run if the store has it, else a new run is made."""
        from mlflow.entities import Metric

        self._Metric = Metric
        self.cfg = cfg
        self.client, self.experiment_id = client_and_experiment(cfg)
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
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

    def log_metric(self, key: str, value: float, step: int = 0) -> None:
        self._buffer.append(self._Metric(key, float(value), int(time.time() * 1000), int(step)))
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

    def __init__(self, cfg, parent_run_id=None, run_name=None, tags=None, resume_run_id=None):
        self.cfg = cfg

    def log_params(self, params):
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


# ---------------------------------------------------------------------------------------------
# Hydra multirun: one parent run


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object


class MultirunParent(Callback):
    """Creates the store and the parent MLflow run before a sweep's jobs start; ends it after."""

    def __init__(self):
        self.run_id = None
        self.failed = False
        self.client = None
        self.experiment_id = None

    def on_multirun_start(self, config, **kwargs) -> None:
        tcfg = config.tracking
        if tcfg.name != "mlflow":
            return
        self.client, exp_id = client_and_experiment(tcfg)
        self.experiment_id = exp_id
        sweep_dir = Path(config.hydra.sweep.dir)
        run = self.client.create_run(exp_id, run_name=f"sweep {sweep_dir.name}", tags={"pipelab.sweep_dir": str(sweep_dir), "mlflow.note.content": " ".join(config.hydra.overrides.task)})
        self.run_id = run.info.run_id
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(self.run_id)
        (sweep_dir / SWEEP_KEYS_FILE).write_text(json.dumps(swept_keys(list(config.hydra.overrides.task))))
        os.environ["PIPELAB_PARENT_RUN_ID"] = self.run_id

    def on_job_end(self, config, job_return, **kwargs) -> None:
        from hydra.core.utils import JobStatus

        if getattr(job_return, "status", None) == JobStatus.FAILED:
            self.failed = True

    def on_multirun_end(self, config, **kwargs) -> None:
        if self.run_id and self.client is not None:
            try:
                from framework.sweep_summary import summarize_sweep

                summarize_sweep(self.client, self.experiment_id, self.run_id, config.tracking, Path(config.hydra.sweep.dir))
            except Exception as e:  # the comparison must never hide the sweep's own outcome
                print(f"warning: could not summarise the sweep on its parent run: {e}", file=sys.stderr)
            self.client.set_terminated(self.run_id, status="FAILED" if self.failed else "FINISHED")
            os.environ.pop("PIPELAB_PARENT_RUN_ID", None)


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys a multirun's overrides sweep: `key=a,b,c` or Hydra's range/choice/interval/glob."""
    out = []
    for o in overrides:
        if "=" not in o:
            continue
        key, value = o.split("=", 1)
        depth, comma = 0, False
        for ch in value:  # a comma at the top level, not inside [..] or (..)
            depth += ch in "[({"
            depth -= ch in "])}"
            comma |= ch == "," and depth == 0
        if comma or value.startswith(("range(", "choice(", "interval(", "glob(")):
            out.append(key.lstrip("+~"))
    return out


def sweep_keys() -> set[str]:
    """The keys this job's multirun sweeps (empty for a single run)."""
    run_id = parent_run_id()
    if run_id is None:
        return set()
    from hydra.core.hydra_config import HydraConfig

    return read_sweep_keys(HydraConfig.get().sweep.dir)


def parent_run_id() -> str | None:
    """The multirun parent of this job, if any (the env var for in-process launchers, the sweep
    directory's file for launchers that run jobs in other processes)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except ValueError:  # not under Hydra (tests, the API)
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    f = Path(hc.sweep.dir) / PARENT_FILE
    if f.exists():
        return f.read_text().strip()
    return os.environ.get("PIPELAB_PARENT_RUN_ID")
