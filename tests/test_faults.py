"""Runs stopped from outside: SIGTERM is handled like Ctrl-C, a SIGKILLed run is closed by the next
run on the store, nothing is left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.test_cli_and_tracking import REPO, TINY, all_runs, cli

LONG = ["model=mlp", "train.epochs=200", "runtime.progress=false", "dataset.n_train=512", "dataset.n_val=64", "dataset.n_test=64"]


def _start(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    # a session of its own: killpg reaches the run and its MLflow recorder (framework.tracking.recorder), nothing else
    return subprocess.Popen([sys.executable, "-m", "framework", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def _wait_until_training(client, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if any(r.info.status == "RUNNING" and "time/epoch_virtual_s" in r.data.metrics for r in all_runs(client)):
            return
        time.sleep(0.3)
    raise AssertionError(f"the run did not reach its first epoch end: {proc.poll()}")


def _pipelab_temp_dirs() -> set[str]:
    return {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("pipelab")}


def test_sigterm_is_handled_like_ctrl_c(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    proc = _start(tracking + LONG + [f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    try:
        _wait_until_training(client, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().startswith("terminated:") and len(err.strip().splitlines()) == 1, err
    assert [r.info.status for r in all_runs(client)] == ["FAILED"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["iterations"] > 0


def test_a_sigkilled_run_is_closed_by_its_recorder(tmp_path, mlflow_store):
    """SIGKILL of the run's process alone (the OOM killer picks one): its MLflow recorder reads
    the end of its pipe and ends the run FAILED, saying why."""
    tracking, client = mlflow_store
    proc = _start(tracking + LONG + [f"hydra.run.dir={tmp_path / 'killed'}"], tmp_path)
    try:
        _wait_until_training(client, proc)
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.time() + 60
    while time.time() < deadline and all_runs(client)[0].info.status == "RUNNING":
        time.sleep(0.2)
    (run,) = all_runs(client)
    assert run.info.status == "FAILED" and "its recorder" in run.data.tags["pipelab.reaped"], run.data.tags
    assert str(proc.pid) == run.data.tags["pipelab.pid"]  # the run's process, not the recorder's
    assert "time/epoch_virtual_s" in run.data.metrics  # what was sent before the kill is kept


@pytest.mark.slow  # a killed process and a second run on its store (about 9 s); the recorder's own close stays fast
def test_a_sigkilled_run_is_closed_by_the_next_run_on_the_store(tmp_path, mlflow_store):
    """SIGKILL of the run and its recorder (the whole process group): nobody can close the run
    until the next run on the store finds its process gone."""
    tracking, client = mlflow_store
    proc = _start(tracking + LONG + [f"hydra.run.dir={tmp_path / 'killed'}"], tmp_path)
    try:
        _wait_until_training(client, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    (killed,) = all_runs(client)
    assert killed.info.status == "RUNNING"  # nobody could close it
    res = cli(tracking + TINY, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "marked 1 MLflow run(s) FAILED" in res.stderr
    runs = {r.info.run_id: r for r in all_runs(client)}
    assert runs[killed.info.run_id].info.status == "FAILED" and "killed" in runs[killed.info.run_id].data.tags["pipelab.reaped"]
    assert [r.info.status for r in runs.values() if r.info.run_id != killed.info.run_id] == ["FINISHED"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs mosquitto (apt-get install mosquitto)")
def test_sigterm_of_a_local_run_leaves_no_process_or_directory(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    before = _pipelab_temp_dirs()
    proc = _start(tracking + LONG + ["runtime=local", "transport=mqtt", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    try:
        _wait_until_training(client, proc, timeout=180)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children  # role processes and the private broker
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert [r.info.status for r in all_runs(client)] == ["FAILED"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "FAILED"
    time.sleep(0.5)
    alive = [pid for pid in children if os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read().lower()]
    assert not alive, alive
    assert _pipelab_temp_dirs() <= before  # no broker or role directory left in the temp folder


@pytest.mark.slow
def test_ctrl_c_of_a_joblib_sweep_leaves_no_run_running(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    proc, err = ctrl_c_of_a_sweep(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "train.lr=0.01,0.02,0.03", *tracking, *LONG], tmp_path, client, training=2)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    statuses = sorted(r.info.status for r in all_runs(client))
    assert len(statuses) >= 3 and "RUNNING" not in statuses, statuses  # the parent and the jobs it had started
    assert subprocess.run(["pgrep", "-f", f"sweep.dir={tmp_path}"], capture_output=True).returncode == 1  # nothing left running


def ctrl_c_of_a_sweep(args, tmp_path, client, training: int = 1, timeout: float = 240):
    """Start `python -m framework -m args` in a session of its own, wait until `training` jobs have
    an epoch's metrics, then Ctrl-C it as a terminal would (the whole foreground process group:
    the launcher, its workers or role processes, recorders); returns (process, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "framework", "-m", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and sum("time/epoch_virtual_s" in r.data.metrics for r in all_runs(client)) < training:
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc, err


def test_temp_folders_of_a_killed_run_are_removed_by_the_next_run(tmp_path, monkeypatch):
    from framework.tracking import faults

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # read TMPDIR again
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        mine, killed, unmarked = (tmp_path / f"pipelab-mosquitto-{n}" for n in ("mine", "killed", "unmarked"))
        for d in (mine, killed, unmarked):
            d.mkdir()
        faults.own_dir(mine)
        (killed / faults.OWNER_FILE).write_text(f"{dead.pid} 1\n")
        assert faults.remove_stale_dirs("pipelab-mosquitto-") == [killed.name]
        assert mine.exists() and unmarked.exists() and not killed.exists()
    finally:
        tempfile.tempdir = None


def _private_broker(proc) -> tuple[int, str, int]:
    """(pid, config file, port) of the mosquitto that run `proc` started for itself."""
    import re

    out = subprocess.run(["pgrep", "-a", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    m = re.search(r"^(\d+) \S*mosquitto -c (\S+)", out, re.M)
    assert m, f"no private broker among the run's children: {out!r}"
    conf = m.group(2)
    port = int(re.search(r"^listener (\d+)", open(conf).read(), re.M).group(1))
    return int(m.group(1)), conf, port


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs mosquitto (apt-get install mosquitto)")
@pytest.mark.parametrize("persistence", [False, True], ids=["forgetful", "persistent"])
def test_a_local_run_survives_a_broker_restart_with_the_same_weights(tmp_path, mlflow_store, persistence):
    """The private broker is stopped in the second epoch and started again on its port 2 s
    later, as an operator would: the run finishes, every role reconnected, nobody is reported
    lost, and the weights equal those of an undisturbed run."""
    from safetensors.torch import load_file

    from plugins.transports.broker import listening

    tracking, client = mlflow_store
    args = ["runtime=local", "transport=mqtt", "scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2", "model=mlp", "dataset=synthetic_mnist",
            "train.epochs=4", "train.iterations_per_epoch=30", "runtime.progress=false", f"transport.broker.persistence={str(persistence).lower()}"]
    ref = cli(["tracking=none", *args, f"hydra.run.dir={tmp_path / 'undisturbed'}"], tmp_path, {"OMP_NUM_THREADS": "1"})
    assert ref.returncode == 0, ref.stderr[-3000:]
    proc = _start(tracking + args + [f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    restarted = None
    try:
        _wait_until_training(client, proc, timeout=180)
        pid, conf, port = _private_broker(proc)
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + 10
        while listening("127.0.0.1", port) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)
        restarted = subprocess.Popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _, err = proc.communicate(timeout=300)
    finally:
        for p in (proc, restarted):
            if p is not None and p.poll() is None:
                p.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "was lost" not in err and "reconnects" in err, err[-3000:]  # no role reported lost
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert all(summary["processes"][r]["transport"]["reconnects"] >= 1 for r in ("coordinator", "stage0", "stage1")), summary["processes"]
    got, want = load_file(tmp_path / "run" / "model.safetensors"), load_file(tmp_path / "undisturbed" / "model.safetensors")
    assert got.keys() == want.keys() and all(bool((got[k] == want[k]).all()) for k in want)


def test_an_interruption_waits_for_a_shielded_block_and_a_second_one_does_not():
    """An MLflow write cut short by Ctrl-C or SIGTERM kept its SQLite transaction, and the store
    locked for the run's own closing writes (framework.tracking.faults.shielded)."""
    from framework.tracking import faults

    faults.handle_sigterm()
    done = []
    with pytest.raises(faults.Terminated):
        with faults.shielded():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler has run: the block goes on
            done.append("write finished")
    assert done == ["write finished"]
    with pytest.raises(KeyboardInterrupt):
        with faults.shielded():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("second write finished")
    assert done[-1] == "second write finished" and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(faults.Terminated):
        with faults.shielded():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal does not wait
            time.sleep(0.05)
            done.append("never")
    assert done[-1] != "never"
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
