"""MLflow beside the run (framework.tracking.recorder): the recorder writes what the in-process
tracker writes, a store it cannot use costs no results, and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.test_cli_and_tracking import REPO, TINY, all_runs, cli
from tests.test_faults import LONG, _start, _wait_until_training

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the recorder is forked (POSIX)")

# metrics of wall time and tags that name the process or the moment differ between any two runs
VARYING_METRICS = ("time/wall_s", "compression/encode_s_fwd", "compression/decode_s_fwd", "compression/encode_s_bwd", "compression/decode_s_bwd")
VARYING_TAGS = ("pipelab.pid", "pipelab.pid_start", "mlflow.source.name", "mlflow.runName", "pipelab.overrides")


def _record(client, run):
    """Everything MLflow keeps of a run that does not vary between two identical runs."""
    metrics = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in run.data.metrics if k not in VARYING_METRICS}
    tags = {k: v for k, v in run.data.tags.items() if k not in VARYING_TAGS}
    inputs = sorted((d.dataset.name, d.dataset.digest, d.dataset.source, d.dataset.schema, d.dataset.profile, [(t.key, t.value) for t in d.tags]) for d in run.inputs.dataset_inputs)

    def artifacts(path=None):
        out = []
        for a in client.list_artifacts(run.info.run_id, path):
            out += artifacts(a.path) if a.is_dir else [a.path]
        return sorted(out)

    return {"status": run.info.status, "params": run.data.params, "metrics": metrics, "tags": tags, "inputs": inputs, "artifacts": artifacts()}


@pytest.mark.slow  # two full runs against two stores (about 16 s)
def test_the_recorder_writes_what_the_in_process_tracker_writes(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    args = tracking + TINY + ["scheduler=gpipe", "train.epochs=2"]
    records = {}
    for where, env in (("recorder", {}), ("in_process", {"PIPELAB_TRACKING_PROCESS": "0"})):
        res = cli(args + [f"hydra.run.dir={tmp_path / where}"], tmp_path, env)
        assert res.returncode == 0, res.stderr
        summary = json.loads((tmp_path / where / "summary.json").read_text())
        run = client.get_run(summary["mlflow_run_id"])
        records[where] = _record(client, run)
        assert json.loads((tmp_path / where / "checkpoint" / "meta.json").read_text())["mlflow_run_id"] == summary["mlflow_run_id"]
        assert not [p.name for p in (tmp_path / where).iterdir() if ".logging-" in p.name]  # checkpoint snapshots are removed
    assert records["recorder"]["status"] == "FINISHED"
    assert records["recorder"]["metrics"]["val/acc"] and "checkpoint/meta.json" in records["recorder"]["artifacts"]
    assert records["recorder"] == records["in_process"]


def test_a_store_the_recorder_cannot_open_costs_no_results(tmp_path):
    """The store fails in the recorder, after the run started: the run still trains and writes
    its outputs, then exits with one line naming the tracking URI."""
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the store's folder should be")
    args = TINY + ["tracking=mlflow", f"tracking.uri=sqlite:///{blocker}/mlflow.db", f"tracking.artifact_root={tmp_path / 'art'}", f"hydra.run.dir={tmp_path / 'run'}"]
    res = cli(args, tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: MLflow could not record the run") and str(blocker) in res.stderr and "Traceback" not in res.stderr, res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["mlflow_run_id"] is None and summary["iterations"] == 3


def test_a_run_that_stops_before_tracking_leaves_no_recorder(tmp_path, mlflow_store):
    """A config error ends the run before it tracks: its recorder (forked at start-up) is ended
    with it, and the store is never touched."""
    tracking, client = mlflow_store
    proc = subprocess.Popen([sys.executable, "-m", "framework", *tracking, *TINY, "cluster.num_devices=0"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "cluster.num_devices" in err, err
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # no process of its session is left
    assert all_runs(client) == []


def test_ctrl_c_reaches_the_run_not_the_recorder(tmp_path, mlflow_store):
    """Ctrl-C in a terminal signals the whole process group: the run ends FAILED through its own
    handling (one line), and the recorder, ignoring the signal, writes that."""
    tracking, client = mlflow_store
    proc = _start(tracking + LONG + [f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)  # its own process group
    try:
        _wait_until_training(client, proc)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and err.strip().startswith("interrupted:") and len(err.strip().splitlines()) == 1, err
    (run,) = all_runs(client)
    assert run.info.status == "FAILED" and "pipelab.reaped" not in run.data.tags
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["mlflow_run_id"] == run.info.run_id


def test_which_commands_get_a_recorder(monkeypatch):
    from framework.tracking.recorder import ENV, wanted

    monkeypatch.delenv(ENV, raising=False)
    assert wanted(["scheduler=pipar", "train.epochs=1"]) and wanted([])
    for args in (["-m", "scheduler=gpipe,1f1b"], ["--multirun"], ["--help"], ["--plugins"], ["--cfg", "job"], ["--info"], ["tracking=none"]):
        assert not wanted(args), args
    monkeypatch.setenv(ENV, "0")
    assert not wanted(["scheduler=pipar"])
