"""Sweeps whose jobs run in parallel processes or log from other machines, end to end.

- `hydra/launcher=joblib`: jobs in parallel local processes, all writing one SQLite MLflow store;
- `tracking.uri=http://...`: a real `mlflow server` (SQLite backend, artifacts served from a
  folder in tmp) on a free loopback port, the same sweep logging into it, artifacts included;
- Hydra's Optuna sweeper with the `experiment=pipar_optuna` preset: 8 trials, and the parent run
  names the trial Optuna reports as best, under an accuracy floor (`tracking.metric_floor`);
- the store's own safety: processes that open a fresh SQLite store at once, a lock held longer
  than MLflow waits, a sweep that stops on a failed job.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from framework.config.validate import validate
from framework.errors import ConfigError
from framework.job import Job
from framework.tracking import objective
from tests.conftest import compose_cfg

REPO = Path(__file__).resolve().parent.parent
# tiny jobs; no checkpoints (each costs a tiny job more than half its time, and none is resumed here)
TINY = ["model=mlp", "train.epochs=1", "train.iterations_per_epoch=3", "dataset.n_train=256", "dataset.n_val=64", "dataset.n_test=64", "runtime.progress=false", "runtime.threads=1",
        "train.checkpoint=false"]
LRS = ["0.01", "0.02", "0.03", "0.04"]
ERROR_TEXT = ("Traceback", "database is locked", "BrokenProcessPool", "Error executing job")


def cli(args, cwd, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "framework", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)


def runs_of(client):
    exps = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in exps], max_results=1000) if exps else []
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def assert_clean(res):
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-4000:])
    for needle in ERROR_TEXT:
        assert needle not in res.stderr, res.stderr[-4000:]


def assert_lr_sweep(client, sweep: Path):
    """One FINISHED parent, the 4 children FINISHED under it, each with its swept value, its name,
    its job folder, its job number, its metrics and its artifacts: nothing lost."""
    parents, children = runs_of(client)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [(p.info.run_name, p.info.status) for p in parents]
    parent = parents[0]
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children), [(c.info.run_name, c.info.status) for c in children]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.data.params["train.lr"] for c in children) == LRS
    assert sorted(c.data.tags["pipelab.job_num"] for c in children) == ["0", "1", "2", "3"]
    for c in children:  # named by the swept value, not just `gpipe mlp pi4_wifi`
        assert c.info.run_name == f"gpipe mlp pi4_wifi train.lr={c.data.params['train.lr']}", c.info.run_name
        assert {"val/acc", "test/acc", "time/epoch_virtual_s", "train/loss"} <= set(c.data.metrics)
        assert {"config.yaml", "summary.json", "model.safetensors", "timeline.json"} <= {a.path for a in client.list_artifacts(c.info.run_id)}
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [f"{i}_train.lr={lr}" for i, lr in enumerate(LRS)]
    by_id = {c.info.run_id: c for c in children}
    for i, lr in enumerate(LRS):  # each job folder's summary points at its own child run
        s = json.loads((sweep / f"{i}_train.lr={lr}" / "summary.json").read_text())
        assert by_id[s["mlflow_run_id"]].data.params["train.lr"] == lr
    assert parent.data.tags["pipelab.best_child_run_id"] in by_id
    assert {"comparison.csv", "comparison.md"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    return parent, children


def overlapping(children) -> bool:
    """Whether two of the runs were running at the same time (parallel processes)."""
    spans = sorted((c.info.start_time, c.info.end_time) for c in children)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


# ---------------------------------------------------------------------------------------------
# joblib: parallel local processes, one SQLite store


@pytest.mark.slow  # starts a sweep of parallel processes (about 25 s)
def test_joblib_sweep_runs_jobs_in_parallel_processes_into_one_sqlite_store(tmp_path, mlflow_store):
    """4 jobs over 2 worker processes (joblib's default on 2 cores; the slow tests run 4 and 8 at
    once): every job's run, folder and artifacts, and jobs really overlapping in time."""
    tracking, client = mlflow_store
    sweep = tmp_path / "sweep"
    res = cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"train.lr={','.join(LRS)}", *tracking, *TINY, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert_clean(res)
    assert "Joblib.Parallel(n_jobs=2" in res.stdout
    _, children = assert_lr_sweep(client, sweep)
    assert overlapping(children), [(c.info.start_time, c.info.end_time) for c in children]


@pytest.mark.slow
def test_eight_jobs_at_once_writing_every_metric_on_its_own_lose_nothing(tmp_path, mlflow_store):
    """An 8-job sweep whose jobs write each metric on its own (`tracking.flush_every=1`): 8
    FINISHED children under one parent, with every iteration's loss and no lock error. (How many
    of the 8 run at the same moment is loky's to decide: on a quiet machine its first worker may
    finish them all before the others have imported torch. Contention itself is the next test's,
    whose processes start writing on one signal.)"""
    tracking, client = mlflow_store
    lrs = [f"0.0{i}" for i in range(1, 9)]
    res = cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=8", f"train.lr={','.join(lrs)}", "tracking.flush_every=1", *tracking, *TINY,
               "train.iterations_per_epoch=12", "dataset.n_train=1024", f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert_clean(res)
    parents, children = runs_of(client)
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert len(children) == 8 and all(c.info.status == "FINISHED" for c in children)
    assert sorted(c.data.params["train.lr"] for c in children) == lrs
    for c in children:  # every iteration's loss, and the epoch's mean at the end (step 12 again)
        assert sorted(m.step for m in client.get_metric_history(c.info.run_id, "train/loss")) == list(range(1, 13)) + [12]


@pytest.mark.slow  # 8 processes importing MLflow (about 20 s)
def test_eight_processes_writing_every_metric_at_once_lose_nothing(tmp_path, mlflow_template):
    """The store under real contention: 8 processes, each its own run, wait until all are ready,
    then write 40 metrics one write each (`flush_every=1`, as `tracking.flush_every=1` does)
    through the tracker the jobs use: every run FINISHED with every point, no lock error."""
    import shutil

    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template, db)
    go, n, points = tmp_path / "go", 8, 40
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from omegaconf import OmegaConf
        from framework.tracking.tracker import MlflowTracker
        cfg = OmegaConf.create({{"uri": "sqlite:///{db}", "artifact_root": "{tmp_path / 'art'}", "experiment": "contention", "flush_every": 1}})
        tracker = MlflowTracker(cfg, run_name="proc" + sys.argv[2])
        Path(sys.argv[1]).touch()
        while not Path("{go}").exists():
            time.sleep(0.01)
        for step in range({points}):
            tracker.log_metric("train/loss", 1.0 / (step + 1), step)
        tracker.end()
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"ready{i}"), str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    try:
        deadline = time.time() + 300
        while not all((tmp_path / f"ready{i}").exists() for i in range(n)) and time.time() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        ready = [(tmp_path / f"ready{i}").exists() for i in range(n)]  # all waiting: the writes start together
        go.touch()
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0 and not any(e in err for e in ERROR_TEXT), err[-3000:]
    assert all(ready), ready
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("contention").experiment_id])
    assert sorted(r.info.run_name for r in runs) == [f"proc{i}" for i in range(n)]
    assert all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "train/loss")) == list(range(points))


@pytest.mark.slow  # many processes opening one store (about 15 s)
def test_processes_opening_a_fresh_sqlite_store_at_once_all_succeed(tmp_path):
    """MLflow creates a fresh store's tables on first access; 3 or 4 processes doing that at the
    same moment all failed but one or none ("table experiments already exists", "duplicate column
    name") before the creation lock. Each imports everything first, then all start on one signal."""
    db, go = tmp_path / "fresh" / "mlflow.db", tmp_path / "go"
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from omegaconf import OmegaConf
        from framework.tracking.store import client_and_experiment
        cfg = OmegaConf.create({{"uri": "sqlite:///{db}", "artifact_root": "{tmp_path / 'art'}", "experiment": "race"}})
        Path(sys.argv[1]).touch()
        while not Path("{go}").exists():
            time.sleep(0.01)
        client, exp_id = client_and_experiment(cfg)
        run = client.create_run(exp_id, run_name="proc" + sys.argv[2])
        client.set_terminated(run.info.run_id)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"ready{i}"), str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    try:
        deadline = time.time() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(3)) and time.time() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        go.touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
    from mlflow.tracking import MlflowClient

    store = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = store.search_runs([store.get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["proc0", "proc1", "proc2"]
    assert all(r.info.status == "FINISHED" for r in runs)


@pytest.mark.slow
def test_a_write_waits_out_a_lock_held_longer_than_mlflow_waits(tmp_path, mlflow_template, capsys):
    """MLflow gives up on a SQLite lock after 20 s ("database is locked"); the store's client
    tries again, with backoff, so a run's writes survive a lock held for 24 s."""
    import shutil
    import sqlite3

    from mlflow.entities import Metric
    from omegaconf import OmegaConf

    from framework.tracking.store import client_and_experiment

    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template, db)
    client, exp_id = client_and_experiment(OmegaConf.create({"uri": f"sqlite:///{db}", "artifact_root": str(tmp_path / "art"), "experiment": "locked"}))
    run_id = client.create_run(exp_id).info.run_id
    held = threading.Event()

    def hold():
        con = sqlite3.connect(db, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(24)
        con.execute("COMMIT")
        con.close()

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    t0 = time.time()
    client.log_batch(run_id, metrics=[Metric("m", 1.0, 0, 0)])
    waited = time.time() - t0
    t.join()
    assert waited > 20  # it really was locked out past MLflow's own wait
    assert "MLflow store busy" in capsys.readouterr().err
    assert client.get_run(run_id).data.metrics == {"m": 1.0}


@pytest.mark.slow
def test_a_sweep_that_stops_on_a_failed_job_leaves_nothing_running(tmp_path, mlflow_store):
    """A job whose value is wrong stops the sweep (as with the basic launcher); the parent run
    ends FAILED, never RUNNING, and the error says which key."""
    tracking, client = mlflow_store
    res = cli(["-m", "hydra/launcher=joblib", "scheduler.microbatches=1,128", *tracking, *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert res.returncode != 0
    assert "error: scheduler.microbatches: 128 micro-batches cannot split a batch of 64 samples" in res.stderr, res.stderr[-3000:]
    assert "BrokenProcessPool" not in res.stderr and "RecursionError" not in res.stderr, res.stderr[-3000:]
    parents, children = runs_of(client)
    assert [p.info.status for p in parents] == ["FAILED"]
    assert all(c.info.status != "RUNNING" for c in children), [(c.info.run_name, c.info.status) for c in children]


# ---------------------------------------------------------------------------------------------
# a real MLflow tracking server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_mlflow(backend_uri: str, root: Path):
    """`mlflow server` on a free loopback port over `backend_uri`, artifacts served from `root`
    (its GenAI job runner off: it starts 7 worker processes these tests have no use for)."""
    port = free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", backend_uri, "--serve-artifacts", "--artifacts-destination", str(root / "artifacts")],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its uvicorn worker
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`serve_mlflow` on a SQLite backend in tmp: (its URL, the artifacts folder)."""
    root = tmp_path_factory.mktemp("mlflow_server")
    with serve_mlflow(f"sqlite:///{root / 'server.db'}", root) as url:
        yield url, root / "artifacts"


def server_tracking(url: str, experiment: str, tmp_path: Path) -> list[str]:
    return ["tracking=mlflow", f"tracking.uri={url}", f"tracking.experiment={experiment}", f"tracking.artifact_root={tmp_path / 'local_artifacts'}"]


def assert_artifacts_on_server(client, run, served: Path, local_dir: Path):
    """The run's artifacts went to the server (`mlflow-artifacts:`, stored under its
    --artifacts-destination) and read back the same through it."""
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/"), run.info.artifact_uri
    assert {"config.yaml", "summary.json", "model.safetensors"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    stored = list(served.rglob(f"{run.info.run_id}/artifacts/model.safetensors"))
    assert len(stored) == 1 and stored[0].read_bytes() == (local_dir / "model.safetensors").read_bytes()
    fetched = client.download_artifacts(run.info.run_id, "summary.json", str(local_dir.parent / f"fetched_{run.info.run_id}"))
    assert json.loads(Path(fetched).read_text())["mlflow_run_id"] == run.info.run_id


@pytest.mark.slow
def test_a_run_logs_into_an_mlflow_server_artifacts_included(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    url, served = mlflow_server
    summary = Job(compose_cfg(server_tracking(url, "one_run", tmp_path) + TINY, fast=False), tmp_path / "run").run()
    client = MlflowClient(tracking_uri=url)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["model.name"] == "mlp"
    assert run.data.metrics["val/acc"] == summary["metrics"]["val/acc"]
    assert_artifacts_on_server(client, run, served, tmp_path / "run")
    assert not (tmp_path / "local_artifacts").exists()  # the server chose where artifacts go


@pytest.mark.slow
def test_joblib_sweep_logs_into_an_mlflow_server(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    url, served = mlflow_server
    sweep = tmp_path / "sweep"
    res = cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4", f"train.lr={','.join(LRS)}", *server_tracking(url, "joblib_sweep", tmp_path), *TINY, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert_clean(res)
    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("joblib_sweep")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.params["train.lr"] for c in children) == LRS
    assert overlapping(children)
    for c in children:
        assert_artifacts_on_server(client, c, served, sweep / f"{c.data.tags['pipelab.job_num']}_train.lr={c.data.params['train.lr']}")
    assert {"comparison.csv", "comparison.md"} <= {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert not (tmp_path / "local_artifacts").exists()


# ---------------------------------------------------------------------------------------------
# Optuna: the preset, the accuracy floor, the parent naming Optuna's best

# tiny trials of the preset: an MLP that learns something in 8 iterations, 2 devices; its search
# space narrowed on the command line (the command line adds to and overrides the preset's)
OPTUNA_TINY = ["model=mlp", "cluster.num_devices=2", "train.epochs=1", "train.iterations_per_epoch=8", "train.lr=0.003", "dataset.n_train=1024",
               "dataset.n_val=256", "dataset.n_test=64", "runtime.threads=1", "runtime.progress=false", "train.checkpoint=false"]
FLOOR = 0.33  # 1-bit activations stay near 0.2 in 8 iterations here, 2- and 4-bit ones reach about 0.38


@pytest.mark.slow
@pytest.mark.parametrize("trials", [8, 3])
def test_optuna_preset_runs_its_trials_and_the_parent_names_optunas_best(tmp_path, mlflow_store, trials):
    """The preset's 8 trials (slow), and 3 of them (fast). The seeded sampler's first trials are
    drawn before any value is known: 1-bit at N=8, then 2-bit at N=1 twice, so even 3 trials meet
    the floor and a tie."""
    tracking, client = mlflow_store
    sweep = tmp_path / "sweep"
    res = cli(["-m", "experiment=pipar_optuna", "scheduler.P=1", "scheduler.N=choice(1,8)", "compressor.forward.bits=choice(1,2,4)", f"tracking.metric_floor.min={FLOOR}",
               f"hydra.sweeper.n_trials={trials}", *OPTUNA_TINY, *tracking, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert_clean(res)
    assert "Sampler: TPESampler" in res.stdout and "Directions: ['minimize']" in res.stdout
    parents, children = runs_of(client)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert len(children) == trials and all(c.info.status == "FINISHED" for c in children), [(c.info.run_name, c.info.status) for c in children]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert all(c.data.params["scheduler.name"] == "pipar" and c.data.params["scheduler.P"] == "1" for c in children)
    # trials are named by what Optuna varies (the fixed P is not part of the name)
    for c in children:
        p = c.data.params
        assert c.info.run_name == f"pipar mlp pipar_4g scheduler.N={p['scheduler.N']} compressor.forward.bits={p['compressor.forward.bits']}", c.info.run_name
    assert sorted(int(p.name.split("_", 1)[0]) for p in sweep.iterdir() if p.is_dir()) == list(range(trials))

    # the floor: 1-bit trials fall below it and are never best, however fast
    metric = "time/epoch_virtual_s"
    below = [c for c in children if c.data.metrics["val/acc"] < FLOOR]
    feasible = [c for c in children if c.data.metrics["val/acc"] >= FLOOR]
    assert below and feasible and all(c.data.params["compressor.forward.bits"] == "1" for c in below)
    job = {c.info.run_id: int(c.data.tags["pipelab.job_num"]) for c in children}
    expected = min(feasible, key=lambda c: (c.data.metrics[metric], job[c.info.run_id]))  # ties: the first trial, as Optuna
    assert parent.data.tags["pipelab.best_child_run_id"] == expected.info.run_id
    assert parent.data.tags["pipelab.best_child_name"] == expected.info.run_name
    assert parent.data.tags["pipelab.metric_floor"] == f"val/acc >= {FLOOR:g}"
    assert parent.data.metrics[f"best/{metric}"] == expected.data.metrics[metric]

    # and Optuna reports the same trial as best
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["best_value"] == expected.data.metrics[metric]
    assert {k: str(v) for k, v in result["best_params"].items()} == {k: expected.data.params[k] for k in ("scheduler.N", "compressor.forward.bits")}


def test_the_preset_study_goes_the_way_of_tracking_and_a_contrary_one_is_an_error(capsys):
    """The preset's study direction follows tracking.optimized_direction; a sweeper direction set
    against it stops the sweep before its parent run is made (on_multirun_start)."""
    from hydra import compose, initialize_config_dir

    from framework.config.dirs import CONF_DIR
    from framework.tracking.multirun import MultirunParent

    def hydra_cfg(overrides):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name="config", overrides=["experiment=pipar_optuna", "tracking=none", *overrides], return_hydra_config=True)

    assert hydra_cfg([]).hydra.sweeper.direction == "minimize"
    assert hydra_cfg(["tracking.optimized_metric=val/acc", "tracking.optimized_direction=max", "tracking.metric_floor.min=null"]).hydra.sweeper.direction == "maximize"
    MultirunParent().on_multirun_start(hydra_cfg([]))  # agrees: nothing to say
    with pytest.raises(SystemExit) as e:
        MultirunParent().on_multirun_start(hydra_cfg(["hydra.sweeper.direction=maximize"]))
    assert e.value.code == 2
    assert "error: hydra.sweeper.direction=maximize disagrees with tracking.optimized_direction=min" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a malformed objective stops the sweep in one line too
        MultirunParent().on_multirun_start(hydra_cfg(["tracking.optimized_direction=up"]))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == "error: tracking.optimized_direction: 'up' is not a choice; choices: max, min"


# ---------------------------------------------------------------------------------------------
# the objective and its floor, without a sweep


def record(name, acc, t):
    return SimpleNamespace(name=name, metrics={"val/acc": acc, "time/epoch_virtual_s": t})


def test_score_and_best_follow_the_metric_direction_and_floor():
    fastest_but_inaccurate, fast, fast_too, slow = record("a", 0.2, 1.0), record("b", 0.5, 2.0), record("c", 0.6, 2.0), record("d", 0.9, 5.0)
    runs = [fastest_but_inaccurate, fast, fast_too, slow]
    shortest = compose_cfg(["tracking.optimized_metric=time/epoch_virtual_s", "tracking.optimized_direction=min", "tracking.metric_floor.min=0.4"]).tracking
    assert objective.best(runs, shortest) is fast  # the tie with fast_too goes to the first
    assert objective.score(fastest_but_inaccurate.metrics, shortest) == math.inf
    assert objective.score(fast.metrics, shortest) == 2.0
    no_floor = compose_cfg(["tracking.optimized_metric=time/epoch_virtual_s", "tracking.optimized_direction=min"]).tracking
    assert objective.best(runs, no_floor) is fastest_but_inaccurate and objective.score(fastest_but_inaccurate.metrics, no_floor) == 1.0
    accuracy = compose_cfg(["tracking.metric_floor.metric=time/epoch_virtual_s", "tracking.metric_floor.min=3"]).tracking  # max val/acc with at least 3 s epochs
    assert objective.best(runs, accuracy) is slow
    assert objective.score(fast.metrics, accuracy) == -math.inf
    assert objective.best(runs, compose_cfg(["tracking.metric_floor.min=0.95"]).tracking) is None
    assert objective.score({"val/acc": 0.5}, compose_cfg(["tracking.optimized_metric=test/acc"]).tracking) is None  # not recorded


@pytest.mark.parametrize("overrides,needles", [
    (["tracking.metric_floor.min=nan"], ["tracking.metric_floor.min", "finite number", "nan"]),
    (["tracking.metric_floor.metric=", "tracking.metric_floor.min=0.9"], ["tracking.metric_floor.metric", "names no metric"]),
    (["tracking.optimized_direction=up"], ["tracking.optimized_direction", "'up'", "max, min"]),
    (["+tracking.metric_floor.mni=0.9"], ["tracking.metric_floor.mni", "did you mean tracking.metric_floor.min"]),
], ids=["nan", "no_metric", "direction", "typo"])
def test_a_bad_objective_fails_before_anything_runs(overrides, needles):
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(overrides))
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_a_metric_no_run_records_is_an_error_before_anything_runs():
    """A sweep optimising `val/accuracy` would end with no best run and no word why."""
    for key in ("tracking.optimized_metric", "tracking.metric_floor.metric"):
        with pytest.raises(ConfigError, match=rf"{key}: 'val/accuracy' is not a metric a run records \(did you mean val/acc\?\); runs record val/acc, "):
            validate(compose_cfg([f"{key}=val/accuracy", "tracking.metric_floor.min=0.5"]))
    for name in ("util/busy_frac/dev3", "net/bytes/dev0_to_dev1", "replay/discarded", "compression/bits_fwd"):  # per role, per link, a plugin's
        validate(compose_cfg([f"tracking.optimized_metric={name}"]))


@pytest.mark.parametrize("scheduler", [[], ["scheduler=pipar", "cluster=pipar_4g"], ["experiment=adalearner"], ["experiment=feature_replay_pi"], ["experiment=edgepipe"]],
                         ids=["gpipe", "pipar", "adalearner", "feature_replay", "super_neuron"])
def test_every_metric_a_run_records_is_declared(tmp_path, scheduler):
    """What `tracking.optimized_metric` may name (framework.tracking.objective.declare_metrics) covers what
    runs record: the core's metrics and each family of schedulers' own."""
    timing = [] if scheduler == ["experiment=edgepipe"] else ["runtime.numerics=false"]  # super_neuron runs with numerics only
    tiny = [o for o in TINY if not o.startswith("model=")]  # each its own model (feature replay's table prices a resnet50)
    summary = Job(compose_cfg(scheduler + tiny + ["train.iterations_per_epoch=2"] + timing), tmp_path).run()
    metrics = objective.run_metrics(summary)
    assert "time/epoch_virtual_s" in metrics and not [k for k in metrics if not objective.known_metric(k)]


def test_a_floor_on_a_metric_the_run_does_not_record_is_an_error(tmp_path):
    cfg = compose_cfg(TINY + ["tracking.metric_floor.metric=replay/discarded", "tracking.metric_floor.min=0.5"])
    validate(cfg)  # a metric some run records (feature replay's), which this one does not: known once it ran
    summary = Job(cfg, tmp_path / "run").run()
    metrics = objective.run_metrics(summary)
    assert metrics["time/epoch_virtual_s"] == summary["history"]["time/epoch_virtual_s"][-1]  # per-epoch metrics: the last epoch's
    with pytest.raises(ConfigError, match=r"tracking.metric_floor.metric: 'replay/discarded' is not a metric this run recorded.*val/acc"):
        objective.require_floor_metric(metrics, cfg.tracking)
