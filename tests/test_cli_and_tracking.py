"""End to end through `python -m framework` and MLflow: errors, runs, sweeps, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from framework import registry

from framework.job import Job
from tests.conftest import compose_cfg

REPO = Path(__file__).resolve().parent.parent
TINY = ["train.epochs=1", "train.iterations_per_epoch=3", "dataset.n_train=256", "dataset.n_val=64", "dataset.n_test=64", "runtime.progress=false"]


def cli(args, cwd, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "framework", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def all_runs(client):
    exps = client.search_experiments()
    return client.search_runs([e.experiment_id for e in exps]) if exps else []


BAD_INPUTS = [
    (["scheduler.microbatches=abc"], ["scheduler.microbatches", "abc"]),
    (["scheduler=nope"], ["scheduler=nope", "gpipe", "1f1b", "pipedream", "local"]),
    (["scheduler.microbatchs=4"], ["microbatchs"]),
    (["cluster.num_devices=0"], ["cluster.num_devices", ">= 1", "got 0"]),
    (["model=lenet", "cluster=uniform", "cluster.num_devices=8"], ["scheduler.stages", "8 stages", "5 units"]),
    (["scheduler.microbatches=128", "train.batch_size=64"], ["scheduler.microbatches", "128", "64"]),
    (["cluster=uniform", "cluster.num_devices=3", "scheduler.partition=[2,1]"], ["scheduler.partition", "strictly increasing"]),
    (["scheduler.partition=[1,2]"], ["scheduler.partition", "2 cut indices", "give 1"]),
    (["dataset=fashion_mnist", "dataset.root=/nonexistent/fmnist"], ["dataset-fashion-mnist", "dataset.root"]),
    (["compressor=mbq", "compressor.forward.bits=7"], ["compressor.forward.bits", "1, 2, 3, 4", "7"]),
    (["compressor=mbq", "compressor.backward.codec=zip"], ["compressor.backward.codec", "zip", "stochastic_uniform"]),
    (["+train.epoch=3"], ["train.epoch: no such key", "did you mean train.epochs"]),  # `+` adds keys no schema declares
    (["+cluster.device.slowdwn=3"], ["cluster.device.slowdwn", "did you mean cluster.device.slowdown"]),
]


# one case per stage where a bad input can stop a run (composing, a group's options, checking the
# config across fields, loading data, building a plugin, a key no schema declares) runs in the fast
# suite; the others are slow: each message is checked in-process by tests/test_bad_inputs.py
FAST_BAD_INPUTS = {"scheduler.microbatches=abc", "scheduler=nope", "scheduler.microbatches=128 train.batch_size=64",
                   "dataset=fashion_mnist dataset.root=/nonexistent/fmnist", "compressor=mbq compressor.forward.bits=7", "+cluster.device.slowdwn=3"}


@pytest.mark.parametrize("args,needles", [
    pytest.param(a, n, id=" ".join(a), marks=() if " ".join(a) in FAST_BAD_INPUTS else pytest.mark.slow) for a, n in BAD_INPUTS])
def test_bad_input_is_one_paragraph_and_no_run_left_running(tmp_path, mlflow_store, args, needles):
    tracking, client = mlflow_store
    res = cli(tracking + TINY + args, tmp_path)
    assert res.returncode != 0
    err = res.stderr
    assert "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    assert len(err.strip().splitlines()) <= 12, err
    assert all(r.info.status != "RUNNING" for r in all_runs(client))


def test_plugins_flag_lists_registered_names(tmp_path):
    res = cli(["--plugins"], tmp_path)
    assert res.returncode == 0
    for name in ("gpipe", "1f1b", "pipedream", "local", "vgg5", "mobilenetv2", "synthetic_mnist", "fashion_mnist", "oracle", "mlflow", "sim"):
        assert name in res.stdout
    res = cli(["--help"], tmp_path)
    assert res.returncode == 0
    assert f"scheduler: {', '.join(registry.names('scheduler'))}" in res.stdout  # every registered one, sorted
    assert "scheduler: 1f1b, adalearner, edge_only, feature_replay, fl, gpipe, jointdnn, local" in res.stdout
    assert "schema/" not in res.stdout.split("== Config ==")[0]


def test_run_recorded_in_mlflow_with_params_metrics_artifacts(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    summary = Job(compose_cfg(tracking + TINY + ["scheduler=gpipe", "train.epochs=2"], fast=False), tmp_path / "run").run()
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["scheduler.name"] == "gpipe" and params["model.name"] == "lenet" and params["scheduler.microbatches"] == "4"
    # every leaf of the composed config, once, by its dotted name
    assert {"cluster.link.bandwidth_bps", "cluster.device.slowdown", "train.momentum", "train.weight_decay", "seed"} <= set(params)
    assert "scheduler" not in params and "model" not in params
    tags = run.data.tags
    assert tags["pipelab.step_axis"] == "training iterations done" and "mlflow.user" in tags and len(tags.get("mlflow.source.git.commit", "x" * 40)) == 40
    # one step axis: epoch-end metrics sit at the iterations done, end-of-run ones are not repeated
    hist = client.get_metric_history(run.info.run_id, "val/loss")
    iters = summary["iterations"]
    assert [m.step for m in hist] == [iters // 2, iters]
    # a per-epoch metric the same every epoch is one point, its first (framework.tracking.series):
    # on this tiny data val/acc may stay at chance
    accs = summary["history"]["val/acc"]
    expected = [iters // 2] if accs[0] == accs[1] else [iters // 2, iters]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")] == expected
    # what a sweeper is told (objective.run_metrics) is what MLflow holds, to the last bit
    from framework.tracking import objective

    told = objective.run_metrics(summary)
    for k in ("val/acc", "val/loss", "time/epoch_virtual_s", "test/acc"):
        assert told[k] == run.data.metrics[k], k
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == iters
    for m in ("train/loss", "val/acc", "test/acc", "time/virtual_s", "time/epoch_virtual_s", "pipe/bubble_frac", "util/busy_frac/stage0", "net/bytes/dev0_to_dev1", "throughput/samples_per_s"):
        assert m in run.data.metrics, m
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "plan.json", "timeline.json", "timeline.png", "summary.json", "model.safetensors"} <= arts
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "run" / "model.safetensors"))  # the trained weights, no pickle
    trained = Job(compose_cfg(tracking + TINY + ["scheduler=gpipe", "train.epochs=2"], fast=False), tmp_path / "again")
    trained.train()
    assert saved.keys() == trained.final_model().state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in trained.final_model().state_dict().items())
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("scheduler", "virtual_time_s", "wall_time_s", "epochs", "iterations", "samples", "metrics", "roles", "links", "bubble_frac", "mlflow_run_id", "peak_inflight"):
        assert key in s
    assert s["links"]["dev0->dev1"]["bytes"] > 0
    trace = json.loads((tmp_path / "run" / "timeline.json").read_text())
    assert any(e.get("ph") == "X" and e["name"].startswith("fwd") for e in trace["traceEvents"])


def test_failure_mid_run_marks_run_failed_and_keeps_outputs(tmp_path, mlflow_store, monkeypatch):
    tracking, client = mlflow_store
    job = Job(compose_cfg(tracking + TINY + ["scheduler=gpipe"], fast=False), tmp_path / "run")
    from framework.stage import Stage

    calls = {"n": 0}
    original = Stage.backward

    def broken(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device fell over")
        return original(self, *a, **k)

    monkeypatch.setattr(Stage, "backward", broken)
    with pytest.raises(RuntimeError, match="device fell over"):
        job.run()
    runs = all_runs(client)
    assert [r.info.status for r in runs] == ["FAILED"]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "FAILED" and s["virtual_time_s"] > 0
    assert (tmp_path / "run" / "timeline.json").exists()


def test_same_config_and_seed_give_identical_summaries(tmp_path, mlflow_store):
    tracking, _ = mlflow_store
    over = tracking + TINY + ["scheduler=1f1b", "train.iterations_per_epoch=6", "train.epochs=2"]
    a = Job(compose_cfg(over, fast=False), tmp_path / "a").run()
    b = Job(compose_cfg(over, fast=False), tmp_path / "b").run()

    def strip(s):
        s = json.loads(json.dumps(s))
        s.pop("wall_time_s")
        s.pop("mlflow_run_id")  # a new MLflow run each time, by design
        s["metrics"].pop("time/wall_s")
        return s

    assert a["mlflow_run_id"] != b["mlflow_run_id"]
    assert strip(a) == strip(b)
    c = Job(compose_cfg(over + ["seed=1"], fast=False), tmp_path / "c").run()
    assert strip(c)["metrics"]["train/loss"] != strip(a)["metrics"]["train/loss"]


# slow: what it asserts (one parent, a FINISHED child per job under it, named by the swept value) the
# fast suite asserts in test_a_sweep_is_comparable_in_the_store and the joblib sweep's assert_lr_sweep;
# this one adds sweeping four schedulers at once (11 s, the suite stood at 10 min on 2 cores)
@pytest.mark.slow
def test_multirun_has_one_parent_and_a_child_per_job(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    res = cli(["-m", "scheduler=local,gpipe,1f1b,pipedream", "cluster.num_devices=2", *tracking, *TINY], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = all_runs(client)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {c.data.params["scheduler.name"] for c in children} == {"local", "gpipe", "1f1b", "pipedream"}
    assert len({c.info.run_name for c in children}) == 4  # named by the swept override
    assert all(r.info.status == "FINISHED" for r in runs)


@pytest.mark.parametrize("experiment", ["bubble_textbook", "vgg5_pi4_wifi"])
def test_experiment_presets_compose_and_run(tmp_path, experiment):
    cfg = compose_cfg([f"experiment={experiment}", "train.epochs=1", "train.iterations_per_epoch=2", "dataset.n_val=64", "dataset.n_test=64"])
    summary = Job(cfg, tmp_path).run()
    assert summary["iterations"] == 2
    if experiment == "bubble_textbook":
        assert summary["bubble_frac"] == pytest.approx(3 / 11, abs=1e-6)


def test_ctrl_c_marks_the_run_failed_and_keeps_outputs(tmp_path, mlflow_store):
    import signal
    import time

    tracking, client = mlflow_store
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "framework", *tracking, "train.epochs=100", "runtime.progress=false", "hydra.run.dir=" + str(tmp_path / "run")]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 120
        # well inside training: the first epoch's metrics are flushed (a loaded machine may be slow)
        while time.time() < deadline and not any(r.info.status == "RUNNING" and "time/epoch_virtual_s" in r.data.metrics for r in all_runs(client)):
            time.sleep(0.5)
        while time.time() < deadline and not (tmp_path / "run" / "checkpoint" / "meta.json").exists():  # written just after the flush
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err  # one line, no asyncio noise
    assert f"train.resume={tmp_path / 'run'}" in err  # a checkpoint exists: how to go on
    assert [r.info.status for r in all_runs(client)] == ["FAILED"]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "FAILED" and s["iterations"] > 0
    json.loads((tmp_path / "run" / "timeline.json").read_text())


@pytest.mark.slow  # a CLI sweep into a store (about 11 s)
def test_a_sweep_is_comparable_in_the_store(tmp_path, mlflow_store):
    """A 3-job sweep over the link bandwidth: each child carries the swept param with its value,
    no param twice under two names, distinct names; the parent holds the common params, the best
    child and the comparison table and plot; job folders are named by the swept value."""
    tracking, client = mlflow_store
    sweep = tmp_path / "sweep"
    res = cli(["-m", "cluster.link.bandwidth_bps=1e6,1e7,1e8", "cluster=uniform", "model=mlp", "tracking.optimized_metric=time/epoch_virtual_s",
               "tracking.optimized_direction=min", f"hydra.sweep.dir={sweep}", *tracking, *TINY], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = all_runs(client)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(float(c.data.params["cluster.link.bandwidth_bps"]) for c in children) == [1e6, 1e7, 1e8]
    for c in children:
        assert not any(f"{k}.name" in c.data.params for k in c.data.params)  # `scheduler` and `scheduler.name` never both
    assert len({c.info.run_name for c in children}) == 3
    assert parent.data.params["scheduler.name"] == "gpipe" and "cluster.link.bandwidth_bps" not in parent.data.params
    fastest = min(children, key=lambda c: c.data.metrics["time/epoch_virtual_s"])
    assert float(fastest.data.params["cluster.link.bandwidth_bps"]) == 1e8
    assert parent.data.tags["pipelab.best_child_run_id"] == fastest.info.run_id
    assert parent.data.metrics["best/time/epoch_virtual_s"] == fastest.data.metrics["time/epoch_virtual_s"]
    assert {"comparison.csv", "comparison.md", "comparison.png"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_cluster.link.bandwidth_bps=1000000.0", "1_cluster.link.bandwidth_bps=10000000.0", "2_cluster.link.bandwidth_bps=100000000.0"]


def test_link_pattern_keys_become_valid_mlflow_names(tmp_path, mlflow_store):
    """`cluster.links."dev*->server"` knobs are params too, under names MLflow accepts."""
    tracking, client = mlflow_store
    summary = Job(compose_cfg(tracking + TINY + ["scheduler=fl", "cluster=pipar_4g", "cluster.num_devices=2", "runtime.numerics=false"], fast=False), tmp_path / "run").run()
    params = client.get_run(summary["mlflow_run_id"]).data.params
    assert float(params["cluster.links.dev__to_server.bandwidth_bps"]) == 10e6
    assert "net/bytes/dev0_to_server" in summary["metrics"]
