"""`python -m framework.report`: the runs table, the plots and report.md, from a sweep folder, from
its MLflow experiment and from one run folder; bad input is one `error:` line and exit code 2."""

from __future__ import annotations

import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from framework.job import Job
from framework.report.cli import main
from framework.report.sources import BYTES_TOTAL, EPOCH_MEAN, load_experiment
from tests.conftest import compose_cfg

REPO = Path(__file__).resolve().parent.parent
TINY = ["model=mlp", "train.epochs=2", "train.iterations_per_epoch=3", "dataset.n_train=256", "dataset.n_val=64", "dataset.n_test=64", "runtime.progress=false"]
BANDWIDTHS, COMPRESSORS = (1e6, 1e7, 1e8), ("none", "fp16")
PLOTS = ("epoch_time.png", "accuracy.png", "link_bytes.png")


def python_m(module, args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def sweep(mlflow_template, tmp_path_factory):
    """One real 6-job sweep through the CLI, tracked in a private copy of the migrated store:
    (its folder, the tracking URI, the folder the sweep ran in)."""
    root = tmp_path_factory.mktemp("report")
    shutil.copy(mlflow_template, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracking = ["tracking=mlflow", f"tracking.uri={uri}", f"tracking.artifact_root={root / 'mlartifacts'}", "tracking.experiment=tests"]
    res = python_m("framework", ["-m", "cluster.link.bandwidth_bps=1e6,1e7,1e8", "compressor=none,fp16", *TINY, *tracking, f"hydra.sweep.dir={root / 'sweep'}"], root)
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "sweep", uri, root


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def assert_real_png(path: Path) -> None:
    """A PNG that decodes to a drawn picture: large enough, many colours, not one flat fill."""
    import matplotlib.image as mpimg
    import numpy as np

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    img = mpimg.imread(path)
    assert img.shape[0] >= 250 and img.shape[1] >= 400, (path, img.shape)
    rgb = img[..., :3].reshape(-1, 3)
    assert len(np.unique((rgb * 255).astype(np.uint8), axis=0)) > 50, path  # lines, text, antialiasing
    assert (rgb < 0.9).any(axis=1).mean() > 0.01, path  # ink on more than a sliver of the canvas


@pytest.mark.slow  # the sweep alone (a CLI process, 6 tracked jobs) takes 25-35 s on 2 busy cores
def test_report_of_a_sweep_folder(sweep):
    sweep_dir, _, root = sweep
    res = python_m("framework.report", [str(sweep_dir)], root)
    assert res.returncode == 0, res.stderr[-3000:]
    out = sweep_dir / "report"
    assert str(out / "report.md") in res.stdout
    rows = read_csv(out / "runs.csv")
    assert len(rows) == 6
    # the swept keys are the param columns (a group by its name), nothing else that differs
    assert [c for c in rows[0] if "." in c and "/" not in c] == ["cluster.link.bandwidth_bps", "compressor.name"]
    assert sorted((float(r["cluster.link.bandwidth_bps"]), r["compressor.name"]) for r in rows) == sorted(itertools.product(BANDWIDTHS, COMPRESSORS))
    for r in rows:  # each row is its job's summary: epoch time is the mean over the epochs, bytes the sum over links
        job = next(d for d in sweep_dir.iterdir() if d.name.startswith(f"{r['run'].split('_')[0]}_"))
        s = json.loads((job / "summary.json").read_text())
        epochs = s["history"]["time/epoch_virtual_s"]
        assert len(epochs) == 2 and float(r[EPOCH_MEAN]) == pytest.approx(sum(epochs) / 2, rel=1e-9)
        assert float(r[BYTES_TOTAL]) == sum(link["bytes"] for link in s["links"].values()) > 0
        assert float(r["val/acc"]) == s["metrics"]["val/acc"]
    by = {(float(r["cluster.link.bandwidth_bps"]), r["compressor.name"]): r for r in rows}
    for bw in BANDWIDTHS:  # half-precision wire format: half the bytes of fp32
        assert float(by[bw, "fp16"][BYTES_TOTAL]) / float(by[bw, "none"][BYTES_TOTAL]) == pytest.approx(0.5, abs=0.05)
    none = [float(by[bw, "none"][EPOCH_MEAN]) for bw in BANDWIDTHS]
    assert none[0] > none[1] > none[2]  # a faster link, a shorter epoch
    for name in PLOTS:
        assert_real_png(out / name)
    md = (out / "report.md").read_text()
    assert all(f"]({name})" in md for name in PLOTS)
    assert md.count("| FINISHED |") == 6 and "compressor.name" in md
    console = res.stdout.splitlines()
    assert sum("bandwidth_bps=" in line and "compressor=" in line for line in console) == 6


@pytest.mark.slow
def test_report_of_the_experiment_matches_the_folder(sweep):
    """The experiment's latest sweep, read from MLflow (params, metrics, summary.json artifacts),
    gives the table the folder gives; without the artifact, the metrics give the same columns."""
    sweep_dir, uri, root = sweep
    if not (sweep_dir / "report" / "runs.csv").exists():
        assert main([str(sweep_dir)]) == 0
    res = python_m("framework.report", ["tests", "--tracking-uri", uri], root)
    assert res.returncode == 0, res.stderr[-3000:]
    out = root / "outputs" / "reports" / "tests"  # the default for an experiment, under the working folder
    from_store, from_folder = read_csv(out / "runs.csv"), read_csv(sweep_dir / "report" / "runs.csv")
    assert len(from_store) == 6 and from_store[0]["run"].startswith("gpipe mlp pi4_wifi")
    assert [{k: v for k, v in r.items() if k != "run"} for r in from_store] == [{k: v for k, v in r.items() if k != "run"} for r in from_folder]
    assert_real_png(out / "epoch_time.png")
    assert "Sweep: `python -m framework -m cluster.link.bandwidth_bps=1e6,1e7,1e8 compressor=none,fp16" in (out / "report.md").read_text()

    # the summary.json artifacts gone: history and bytes per link come from the run's metrics
    for p in (root / "mlartifacts").rglob("summary.json"):
        p.unlink()
    src = load_experiment("tests", uri)
    folder = {r["run_id"]: r for r in from_folder}
    assert len(src.records) == 6
    for rec in src.records:
        assert rec.metrics[EPOCH_MEAN] == pytest.approx(float(folder[rec.run_id][EPOCH_MEAN]), rel=1e-9)
        assert rec.metrics[BYTES_TOTAL] == float(folder[rec.run_id][BYTES_TOTAL])
        assert len(rec.history["val/acc"]) == 2 and set(rec.links) == {"dev0->dev1", "dev1->dev0"}


@pytest.mark.slow  # several CLI runs and a report (about 11 s)
def test_report_of_runs_without_a_sweep(tmp_path, mlflow_store):
    """The fast variant of the sweep tests: four runs made in-process (no CLI start-up), in one
    folder and as top-level MLflow runs. With no sweep to name its keys, the columns are the
    params that differ, a config group by its name only; an experiment without a sweep reports
    every top-level run, and the store gives the folder's table."""
    tracking, _ = mlflow_store
    folder = tmp_path / "runs"
    grid = list(itertools.product((1e6, 1e8), COMPRESSORS))
    for i, (bw, comp) in enumerate(grid):
        Job(compose_cfg(tracking + TINY + [f"cluster.link.bandwidth_bps={bw}", f"compressor={comp}"], fast=False), folder / str(i)).run()
    assert main([str(folder)]) == 0
    rows = read_csv(folder / "report" / "runs.csv")
    assert [c for c in rows[0] if "." in c and "/" not in c] == ["cluster.link.bandwidth_bps", "compressor.name"]
    assert [(float(r["cluster.link.bandwidth_bps"]), r["compressor.name"]) for r in rows] == grid
    assert float(rows[0][EPOCH_MEAN]) > float(rows[2][EPOCH_MEAN])  # 1 Mbit/s is slower than 100 Mbit/s
    assert float(rows[1][BYTES_TOTAL]) / float(rows[0][BYTES_TOTAL]) == pytest.approx(0.5, abs=0.05)  # fp16 halves the bytes
    for name in PLOTS:
        assert_real_png(folder / "report" / name)
    uri = next(o.split("=", 1)[1] for o in tracking if o.startswith("tracking.uri="))
    assert main(["tests", "--tracking-uri", uri, "--out", str(tmp_path / "exp")]) == 0  # also a folder here, without runs: the experiment wins
    from_store = read_csv(tmp_path / "exp" / "runs.csv")
    assert [{k: v for k, v in r.items() if k != "run"} for r in from_store] == [{k: v for k, v in r.items() if k != "run"} for r in rows]
    assert "Sweep:" not in (tmp_path / "exp" / "report.md").read_text()


def test_absent_data_skips_its_plot_with_a_note(tmp_path, capsys):
    """A timing-only run on one device: no accuracy, no link bytes; the epoch time still drawn."""
    run = tmp_path / "run"
    Job(compose_cfg(TINY + ["scheduler=local", "runtime.numerics=false"]), run).run()
    assert main([str(run), "--out", str(tmp_path / "rep")]) == 0
    stdout = capsys.readouterr().out
    assert "Accuracy per epoch: not drawn" in stdout and "Bytes per link: not drawn" in stdout
    rep = tmp_path / "rep"
    assert [p.name for p in rep.glob("*.png")] == ["epoch_time.png"]
    assert_real_png(rep / "epoch_time.png")
    md = (rep / "report.md").read_text()
    assert md.count("*Not drawn:") == 2 and "runtime.numerics=false" in md
    rows = read_csv(rep / "runs.csv")
    assert len(rows) == 1 and "val/acc" not in rows[0] and float(rows[0][EPOCH_MEAN]) > 0


@pytest.mark.parametrize("args,needle", [
    (["{tmp}/nope"], "no such folder"),
    (["{tmp}/empty"], "no runs here"),
    (["no_such_experiment", "--tracking-uri", "sqlite:///{tmp}/none.db"], "no MLflow store"),
    (["{tmp}/empty", "--parent", "abc"], "--parent"),
], ids=["missing-folder", "empty-folder", "missing-store", "parent-on-folder"])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, args, needle):
    (tmp_path / "empty").mkdir()
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "none.db").exists()  # reading never creates a store


def test_unknown_experiment_is_one_error_line(mlflow_store, capsys):
    tracking, _ = mlflow_store
    uri = next(o.split("=", 1)[1] for o in tracking if o.startswith("tracking.uri="))
    assert main(["no_such_experiment", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no_such_experiment") and "pipelab" in err and len(err.splitlines()) == 1, err


def test_the_command_exits_2_without_a_traceback(tmp_path):
    res = python_m("framework.report", [str(tmp_path / "nope")], tmp_path)
    assert res.returncode == 2 and res.stdout == "" and res.stderr.strip() == f"error: {tmp_path / 'nope'}: no such folder", res.stderr
