"""EdgePipe on the simulator (scheduler=super_neuron): message accounting against the ownership
model, exact arithmetic of the neuron-chunk ownership against a plain MLP, Eq. 3's staleness
under Eq. 2's schedule, the loss semantics of notes 2.10 (forward zero-fill, backward
all-or-nothing with cascade), and configuration errors."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from framework.errors import ConfigError
from framework.job import Job
from plugins.schedulers.edgepipe.partition import message_counts, messages, partition
from plugins.schedulers.edgepipe.plan import EdgePipePlan
from plugins.schedulers.edgepipe.roles import SuperNeuronSpec
from plugins.schedulers.edgepipe.timing import slots_for
from tests.conftest import compose_cfg
from tests.role_specs import assert_holds_no_scheduler, roles_from_shipped_specs

# 784-16-16-16-16-10 on 300 synthetic samples, minibatch 50: 6 minibatches per epoch
SIZES = [784, 16, 16, 16, 16, 10]
TINY = ["scheduler=super_neuron", "model=mlp", "model.depth=5", "model.hidden=16", "dataset=synthetic_mnist", "dataset.n_train=300",
        "dataset.n_val=100", "dataset.n_test=100", "cluster=edgepipe_rpi2", "train.batch_size=50", "train.epochs=1", "train.lr=0.05",
        "train.momentum=0.0", "train.checkpoint=false", "runtime.dtype=float64", "scheduler.generations=50"]
LOSSLESS = ["scheduler.prr.source=cluster"]  # the preset's links lose nothing


def job_for(tmp_path, overrides, name="run", prr=None):
    cfg = compose_cfg(TINY + list(overrides))
    if prr is not None:
        cfg.scheduler.prr.source = "given"
        cfg.scheduler.prr.matrix = prr.tolist()
    return Job(cfg, tmp_path / name)


def run(tmp_path, overrides, name="run", prr=None):
    job = job_for(tmp_path, overrides, name, prr)
    init = {k: v.clone() for k, v in job.model.state_dict().items()}
    job.run()
    return job, init, json.loads((job.out_dir / "summary.json").read_text())


def weights(job) -> list[torch.Tensor]:
    """W_2 .. W_L of the trained model (torch layout: out x in)."""
    sd = job.final_model().state_dict()
    return [sd[k] for k in sorted(sd) if k.endswith("weight")]


@pytest.mark.parametrize("kind", ["hybrid", "vertical", "horizontal"])
def test_lossless_message_counts_per_link_are_the_ownership_models(tmp_path, kind):
    job, _, summ = run(tmp_path, LOSSLESS + [f"scheduler.partition_class={kind}", "scheduler.mapping=ga"])
    plan = job.scheduler.plan()
    p = partition(SIZES, 6, kind)
    perm = plan["mapping"]["perm"]
    mb = job.scheduler.iterations_per_epoch()
    assert mb == 6
    expect = message_counts(p, perm=perm) * mb  # device space
    devs = job.scheduler.devices
    got = np.zeros_like(expect)
    for name, st in summ["links"].items():
        a, b = name.split("->")
        got[devs.index(a), devs.index(b)] = st["messages"]
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(np.array(summ["edgepipe"]["messages_sent_per_sn_pair"]), message_counts(p) * mb)
    assert summ["plan"]["messages_per_minibatch"] == plan["messages_per_minibatch"] == len(messages(p))
    assert summ["messages_lost"] == 0
    assert set(summ["edgepipe"]["bwd_applied"].values()) == {1.0} and set(summ["edgepipe"]["fwd_arrival"].values()) == {1.0}
    # the epoch takes the schedule's slots (Theorem 1 for uniform groups) on the slot clock
    slots = slots_for(p, mb, True)
    assert plan["slots_per_epoch"] == slots
    assert summ["virtual_time_s"] == pytest.approx(slots * plan["slot_s"], rel=1e-12)
    last_compute = max(iv.end for iv in job.runtime.timeline.intervals if iv.resource.startswith("sn"))
    assert (slots - 1) * plan["slot_s"] < last_compute <= slots * plan["slot_s"]


@pytest.mark.parametrize("kind,epochs,devices", [("hybrid", 2, 6), ("horizontal", 1, 6), ("vertical", 1, 1)])
def test_unpipelined_chunks_train_exactly_as_one_sequential_mlp(tmp_path, kind, epochs, devices):
    """pipeline=false, no loss: the neuron-chunk ownership (activation broadcast, backward partial
    products, per-chunk SGD with momentum and weight decay) is plain backprop, to 1e-10. (Vertical
    on one device is the Naive baseline.)"""
    over = LOSSLESS + [f"scheduler.partition_class={kind}", f"scheduler.n_devices={devices}", "scheduler.pipeline=false", f"train.epochs={epochs}", "train.momentum=0.9",
                       "train.weight_decay=0.001"]
    job = job_for(tmp_path, over)
    ref = copy.deepcopy(job.model)
    job.run()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=0.001)
    for epoch in range(epochs):
        for x, y in job.context.train_batches(epoch):
            opt.zero_grad()
            F.cross_entropy(ref(x), y).backward()
            opt.step()
    a, b = job.final_model().state_dict(), ref.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-10
    init = copy.deepcopy(job.model).state_dict()
    assert min(float((a[k] - init[k]).abs().max()) for k in a) > 1e-4  # every layer moved


def test_pipelined_staleness_follows_eq3(tmp_path):
    """Eq. 2 + Eq. 3: group w's gradient of minibatch j is taken at the weights its forward used,
    min(P - w, j - 1) updates before the latest, to which it is applied."""
    job, _, summ = run(tmp_path, LOSSLESS + ["scheduler.mapping=identity"])
    p = job.scheduler.partition
    assert p.P == 3
    seen = set()
    for role, st in job.runtime.role_stats.items():
        w = p.super_neurons[int(role[2:])].group
        log = st["stale_log"]
        assert len(log) == 6 * sum(1 for l in p.super_neurons[int(role[2:])].layers if l > 1)
        for layer, data, stale in log:
            assert stale == min(p.P - w, data - 1), (role, layer, data, stale)
            seen.add(stale)
    assert seen == {0, 1, 2}
    assert summ["staleness"]["max"] == 2
    # no stashing: the same schedule, other numbers (the partial products see newer weights)
    job2, _, _ = run(tmp_path, LOSSLESS + ["scheduler.mapping=identity", "scheduler.weight_stashing=false"], "nostash")
    assert max(float((a - b).abs().max()) for a, b in zip(weights(job), weights(job2))) > 1e-12


def prr_with(pairs) -> np.ndarray:
    m = np.ones((6, 6))
    for a, b in pairs:
        m[a, b] = 0.0
    return m


def test_lost_forward_slices_are_zero_filled(tmp_path):
    """Identity mapping. dev0 -> dev2 at PRR 0: sn2 never gets sn0's slice of H1 (neurons 0..7)
    for its H2 forward, so it computes as if those inputs were 0: its incoming weights from them
    never move; everything else trains, and sn0 still updates (sn2's partial is zero, not missing)."""
    base = LOSSLESS + ["scheduler.mapping=identity"]
    ref, init, _ = run(tmp_path, base, "ref")
    cut, _, summ = run(tmp_path, ["scheduler.mapping=identity"], "cut", prr=prr_with([(0, 2)]))
    k = "units.1.0.weight"  # W_3: H1 -> H2; sn2 holds rows 0..7, sn3 rows 8..15
    W_ref, W_cut, W0 = ref.final_model().state_dict()[k], cut.final_model().state_dict()[k], init[k]
    assert torch.equal(W_cut[0:8, 0:8], W0[0:8, 0:8])
    assert (W_cut[0:8, 8:16] - W0[0:8, 8:16]).abs().max() > 1e-6  # sn1's slice arrived
    assert (W_ref[0:8, 0:8] - W0[0:8, 0:8]).abs().max() > 1e-6  # lossless, the same weights train
    assert (W_cut[8:16, 0:8] - W0[8:16, 0:8]).abs().max() > 1e-6  # sn3 got sn0's slice
    assert summ["messages_lost"] == 6  # one message per minibatch on that link
    assert summ["edgepipe"]["fwd_arrival"]["2"] == pytest.approx(1 - 6 / 24)
    assert set(summ["edgepipe"]["bwd_applied"].values()) == {1.0}
    k2 = "units.0.1.weight"  # W_2 still trains on both group-1 devices
    assert (cut.final_model().state_dict()[k2] - init[k2]).abs().max() > 0
    # masked: sn2's partial for sn0 is the gradient of what sn2 computed (zero); phantom sends
    # delta W as if the slice had arrived, so sn0's H1 chunk (rows 0..7 of W_2) trains differently
    ph, _, _ = run(tmp_path, ["scheduler.mapping=identity", "scheduler.bwd_mode=phantom"], "phantom", prr=prr_with([(0, 2)]))
    W2_cut, W2_ph = cut.final_model().state_dict()[k2], ph.final_model().state_dict()[k2]
    assert (W2_cut[0:8] - W2_ph[0:8]).abs().max() > 1e-9
    assert torch.equal(W_cut[0:8, 0:8], ph.final_model().state_dict()[k][0:8, 0:8])  # the zero-filled input still gives no gradient


def test_backward_is_all_or_nothing_and_the_failure_cascades(tmp_path):
    """dev4 -> dev3 at PRR 0 drops sn4's partial dL/da_4 for sn3: sn3 cannot update its H3 chunk
    and sends nothing, so its own H2 chunk, sn2's H2 chunk (missing sn3's partial) and then all
    of H1 (missing both partials) stop; sn2's H3 chunk and the top layers still train."""
    job, init, summ = run(tmp_path, ["scheduler.mapping=identity"], prr=prr_with([(4, 3)]))
    sd = job.final_model().state_dict()
    for k in ("units.0.1.weight", "units.0.1.bias", "units.1.0.weight", "units.1.0.bias"):  # W_2, W_3: frozen
        assert torch.equal(sd[k], init[k]), k
    W4, W4_0 = sd["units.2.0.weight"], init["units.2.0.weight"]
    assert torch.equal(W4[8:16], W4_0[8:16])  # sn3's H3 chunk
    assert (W4[0:8] - W4_0[0:8]).abs().max() > 0  # sn2's
    for k in ("units.3.0.weight", "units.4.weight"):
        assert (sd[k] - init[k]).abs().max() > 0
    rate = summ["edgepipe"]["bwd_applied"]
    assert rate == {"2": 0.0, "3": 0.0, "4": 0.5, "5": 1.0, "6": 1.0}
    assert summ["messages_lost"] == 6


def test_a_missing_logit_share_is_zero_or_aborts_the_output_update(tmp_path):
    """dev5 -> dev4 at PRR 0: sn4 never sees sn5's logits. abort (default): sn4 updates nothing
    and sends nothing, so its H4 partials never reach the group below and the failure cascades,
    while sn5 (which hears sn4) trains on; zero_fill: sn4 still learns from its zero-filled view."""
    base = ["scheduler.mapping=identity"]
    zero, init, z = run(tmp_path, base + ["scheduler.share_missing=zero_fill"], "zero", prr=prr_with([(5, 4)]))
    abort, _, a = run(tmp_path, base, "abort", prr=prr_with([(5, 4)]))
    assert z["edgepipe"]["bwd_applied"]["6"] == 1.0 and a["edgepipe"]["bwd_applied"]["6"] == 0.5
    assert a["edgepipe"]["bwd_applied"]["5"] == 0.0  # every H4 holder misses sn4's partial
    W6, W6_0 = abort.final_model().state_dict()["units.4.weight"], init["units.4.weight"]
    assert torch.equal(W6[0:5], W6_0[0:5]) and (W6[5:10] - W6_0[5:10]).abs().max() > 0  # sn4's logits frozen, sn5's train
    assert (zero.final_model().state_dict()["units.4.weight"][0:5] - W6_0[0:5]).abs().max() > 0


def test_channel_prr_drives_the_links_and_the_mapping(tmp_path):
    job = job_for(tmp_path, ["scheduler.prr.topology_seed=3"])
    plan = job.scheduler.plan()
    true = np.array(plan["prr"]["true"])
    assert 0.3 < plan["prr"]["mean_true"] < 1.0
    devs = job.scheduler.devices
    for i, a in enumerate(devs):
        for j, b in enumerate(devs):
            if i != j:
                assert job.cluster.link(a, b).cfg.loss == pytest.approx(1 - true[i, j])
    assert sorted(plan["mapping"]["perm"]) == list(range(6)) and plan["mapping"]["method"] == "ga"


@pytest.mark.parametrize("key,value,choices", [("partition_class", "diagonal", "vertical, hybrid, horizontal"),
                                               ("mapping", "best", "ga, random, upper, identity"),
                                               ("bwd_mode", "ghost", "masked, phantom"), ("init", "he", "glorot, model"),
                                               ("recovery", "arq", "none, rtx, ack"), ("share_missing", "drop", "abort, zero_fill")])
def test_bad_choices_fail_before_running_naming_key_and_choices(tmp_path, key, value, choices):
    with pytest.raises(ConfigError) as e:
        job_for(tmp_path, [f"scheduler.{key}={value}"])
    assert e.value.key == f"scheduler.{key}"
    assert value in str(e.value) and choices in str(e.value)
    assert not (tmp_path / "run").exists()


def test_other_models_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="model"):
        Job(compose_cfg([o for o in TINY if not o.startswith("model")] + ["model=lenet"]), tmp_path / "run")


def test_rtx_sends_every_message_twice_and_the_receiver_keeps_one(tmp_path):
    base = LOSSLESS + ["scheduler.mapping=identity", "scheduler.lossy_test_passes=0"]
    one, _, s1 = run(tmp_path, base, "one")
    two, _, s2 = run(tmp_path, base + ["scheduler.recovery=rtx"], "two")
    sent = {k: v["messages"] for k, v in s1["links"].items()}
    assert {k: v["messages"] for k, v in s2["links"].items()} == {k: 2 * v for k, v in sent.items()}
    assert s2["edgepipe"]["messages_sent"] == s1["edgepipe"]["messages_sent"]  # distinct messages
    assert two.scheduler.plan()["worst_message_s"] == pytest.approx(2 * one.scheduler.plan()["worst_message_s"])
    a, b = one.final_model().state_dict(), two.final_model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # duplicates change nothing


def test_lossy_forward_matches_the_model_when_everything_arrives_and_zero_fills_otherwise():
    from plugins.schedulers.edgepipe.lossy_eval import lossy_logits, lossy_test

    torch.manual_seed(0)
    sizes = [12, 8, 8, 6]
    lins = [torch.nn.Linear(a, b).double() for a, b in zip(sizes, sizes[1:])]
    layers = [(m.weight.detach(), m.bias.detach()) for m in lins]
    x = torch.randn(20, 12, dtype=torch.float64)

    def forward(x):
        return lins[2](torch.relu(lins[1](torch.relu(lins[0](x)))))

    p = partition(sizes, 4, "hybrid")
    views = lossy_logits(p, layers, x, lambda *k: True)
    for v in views.values():
        assert torch.allclose(v, forward(x), atol=1e-12)
    # the fw message from sn0 (its slice of layer 2) to sn2 is lost: sn2 computes its chunk of
    # layer 3 with that slice zero; sn3's chunk, and everything sn2 forwards after, use the rest
    views = lossy_logits(p, layers, x, lambda *k: k != ("fw", 0, 2, 2))
    lo, hi = next((lo, hi) for s, lo, hi in p.holders(2) if s == 0)
    lo3, hi3 = next((lo, hi) for s, lo, hi in p.holders(3) if s == 2)
    h2 = torch.relu(lins[0](x))
    h2_cut = h2.clone()
    h2_cut[:, lo:hi] = 0
    h3 = torch.relu(lins[1](h2))
    h3[:, lo3:hi3] = torch.relu(lins[1](h2_cut))[:, lo3:hi3]
    out = lins[2](h3)
    good = forward(x)
    for v in views.values():
        assert torch.allclose(v, out, atol=1e-12) and not torch.allclose(v, good)
    y = good.argmax(1)
    prr = np.ones((4, 4))
    res = lossy_test(p, layers, x, y, prr, passes=3)
    assert res["acc"] == [1.0, 1.0, 1.0] and res["std"] == 0.0
    prr[0, 2] = 0.0
    res = lossy_test(p, layers, x, y, prr, passes=2)
    assert res["acc"][0] == res["acc"][1] == float((out.argmax(1) == y).double().mean())


def test_lossy_test_passes_are_recorded(tmp_path):
    job, _, summ = run(tmp_path, ["scheduler.mapping=identity", "scheduler.lossy_test_passes=5"], prr=prr_with([(0, 2), (4, 3)]))
    lossy = summ["edgepipe"]["lossy_test"]
    assert lossy["passes"] == 5 and len(lossy["acc"]) == 5 and lossy["std"] == 0.0  # PRR 0 or 1: every pass alike
    assert summ["metrics"]["test/lossy_acc_mean"] == lossy["mean"]
    ok, _, s_ok = run(tmp_path, LOSSLESS + ["scheduler.mapping=identity", "scheduler.lossy_test_passes=2"], "ok")
    assert s_ok["edgepipe"]["lossy_test"]["mean"] == pytest.approx(s_ok["metrics"]["test/acc"], abs=1e-12)  # lossless: the model's own accuracy
    _, _, s_v = run(tmp_path, LOSSLESS + ["scheduler.partition_class=vertical", "scheduler.lossy_test_passes=2"], "vertical")
    assert s_v["edgepipe"]["lossy_test"]["passes"] == 2  # its input-layer role holds no weights, so sends no state


def test_glorot_init_is_the_default_and_seeded(tmp_path):
    a = job_for(tmp_path, LOSSLESS, "a").model.state_dict()
    b = job_for(tmp_path, LOSSLESS, "b").model.state_dict()
    plain = job_for(tmp_path, LOSSLESS + ["scheduler.init=model"], "c").model.state_dict()
    for k, v in a.items():
        assert torch.equal(v, b[k])
        if k.endswith("bias"):
            assert not v.any() and plain[k].any()
        else:
            bound = (6.0 / sum(v.shape)) ** 0.5
            assert v.abs().max() <= bound and v.abs().max() > 0.9 * bound
            assert not torch.equal(v, plain[k])


def test_the_edgepipe_preset_is_the_papers_setting(tmp_path):
    """experiment=edgepipe (data shrunk: the real run reads Debian's Fashion-MNIST): six devices,
    the 784-128-128-128-128-10 MLP, Hybrid with M = 2, 28 messages per minibatch, a lossy channel."""
    cfg = compose_cfg(["experiment=edgepipe", "dataset=synthetic_mnist", "dataset.n_train=200", "dataset.n_val=50", "dataset.n_test=50",
                       "scheduler.generations=50", "scheduler.lossy_test_passes=2"])
    job = Job(cfg, tmp_path / "preset")
    assert [u.out_shape[0] for u in job.model.infos] == [128, 128, 128, 128, 10]
    job.run()
    summ = json.loads((job.out_dir / "summary.json").read_text())
    assert summ["plan"]["messages_per_minibatch"] == 28
    plan = json.loads((job.out_dir / "plan.json").read_text())
    assert len(job.scheduler.role_devices()) == 6 and job.scheduler.partition.m_layers == 2
    assert abs(summ["plan"]["mean_prr"] - 0.809) <= 0.01, summ["plan"]  # the calibrated channel (paper: 80.9 %)
    # the placement's source: the first seed with the paper's mean PRR, not any seed that does
    from plugins.schedulers.edgepipe.channel import calibrated_topology

    assert cfg.scheduler.prr.topology_seed == calibrated_topology().seed
    assert plan["partition"] and plan["mapping"] and plan["prr"] and plan["messages_per_minibatch"] == 28  # recorded for the timeline and reports


def test_a_time_budget_trains_theorem1s_minibatches_across_data_epochs(tmp_path):
    """budget_min on a fixed 1 s slot, unpipelined (2L - 1 = 11 slots a minibatch): 150 slots hold
    1 + (150 - 11) // 11 = 13 minibatches, two data epochs of 6 and one minibatch of the third, as
    one continuous schedule; no loss, so the weights are plain SGD over those 13 minibatches."""
    over = LOSSLESS + ["scheduler.pipeline=false", "scheduler.slot_s=1.0", "scheduler.budget_min=2.5", "scheduler.lossy_test_passes=0"]
    job = job_for(tmp_path, over)
    ref = copy.deepcopy(job.model)
    job.run()
    summ = json.loads((job.out_dir / "summary.json").read_text())
    plan = json.loads((job.out_dir / "plan.json").read_text())
    n = 1 + (int(2.5 * 60 / 1.0) - 11) // 11
    assert n == 13 and plan["budget"]["minibatches"] == n and summ["edgepipe"]["budget"]["minibatches"] == n
    assert plan["budget"] == {"budget_min": 2.5, "minibatches": 13, "slots": 143, "predicted_s": 143.0, "data_epochs": 3,
                              "paper_epoch_step": [3, 1], "minibatches_per_data_epoch": 6}
    assert summ["iterations"] == n and summ["virtual_time_s"] == pytest.approx(143.0, rel=1e-12)  # <= the budget's 150 s
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    done = 0
    for epoch in range(3):
        for x, y in job.context.train_batches(epoch)[: n - done]:
            opt.zero_grad()
            F.cross_entropy(ref(x), y).backward()
            opt.step()
            done += 1
    a, b = job.final_model().state_dict(), ref.state_dict()
    assert done == n and max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-10
    # pipelined Hybrid: 11 slots for the first minibatch, then one per 2M = 4 slots (Theorem 1)
    piped = job_for(tmp_path, LOSSLESS + ["scheduler.slot_s=1.0", "scheduler.budget_min=1.0"], "piped").scheduler.plan()
    assert piped["budget"]["minibatches"] == 1 + (60 - 11) // 4 == 13 and piped["budget"]["slots"] == 59
    with pytest.raises(ConfigError, match="train.epochs"):
        job_for(tmp_path, ["scheduler.budget_min=1.0", "train.epochs=2"], "two")
    with pytest.raises(ConfigError, match="budget_min"):
        job_for(tmp_path, ["scheduler.slot_s=1.0", "scheduler.budget_min=0.1"], "short")  # 6 slots < the first minibatch's 11


def test_ack_retransmits_lost_messages_and_counts_its_frames(tmp_path):
    """recovery=ack (the links' bounded ARQ): on lossless links one data frame and one ACK per
    message and the same training as without recovery; on PRR 0.8 links (data and ACKs) ~1.5 data
    frames and ~2.6 frames with ACKs per message (the study's gate: [1.5, 3]), almost every message delivered,
    and every layer's applied-update fraction at least that without recovery."""
    base = ["scheduler.mapping=identity", "scheduler.lossy_test_passes=0"]
    plain, _, s0 = run(tmp_path, LOSSLESS + base, "plain")
    ack, _, s1 = run(tmp_path, LOSSLESS + base + ["scheduler.recovery=ack"], "ack")
    t = s1["edgepipe"]["transmissions"]
    assert t["recovery"] == "ack" and t["data_per_message"] == 1.0 and t["packets_per_message"] == 2.0 and t["delivered_frac"] == 1.0
    assert s0["edgepipe"]["transmissions"]["data_per_message"] == s0["edgepipe"]["transmissions"]["packets_per_message"] == 1.0
    a, b = plain.final_model().state_dict(), ack.final_model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ack.scheduler.plan()["max_transmissions_per_message"] == 4
    prr = np.full((6, 6), 0.8)
    _, _, lossy = run(tmp_path, base, "lossy", prr=prr)
    _, _, rec = run(tmp_path, base + ["scheduler.recovery=ack"], "lossy_ack", prr=prr)
    t = rec["edgepipe"]["transmissions"]
    assert 1.0 < t["data_per_message"] <= 4 and 1.5 <= t["packets_per_message"] <= 3.0, t
    assert t["delivered_frac"] > 0.99 and lossy["messages_lost"] > 0
    assert rec["messages_lost"] == round(t["messages"] * (1 - t["delivered_frac"]))  # the links' count of undelivered messages
    links = rec["links"].values()
    assert t["data_frames"] - t["ack_frames"] == sum(st["lost"] for st in links) > 0  # every frame that arrived was ACKed
    assert sum(st["duplicates"] for st in links) > 0  # lost ACKs made the link send a received frame again
    for k in ("bwd_applied", "fwd_arrival"):
        assert all(rec["edgepipe"][k][l] >= lossy["edgepipe"][k][l] for l in lossy["edgepipe"][k]), (k, rec["edgepipe"][k], lossy["edgepipe"][k])
    _, _, rtx = run(tmp_path, base + ["scheduler.recovery=rtx"], "lossy_rtx", prr=prr)
    assert rtx["edgepipe"]["transmissions"]["data_per_message"] == rtx["edgepipe"]["transmissions"]["packets_per_message"] == 2.0
    # the plan's epoch (Theorem 1's slots x a slot sized for every retry) is the simulated one,
    # however many retries the lossy links took
    for summ in (s0, s1, lossy, rec, rtx):
        assert summ["prediction"]["epoch_over_predicted"] == pytest.approx(1.0, abs=1e-12), summ["prediction"]


@pytest.mark.parametrize("predictor", ["oracle", "flops"])
def test_neuron_chunks_are_priced_as_their_share_of_layer_work(tmp_path, predictor):
    """A chunk is layer work with `share` = its neurons / the layer's (no opaque seconds): the
    predictor prices it as it prices the layer, times the share, and the slot follows."""
    from framework.cluster import Work

    job = job_for(tmp_path, LOSSLESS + [f"predictor={predictor}"])
    sched, pred = job.scheduler, job.predictor
    for s, sn in enumerate(sched.partition.super_neurons):
        dev = job.cluster.device(sched.devices[sched.perm[s]])
        for layer, lo, hi in sn.chunks:
            works = sched.op_works(s)[("BW", layer)]
            if layer < 2:
                assert works == []
                continue
            share = (hi - lo) / SIZES[layer - 1]
            assert all(w.seconds is None and w.share == share and (w.start, w.stop) == (layer - 2, layer - 1) for w in works)
            whole = sum(pred.predict(dev, Work(w.kind, w.start, w.stop, w.batch)) for w in works)
            assert sched.op_seconds(s, sched.perm)[("BW", layer)] == pytest.approx(share * whole, rel=1e-12)
    worst = max(t for s in range(len(sched.perm)) for t in sched.op_seconds(s, sched.perm).values())
    assert sched.plan()["worst_op_s"] == pytest.approx(worst)


@pytest.mark.parametrize("overrides", [["scheduler.recovery=ack", "scheduler.slot_s=1.0", "scheduler.budget_min=1.0", "scheduler.eval_every_min=0.25"],
                                       ["scheduler.recovery=rtx", "scheduler.pipeline=false"]], ids=["ack-budget-curve", "rtx-epochs"])
def test_super_neurons_are_built_from_their_specs_alone(tmp_path, overrides):
    """Issue 45: every super neuron is built from its spec's JSON and the run's parts, holds no
    reference to the scheduler, and its spec (and the plan) come back equal from JSON."""
    job = job_for(tmp_path, overrides)
    sched = job.scheduler
    plan = sched.typed_plan()
    assert EdgePipePlan.from_json(json.loads(json.dumps(sched.plan()))) == plan
    roles = roles_from_shipped_specs(sched)
    assert sorted(roles) == [f"sn{s}" for s in range(6)]
    for name, role in roles.items():
        assert_holds_no_scheduler(role, sched)
        spec = role.spec
        assert isinstance(spec, SuperNeuronSpec) and spec.partition == sched.partition and spec.device == plan.mapping.devices[name]
        assert spec.slot_s == plan.slot_s and spec.pipeline == sched.cfg.pipeline
        assert (spec.recovery.copies, spec.recovery.retries) == ((1, 3) if sched.cfg.recovery == "ack" else (2, 0))
        assert spec.budget_minibatches == (plan.budget.minibatches if plan.budget else None)
        assert spec.snapshot_slots == (plan.eval.at_slots if plan.eval else None)
    job.run()  # the roles the runtime built the same way train
