"""Where a report's runs come from: a sweep folder, one run folder, or an MLflow experiment.

Folders are read directly (config.yaml + summary.json per job), so a report needs no MLflow and
works for `tracking=none` sweeps. Both sources give the same `RunRecord`s: params as MLflow
names them, the run's metrics with summary.json's end-of-run values winning (so a sweep folder
and its MLflow experiment give the same table), its per-epoch history and bytes per link.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from framework.config.schemas import SWEEP_KEYS_FILE
from framework.errors import PipelabError
from framework.report.plan import read_plan
from framework.tracking import per_device
from framework.tracking.comparison import RunRecord, is_number
from framework.tracking.multirun import swept_keys
from framework.tracking.store import flatten, mlflow_name, quiet_mlflow

EPOCH_MEAN = "time/epoch_virtual_s (mean)"  # the mean over epochs: MLflow's latest value is the last epoch's only
BYTES_TOTAL = "net/bytes (all links)"
FALLBACK_HISTORY = ("val/acc", "time/epoch_virtual_s")  # read from MLflow when a run has no summary.json


class ReportError(PipelabError):
    """The report's input cannot be read: no such folder, experiment or runs."""


@dataclass
class Source:
    title: str  # what the report is of
    location: str  # the folder, or the experiment in its store
    records: list[RunRecord]
    sweep_keys: list[str] | None  # the keys the sweep varied, in its order; None: not known
    default_out: Path
    overrides: str = ""  # the sweep's command-line overrides, where known
    skipped: list[str] = field(default_factory=list)  # jobs without a readable summary.json


def load(source: str, tracking_uri: str, parent: str | None = None) -> Source:
    """A folder if `source` is one with runs, else an MLflow experiment of that name."""
    path = Path(source).expanduser()
    bare = not any(c in source for c in "/\\") and not source.startswith((".", "~"))  # could name an experiment
    if path.is_dir() and not (parent and bare):  # with --parent, a bare name is the experiment
        if parent:
            raise ReportError("--parent picks a sweep in an MLflow experiment; a folder is one sweep or run already")
        try:
            return load_folder(path)
        except ReportError:
            if not bare:
                raise
        # `tests` names a folder in the working directory and maybe an experiment too: the one with runs wins
        try:
            return load_experiment(source, tracking_uri, parent)
        except ReportError:
            raise ReportError(f"{source}: neither a folder with runs nor an MLflow experiment with runs in {tracking_uri}") from None
    if path.exists():
        raise ReportError(f"{source}: not a folder (give a sweep folder, a run folder or an MLflow experiment name)")
    if not bare:
        raise ReportError(f"{source}: no such folder")
    return load_experiment(source, tracking_uri, parent)


# ---- folders ---------------------------------------------------------------------------------


def _derive(rec: RunRecord, pipeline: bool = True) -> RunRecord:
    """The report's own columns, computed alike for both sources."""
    epochs = [v for v in rec.history.get("time/epoch_virtual_s", []) if is_number(v)]
    if epochs:
        rec.metrics[EPOCH_MEAN] = sum(epochs) / len(epochs)
    if rec.links:
        rec.metrics[BYTES_TOTAL] = sum(rec.links.values())
    if not pipeline:  # nothing was pipelined (collaborative schedules): a bubble means nothing, as the CLI's summary line says
        rec.metrics.pop("pipe/bubble_frac", None)
    return rec


def _from_summary(rec: RunRecord, summary: dict) -> RunRecord:
    """Overlay what summary.json holds on `rec` (end-of-run metrics, history, links, clock)."""
    hist = {k: list(v) for k, v in (summary.get("history") or {}).items() if isinstance(v, list)}
    for k, v in hist.items():  # an epoch metric's last value, as MLflow's latest value has it
        if v and is_number(v[-1]):
            rec.metrics.setdefault(k, v[-1])
    rec.metrics.update({k: v for k, v in (summary.get("metrics") or {}).items() if is_number(v)})
    rec.history = hist
    rec.links = {name: st["bytes"] for name, st in (summary.get("links") or {}).items() if is_number(st.get("bytes"))}
    rec.clock = summary.get("clock", "virtual")
    rec.status = summary.get("status", rec.status)
    return _derive(rec, summary.get("pipeline", True) is not False)


def job_record(folder: Path) -> RunRecord:
    """One job folder (config.yaml + summary.json) as a record; params named as Job.params() logs them."""
    summary = json.loads((folder / "summary.json").read_text())
    params = {}
    if (folder / "config.yaml").is_file():
        cfg = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"), resolve=False)
        params = {mlflow_name(k): str(v)[:6000] for k, v in flatten(cfg).items()}
    rec = RunRecord(folder.name, summary.get("mlflow_run_id") or "", "", params, {})
    rec.plan = read_plan(folder / "plan.json")
    return _from_summary(rec, summary)


def _job_number(p: Path) -> tuple:
    m = re.match(r"(\d+)", p.name)
    return (int(m.group(1)) if m else math.inf, p.name)


def _sweep_meta(folder: Path) -> tuple[list[str] | None, str]:
    """The swept keys (sweep_keys.json, in the sweep's order; else from Hydra's multirun.yaml,
    which `tracking=none` sweeps have too) and the sweep's overrides."""
    overrides = []
    try:
        overrides = list(yaml.safe_load((folder / "multirun.yaml").read_text())["hydra"]["overrides"]["task"])
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        pass  # not a Hydra sweep folder: no overrides to show
    try:
        return list(json.loads((folder / SWEEP_KEYS_FILE).read_text())), " ".join(overrides)
    except (OSError, ValueError):
        return (swept_keys(overrides) if overrides else None), " ".join(overrides)


def load_folder(folder: Path) -> Source:
    if (folder / "summary.json").is_file():  # one run's folder
        try:
            rec = job_record(folder)
        except Exception as e:  # unreadable JSON or YAML, a summary of another shape: say so, no traceback
            raise ReportError(f"{folder}: cannot read its summary.json or config.yaml: {type(e).__name__}: {e}") from None
        return Source(f"run {folder.name}", str(folder), [rec], None, folder / "report")
    records, skipped = [], []
    for job in sorted((d for d in folder.iterdir() if d.is_dir()), key=_job_number):
        if (job / "summary.json").is_file():
            try:
                records.append(job_record(job))
            except Exception as e:  # a half-written summary (a killed job), odd YAML: leave the job out, say so
                skipped.append(f"{job.name} ({type(e).__name__})")
        elif re.match(r"\d+(_|$)", job.name):  # a job that failed before writing its summary
            skipped.append(f"{job.name} (no summary.json)")
    if not records:
        raise ReportError(f"{folder}: no runs here (neither a run folder with summary.json nor a sweep folder with job folders holding one)")
    keys, overrides = _sweep_meta(folder)
    title = f"{'sweep' if overrides or keys else 'runs in'} {folder.resolve().parent.name}/{folder.name}"
    return Source(title, str(folder), records, keys, folder / "report", overrides, skipped)


# ---- MLflow ----------------------------------------------------------------------------------


def _client(uri: str, name: str):
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        # MLflow would create (and migrate) an empty store: say what is wrong instead
        raise ReportError(f"{name}: no such folder, and no MLflow store at {uri[len('sqlite:///'):]} (give a sweep folder, or --tracking-uri)")

    quiet_mlflow()
    from mlflow.tracking import MlflowClient  # mlflow: start-up (only a report of an MLflow experiment imports it)

    return MlflowClient(tracking_uri=uri)


def mlflow_record(client, run, tmp: Path) -> RunRecord:
    """A run from the store: its params and metrics, then its summary.json artifact; without the
    artifact, the per-epoch history and link bytes come from its metrics."""
    rec = RunRecord(run.info.run_name, run.info.run_id, run.info.status, dict(run.data.params), dict(run.data.metrics))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        rec.plan = read_plan(client.download_artifacts(run.info.run_id, "plan.json", str(tmp)))
    except Exception:  # no plan artifact (a run that failed before planning): no plan columns
        pass
    try:
        path = client.download_artifacts(run.info.run_id, "summary.json", str(tmp))
        return _from_summary(rec, json.loads(Path(path).read_text()))
    except Exception:  # no artifact (a failed run, a deleted artifact store): the metrics are what there is
        pass
    for key in FALLBACK_HISTORY:
        points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        if points:
            rec.history[key] = [m.value for m in points]
    # (a large cluster's links are a table artifact, its metrics their statistics: framework.tracking.per_device)
    rec.links = {k[len("net/bytes/") :].replace("_to_", "->"): v for k, v in rec.metrics.items() if k.startswith("net/bytes/") and k[len("net/bytes/") :] not in per_device.STATS}
    return _derive(rec)


def load_experiment(name: str, uri: str, parent: str | None = None) -> Source:
    """The latest sweep's jobs (or the sweep `parent` names); in an experiment with no sweep,
    every top-level run."""
    client = _client(uri, name)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = ", ".join(sorted(e.name for e in client.search_experiments())) or "none"
        raise ReportError(f"{name}: no such folder, and no MLflow experiment of that name in {uri} (experiments: {known})")
    runs = sorted(client.search_runs([exp.experiment_id], max_results=5000), key=lambda r: r.info.start_time or 0)
    parent_ids = {r.data.tags.get("mlflow.parentRunId") for r in runs} - {None}
    sweeps = [r for r in runs if r.info.run_id in parent_ids or "pipelab.sweep_dir" in r.data.tags]
    chosen, keys, overrides = None, None, ""
    if parent:
        chosen = next((r for r in sweeps if r.info.run_id == parent), None)
        if chosen is None:
            raise ReportError(f"--parent {parent}: no sweep parent run with that id in experiment {name}")
    elif sweeps:
        chosen = sweeps[-1]
    if chosen is not None:
        picked = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == chosen.info.run_id]
        overrides = chosen.data.tags.get("mlflow.note.content", "")  # the sweep's overrides (MultirunParent)
        keys = swept_keys(overrides.split()) if overrides else None
        title = f"{name}: {chosen.info.run_name}"
    else:
        picked = [r for r in runs if r.info.run_id not in parent_ids]
        title = f"{name}: all runs"
    if not picked:
        raise ReportError(f"experiment {name} in {uri}: no runs to report")
    with tempfile.TemporaryDirectory() as tmp:
        records = [mlflow_record(client, r, Path(tmp) / str(i)) for i, r in enumerate(picked)]
    safe = re.sub(r"[^A-Za-z0-9_.=+-]", "_", name)
    return Source(title, f"experiment {name} in {uri}", records, keys, Path("outputs") / "reports" / safe, overrides)
