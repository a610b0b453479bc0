"""Re-planning a pipeline when a device drifts (plugins/predictors/accept_replan.py, `scheduler.replan_epsilon`):
stages report their measured forward + backward time per mini-batch at each epoch's end, stage 0
re-plans when one is off its prediction by more than epsilon, and units move before the next
epoch, on the simulator and on real processes."""

from __future__ import annotations

import shutil

import pytest
import torch

from framework.cluster import Work
from framework.job import Job
from plugins.predictors.accept_replan import drifted
from tests.conftest import compose_cfg

# AccEPT's scenario 1 at 4 Mbit/s, small: three stages of MobileNetV2, timing only
TIMING = ["experiment=accept", "runtime.numerics=false", "compressor=none", "predictor=oracle", "train.epochs=3", "train.iterations_per_epoch=6",
          "cluster.link.bandwidth_bps=4e6"]
SLOW_DEV1 = "+cluster.devices.dev1.trace=[[0.0,4.0]]"  # dev1 computes 4x slower than its model from the start


def run(tmp_path, overrides):
    job = Job(compose_cfg(overrides), tmp_path)
    res = job.run()
    return job, res


def test_the_drift_rule():
    assert drifted([1.0, 1.0, 1.0, 0.0], [1.1, 1.2, 0.8, 5.0], 0.15) == [1, 2]  # off by more than 15 %; a 0 prediction is never called off


def test_observe_rescales_the_device_it_measured(tmp_path):
    job = Job(compose_cfg(TIMING), tmp_path)
    p, dev1, dev2 = job.predictor, job.cluster.device("dev1"), job.cluster.device("dev2")
    before = [p.predict(d, Work("fwd", 2, 9, 128)) for d in (dev1, dev2)]
    p.observe(dev1, 0, 5, 128, 3.0 * p.fwd_bwd(dev1, 0, 5, 128), now=1.0)
    after = [p.predict(d, Work("fwd", 2, 9, 128)) for d in (dev1, dev2)]
    assert after[0] == pytest.approx(3.0 * before[0]) and after[1] == before[1]


def test_a_slowed_device_loses_units_and_the_epochs_get_shorter(tmp_path):
    fixed_job, fixed = run(tmp_path / "fixed", TIMING + [SLOW_DEV1])
    job, res = run(tmp_path / "replan", TIMING + [SLOW_DEV1, "scheduler.replan_epsilon=0.15"])
    summary = __import__("json").loads((tmp_path / "replan" / "summary.json").read_text())
    events = summary["replans"]
    assert events and events[0]["epoch"] == 0 and events[0]["drifted"] == ["stage1"]
    m, p = events[0]["measured_s"][1], events[0]["predicted_s"][1]
    assert m == pytest.approx(4.0 * p, rel=1e-6)  # the stage timed its own calls: 4x its model
    first = [tuple(b) for b in events[0]["bounds"]]
    planned = [tuple(s["units"]) for s in job.scheduler.plan()["stages"]]
    assert first[1][1] - first[1][0] < planned[1][1] - planned[1][0]  # dev1 holds fewer units
    assert summary["metrics"]["pipe/replans"] == len(events)
    assert res["virtual_time_s"] < 0.9 * fixed["virtual_time_s"]


def test_without_drift_nothing_moves(tmp_path):
    _, res = run(tmp_path, TIMING + ["scheduler.replan_epsilon=0.15"])
    summary = __import__("json").loads((tmp_path / "summary.json").read_text())
    assert summary["replans"] == [] and summary["metrics"]["pipe/replans"] == 0


def test_replanned_weights_equal_a_configured_repartition(tmp_path):
    """Re-planning moves units with their weights and optimizer state exactly as a configured
    repartition at the same epoch boundary does: the same float64 weights, bit for bit."""
    base = ["scheduler=pipedream", "model=vgg5", "dataset=synthetic_cifar10", "dataset.n_train=192", "dataset.n_val=32", "dataset.n_test=32",
            "cluster.num_devices=3", "train.epochs=2", "train.batch_size=16", "train.momentum=0.9", "runtime.dtype=float64", "predictor=oracle",
            "+cluster.devices.dev1.trace=[[0.0,5.0]]"]
    job, _ = run(tmp_path / "replan", base + ["scheduler.replan_epsilon=0.15"])
    events = job.runtime.role_stats["stage0"]["replans"]
    assert len(events) == 1
    cuts = [b for _, b in events[0]["bounds"][:-1]]
    static, _ = run(tmp_path / "static", base + [f"scheduler.repartition=[[1,{cuts}]]"])
    a, b = job.final_model().state_dict(), static.final_model().state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad,msg", [
    ("scheduler.replan_epsilon=0", "must be > 0"),
    ("scheduler.partition=[5,12]", "fixes the cuts"),
    ("scheduler.repartition=[[1,[5,12]]]", "both move units"),
])
def test_bad_replanning_configs_fail_before_running(tmp_path, bad, msg):
    from framework.errors import ConfigError

    over = TIMING + ["scheduler.replan_epsilon=0.15", bad] if "replan_epsilon" not in bad else TIMING + [bad]
    with pytest.raises(ConfigError, match=msg):
        Job(compose_cfg(over), tmp_path)


@pytest.mark.slow  # three role processes over a real mosquitto
@pytest.mark.parametrize("predictor", [["predictor=oracle"], ["predictor=accept", "predictor.pool=8", "predictor.epochs=30", "predictor.cache_dir=CACHE"]], ids=["oracle", "accept"])
def test_replanning_on_real_processes_decides_as_the_simulator(tmp_path, predictor):
    """runtime=local: each stage times its own (emulated) calls on the wall clock, stage 0 decides
    from those reports, and the units move over MQTT: the same new cuts as the simulator's and
    the same float64 weights. (An emulated call lasts the longer of its modelled time and the
    host's: where the host is slower, the wall reports differ from the simulator's, and so may the
    decision.)"""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto not installed (bash setup.sh)")
    base = ["experiment=accept", "tracking=none", "runtime.progress=false", "train.epochs=2", "train.iterations_per_epoch=3", "train.batch_size=16",
            "dataset.n_val=32", "dataset.n_test=32", "runtime.dtype=float64", *predictor, "compressor=none",
            "cluster.link.bandwidth_bps=4e6",
            "scheduler.replan_epsilon=0.15", SLOW_DEV1,
            # devices slow enough that the modelled times, not this host's, set the emulated calls'
            # lengths: analytic ones (accept_s1's own are profile-table columns at 2-4x this host's
            # single-core times, which three processes on two cores exceed)
            "cluster.device.time_model=analytic", "cluster.device.flops_per_s=2.5e8", "cluster.device.slowdown=1.0",
            "+cluster.devices.dev0.flops_per_s=5e8", "cluster.devices.dev0.slowdown=1.0"]
    base = [o.replace("CACHE", str(tmp_path / "cache")) for o in base]  # the accept predictor trains once, in the simulator's run
    out = {}
    for rt, extra in (("sim", []), ("local", ["runtime=local", "transport=mqtt", "runtime.emulate_compute=true"])):
        job = Job(compose_cfg(base + extra), tmp_path / rt)
        job.run()
        events = job.runtime.role_stats["stage0"]["replans"]
        out[rt] = ([e["bounds"] for e in events], job.final_model().state_dict())
    assert out["sim"][0] and out["sim"][0] == out["local"][0]
    a, b = out["sim"][1], out["local"][1]
    assert all(torch.equal(a[k], b[k]) for k in a)
