"""The EdgePipe study's verdicts (experiments/edgepipe_claims.py) on made-up records: what each
claim reads from the runs, and that a miss is a miss. The runs themselves are the study's."""

from __future__ import annotations

import math

import pytest

from experiments.edgepipe_claims import all_claims, planner_rows, time_to_80
from experiments.edgepipe_plan_facts import mapping_facts, partition_facts

HYBRID = {"groups": [[1, 2], [3, 4], [5, 6]], "devices_per_group": [2, 2, 2], "m_layers": 2, "P": 3, "effective_class": "hybrid"}
VERTICAL = {"groups": [[1], [2], [3], [4], [5], [6]], "devices_per_group": [1] * 6, "m_layers": 1, "P": 6, "effective_class": "vertical"}
HORIZONTAL = {"groups": [[1, 2, 3, 4, 5, 6]], "devices_per_group": [6], "m_layers": 6, "P": 1, "effective_class": "horizontal"}


def record(name, placement, acc, *, part=HYBRID, n=100, slot=0.3, overrides=(), std=0.01, prr=0.8, curve=None, **extra):
    cyc = 2 * part["m_layers"] if part["P"] > 1 and "scheduler.pipeline=false" not in overrides else 11
    slots = (12 + cyc * (n - 1) - 1) if cyc != 11 else 11 * n
    r = {"name": name, "placement": placement, "overrides": list(overrides), "lossy": [acc] * 4, "mean": acc, "std": std, "min": acc, "frac_below_0.3": 0.0,
         "minibatches": n, "slots": slots, "paper_epoch_step": [1, n], "virtual_s": slots * slot, "slot_s": slot, "mean_prr": prr, "min_prr": prr,
         "messages_per_minibatch": 28, "cycle_slots": cyc, "partition": part, "fwd_arrival": {"1": prr}, "bwd_applied": {"2": 1.0},
         "transmissions": {"data_per_message": 1.0, "packets_per_message": 1.0},
         "prediction": {"predicted_epoch_s": slots * slot, "epoch_s": slots * slot, "epoch_over_predicted": 1.0}}
    if curve:
        r["curve"] = {"t_min": [10.0 * (i + 1) for i in range(len(curve))], "lossy_mean": curve}
    r.update(extra)
    return r


def results(h=(0.83, 0.80), v=(0.70, 0.50), z=(0.15, 0.12)):
    runs = {"hybrid": [record("hybrid", p, a, curve=[0.5, 0.81, 0.85]) for p, a in enumerate(h)],
            "vertical": [record("vertical", p, a, part=VERTICAL) for p, a in enumerate(v)],
            "horizontal": [record("horizontal", p, a, part=HORIZONTAL) for p, a in enumerate(z)],
            "model": [record("model", p, 0.9, overrides=["scheduler.pipeline=false"], curve=[0.4, 0.6, 0.79, 0.8, 0.82, 0.83],
                             at_budget={"mean": 0.78, "lossy": [0.78], "std": 0.0, "minibatches": 33}) for p in range(len(h))]}
    return {"settings": {"budget_min": 194.0}, "runs": runs, "plan": {"partition": partition_facts()}}


def by_what(claims):
    return {c.what: c for c in claims}


def test_accuracy_claims_are_means_over_placements_and_spreads_are_best_minus_worst():
    c = by_what(all_claims(results()))
    assert c["Hybrid test accuracy at 194 min, %"].ours == pytest.approx(81.5)
    assert c["Hybrid - Vertical, points"].ours == pytest.approx(81.5 - 60.0)
    assert c["Vertical: best - worst placement, points"].ours == pytest.approx(20.0)
    assert c["Hybrid: best - worst placement, points"].ours == pytest.approx(3.0)
    assert c["Hybrid / Vertical, the largest over placements"].ours == pytest.approx(80 / 50)
    assert c["Hybrid > Vertical > Horizontal"].hit and c["placement moves Vertical more than Hybrid"].hit
    assert c["Hybrid beats Model at 194 min"].hit  # Model read at the budget (78 %), not at its longer run's end (90 %)


def test_an_overshoot_misses_as_a_shortfall_does():
    c = by_what(all_claims(results(h=(0.99, 0.99), v=(0.10, 0.10))))
    assert not c["Hybrid - Vertical, points"].hit  # 89 points against the paper's 18.05
    c = by_what(all_claims(results(h=(0.83, 0.80), v=(0.80, 0.78))))
    assert not c["Hybrid - Vertical, points"].hit  # 2.5 points


def test_time_to_80_is_per_placement_and_names_a_placement_that_never_gets_there():
    res = results()
    [c] = time_to_80(res)
    assert c.ours == pytest.approx(40 / 20) and "2 of 2" in c.note  # Model 40 min, Hybrid 20 min on each
    res["runs"]["hybrid"][1]["curve"]["lossy_mean"] = [0.5, 0.6, 0.7]
    [c] = time_to_80(res)
    assert c.ours == pytest.approx(2.0) and "1 of 2" in c.note and "placement 1: Hybrid never reached 80 %" in c.note
    for r in res["runs"]["hybrid"]:
        r["curve"]["lossy_mean"] = [0.5, 0.6, 0.7]
    [c] = time_to_80(res)
    assert not c.hit


def test_theorem1_flags_a_run_whose_slots_are_off():
    res = results()
    c = by_what(all_claims(res))
    key = next(k for k in c if k.startswith("Theorem 1"))
    assert c[key].hit and "8 of 8" in c[key].ours  # four configurations on two placements
    res["runs"]["vertical"][1]["virtual_s"] += 0.3  # one slot more than Theorem 1's
    c = by_what(all_claims(res))
    assert not c[key].hit and "vertical@1" in c[key].ours


def test_a_shorter_budget_compares_with_table_iii_scaled_and_missing_runs_make_no_claims():
    res = results()
    res["settings"]["budget_min"] = 19.4
    c = by_what(all_claims(res))
    assert c["minibatches in 19.4 min, hybrid"].paper == 936  # 9356 x 0.1
    assert not any("r-TX" in k or "rtx" in k or "4 devices" in k for k in c)  # those configurations did not run


def test_the_planner_rows_show_each_configurations_worst_placement():
    res = results()
    res["runs"]["hybrid"][1]["prediction"] = {"predicted_epoch_s": 100.0, "epoch_s": 104.0, "epoch_over_predicted": 1.04}
    rows = {n: r for n, *_, r in planner_rows(res)}
    assert rows["hybrid"] == 1.04 and rows["vertical"] == 1.0


def test_mapping_facts_on_two_placements():
    mf = mapping_facts([0, 1], generations=300)
    for row in mf.values():
        assert row["horizontal"]["all_equal"]
        for cls in ("vertical", "hybrid"):
            assert row[cls]["ga"] <= row[cls]["upper"] + 1e-9 and row[cls]["random"] <= row[cls]["upper"] + 1e-9
        assert not math.isnan(row["mean_prr"])


def test_side_groups_are_compared_with_hybrid_on_their_own_placements():
    res = results(h=(0.70, 0.90))  # Hybrid 70 % on placement 0, 90 % on placement 1
    for name, acc, tx in (("rtx", 0.75, "data_per_message"), ("ack", 0.80, "packets_per_message")):
        res["runs"][name] = [record(name, 0, acc)]
        res["runs"][name][0]["transmissions"][tx] = 2.0
    c = by_what(all_claims(res))
    assert c["rtx: test accuracy, %"].ours == pytest.approx(75.0) and c["rtx: transmissions per message"].ours == 2.0
    order = c["recovery helps: Ours < r-TX < ACK"]
    assert order.hit and "70.00 < 75.00 < 80.00" in order.ours  # against Hybrid's 70 % there, not its 80 % mean
