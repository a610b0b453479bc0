"""EdgePipe's accuracy over the slot clock (edgepipe.curve): snapshots on a slot grid, each the
model the devices hold at that instant, tested like the final model."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from framework.errors import ConfigError
from plugins.schedulers.edgepipe.curve import SNAP_SLOTS, grid, layers_at, time_to
from tests.test_edgepipe import LOSSLESS, job_for


def test_the_grid_is_the_nearest_slot_boundaries_and_the_end():
    assert grid(1.0, 7.0, 40) == [9, 17, 26, 34, 40]  # 60/7 = 8.57, 17.1, 25.7, 34.3; then the end
    assert grid(0.01, 1.0, 5) == [1, 2, 3, 4, 5]  # never two snapshots on one boundary
    assert grid(10.0, 1.0, 100) == [100]  # a grid longer than the run: the end alone


def test_time_to_is_the_first_point_at_the_target():
    c = {"t_min": [1.0, 2.0, 3.0, 4.0], "lossy_mean": [0.5, 0.81, 0.79, 0.9]}
    assert time_to(c, 0.8) == 2.0 and time_to(c, 0.85) == 4.0 and time_to(c, 0.95) is None


def test_snapshots_hold_the_weights_after_exactly_the_slots_before_them(tmp_path):
    """Unpipelined and lossless on a 1 s slot: a minibatch takes 2L - 1 = 11 slots, so a grid of
    22 slots (22/60 min) catches the model after every second minibatch: plain SGD's."""
    over = LOSSLESS + ["scheduler.pipeline=false", "scheduler.slot_s=1.0", "scheduler.budget_min=2.5", "scheduler.lossy_test_passes=1",
                       f"scheduler.eval_every_min={22 / 60}", "scheduler.eval_passes=2"]
    job = job_for(tmp_path, over)
    ref = copy.deepcopy(job.model)
    job.run()
    plan = json.loads((job.out_dir / "plan.json").read_text())
    assert plan["eval"]["at_slots"] == [22, 44, 66, 88, 110, 132, 143]  # 13 minibatches end at slot 143
    sched = job.scheduler
    states = {r: st for r, st in sched.final_states.items() if SNAP_SLOTS in st}
    assert states and all(st[SNAP_SLOTS].tolist() == plan["eval"]["at_slots"] for st in states.values())
    trained = sched.trained_layers()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    batches = [b for e in range(3) for b in job.context.train_batches(e)][:13]
    done = 0
    for k, slots in enumerate(plan["eval"]["at_slots"]):
        while done < slots // 11:
            x, y = batches[done]
            opt.zero_grad()
            F.cross_entropy(ref(x), y).backward()
            opt.step()
            done += 1
        got = layers_at(sched.partition, states, k, trained)
        want = [(u.weight, u.bias) for u in ref.modules() if isinstance(u, torch.nn.Linear)]
        assert max(float((g - w).abs().max()) for (gw, gb), (ww, wb) in zip(got, want) for g, w in ((gw, ww), (gb, wb))) <= 1e-10, k
    summ = json.loads((job.out_dir / "summary.json").read_text())
    c = summ["edgepipe"]["curve"]
    assert c["slots"] == plan["eval"]["at_slots"] and c["t_min"] == pytest.approx([s / 60 for s in c["slots"]])
    assert c["acc"][-1] == summ["metrics"]["test/acc"]  # the last snapshot is the trained model
    assert c["lossy_mean"] == pytest.approx(c["acc"], abs=1e-12) and c["passes"] == 2  # lossless links: every pass is the model


def test_a_pipelined_lossy_run_records_a_curve_on_every_role_alike(tmp_path):
    over = ["scheduler.slot_s=1.0", "scheduler.budget_min=1.0", "scheduler.eval_every_min=0.25", "scheduler.eval_passes=3", "scheduler.lossy_test_passes=3"]
    prr = np.full((6, 6), 0.7)
    job = job_for(tmp_path, over, prr=prr)
    job.run()
    summ = json.loads((job.out_dir / "summary.json").read_text())
    c = summ["edgepipe"]["curve"]
    assert "error" not in c and c["slots"] == [15, 30, 45, 59] and len(c["lossy_mean"]) == len(c["acc"]) == 4
    assert c["acc"][-1] == summ["metrics"]["test/acc"]
    assert all(0 <= a <= 1 for a in c["lossy_mean"]) and any(s > 0 for s in c["lossy_std"])  # lossy: passes differ
    again = job_for(tmp_path, over, "again", prr=prr)
    again.run()
    assert json.loads((again.out_dir / "summary.json").read_text())["edgepipe"]["curve"] == c  # deterministic


@pytest.mark.parametrize("key,value", [("eval_every_min", 0), ("eval_every_min", -1.0), ("eval_passes", 0)])
def test_bad_curve_settings_fail_before_running(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"scheduler.{key}"):
        job_for(tmp_path, [f"scheduler.{key}={value}"])
