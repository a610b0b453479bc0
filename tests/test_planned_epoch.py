"""Every run records the epoch its plan predicts beside the epoch it took, and their ratio."""

import json

import pytest

from framework.job import Job
from tests.conftest import compose_cfg

CASES = {
    "gpipe": ["scheduler=gpipe", "cluster=uniform", "model=mlp", "scheduler.microbatches=4"],
    "pipar": ["scheduler=pipar", "cluster=pipar_wifi", "model=lenet"],
    "feature_replay": ["experiment=feature_replay_pi", "train.iterations_per_epoch=10"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_records_its_predicted_and_actual_epoch(case, tmp_path):
    cfg = compose_cfg([*CASES[case], "runtime.numerics=false", "train.epochs=2"])
    summary = Job(cfg, tmp_path).run()
    pred = summary["prediction"]
    epochs = summary["history"]["time/epoch_virtual_s"]
    assert pred["predicted_epoch_s"] > 0
    assert pred["epoch_s"] == pytest.approx(sum(epochs) / len(epochs))
    assert pred["epoch_over_predicted"] == pytest.approx(pred["epoch_s"] / pred["predicted_epoch_s"])
    m = summary["metrics"]
    assert m["plan/predicted_epoch_s"] == pred["predicted_epoch_s"]
    assert m["plan/epoch_over_predicted"] == pred["epoch_over_predicted"]
    assert json.loads((tmp_path / "summary.json").read_text())["prediction"] == pred


def test_a_schedule_that_predicts_nothing_records_nothing(tmp_path, monkeypatch):
    cfg = compose_cfg(["scheduler=gpipe", "cluster=uniform", "model=mlp", "runtime.numerics=false", "train.epochs=1"])
    job = Job(cfg, tmp_path)
    monkeypatch.setattr(job.scheduler, "planned_epoch_s", lambda: None)
    summary = job.run()
    assert summary["prediction"] is None
    assert "plan/predicted_epoch_s" not in summary["metrics"] and "plan/epoch_over_predicted" not in summary["metrics"]
