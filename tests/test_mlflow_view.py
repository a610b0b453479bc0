"""What a researcher sees in MLflow: run and sweep names, what is logged and what is summarised.
Fast unit tests of framework.tracking.{run_names, series, relevance, per_device, ui_links}; the
end-to-end checks are in tests/test_mlflow_ui.py (the UI itself) and at the bottom (K = 1,000)."""

from __future__ import annotations

import csv
import json

import pytest

from framework.tracking import per_device, relevance, run_names, ui_links
from framework.tracking.series import EpochSeries
from tests.test_cli_and_tracking import cli


# ---- names ---------------------------------------------------------------------------------


def test_a_single_run_is_named_by_its_overrides_without_noise():
    name = run_names.run_name("gpipe", "lenet", "pi4_wifi", ["+cluster.devices.dev1.slowdown=4", "train.iterations_per_epoch=20",
                                                             "tracking.uri=sqlite:///x.db", "hydra.run.dir=out", "hydra/launcher=joblib",
                                                             "runtime.progress=false", "scheduler=gpipe"])
    assert name == "gpipe lenet pi4_wifi cluster.devices.dev1.slowdown=4 train.iterations_per_epoch=20"
    assert run_names.run_name("gpipe", "lenet", "pi4_wifi", []) == "gpipe lenet pi4_wifi"
    assert run_names.run_name("gpipe", "lenet", "uniform", ["cluster=uniform", "cluster.num_devices=3", "scheduler.partition=[1,3]"]) == \
        "gpipe lenet uniform cluster.num_devices=3 scheduler.partition=[1,3]"


def test_single_runs_with_different_overrides_get_different_names():
    runs = [[], ["+cluster.devices.dev1.slowdown=4"], ["train.iterations_per_epoch=20"], ["scheduler.partition=[1,3]"]]
    names = {run_names.run_name("gpipe", "lenet", "pi4_wifi", o) for o in runs}
    assert len(names) == len(runs)


def test_a_sweeps_jobs_are_named_by_what_it_varies_and_the_parent_by_what_it_sweeps():
    keys = {"scheduler", "compressor"}
    names = []
    for sched in ("gpipe", "1f1b"):
        for comp in ("none", "mbq"):
            overrides = [f"scheduler={sched}", f"compressor={comp}", "train.epochs=1", "tracking.uri=x"]
            names.append(run_names.run_name(sched, "lenet", "pi4_wifi", overrides, keys))
    assert names == ["gpipe lenet pi4_wifi compressor=none", "gpipe lenet pi4_wifi compressor=mbq",
                     "1f1b lenet pi4_wifi compressor=none", "1f1b lenet pi4_wifi compressor=mbq"]
    task = ["scheduler=gpipe,1f1b", "compressor=none,mbq", "train.epochs=1"]
    assert run_names.sweep_name(task, ["scheduler", "compressor"]) == "sweep scheduler=gpipe,1f1b · compressor=none,mbq"
    # a search space in the config (Optuna's) rather than on the command line
    assert run_names.sweep_name(["train.epochs=1"], ["scheduler.N"], {"scheduler.N": "range(1,5)"}) == "sweep scheduler.N=range(1,5)"


def test_a_long_value_is_cut_and_a_name_kept_short():
    name = run_names.run_name("gpipe", "lenet", "pi4_wifi", [f"scheduler.partition=[{','.join(map(str, range(100)))}]"])
    assert name.endswith("...]"[:3]) and len(name.split("=", 1)[1]) == run_names.MAX_VALUE
    assert len(run_names.run_name("gpipe", "lenet", "pi4_wifi", [f"train.k{i}=1" for i in range(200)])) == run_names.MAX_NAME


# ---- what MLflow gets -------------------------------------------------------------------------


class Recorded:
    def __init__(self):
        self.points: list[tuple[str, float, int]] = []

    def log_metric(self, key, value, step=0):
        self.points.append((key, value, step))

    def of(self, key):
        return [(s, v) for k, v, s in self.points if k == key]


def test_a_per_epoch_metric_is_one_point_while_constant_and_a_line_once_it_varies():
    t, series = Recorded(), EpochSeries()
    for step, (epoch_s, acc, wall) in enumerate([(3.8406863660606123, 0.1, 1.0), (3.840686366060899, 0.1, 2.0), (3.8406863660606, 0.1, 3.0), (3.8406863660606, 0.7, 4.0)], start=1):
        series.log(t, "time/epoch_virtual_s", epoch_s, step * 10)  # float noise in the 13th digit: constant
        series.log(t, "val/acc", acc, step * 10)
        series.log(t, "time/wall_s", wall, step * 10)
    assert t.of("time/epoch_virtual_s") == [(10, 3.8406863660606123)]  # one point: the first, shown at once
    assert t.of("val/acc") == [(10, 0.1), (20, 0.1), (30, 0.1), (40, 0.7)]  # held repeats sent once it varied
    assert t.of("time/wall_s") == [(10, 1.0), (20, 2.0), (30, 3.0), (40, 4.0)]


def test_a_resumed_series_goes_on_from_its_checkpointed_state():
    t, series = Recorded(), EpochSeries()
    series.log(t, "val/acc", 0.1, 3)
    series.log(t, "val/acc", 0.1, 6)
    resumed = EpochSeries(json.loads(json.dumps(series.state)))  # as a checkpoint keeps it
    resumed.log(t, "val/acc", 0.5, 9)
    assert t.of("val/acc") == [(3, 0.1), (6, 0.1), (9, 0.5)]


def test_without_a_codec_no_codec_metrics_and_only_what_the_schedule_has():
    metrics = {"compression/ratio_fwd": 1.0, "compression/encode_s_bwd": 0.0, "net/raw_bytes/dev0_to_dev1": 10, "net/bytes/dev0_to_dev1": 10,
               "net/compression_ratio": 1.0, "pipe/bubble_frac": 0.5, "pipe/staleness": 0.0, "roles/dropouts": 0, "val/acc": 0.9}
    assert relevance.for_mlflow(metrics, coded=set(), pipeline=True, stale=False) == {"net/bytes/dev0_to_dev1": 10, "pipe/bubble_frac": 0.5, "val/acc": 0.9}
    kept = relevance.for_mlflow(metrics, coded={"fwd"}, pipeline=False, stale=True)
    assert "compression/ratio_fwd" in kept and "compression/encode_s_bwd" not in kept and "net/raw_bytes/dev0_to_dev1" in kept
    assert "pipe/bubble_frac" not in kept and "pipe/staleness" in kept
    assert "roles/dropouts" in relevance.for_mlflow({"roles/dropouts": 2}, coded=set(), pipeline=True, stale=False)


def test_per_device_families_over_the_limit_become_statistics_and_a_table(tmp_path):
    metrics = {f"util/busy_frac/dev{i}": i / 100 for i in range(100)}
    metrics.update({f"net/bytes/dev{i}_to_server": 1000.0 + i for i in range(40)})
    metrics.update({"util/busy_frac/server": 1.0, "pipe/bubble_frac": 0.3, "idle/device_max_s": 2.0})
    metrics.update({f"edgepipe/rate/l{i}": 1.0 for i in range(5)})  # a small family stays as it is
    kept, tables = per_device.split(metrics, 32)
    assert set(tables) == {"util/busy_frac", "net/bytes"} and len(tables["util/busy_frac"]) == 101
    assert set(kept) == {"pipe/bubble_frac", "idle/device_max_s", *(f"edgepipe/rate/l{i}" for i in range(5))}
    stats = per_device.stats(tables)
    assert stats["util/busy_frac/max"] == 1.0 and stats["util/busy_frac/p50"] == pytest.approx(0.5)
    assert stats["net/bytes/mean"] == pytest.approx(1019.5) and stats["net/bytes/p95"] == pytest.approx(1037.05)
    path = per_device.write_csv(tables, tmp_path / "per_device.csv")
    rows = list(csv.DictReader(path.open()))
    by_name = {r["name"]: r for r in rows}
    assert len(rows) == 101 + 40 and float(by_name["dev3"]["util/busy_frac"]) == 0.03 and by_name["dev3"]["net/bytes"] == ""
    assert float(by_name["dev3_to_server"]["net/bytes"]) == 1003.0
    png = per_device.plot(tables, tmp_path / "per_device.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert per_device.split(metrics, 1000)[1] == {}  # under the limit: every value is its own metric


def test_ui_links_open_in_model_training_mode():
    base, serve = ui_links.ui_base("sqlite:///outputs/mlflow.db")
    assert base == "http://127.0.0.1:5000" and serve == "mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db"
    assert ui_links.ui_base("http://mlflow.lab:5000/") == ("http://mlflow.lab:5000", None)
    assert ui_links.run_url(base, "3", "abc") == "http://127.0.0.1:5000/#/experiments/3/runs/abc/model-metrics?workflowType=machine_learning"
    assert ui_links.experiment_url(base, "3") == "http://127.0.0.1:5000/#/experiments/3?workflowType=machine_learning"


# ---- a large cluster end to end ------------------------------------------------------------------


@pytest.mark.slow  # a K = 1,000 run through the CLI into MLflow (about 20 s)
def test_a_run_on_a_thousand_devices_logs_few_metrics_and_its_per_device_table(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    args = ["scheduler=pipar", "cluster=pipar_wifi", "cluster.num_devices=1000", "model=lenet", "dataset=synthetic_mnist", "dataset.n_train=96000",
            "train.batch_size=32", "train.epochs=1", "runtime.numerics=false", "runtime.progress=false", "hydra.run.dir=run"]
    res = cli(tracking + args, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(run.data.metrics) <= 50, sorted(run.data.metrics)
    for stat in per_device.STATS:
        assert f"util/busy_frac/{stat}" in run.data.metrics and f"net/bytes/{stat}" in run.data.metrics
    assert not any(k.startswith("util/busy_frac/dev") for k in run.data.metrics)
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert set(per_device.ARTIFACTS) <= arts
    rows = list(csv.DictReader((tmp_path / "run" / "per_device.csv").open()))
    assert sum(1 for r in rows if r["util/busy_frac"]) > 1000
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert sum(k.startswith("util/busy_frac/") for k in summary["metrics"]) > 1000  # summary.json keeps every value
    assert f"runs/{run.info.run_id}/model-metrics?workflowType=machine_learning" in res.stdout
