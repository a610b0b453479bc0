"""The report's plan columns (framework.report.plan): what each scheduler family's plan.json
gives, and a real run's plan in runs.csv and report.md."""

from __future__ import annotations

import csv

from framework.job import Job
from framework.report.cli import main
from framework.report.plan import plan_columns, read_plan
from tests.conftest import compose_cfg

TINY = ["runtime.numerics=false", "train.epochs=1", "train.iterations_per_epoch=1", "tracking=none", "runtime.progress=false"]


def test_pipeline_stages_give_the_cuts_and_the_schedule():
    stages = [{"units": [0, 2]}, {"units": [2, 4]}, {"units": [4, 5]}]
    assert plan_columns({"stages": stages, "microbatches": 8, "flush_per": "iteration"}) == {"plan/cuts": "2,4", "plan/schedule": "M=8, flush per iteration"}
    assert plan_columns({"stages": [{"units": [0, 5]}], "microbatches": 1, "flush_per": "epoch", "weight_stashing": True}) == {"plan/cuts": "none (one stage)", "plan/schedule": "M=1, flush per epoch, weight stashing"}


def test_split_pipar_and_adalearner_plans():
    assert plan_columns({"cut": 1, "edge": {"units": [0, 1]}}) == {"plan/cuts": "1"}  # edge/cloud split
    assert plan_columns({"P": 3, "N": 2, "micro_batch": 32}) == {"plan/P": "3", "plan/N": "2"}
    assert plan_columns({"n": 8, "workers": []}) == {"plan/n": "8"}
    assert plan_columns({"n": True, "cut": "x", "stages": "?"}) == {}  # not what the keys mean: nothing
    assert plan_columns([]) == {}


def test_unreadable_plan_gives_no_columns(tmp_path):
    assert read_plan(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert read_plan(tmp_path / "bad.json") == {}


def test_runs_csv_and_report_md_show_each_runs_plan(tmp_path):
    """GPipe on 3 devices at two link rates, and PiPar: their cuts, schedule and (P, N)."""
    folder = tmp_path / "runs"
    Job(compose_cfg(TINY + ["cluster.num_devices=3", "scheduler.partition=[1,3]"], fast=False), folder / "0").run()
    Job(compose_cfg(TINY + ["scheduler=pipar", "scheduler.P=2", "scheduler.N=4"], fast=False), folder / "1").run()
    assert main([str(folder)]) == 0
    with (folder / "report" / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["plan/cuts"] == "1,3" and rows[0]["plan/schedule"].startswith("M=")
    assert rows[1]["plan/P"] == "2" and rows[1]["plan/N"] == "4" and rows[1]["plan/cuts"] == ""
    assert "plan/n" not in rows[0]  # no run chose an n: no column
    md = (folder / "report" / "report.md").read_text()
    assert "| plan/cuts | plan/schedule | plan/P | plan/N |" in md and "`plan/cuts` the units where a new stage starts" in md
