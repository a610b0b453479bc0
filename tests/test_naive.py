"""`scheduler=naive`, the system docs/tutorial_add_a_system.md adds (plugins/schedulers/naive/,
conf/scheduler/naive.yaml): its bubble against the closed form (S-1)/S, end to end through the
command line and in process for several depths and micro-batch counts, and its arithmetic against
GPipe's (the same forwards and backwards in another order of time: the same weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from framework.job import Job
from tests.conftest import compose_cfg

REPO = Path(__file__).resolve().parent.parent
# The textbook pipeline: identical devices, links that take no time, units of equal cost, and no
# tensor math (conf/experiment/bubble_textbook.yaml); only the schedule decides the bubble.
TEXTBOOK = ["experiment=bubble_textbook", "tracking=none", "runtime.progress=false"]


def test_the_command_line_runs_it_with_the_closed_form_bubble(tmp_path):
    S = 4
    args = [*TEXTBOOK, "scheduler=naive", f"cluster.num_devices={S}", f"hydra.run.dir={tmp_path / 'run'}"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "framework", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["scheduler"] == "naive"
    assert summary["bubble_frac"] == pytest.approx((S - 1) / S, abs=1e-6)  # GPipe's here: 3/11


def run(tmp_path, overrides):
    job = Job(compose_cfg(overrides), tmp_path)
    return job, job.run()


@pytest.mark.parametrize("M", [1, 4, 8])
@pytest.mark.parametrize("S", [2, 4])
def test_one_stage_works_at_a_time_whatever_the_micro_batches(tmp_path, S, M):
    common = [*TEXTBOOK, f"cluster.num_devices={S}", f"scheduler.microbatches={M}"]
    _, naive = run(tmp_path / "naive", common + ["scheduler=naive"])
    _, gpipe = run(tmp_path / "gpipe", common + ["scheduler=gpipe"])
    assert naive["bubble_frac"] == pytest.approx((S - 1) / S, abs=1e-6)
    assert gpipe["bubble_frac"] == pytest.approx((S - 1) / (M + S - 1), abs=1e-6)
    assert naive["peak_inflight"] == {f"stage{s}": 1 for s in range(S)}  # one micro-batch alive per stage
    assert naive["prediction"]["epoch_over_predicted"] == pytest.approx(1.0)  # the plan plays the actions out as the run does


def test_it_trains_to_gpipes_weights(tmp_path):
    exact = ["model=mlp", "model.depth=4", "model.hidden=32", "dataset.n_train=384", "dataset.n_val=64", "dataset.n_test=64", "cluster=uniform",
             "cluster.num_devices=3", "runtime.dtype=float64", "train.epochs=2", "train.batch_size=48", "scheduler.microbatches=4", "tracking=none"]
    naive, _ = run(tmp_path / "naive", exact + ["scheduler=naive"])
    gpipe, _ = run(tmp_path / "gpipe", exact + ["scheduler=gpipe"])
    init = Job(compose_cfg(exact + ["scheduler=naive"]), tmp_path / "init").model.state_dict()
    w_naive, w_gpipe = naive.final_model().state_dict(), gpipe.final_model().state_dict()
    assert any((w_naive[k] - init[k]).abs().max() > 1e-3 for k in init), "training must move the weights"
    for k in w_gpipe:
        assert w_naive[k].equal(w_gpipe[k]), k
