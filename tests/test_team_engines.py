"""The engines a team shares, run for real (slow: each starts several processes or servers).

- `hydra/launcher=submitit_local`: Hydra's submitit launcher without a cluster, the same code path
  as `submitit_slurm` (each job pickled into submitit's folder and run by `python -m
  submitit.core._submit` in a process of its own), its jobs nested under one parent run;
- an MLflow tracking server backed by PostgreSQL, as a team runs it: a sweep logs into it over
  HTTP and `python -m framework.report` reads the experiment back, the same table as the folder's;
- an Optuna study in a database (SQLite, and PostgreSQL): two sweeps of `experiment=pipar_optuna`
  at once, one study, no trial of one repeating a trial of the other.

PostgreSQL runs as a throwaway cluster the test starts (tests/postgres.py); without it installed
those tests skip with the reason. `.ci/run` runs this file's slow tests after the default suite.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from tests import postgres
from tests.test_parallel_sweeps import LRS, OPTUNA_TINY, REPO, TINY, assert_clean, assert_lr_sweep, cli, overlapping, runs_of, serve_mlflow

NO_POSTGRES = postgres.why_not()
needs_postgres = pytest.mark.skipif(NO_POSTGRES is not None, reason=NO_POSTGRES or "")


# ---------------------------------------------------------------------------------------------
# Hydra's submitit launcher, local mode


@pytest.mark.slow  # 4 submitit job processes, each importing torch (about 35 s; 70 s on a loaded 2-core machine)
def test_submitit_local_sweep_nests_its_jobs_under_one_parent_run(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    sweep = tmp_path / "sweep"
    jobs = tmp_path / "submitit"  # submitit's job files (by default .submitit/ in the sweep folder)
    res = cli(["-m", "hydra/launcher=submitit_local", f"hydra.launcher.submitit_folder={jobs}/%j", f"train.lr={','.join(LRS)}", *tracking, *TINY, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert_clean(res)
    assert f"Submitit 'local' sweep output dir : {sweep}" in res.stdout, res.stdout[-2000:]
    parent, children = assert_lr_sweep(client, sweep)
    # each job ran in a process of its own, none of them the launching one, from submitit's folder
    pids = {c.data.tags["pipelab.pid"] for c in children}
    assert len(pids) == 4 and parent.data.tags["pipelab.pid"] not in pids
    job_logs = sorted(jobs.glob("*/*_0_log.out"))
    assert len(job_logs) == 4, job_logs
    assert all(p.with_name(p.name.replace("_log.out", "_result.pkl")).is_file() for p in job_logs)


# ---------------------------------------------------------------------------------------------
# an MLflow tracking server on PostgreSQL


def read_csv(path: Path) -> list[dict]:
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # PostgreSQL, an MLflow server, a 4-job sweep and two reports (about 40 s)
@needs_postgres
def test_a_sweep_logs_into_a_postgresql_backed_server_and_the_report_reads_it_back(tmp_path):
    import sqlalchemy
    from mlflow.tracking import MlflowClient

    sweep = tmp_path / "sweep"
    with postgres.postgres_server(["mlflow"]) as dbs, serve_mlflow(dbs["mlflow"], tmp_path) as url:
        tracking = ["tracking=mlflow", f"tracking.uri={url}", "tracking.experiment=team", f"tracking.artifact_root={tmp_path / 'local_artifacts'}"]
        res = cli(["-m", f"train.lr={','.join(LRS)}", *tracking, *TINY, f"hydra.sweep.dir={sweep}"], tmp_path)
        assert_clean(res)
        client = MlflowClient(tracking_uri=url)
        parent, children = assert_lr_sweep(client, sweep)
        assert not (tmp_path / "local_artifacts").exists()  # the server chose where artifacts go

        # the runs are rows of the PostgreSQL database behind the server
        engine = sqlalchemy.create_engine(dbs["mlflow"])
        with engine.connect() as conn:
            exp_id = conn.exec_driver_sql("SELECT experiment_id FROM experiments WHERE name = 'team'").scalar_one()
            stored = {r[0]: r[1] for r in conn.exec_driver_sql(f"SELECT run_uuid, status FROM runs WHERE experiment_id = {int(exp_id)}")}
            lrs = sorted(r[0] for r in conn.exec_driver_sql("SELECT value FROM params WHERE key = 'train.lr'"))
        engine.dispose()
        assert stored == {r.info.run_id: "FINISHED" for r in [parent, *children]}
        assert lrs == LRS

        # the report of the experiment, read over HTTP, is the report of the sweep folder
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        report = subprocess.run([sys.executable, "-m", "framework.report", "team", "--tracking-uri", url, "--out", str(tmp_path / "report")],
                                cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
        assert report.returncode == 0, report.stderr[-3000:]
        assert f"experiment team in {url}" in (tmp_path / "report" / "report.md").read_text()
    folder = subprocess.run([sys.executable, "-m", "framework.report", str(sweep)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert folder.returncode == 0, folder.stderr[-3000:]
    from_server, from_folder = read_csv(tmp_path / "report" / "runs.csv"), read_csv(sweep / "report" / "runs.csv")
    assert sorted(r["train.lr"] for r in from_server) == LRS
    assert [{k: v for k, v in r.items() if k != "run"} for r in from_server] == [{k: v for k, v in r.items() if k != "run"} for r in from_folder]  # a run's name there, its folder's here


# ---------------------------------------------------------------------------------------------
# one Optuna study, two workers


def test_a_prepared_storage_is_one_optuna_2_opens_under_sqlalchemy_2(tmp_path):
    """optuna 2.10 alone fails on a fresh database under SQLAlchemy 2 (its schema stamp is never
    committed); prepared first, it opens it, and a second opening shares the study's trials."""
    import optuna

    from framework.tracking.study_storage import prepare

    url = f"sqlite:///{tmp_path / 'new' / 'study.db'}"
    prepare(url)
    prepare(url)  # a storage prepared already is left as it is
    first = optuna.create_study(study_name="s", storage=url, load_if_exists=True, sampler=optuna.samplers.RandomSampler(seed=1))
    first.optimize(lambda t: t.suggest_int("x", 0, 9), n_trials=2)
    second = optuna.create_study(study_name="s", storage=url, load_if_exists=True)
    assert [t.params for t in second.get_trials()] == [t.params for t in first.get_trials()] and len(first.get_trials()) == 2


def test_a_storage_optuna_cannot_open_is_one_error_line_before_any_trial(capsys):
    from framework.tracking.study_storage import StudyStorage

    StudyStorage().on_multirun_start(OmegaConf.create({"hydra": {"sweeper": {"storage": None}}}))  # an in-memory study: nothing to do
    with pytest.raises(SystemExit) as e:
        StudyStorage().on_multirun_start(OmegaConf.create({"hydra": {"sweeper": {"storage": "nodb://x"}}}))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: hydra.sweeper.storage: 'nodb://x': Optuna cannot open a study there: "), err

GRID = {"scheduler.P": ["1", "2"], "scheduler.N": ["1", "8"]}  # 4 points, 2 trials per worker


def worker(storage: str, tracking: list[str], sweep: Path, cwd: Path) -> subprocess.Popen:
    """One sweep of the preset on the shared study: Optuna's grid sampler over GRID (every key of
    the preset's space given as a choice, so the grid is exactly GRID), no accuracy floor."""
    args = ["-m", "experiment=pipar_optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage={storage}", "hydra.sweeper.study_name=shared",
            *(f"{k}=choice({','.join(v)})" for k, v in GRID.items()), "compressor.forward.bits=choice(4)", "tracking.metric_floor.min=null",
            *OPTUNA_TINY, *tracking, f"hydra.sweep.dir={sweep}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    out = (cwd / f"{sweep.name}.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "framework", *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def storages():
    yield pytest.param("sqlite", id="sqlite")
    yield pytest.param("postgresql", id="postgresql", marks=needs_postgres)


@contextmanager
def study_storage(kind: str, tmp_path: Path):
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'study' / 'optuna.db'}"  # a folder not there yet: the preparation makes it
        return
    with postgres.postgres_server(["optuna"]) as dbs:
        yield dbs["optuna"]


@pytest.mark.slow  # two sweeps of 2 trials at once (about 35 s; 60 s on a loaded 2-core machine)
@pytest.mark.parametrize("kind", storages())
def test_two_workers_share_one_optuna_study_and_split_its_grid(tmp_path, mlflow_store, kind):
    import optuna

    tracking, client = mlflow_store
    sweeps = [tmp_path / "worker_a", tmp_path / "worker_b"]
    with study_storage(kind, tmp_path) as storage:
        procs = [worker(storage, tracking, sweeps[0], tmp_path)]
        try:
            # the second starts once the first runs its first trial: both then run at once (two
            # workers asking in the same millisecond could both get one grid point, Optuna warns)
            deadline = time.time() + 300
            while not list(sweeps[0].glob("0_*")) and procs[0].poll() is None and time.time() < deadline:
                time.sleep(0.2)
            procs.append(worker(storage, tracking, sweeps[1], tmp_path))
            for p in procs:
                p.wait(600)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        logs = [(tmp_path / f"{s.name}.log").read_text() for s in sweeps]
        for p, log in zip(procs, logs):
            assert p.returncode == 0, log[-4000:]
            assert "Traceback" not in log and "re-evaluating a configuration" not in log, log[-4000:]
            assert "Sampler: GridSampler" in log and "Study name: shared" in log and f"Storage: {storage}" in log
        study = optuna.load_study(study_name="shared", storage=storage)
        trials = study.get_trials(deepcopy=False)

    # one study holds both workers' trials: 4 of them, complete, the whole grid once
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    point = lambda params: tuple(str(params[k]) for k in GRID)  # noqa: E731
    assert sorted(point(t.params) for t in trials) == sorted(itertools.product(*GRID.values()))

    # each worker is a sweep of its own (a parent, its 2 trials as children), they overlapped, and
    # neither ran a point the other ran
    parents, children = runs_of(client)
    assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents)
    assert overlapping(parents), [(p.info.start_time, p.info.end_time) for p in parents]
    by_parent = {p.info.run_id: [point(c.data.params) for c in children if c.data.tags["mlflow.parentRunId"] == p.info.run_id] for p in parents}
    assert sorted(len(v) for v in by_parent.values()) == [2, 2]
    a, b = by_parent.values()
    assert not set(a) & set(b) and len(set(a)) == len(set(b)) == 2
    # and what each job returned is what the study recorded for that point
    value = {point(t.params): t.value for t in trials}
    for c in children:
        assert c.data.metrics["time/epoch_virtual_s"] == pytest.approx(value[point(c.data.params)], rel=1e-12)
    # each worker reports the study's best over the trials finished when it ended, its own and the
    # other's: the one that ended last, the best of all four
    bests = {s.name: yaml.safe_load((s / "optimization_results.yaml").read_text())["best_value"] for s in sweeps}
    for p in parents:
        assert bests[Path(p.data.tags["pipelab.sweep_dir"]).name] <= min(value[pt] for pt in by_parent[p.info.run_id])
    assert min(bests.values()) == min(value.values())
