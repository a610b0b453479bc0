"""The feature-replay cost model and decision engine against the paper's identities and the numbers
its profile tables give (notes section 6.2, AC-1)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from framework import profile_tables
from plugins.schedulers.feature_replay.cost import (
    MB,
    CutProfile,
    Deployment,
    TauEstimator,
    decide,
    full_pipeline_cost,
    grouped_cost,
    migration_cost,
    serial_cost,
    table_profile,
)

RESNET50_BLOCK_MB = [0.007, 0.286, 0.269, 0.269, 1.447, 1.068, 1.068, 1.068, 5.770, 4.262, 4.262, 4.262, 4.262, 4.262, 23.039, 17.023, 17.023, 0.0, 0.078]


def test_grouped_cost_is_serial_at_k0_and_the_full_pipeline_without_a_bound():
    rng = random.Random(0)
    for _ in range(1000):
        T = [rng.uniform(1e-3, 5.0) for _ in range(4)]
        tau = rng.randint(1, 500)
        assert grouped_cost(T, 0, tau) == pytest.approx(serial_cost(T, tau), abs=1e-9, rel=0)
        assert grouped_cost(T, 10**9, tau) == pytest.approx(full_pipeline_cost(T, tau), abs=1e-9, rel=0)
        assert grouped_cost(T, None, tau) == full_pipeline_cost(T, tau)
        # more staleness never costs more, and four modules gain at most 4x
        assert grouped_cost(T, 5, tau) <= grouped_cost(T, 2, tau) + 1e-9
        assert serial_cost(T, tau) / full_pipeline_cost(T, tau) <= 4.0 + 1e-9


def test_pi_resnet50_case_predicts_the_papers_latency_and_saving():
    """Pi 4B, ResNet-50/CIFAR-10, cut after the first block, 8 bits, 5/10 MB/s, tau = 100, K = 5:
    81.3 s per 100 iterations against 4847 s edge-only (the paper: 'saving up to 97.6%')."""
    prof = table_profile(profile_tables.load("feature_replay_resnet50_cifar10"), "pi4b", "rtx2080ti")
    T = prof.module_times(1, 8, 5 * MB, 10 * MB)
    assert T == pytest.approx((0.5449 + 0.247, 0.4, 0.1148, 0.8))
    k5 = grouped_cost(T, 5, 100)
    assert k5 == pytest.approx(81.3, abs=0.5)
    assert serial_cost(T, 100) == pytest.approx(210.7, abs=0.5)
    edge_only = prof.edge_s[-1] * 100
    assert edge_only == pytest.approx(4847, abs=1)
    assert 1 - k5 / edge_only >= 0.976


def test_tx2_resnet50_goes_edge_only_on_a_slow_link_and_offloads_on_a_fast_one():
    table = profile_tables.load("feature_replay_resnet50_cifar10")
    for blocks, start in (([0.0] * 19, None), ([mb * MB for mb in RESNET50_BLOCK_MB], 19)):
        prof = table_profile(table, "tx2", "rtx2080ti", blocks)
        for up, expect in ((2.5, 19), (12.5, 1)):
            current = Deployment(start, 32) if start else Deployment(expect, 8 if expect < 19 else 32)
            d = decide(prof, current, 5, up * MB, 2 * up * MB, 100)
            assert d.deployment.cut == expect, (up, d.deployment, sorted(d.candidates, key=lambda c: c[2])[:3])
            d = decide(prof, current, 5, up * MB, 2 * up * MB, 100, bits_candidates=(8, 32))
            assert d.deployment.cut == expect
    # the Pi offloads at the first cut on any link from 0.5 MB/s up
    pi = table_profile(table, "pi4b", "rtx2080ti", [mb * MB for mb in RESNET50_BLOCK_MB])
    for up in (0.5, 1, 5, 12.5):
        assert decide(pi, Deployment(1, 8), 5, up * MB, 2 * up * MB, 100).deployment.cut == 1


def test_migration_cost_moves_the_blocks_between_the_cuts_over_the_link_they_cross():
    blocks = [1.0, 2.0, 4.0, 8.0]
    assert migration_cost(blocks, 1, 3, 1.0, 2.0) == (2.0 + 4.0) / 2.0  # blocks 2-3 come down
    assert migration_cost(blocks, 3, 1, 1.0, 2.0) == (2.0 + 4.0) / 1.0  # and go back up
    assert migration_cost(blocks, 2, 2, 1.0, 2.0) == 0.0


def test_a_large_migration_cost_keeps_the_current_deployment():
    prof = CutProfile([1.0, 1.0, 3.0], [1.0, 1.0, 0.0], [4.0, 1.0], lambda c, b: 0.0, [1.0, 1e6, 1.0])
    # cut 2 sends less, but moving block 2 costs far more than it saves over tau iterations
    d = decide(prof, Deployment(1, 32), None, 1.0, 1.0, 10, bits_candidates=(32,))
    assert d.deployment == Deployment(1, 32)
    d = decide(prof, Deployment(1, 32), None, 1.0, 1.0, 10, bits_candidates=(32,), include_edge_only=False)
    assert d.deployment == Deployment(1, 32)
    cheap = CutProfile([1.0, 1.0, 3.0], [1.0, 1.0, 0.0], [4.0, 1.0], lambda c, b: 0.0, [1.0, 1.0, 1.0])
    assert decide(cheap, Deployment(1, 32), None, 1.0, 1.0, 10, bits_candidates=(32,)).deployment == Deployment(2, 32)


def test_min_bits_and_edge_only_flag_restrict_the_candidates():
    prof = CutProfile([0.1, 500.0], [0.1, 0.0], [32.0], lambda c, b: 0.0, [0.0, 0.0], min_bits=[8])
    d = decide(prof, Deployment(1, 32), 0, 1.0, 1.0, 10)
    assert {(c, b) for c, b, _ in d.candidates} == {(1, 8), (1, 16), (1, 32), (2, 32)}
    assert d.deployment == Deployment(1, 8)
    assert all(c < 2 for c, _, _ in decide(prof, Deployment(1, 32), 0, 1.0, 1.0, 10, include_edge_only=False).candidates)


def test_tau_is_the_codes_every_iteration_ewma():
    est = TauEstimator(100.0)
    assert est.update(False) == pytest.approx(0.8 * 100 + 0.2 * 2)
    assert est.update(True) == pytest.approx(0.8 * (0.8 * 100 + 0.2 * 2) + 0.2 * 1)
    for _ in range(200):
        est.update(False)
    assert est.tau > 150  # with no re-deployment tau grows with the iterations since the last one


def test_the_table_time_model_prices_unit_ranges_from_the_shipped_rows():
    from framework.cluster import Device, Work
    from framework.config.schemas import DeviceConfig
    from framework.errors import ConfigError

    pi = Device("edge", DeviceConfig(time_model="table", table="feature_replay_resnet50_cifar10", table_device="pi4b"))
    gpu = Device("cloud", DeviceConfig(time_model="table", table="feature_replay_resnet50_cifar10", table_device="rtx2080ti"))
    assert pi.time(Work("fwd", 0, 1, 32)) + pi.time(Work("bwd", 0, 1, 32)) == pytest.approx(0.5449)
    assert pi.time(Work("fwd", 0, 1, 32)) == pytest.approx(0.5449 / 3)
    assert pi.time(Work("fwd", 0, 1, 16)) == pytest.approx(0.5449 / 6)  # linear in the batch
    assert pi.time(Work("step", 0, 1)) == 0.0  # inside the measured iteration
    assert pi.time(Work("bwd", 1, 3, 32)) == pytest.approx((7.459 - 0.5449) * 2 / 3)
    assert gpu.time(Work("fwd", 1, 19, 32)) + gpu.time(Work("bwd", 1, 19, 32)) == pytest.approx(0.1148)
    assert gpu.time(Work("fwd", 1, 3, 32)) == pytest.approx((0.1148 - 0.09883) / 3)
    with pytest.raises(ConfigError, match="table_device.*choices: pi4b, tx2, rtx2080ti"):
        Device("edge", DeviceConfig(time_model="table", table="feature_replay_resnet50_cifar10", table_device="jetson"))
    with pytest.raises(ConfigError, match="no profile table 'nope'; choices: .*feature_replay_resnet50_cifar10"):
        Device("edge", DeviceConfig(time_model="table", table="nope", table_device="pi4b"))


# ---- the policy-aware cost model (feature_replay.pipeline) ---------------------------------------

def _stages(rng, latency=True):
    from plugins.schedulers.feature_replay.pipeline import Stages

    u = lambda: rng.uniform(0.01, 2.0)  # noqa: E731
    return Stages(forward_s=u(), encode_s=rng.choice([0.0, u()]), replay_s=u(), up_s=u(), cloud_s=u(), cloud_step_s=rng.choice([0.0, u()]), down_s=u(),
                  up_latency_s=u() if latency else 0.0, down_latency_s=u() if latency else 0.0)


def test_the_walk_is_serial_at_k0_and_bounded_by_the_slowest_module_without_a_bound():
    from plugins.schedulers.feature_replay.pipeline import epoch_seconds

    rng = random.Random(1)
    for _ in range(300):
        st = dataclasses.replace(_stages(rng, latency=False), cloud_step_s=0.0)  # (the cloud's step overlaps the way back)
        T = st.paper_modules
        tau = rng.randint(1, 200)
        for policy in ("block", "fixed", "group"):
            assert epoch_seconds(st, 0, policy, tau, exact=True) == pytest.approx(serial_cost(T, tau), rel=1e-9)
        full = epoch_seconds(st, None, "block", tau, exact=True)
        assert full >= tau * max(T) - 1e-9  # no module works faster than its time
        assert full <= serial_cost(T, tau) + 1e-9


def test_the_group_barrier_refills_the_pipeline_every_group():
    """Groups of K + 1 on a link-bound pipeline: each group takes one batch's way through every
    module plus K more downlink transfers (the bottleneck), which Eq. 12 does not charge."""
    from plugins.schedulers.feature_replay.pipeline import Stages, epoch_seconds

    st = Stages(forward_s=0.1, encode_s=0.0, replay_s=0.2, up_s=0.3, cloud_s=0.1, cloud_step_s=0.0, down_s=1.0)
    K, groups = 1, 20
    one_group = 0.1 + 0.3 + 0.1 + (K + 1) * 1.0 + 0.2
    tau = groups * (K + 1)
    assert epoch_seconds(st, K, "group", tau, exact=True) == pytest.approx(groups * one_group)
    # the sliding window keeps the downlink busy: Eq. 12's price, 25% less
    assert epoch_seconds(st, K, "block", tau, exact=True) == pytest.approx(grouped_cost(st.paper_modules, K, tau))
    assert grouped_cost(st.paper_modules, K, tau) < 0.8 * groups * one_group


def test_discarded_gradients_cost_no_replay():
    """At K = 0 under `discard`, every gradient comes back after the next forward and is dropped:
    the edge only forwards, so the epoch is the links' and the cloud's, not P1's."""
    from plugins.schedulers.feature_replay.pipeline import Stages, epoch_seconds

    st = Stages(forward_s=0.1, encode_s=0.0, replay_s=5.0, up_s=0.5, cloud_s=0.1, cloud_step_s=0.0, down_s=0.2)
    assert epoch_seconds(st, 0, "discard", 100, exact=True) < 0.6 * 100
    assert epoch_seconds(st, 0, "block", 100, exact=True) == pytest.approx(100 * (0.1 + 5.0 + 0.5 + 0.1 + 0.2))


def test_long_epochs_extrapolate_the_periodic_regime():
    from plugins.schedulers.feature_replay.pipeline import epoch_seconds

    rng = random.Random(2)
    for _ in range(150):
        st = _stages(rng)
        K = rng.choice([0, 1, 2, 5, 8, None])
        policy = rng.choice(["block", "fixed", "group", "discard"])
        tau = rng.randint(257, 2000)
        assert epoch_seconds(st, K, policy, tau) == pytest.approx(epoch_seconds(st, K, policy, tau, exact=True), rel=0.01), (st, K, policy, tau)
    with pytest.raises(ValueError, match="choices: block, fixed, group, discard"):
        epoch_seconds(st, 1, "lazy", 10)


def test_the_engine_takes_the_cost_model_it_is_given():
    """The policy-aware engine makes the paper's choices on its tables (edge-only for the TX2 on a
    slow link, the first cut on a fast one; the Pi offloads) with the replay's forward charged;
    Eq. 12 stays the default of `decide` (Alg. 2 as printed)."""
    from plugins.schedulers.feature_replay.pipeline import policy_cost

    table = profile_tables.load("feature_replay_resnet50_cifar10")
    blocks = [mb * MB for mb in RESNET50_BLOCK_MB]
    for policy in ("block", "group", "discard"):
        tx2 = table_profile(table, "tx2", "rtx2080ti", blocks, forward_fraction=1 / 3, price_replay=True)
        for up, expect in ((2.5, 19), (12.5, 1)):
            assert decide(tx2, Deployment(19, 32), 5, up * MB, 2 * up * MB, 100, bits_candidates=(8, 32), model=policy_cost(policy)).deployment.cut == expect
        pi = table_profile(table, "pi4b", "rtx2080ti", blocks, forward_fraction=1 / 3, price_replay=True)
        assert decide(pi, Deployment(19, 32), 5, 0.5 * MB, MB, 100, model=policy_cost(policy)).deployment.cut == 1
    # the group barrier's cost is what the policy-aware engine sees and Eq. 12 does not
    prof = table_profile(table, "pi4b", "rtx2080ti", forward_fraction=1 / 3, price_replay=True)
    dep = Deployment(1, 8)
    walked = policy_cost("group")(prof, dep, 1, 5 * MB, 10 * MB, 100)
    assert walked > 1.2 * grouped_cost(prof.module_times(1, 8, 5 * MB, 10 * MB), 1, 100)
    assert decide(prof, dep, 1, 5 * MB, 10 * MB, 100, bits_candidates=(8,), include_edge_only=False).cost == pytest.approx(
        grouped_cost(prof.module_times(1, 8, 5 * MB, 10 * MB), 1, 100))
    with pytest.raises(ValueError, match="send share"):
        policy_cost("block")(table_profile(table, "pi4b", "rtx2080ti"), dep, 5, MB, MB, 10)
