"""Faults end in one line, without tracebacks: Ctrl-C of a sweep of real processes, the broker lost
for good, a role killed; and a sweep killed with SIGKILL leaves no MLflow run RUNNING once the
next command on its store starts. Each spawns real processes (and a mosquitto): `-m slow`."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from tests.test_cli_and_tracking import TINY, all_runs, cli
from tests.test_faults import LONG, _start, _wait_until_training, ctrl_c_of_a_sweep

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs mosquitto (apt-get install mosquitto)")]
MQTT = ["runtime=local", "transport=mqtt"]


def _children(pid: int, pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def test_ctrl_c_of_a_sweep_of_real_processes_prints_one_line(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    proc, err = ctrl_c_of_a_sweep(["train.lr=0.01,0.02", *MQTT, *tracking, *LONG], tmp_path, client)  # the coordinator, its roles, its recorder
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted: "), err[-3000:]
    statuses = sorted(r.info.status for r in all_runs(client))
    assert len(statuses) >= 2 and "RUNNING" not in statuses, statuses  # the parent and the job it had started


def test_a_broker_lost_for_good_ends_the_run_with_the_brokers_message(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    proc = _start(tracking + LONG + MQTT + ["transport.reconnect_timeout_s=2", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    try:
        _wait_until_training(client, proc, timeout=180)
        (broker,) = _children(proc.pid, "mosquitto")
        os.kill(broker, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode not in (0, None), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"error: lost the MQTT broker at 127\.0\.0\.1:\d+ for more than 2s: .{0,200}", last), err[-3000:]
    assert [r.info.status for r in all_runs(client)] == ["FAILED"]


def test_a_killed_role_ends_the_run_in_one_line(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    proc = _start(tracking + LONG + MQTT + [f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    try:
        _wait_until_training(client, proc, timeout=180)
        role = _children(proc.pid, "role=stage1")[0]
        os.kill(role, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"error: role stage1 (pid {role}) was killed by signal 9", err[-3000:]
    assert [r.info.status for r in all_runs(client)] == ["FAILED"]


def test_a_sigkilled_sweep_is_closed_by_the_next_command_on_its_store(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    proc = _start(["-m", "train.lr=0.01,0.02", *tracking, *LONG, f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not any("time/epoch_virtual_s" in r.data.metrics for r in all_runs(client)):
            time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, its job and their recorders: nobody can close a run
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = {r.info.run_id for r in all_runs(client)}
    assert len(killed) == 2  # the parent and its first job
    deadline = time.time() + 30  # a recorder whose run process died may close its run first: either way none stays RUNNING
    res = cli(tracking + TINY, tmp_path)
    assert res.returncode == 0, res.stderr
    runs = {r.info.run_id: r.info.status for r in all_runs(client)}
    assert all(runs[r] == "FAILED" for r in killed), runs
    assert sorted(runs.values()).count("FINISHED") == 1
