"""EdgePipe as real processes (runtime=local over a real mosquitto, link emulation with the
plan's losses): each role process applies the PRR to its own links, whose loss generators are
seeded by the link's name, and the slot clock starts when the runtime starts every role together.
So a message is lost, late or delivered on the wall clock exactly as on the simulator: the same
messages per super-neuron pair, the same losses per link, the same weights."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from framework.errors import ConfigError
from framework.job import Job
from tests.conftest import compose_cfg
from tests.test_edgepipe import TINY

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed (bash setup.sh)")

LOCAL = ["runtime=local", "transport=mqtt", "runtime.emulate_links=true"]
LOSSY = ["scheduler.prr.topology_seed=6"]  # the preset's channel: mean PRR 0.809


def run(tmp_path, name, overrides):
    job = Job(compose_cfg(TINY + LOSSY + ["tracking=none", "runtime.progress=false", "scheduler.lossy_test_passes=3"] + overrides), tmp_path / name)
    job.run()
    return job, json.loads((job.out_dir / "summary.json").read_text())


# six real processes over MQTT for a whole epoch (about 25 s each): -m slow
@pytest.mark.parametrize("seed,recovery", [pytest.param(0, "ack", marks=pytest.mark.slow), pytest.param(1, "none", marks=pytest.mark.slow), pytest.param(2, "rtx", marks=pytest.mark.slow)])
def test_local_processes_lose_and_deliver_exactly_what_the_simulator_does(tmp_path, seed, recovery):
    over = [f"seed={seed}", f"scheduler.recovery={recovery}"]
    sim, s = run(tmp_path, "sim", over)
    local, l = run(tmp_path, "local", over + LOCAL)
    assert l["edgepipe"]["messages_sent_per_sn_pair"] == s["edgepipe"]["messages_sent_per_sn_pair"]
    lost = {k: v["lost"] for k, v in s["links"].items()}
    assert sum(lost.values()) > 0  # the channel did drop messages
    assert {k: v["lost"] for k, v in l["links"].items()} == lost
    assert l["edgepipe"]["transmissions"] == s["edgepipe"]["transmissions"]
    for k in ("fwd_arrival", "bwd_applied"):
        assert l["edgepipe"][k] == s["edgepipe"][k]
    a, b = sim.final_model().state_dict(), local.final_model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # float64, same ops in the same order
    assert l["metrics"]["test/acc"] == s["metrics"]["test/acc"]
    assert l["edgepipe"]["lossy_test"]["mean"] == s["edgepipe"]["lossy_test"]["mean"]  # from the states the roles sent
    # the wall clock kept the slot clock: the run took its planned slots (plus start-up jitter)
    assert s["virtual_time_s"] <= l["virtual_time_s"] < s["virtual_time_s"] + 1.0


def test_real_processes_need_the_links_model(tmp_path):
    with pytest.raises(ConfigError, match="runtime.emulate_links"):
        Job(compose_cfg(TINY + ["runtime=local", "transport=mqtt", "tracking=none"]), tmp_path / "run")
