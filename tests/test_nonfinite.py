"""Non-finite numbers end a run (`train.on_nonfinite`, framework/nonfinite.py).

A diverged run and a poisoned peer used to end FINISHED with `val/loss nan`. Here: the first
NaN or infinity in a loss, a parameter after its update or a received tensor fails the run with
one line naming what, the role and the iteration, on the simulator and on real processes over
MQTT; `warn` goes on and counts; `ignore` checks nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from framework import nonfinite, plugin_discovery
from framework.errors import WireError
from framework.job import Job
from framework.runtime.control import ctl_pack, ctl_unpack
from tests.conftest import compose_cfg

REPO = Path(__file__).resolve().parent.parent
TINY = ["tracking=none", "runtime.progress=false", "train.epochs=1", "train.iterations_per_epoch=4", "dataset.n_train=512", "dataset.n_val=64", "dataset.n_test=64"]


def test_a_sum_that_overflows_is_not_taken_for_a_non_finite_tensor():
    big = torch.full((4, 4), 3e38)  # finite; their sum is not
    assert nonfinite.finite_tensor(big)
    assert nonfinite.finite_tensor(torch.randn(8))
    assert nonfinite.finite_tensor(torch.tensor([1, 2], dtype=torch.int64))
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.randn(16)
        t[5] = bad
        assert not nonfinite.finite_tensor(t)


def test_the_policies():
    t = torch.tensor([1.0, float("nan")])
    with pytest.raises(nonfinite.NonFiniteError, match=r"non-finite 'act' tensor received from a \(role b, iteration 7\): a peer sent"):
        nonfinite.Guard("fail").received(t, "'act' tensor received from a", "b", 7)
    warn = nonfinite.Guard("warn")
    for _ in range(3):
        warn.received({"w": t}, "'weights' tensor received from a", "b")
    warn.number(float("inf"), "loss")
    assert warn.summary() == {"b: 'weights' tensor received from a (w)": 3, "loss": 1}
    off = nonfinite.Guard("ignore")
    assert not off.enabled
    off.received(t, "x")
    off.number(float("nan"), "loss")
    assert off.summary() == {}
    with pytest.raises(ValueError, match="fail, warn, ignore"):
        nonfinite.Guard("sometimes")


def test_a_parameter_made_non_finite_by_its_gradient_or_by_the_update_is_told_apart():
    lin = torch.nn.Linear(2, 2)
    lin.weight.grad = torch.full_like(lin.weight, float("nan"))
    with torch.no_grad():
        lin.weight.fill_(float("nan"))
    with pytest.raises(nonfinite.NonFiniteError, match=r"non-finite gradient of parameter weight in stage \[0:1\)"):
        nonfinite.Guard().parameters(lin.named_parameters(), "stage [0:1)")
    lin.weight.grad = torch.ones_like(lin.weight)
    with pytest.raises(nonfinite.NonFiniteError, match="non-finite update of parameter weight"):
        nonfinite.Guard().parameters(lin.named_parameters(), "stage [0:1)")


def test_inside_a_batched_flush_the_check_reads_nothing_until_it_ends():
    """A flush of deferred work must not read values back (a GPU would stall): the parameters'
    sums are kept and read when it ends, and the error is raised then."""
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.bias.fill_(float("inf"))
    reached_the_end = False
    with pytest.raises(nonfinite.NonFiniteError, match="non-finite update of parameter bias in stage"):
        with nonfinite.held():
            nonfinite.Guard().parameters(lin.named_parameters(), "stage [3:4)")
            reached_the_end = True
    assert reached_the_end


def test_a_diverged_batched_run_fails_too(tmp_path):
    cfg = compose_cfg([*TINY, "scheduler=pipar", "cluster=pipar_4g", "runtime.batch_replicas=true", "train.lr=1e9"])
    job = Job(cfg, tmp_path / "run")
    with pytest.raises(nonfinite.NonFiniteError, match="non-finite .*iteration"):
        job.run()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["failure"]["kind"] == "nonfinite"


def test_a_non_finite_loss_crosses_the_control_channel_by_its_name():
    """JSON has no NaN: under warn/ignore a role sends a non-finite loss as "nan"/"inf"; the
    coordinator's check then fails or warns. Nothing else passes as a loss."""
    for name in ("nan", "inf", "-inf"):
        h, _ = ctl_unpack(ctl_pack({"kind": "train", "loss_sum": name, "correct": 0, "n": 4}))
        assert h["loss_sum"] == name
    with pytest.raises(WireError, match="loss_sum"):
        ctl_pack({"kind": "train", "loss_sum": "NaNa", "correct": 0, "n": 4})


def test_a_diverged_run_fails_naming_the_iteration_and_its_mlflow_run_is_failed(tmp_path, mlflow_store):
    overrides, client = mlflow_store
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "framework", "train.lr=1e9", *TINY[1:], *overrides, f"hydra.run.dir={out}"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 3, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith("error: non-finite ") and "iteration " in lines[-1] and "train.lr" in lines[-1], res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "FAILED"
    failure = summary["failure"]
    assert failure["kind"] == "nonfinite" and isinstance(failure["iteration"], int) and failure["role"]
    assert failure["message"] in lines[-1]
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert run.data.tags["pipelab.failure"] == failure["message"]


def test_warn_goes_on_and_counts_and_ignore_checks_nothing(tmp_path):
    sums = {}
    for policy in ("warn", "ignore"):
        cfg = compose_cfg([*TINY, "train.lr=1e9", f"train.on_nonfinite={policy}"])
        sums[policy] = Job(cfg, tmp_path / policy).run()
    warned = sums["warn"]
    assert warned["status"] == "FINISHED"
    assert any("loss" in k for k in warned["nonfinite"]) and all(n >= 1 for n in warned["nonfinite"].values())
    assert "nonfinite" not in sums["ignore"] and sums["ignore"]["status"] == "FINISHED"


def test_a_finite_run_is_untouched_by_the_checks(tmp_path):
    """The checks read; they change nothing: `fail` and `ignore` train to the same numbers."""
    runs = [Job(compose_cfg([*TINY, f"train.on_nonfinite={p}"]), tmp_path / p).run() for p in ("fail", "ignore")]
    assert runs[0]["metrics"]["val/loss"] == runs[1]["metrics"]["val/loss"]
    assert runs[0]["history"] == runs[1]["history"]


# ---- a poisoned peer on real processes ---------------------------------------------------------

POISON = '''
"""pipelab_poison: an MLP whose first unit puts out NaN at one training forward (a broken or
malicious device: its role sends the NaN itself, through its own transport, with valid MACs)."""

from dataclasses import dataclass

import torch
from torch import nn

from framework.config.schemas import ModelConfig
from framework.registry import register


@dataclass
class PoisonedMLPConfig(ModelConfig):
    name: str = "poisoned_mlp"
    hidden: int = 32
    at_call: int = 3


class Poison(nn.Module):
    def __init__(self, at_call):
        super().__init__()
        self.at_call, self.calls = at_call, 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.at_call:
                return x * float("nan")
        return x


@register("model", "poisoned_mlp", schema=PoisonedMLPConfig)
def poisoned_mlp(cfg, input_shape, num_classes):
    import math

    return [("fc0", nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), cfg.hidden), nn.ReLU(), Poison(cfg.at_call))),
            ("head", nn.Linear(cfg.hidden, num_classes))]
'''


@pytest.fixture(scope="module")
def poison_site(tmp_path_factory) -> Path:
    from tests.test_external_plugin import install_plugin

    return install_plugin(tmp_path_factory.mktemp("poison_site"), "pipelab_poison", POISON, "poison")


@pytest.mark.slow  # two role processes and a broker (about 15 s)
def test_a_role_that_receives_nan_over_mqtt_fails_the_run_naming_itself(tmp_path, poison_site, mlflow_store):
    overrides, client = mlflow_store
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(poison_site), str(REPO)]), OMP_NUM_THREADS="1")
    env[plugin_discovery.ONLY_PLUGINS_ENV] = "pipelab_poison"  # the suite loads only the outside plugins a test names (tests/conftest.py)
    env.pop("HYDRA_FULL_ERROR", None)
    out = tmp_path / "run"
    args = ["model=poisoned_mlp", "scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2", "runtime=local", "transport=mqtt",
            *TINY[1:], *overrides, f"hydra.run.dir={out}"]
    res = subprocess.run([sys.executable, "-m", "framework", *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 3, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: non-finite 'act' tensor received from stage0 (role stage1, iteration "), res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["failure"]["role"] == "stage1"
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
