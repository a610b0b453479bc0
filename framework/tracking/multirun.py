"""Hydra multirun: the parent MLflow run of a sweep, the keys a sweep varies, and where a job
stands in its sweep.

The launching process creates the store and the parent run in a Hydra callback
(`MultirunParent`, named in conf/config.yaml) before any job starts, so parallel jobs never race
to create a fresh store, and leaves the parent's id in the sweep directory (`PARENT_FILE`) for
jobs in other processes to find; once the jobs are done it writes the comparison onto the parent
(framework.tracking.sweep_summary) and ends it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from framework.config.schemas import SWEEP_KEYS_FILE, read_sweep_keys
from framework.errors import PipelabError, one_line
from framework.tracking import faults, objective, run_names, ui_links
from framework.tracking.store import client_and_experiment
from framework.tracking.sweep_summary import summarize_sweep

PARENT_FILE = "mlflow_parent_run_id"

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
        self.ended = False

    def on_multirun_start(self, config, **kwargs) -> None:
        tcfg = config.tracking
        check_objective(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        space = sweeper_params(config)  # a search space in the config (an Optuna preset's)
        task = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]  # `${..}` stays text
        keys = swept_keys(task)
        given = {o.split("=", 1)[0].lstrip("+~") for o in task if "=" in o}  # the command line wins over the config's space
        keys += [k for k in swept_keys([f"{k}={v}" for k, v in space.items()]) if k not in given]
        (sweep_dir / SWEEP_KEYS_FILE).write_text(json.dumps(keys))  # job folders and run names use it, tracked or not
        if tcfg.name != "mlflow":
            return
        self.client, exp_id = client_and_experiment(tcfg)
        self.experiment_id = exp_id
        faults.reap_orphans(self.client, exp_id)  # a sweep killed with SIGKILL: its parent and children
        note = " ".join(task + [f"{k}={v}" for k, v in space.items()])
        tags = {"pipelab.sweep_dir": str(sweep_dir), "mlflow.note.content": note, **faults.process_tags()}
        run = self.client.create_run(exp_id, run_name=run_names.sweep_name(task, keys, space), tags=tags)
        self.run_id = run.info.run_id
        (sweep_dir / PARENT_FILE).write_text(self.run_id)
        os.environ["PIPELAB_PARENT_RUN_ID"] = self.run_id
        atexit.register(self._end_if_abandoned)  # a sweep that raises never calls on_multirun_end

    def on_job_end(self, config, job_return, **kwargs) -> None:
        if getattr(job_return, "status", None) == JobStatus.FAILED:
            self.failed = True

    def on_multirun_end(self, config, **kwargs) -> None:
        if self.run_id and self.client is not None:
            try:
                result = summarize_sweep(self.client, self.experiment_id, self.run_id, config.tracking, Path(config.hydra.sweep.dir))
                # jobs in other processes (joblib, submitit) call on_job_end on their own copy of
                # this callback: the children's statuses in the store say whether one failed
                self.failed |= any(row.get("status") == "FAILED" for row in result["rows"])
                print(sweep_outcome(result, config.tracking, self.experiment_id, self.run_id))
            except Exception as e:  # the comparison must never hide the sweep's own outcome
                print(f"warning: could not summarise the sweep on its parent run: {e}", file=sys.stderr)
            self.ended = True
            self.client.set_terminated(self.run_id, status="FAILED" if self.failed else "FINISHED")
            os.environ.pop("PIPELAB_PARENT_RUN_ID", None)

    def _end_if_abandoned(self) -> None:
        """At exit: a sweep that stopped on a failed job (Hydra raises before on_multirun_end)
        leaves its parent FAILED, never RUNNING, and so the children it stopped mid-run (a joblib
        pool is torn down with the sweep)."""
        if self.run_id and self.client is not None and not self.ended:
            self.ended = True
            faults.close_sweep(self.client, self.experiment_id, self.run_id, status="FAILED")


def sweep_outcome(result: dict, tcfg, experiment_id: str, parent_id: str) -> str:
    """What a sweep ends with: its best job by the optimized metric (or why none), and links to
    its runs and to the best job's charts in the MLflow UI (framework.tracking.ui_links)."""
    base, _ = ui_links.ui_base(tcfg.uri)
    metric = tcfg.optimized_metric
    best = result.get("best")
    lines = [f"sweep: {len(result['rows'])} job(s); runs: " + ui_links.describe(tcfg.uri, ui_links.experiment_url(base, experiment_id))]
    if best is None:
        floor = objective.describe_floor(tcfg)
        lines.append(f"best: none (no job recorded {metric}" + (f" at {floor}" if floor else "") + ")")
    else:
        lines.append(f"best: {best.name}: {metric} {best.metrics[metric]:.6g} ({tcfg.optimized_direction})  {ui_links.run_url(base, experiment_id, best.run_id)}")
    return "\n".join(lines)


def sweeper_params(config) -> dict:
    """`hydra.sweeper.params`: a search space given in the config (Optuna's, or the basic
    sweeper's) rather than on the command line, as {key: sweep expression}."""
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
    return {str(k): str(v) for k, v in params.items()} if params else {}


def check_objective(config) -> None:
    """Before a sweep starts: what it optimises is well formed (`framework.tracking.objective.check`), and
    an Optuna study goes the way the parent run picks its best child (`hydra.sweeper.direction`
    agrees with `tracking.optimized_direction`). Exits with status 2 and one line otherwise."""
    try:
        objective.check(config.tracking)
    except PipelabError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    if direction is None or OmegaConf.is_list(direction) or isinstance(direction, (list, tuple)):
        return  # no direction (the basic sweeper), or a multi-objective study
    name = str(getattr(direction, "name", direction))
    want = {"max": "maximize", "min": "minimize"}.get(str(config.tracking.optimized_direction))
    if want and name != want:
        print(f"error: hydra.sweeper.direction={name} disagrees with tracking.optimized_direction={config.tracking.optimized_direction}: "
              f"the sweeper would {name[:3]}imise {config.tracking.optimized_metric} while the parent run names the best child by its {config.tracking.optimized_direction}imum; "
              f"set one of them (the Optuna presets use hydra.sweeper.direction=${{pipelab_study_direction:${{tracking.optimized_direction}}}})", file=sys.stderr)
        sys.exit(2)


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
    return read_sweep_keys(HydraConfig.get().sweep.dir)


def job_num() -> int | None:
    """This job's number in its multirun (`hydra.job.num`), None outside one."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    return int(hc.job.num) if hc.mode == RunMode.MULTIRUN and hc.job.get("num") is not None else None


def parent_run_id() -> str | None:
    """The multirun parent of this job, if any (the env var for in-process launchers, the sweep
    directory's file for launchers that run jobs in other processes)."""
    try:
        hc = HydraConfig.get()
    except ValueError:  # not under Hydra (tests, the API)
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    f = Path(hc.sweep.dir) / PARENT_FILE
    if f.exists():
        return f.read_text().strip()
    return os.environ.get("PIPELAB_PARENT_RUN_ID")
