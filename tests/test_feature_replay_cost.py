"""The feature-replay cost model and decision engine against the paper's identities and the numbers
its profile tables give (notes section 6.2, AC-1)."""

from __future__ import annotations

import random

import pytest

from framework import profile_tables
from plugins.schedulers.feature_replay_cost import (
    MB, CutProfile, Deployment, TauEstimator, decide, full_pipeline_cost, grouped_cost, migration_cost, serial_cost, table_profile,
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
    from framework.config import DeviceConfig
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
