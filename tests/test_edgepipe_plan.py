"""EdgePipe's planning layer (partition, channel, mapping, slot timing) against the paper's numbers
and the notes' acceptance checks (edgepipe.notes.md section 6.2, items 1-3)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from plugins.schedulers.edgepipe.channel import (
    as_prr_matrix, calibrated_topology, k_from_radio, mean_prr, measure_prr, prr_from_distance, prr_matrix, random_positions,
    random_topology, uniform_prr,
)
from plugins.schedulers.edgepipe.mapping import (
    all_scores, canonical, ga_mapping, map_devices, random_baseline_score, random_mappings, score, twin_classes, upper_mapping,
)
from plugins.schedulers.edgepipe.partition import (
    devices_per_group, elect_coordinator, etx_distances, max_message_width, message_counts, messages, neuron_chunks, paper_groups,
    partition, snnet,
)
from plugins.schedulers.edgepipe.timing import (
    Op, check_schedule, cycle_slots, device_timeline, minibatches_in_budget, packets_per_device_per_s, schedule, slots_for,
    table_ii_slot_ms, theorem1_slots, throughput_ratio, time_for_s, total_slots,
)

DNN = [784, 128, 128, 128, 128, 10]
KINDS = ("vertical", "hybrid", "horizontal")


@pytest.fixture(scope="module")
def parts():
    out = {k: partition(DNN, 6, k) for k in KINDS}
    out["naive"] = partition(DNN, 1, "vertical")
    return out


# --- item 1: partition and traffic accounting -------------------------------------------------------

def test_algorithm1_on_the_main_dnn_gives_the_papers_groups_devices_and_chunks(parts):
    h = parts["hybrid"]
    assert h.m_layers == 2 and h.P == 3 and h.effective_class == "hybrid"
    assert h.groups == ((1, 2), (3, 4), (5, 6))
    assert h.devices == (2, 2, 2)
    sizes = [[hi - lo for _, lo, hi in sn.chunks] for sn in h.super_neurons]
    assert sizes == [[392, 64], [392, 64], [64, 64], [64, 64], [64, 5], [64, 5]]  # notes 2.4 table
    assert [(sn.group, sn.h) for sn in h.super_neurons] == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    assert parts["vertical"].groups == tuple((l,) for l in range(1, 7)) and parts["vertical"].devices == (1,) * 6
    assert parts["horizontal"].groups == ((1, 2, 3, 4, 5, 6),) and parts["horizontal"].devices == (6,)
    # every neuron of every layer is held by exactly one super neuron
    for p in parts.values():
        for l, n in enumerate(DNN, start=1):
            held = sorted((lo, hi) for _, lo, hi in p.holders(l))
            assert held[0][0] == 0 and held[-1][1] == n and all(a[1] == b[0] for a, b in zip(held, held[1:]))


def test_message_widths_and_counts_per_minibatch_match_eq4_and_section_4b(parts):
    assert [max_message_width(parts[k]) for k in KINDS] == [784, 392, 131]
    assert [len(messages(parts[k])) for k in KINDS] == [9, 28, 300]
    assert max_message_width(parts["naive"]) == 0 and messages(parts["naive"]) == []
    c = message_counts(parts["hybrid"])
    expect = np.array([[0, 1, 1, 1, 0, 0], [1, 0, 1, 1, 0, 0], [1, 1, 0, 2, 1, 1],
                       [1, 1, 2, 0, 1, 1], [0, 0, 1, 1, 0, 3], [0, 0, 1, 1, 3, 0]])
    np.testing.assert_array_equal(c, expect)  # notes 2.6
    assert c[4, 5] == c[5, 4] == c.max() == 3  # Dev5 <-> Dev6: forward, backward, output sharing
    assert c[2, 3] == 2  # Dev3 -> Dev4: one forward, one backward
    assert message_counts(parts["hybrid"], ("share",))[4, 5] == 1
    s = snnet(parts["hybrid"])
    assert s.max() == 1.0 and s[2, 3] == pytest.approx(2 / 3) and not s.diagonal().any()
    v = message_counts(parts["vertical"])
    assert v.sum() == 9 and v[0, 1] == 1 and v[1, 0] == 0  # the input layer gets no gradient
    assert (v + v.T).astype(bool).sum() == 10  # a chain: 5 undirected links
    hz = message_counts(parts["horizontal"])
    assert (hz + np.eye(6, dtype=int) * 10 == 10).all()  # every off-diagonal pair exchanges 10
    # counts in device space under a mapping are the same matrix, reindexed
    perm = [3, 0, 5, 1, 4, 2]
    d = message_counts(parts["hybrid"], perm=perm)
    assert all(d[perm[s], perm[t]] == c[s, t] for s in range(6) for t in range(6))


def test_every_message_carries_its_owners_slice(parts):
    for p in parts.values():
        chunk = {(s, l): hi - lo for l in range(1, p.L + 1) for s, lo, hi in p.holders(l)}
        for m in messages(p):
            assert m.src != m.dst
            if m.kind == "fw":
                assert m.dst_layer == m.src_layer + 1 and m.width == chunk[(m.src, m.src_layer)] and (m.dst, m.dst_layer) in chunk
            elif m.kind == "bw":
                assert m.src_layer == m.dst_layer + 1 and m.dst_layer >= 2 and m.width == chunk[(m.dst, m.dst_layer)]
            else:
                assert m.src_layer == m.dst_layer == p.L and m.width == chunk[(m.src, p.L)]


@pytest.mark.parametrize("L", [3, 4, 6, 7])
@pytest.mark.parametrize("N", [2, 3, 5, 6, 8])
def test_horizontal_message_count_is_quadratic_in_devices(L, N):
    p = partition([20] * L, N, "horizontal")
    # (L-1) forward and (L-2) backward transitions plus output sharing, each N(N-1) messages
    assert len(messages(p)) == N * (N - 1) * (2 * L - 2)


def test_hybrid_sends_375_packets_per_second_per_device(parts):
    assert packets_per_device_per_s(parts["hybrid"]) == pytest.approx(3.75, abs=0.01)
    assert packets_per_device_per_s(parts["vertical"]) == pytest.approx(9 / 6 / (2 * 0.54177), abs=0.01)


def test_hybrid_edge_cases_become_vertical_or_horizontal():
    for N in (2, 3):  # floor(N/2) = 1: M = L
        p = partition(DNN, N, "hybrid")
        assert p.effective_class == "horizontal" and p.groups == ((1, 2, 3, 4, 5, 6),)
    for N in (12, 13, 20):  # N >= 2L: M = 1, every layer still shared by >= 2 devices
        p = partition([30] * 6, N, "hybrid")
        assert p.effective_class == "vertical" and p.m_layers == 1 and sum(p.devices) == N and min(p.devices) >= 2
    assert partition([30] * 6, 20, "hybrid").notes  # the M = 0 repair fired and was recorded


def test_literal_rounding_reproduces_the_notes_inconsistent_sums_and_the_repair_fixes_them():
    # notes 2.4's list for the paper's round() (Python's, half to even)
    expect = {(6, 5): [2, 2], (6, 7): [2, 2, 2], (6, 9): [2, 2, 3, 3], (6, 10): [2, 2, 2, 2, 3],
              (7, 6): [2, 2, 3], (4, 6): [2, 2, 3], (5, 6): [1, 2, 2], (6, 8): [1, 1, 3, 3]}
    for (L, N), devs in expect.items():
        assert devices_per_group(paper_groups(L, N), N, "half_even") == devs
        if sum(devs) != N:
            with pytest.raises(ValueError, match="rounding='hamilton'"):
                partition([16] * L, N, "hybrid", rounding="half_even")
    # (6, 8) sums to N but leaves layers 1 and 2 on one device each, against "at least two devices per layer"
    assert paper_groups(6, 8) == [[1], [2], [3, 4], [5, 6]]
    assert partition([16] * 6, 8, "hybrid", rounding="half_even").devices == (1, 1, 3, 3)
    assert partition([16] * 6, 8, "hybrid").devices == (2, 2, 2, 2)
    assert devices_per_group(paper_groups(6, 5), 5, "half_up") == [3, 3]  # half-up misses too
    # the default repair: sum N, every group >= 2 devices, identical where the literal rule is consistent
    consistent = set()
    for L in range(4, 11):
        for N in range(2, 13):
            p = partition([16] * L, N, "hybrid")
            assert sum(p.devices) == N == len(p.super_neurons)
            assert min(p.devices) >= 2 or p.P == 1 and N >= 2
            literal = devices_per_group(paper_groups(L, N), N, "half_up") if N // 2 <= L else [0]
            if sum(literal) == N and min(literal) >= min(2, N):  # the rule is consistent: no repair
                assert list(p.devices) == literal and [list(g) for g in p.groups] == paper_groups(L, N) and not p.notes
                consistent.add((L, N))
    # the notes' list of consistent configurations (N >= 4) is among them
    assert {(L, L) for L in range(4, 11)} | {(6, 6), (8, 6), (9, 6), (10, 6), (6, 4)} <= consistent
    assert partition([16] * 7, 6).groups == ((1, 2), (3, 4), (5, 6, 7))  # the spare layer goes to the output side


def test_explicit_m_layers_spans_vertical_to_horizontal():
    m1, m6 = partition(DNN, 6, "hybrid", m_layers=1), partition(DNN, 6, "hybrid", m_layers=6)
    assert (m1.groups, m1.devices) == (partition(DNN, 6, "vertical").groups, partition(DNN, 6, "vertical").devices)
    assert (m6.groups, m6.devices) == (partition(DNN, 6, "horizontal").groups, partition(DNN, 6, "horizontal").devices)
    assert len(messages(m1)) == 9 and len(messages(m6)) == 300
    assert partition(DNN, 6, "hybrid", m_layers=3).groups == ((1, 2, 3), (4, 5, 6))
    m4 = partition(DNN, 6, "hybrid", m_layers=4)
    assert m4.groups == ((1, 2, 3, 4), (5, 6)) and m4.devices == (4, 2) and m4.m_layers == 4
    with pytest.raises(ValueError, match="m_layers"):
        partition(DNN, 6, "hybrid", m_layers=7)


def test_vertical_with_fewer_or_more_devices_than_layers():
    p = partition(DNN, 4, "vertical")
    assert p.groups == ((1,), (2,), (3, 4), (5, 6)) and p.devices == (1, 1, 1, 1)
    q = partition(DNN, 8, "vertical")
    assert q.groups == tuple((l,) for l in range(1, 7)) and q.devices == (1, 1, 1, 1, 2, 2)
    naive = partition(DNN, 1, "vertical")
    assert naive.P == 1 and len(naive.super_neurons) == 1


def test_neuron_chunks_are_balanced_and_contiguous():
    for n in (10, 128, 784, 1000):
        for k in range(1, 11):
            ch = neuron_chunks(n, k)
            widths = [hi - lo for lo, hi in ch]
            assert ch[0][0] == 0 and ch[-1][1] == n and all(a[1] == b[0] for a, b in zip(ch, ch[1:]))
            assert max(widths) - min(widths) <= 1 and widths == sorted(widths, reverse=True)
    assert max(hi - lo for lo, hi in neuron_chunks(784, 6)) == 131
    with pytest.raises(ValueError):
        neuron_chunks(3, 4)


def test_coordinator_is_the_closest_device_by_etx():
    prr = np.full((5, 5), 0.2)
    prr[2, :] = prr[:, 2] = 0.95  # device 2 hears and is heard by everyone well
    assert elect_coordinator(as_prr_matrix(prr)) == 2
    # relaying through good links beats a poor direct one
    chain = as_prr_matrix([[1, 0.9, 0.05], [0.9, 1, 0.9], [0.05, 0.9, 1]])
    assert etx_distances(chain)[0, 2] == pytest.approx(2 / 0.9)
    assert elect_coordinator(chain) == 1
    assert elect_coordinator(uniform_prr(6, 0.8)) == 0  # ties: lowest index
    # a device nobody can reach from cannot coordinate
    cut = np.full((4, 4), 0.9)
    cut[0, 1:] = 0.0
    assert elect_coordinator(as_prr_matrix(cut)) != 0
    bi = np.full((3, 3), 0.9)
    bi[0, 1], bi[1, 0] = 0.5, 0.9
    assert etx_distances(bi, "bidirectional")[0, 1] == pytest.approx(min(1 / 0.45, 2 / 0.81))


# --- the channel ------------------------------------------------------------------------------------

def test_calibrated_channel_gives_the_papers_mean_prr():
    def mean_over(n_layouts, roi=50.0, **ch):
        return np.mean([mean_prr(prr_matrix(random_positions(6, roi, s), **ch)) for s in range(n_layouts)])

    assert mean_over(2000) == pytest.approx(0.809, abs=0.005)  # K = 51.8 dB: the paper's 80.9 %
    assert mean_over(1000, n=3.5) == pytest.approx(0.618, abs=0.01)  # notes 2.11 sweep values
    assert mean_over(1000, roi=100.0) == pytest.approx(0.489, abs=0.01)
    assert k_from_radio(0.0, -98.5) == pytest.approx(51.82)
    d = np.array([1.0, 5.0, 20.0, 50.0, 100.0])
    assert np.all(np.diff(prr_from_distance(d)) < 0)
    assert prr_from_distance(np.array([0.1]))[0] == prr_from_distance(np.array([1.0]))[0]


def test_random_topologies_are_seeded_and_measured_with_50_packets():
    a, b = random_topology(7), random_topology(7)
    np.testing.assert_array_equal(a.measured_prr, b.measured_prr)
    assert not np.array_equal(a.measured_prr, random_topology(8).measured_prr)
    np.testing.assert_array_equal(a.true_prr, a.true_prr.T)
    assert not np.array_equal(a.measured_prr, a.measured_prr.T)  # independent per direction
    assert np.allclose(a.measured_prr * 50, np.round(a.measured_prr * 50))
    assert (np.diag(a.measured_prr) == 1).all() and (np.diag(a.true_prr) == 1).all()
    err = np.abs(measure_prr(np.full((40, 40), 0.7), 50, 0) - 0.7)[~np.eye(40, dtype=bool)]
    assert err.mean() == pytest.approx(np.sqrt(0.21 / 50) * np.sqrt(2 / np.pi), rel=0.1)  # binomial noise
    topo = calibrated_topology()
    assert abs(mean_prr(topo.true_prr) - 0.809) <= 0.01
    for bad in ([[1, 2], [0, 1]], [[1, 0.5, 0.5]], [[np.nan, 1], [1, 1]]):
        with pytest.raises(ValueError):
            as_prr_matrix(bad)


# --- item 3: mapping --------------------------------------------------------------------------------

def test_score_is_the_hadamard_sum_under_the_permutation(parts):
    s, d = snnet(parts["hybrid"]), random_topology(3).measured_prr
    perm = (2, 0, 1, 5, 3, 4)
    assert score(s, d, perm) == pytest.approx(sum(s[i, j] * d[perm[i], perm[j]] for i in range(6) for j in range(6)))
    assert score(s, d, range(6)) == pytest.approx((s * d).sum())
    allv = all_scores(s, d)
    up = upper_mapping(s, d)
    assert up.score == pytest.approx(allv.max()) and up.evaluated == 720
    assert score(s, d, up.perm) == pytest.approx(up.score)
    with pytest.raises(ValueError, match="permutation"):
        score(s, d, (0, 0, 1, 2, 3, 4))
    with pytest.raises(ValueError, match="square"):
        score(s, d[:5, :5], range(6))


def test_ga_is_deterministic_given_a_seed_and_breaks_ties_the_same_way_as_brute_force(parts):
    s, d = snnet(parts["vertical"]), random_topology(11).measured_prr
    assert ga_mapping(s, d, seed=5) == ga_mapping(s, d, seed=5)
    assert ga_mapping(s, d, seed=5).evaluated == 2001
    # with every link alike every mapping ties: all methods return the smallest permutation
    for kind in KINDS:
        sk = snnet(parts[kind])
        for m in (ga_mapping(sk, uniform_prr(6, 0.9), seed=1), upper_mapping(sk, uniform_prr(6, 0.9))):
            assert m.perm == tuple(range(6))
    # twins: super neurons of one group swap devices without changing the score
    sh = snnet(parts["hybrid"])
    assert twin_classes(sh) == [[0, 1], [2, 3], [4, 5]] and twin_classes(s) == [[i] for i in range(6)]
    p = (5, 1, 0, 4, 3, 2)
    assert canonical(p, twin_classes(sh)) == (1, 5, 0, 4, 2, 3)
    assert score(sh, d, canonical(p, twin_classes(sh))) == pytest.approx(score(sh, d, p))
    assert map_devices("random", s, d, seed=2).perm == random_mappings(s, d, 1, 2)[0].perm
    with pytest.raises(ValueError, match="ga, upper, random"):
        map_devices("annealing", s, d)


def test_horizontal_scores_the_same_for_every_permutation(parts):
    s = snnet(parts["horizontal"])
    for seed in range(5):
        v = all_scores(s, random_topology(seed).measured_prr)
        assert v.max() - v.min() < 1e-12


def test_ga_against_brute_force_and_random_over_100_calibrated_topologies(parts):
    """Notes 6.2 item 3: GA/Upper >= 0.97 on every topology and >= 0.99 on >= 90 % of them, and
    Random(5)/Upper mean < 0.95, for Vertical and Hybrid; Hybrid's GA finds Upper's mapping on every
    topology (the notes: 100/100). Measured here: Vertical min 0.987, >= 0.99 on 98 %, GA = Upper on 87;
    Hybrid exact on 100; Random/Upper 0.840 (Vertical), 0.903 (Hybrid). Over 1000 topologies Vertical
    is >= 0.99 on 95.6 % and below 0.97 once (0.962): these gates hold for these seeds, not for any."""
    nets = {k: snnet(parts[k]) for k in ("vertical", "hybrid")}
    ratio = {k: [] for k in nets}
    rand = {k: [] for k in nets}
    exact = {k: 0 for k in nets}
    for seed in range(100):
        dev = random_topology(seed).measured_prr
        for k, s in nets.items():
            ga, up = ga_mapping(s, dev, seed=10_000 + seed), upper_mapping(s, dev)
            assert ga.score <= up.score + 1e-9
            ratio[k].append(ga.score / up.score)
            rand[k].append(random_baseline_score(s, dev, 5, seed=20_000 + seed) / up.score)
            if abs(ga.score - up.score) <= 1e-9:
                exact[k] += 1
                if k == "hybrid":
                    assert ga.perm == up.perm  # the same tie-break
    for k in nets:
        r = np.array(ratio[k])
        assert r.min() >= 0.97, (k, r.min())
        assert (r >= 0.99).mean() >= 0.90, (k, (r >= 0.99).mean())
        assert np.mean(rand[k]) < 0.95, (k, np.mean(rand[k]))
        assert np.mean(rand[k]) < r.mean()
    assert exact["hybrid"] == 100
    assert exact["vertical"] >= 70  # a uniform random candidate per generation misses a unique optimum w.p. ~e^(-1000/720)


# --- item 2: timing ---------------------------------------------------------------------------------

def test_slot_times_follow_table_ii_and_eq4(parts):
    got = [table_ii_slot_ms(parts[k]) for k in (*KINDS, "naive")]
    assert got == pytest.approx([541.77, 311.33, 172.86, 441.42], abs=0.005)


@pytest.mark.parametrize("L,M", [(6, 1), (6, 2), (6, 3), (6, 6), (4, 2), (8, 2), (8, 4), (9, 3), (10, 5)])
def test_generated_schedule_takes_theorem1_slots(L, M):
    p = partition([12] * L, max(2, 2 * L // M), "hybrid", m_layers=M)
    assert p.m_layers == M and all(len(g) == M for g in p.groups)
    for n in (1, 2, 3, 10, 57):
        ops = schedule(p, n)
        check_schedule(p, ops, n)
        assert total_slots(ops) == theorem1_slots(L, M, n, horizontal=(M == L)) == slots_for(p, n)
        model = schedule(p, n, pipeline=False)  # the Model baseline: no pipelining
        check_schedule(p, model, n)
        assert total_slots(model) == (2 * L - 1) * n


def test_non_uniform_groups_schedule_is_executable():
    for sizes, N, m in (([16] * 7, 6, None), ([16] * 6, 6, 4), ([16] * 5, 6, None), ([16] * 9, 8, None)):
        p = partition(sizes, N, "hybrid", m_layers=m)
        for n in (1, 4, 9):
            ops = schedule(p, n)
            check_schedule(p, ops, n)
            assert total_slots(ops) == slots_for(p, n)
        assert cycle_slots(p) == 2 * p.m_layers


def test_schedule_checker_rejects_broken_schedules(parts):
    p = parts["hybrid"]
    ops = schedule(p, 3)
    check_schedule(p, ops, 3)
    fw3 = next(o for o in ops if o.kind == "FW" and o.layer == 3 and o.data == 2)
    with pytest.raises(ValueError, match="FW_3 of minibatch 2 before FW_2"):
        check_schedule(p, [o._replace(slot=1) if o == fw3 else o for o in ops], 3)
    with pytest.raises(ValueError, match="FW_3 of minibatch 2: 1 ops for 2 holders"):
        check_schedule(p, [o for o in ops if o != fw3], 3)
    with pytest.raises(ValueError, match="two ops"):
        check_schedule(p, ops + [Op(fw3.slot, fw3.sn, "BW", 4, 1)], 3)


def test_device4_runs_the_papers_op_sequence(parts):
    ops = schedule(parts["hybrid"], 4)
    dev4 = device_timeline(ops, 3, 12)  # SN[2][2]: layers {3, 4}
    assert dev4[:10] == [None, None, ("FW", 3, 1), ("FW", 4, 1), None, None,  # BW^0: stalls
                         ("FW", 3, 2), ("FW", 4, 2), ("BW", 4, 1), ("BW", 3, 1)]
    # the closed form of notes 2.8: FW_l^i in slot l + 2M(i-1), BW_l^j in slot 2L - l + 1 + 2M(j-1)
    for o in ops:
        assert o.slot == (o.layer + 4 * (o.data - 1) if o.kind == "FW" else 12 - o.layer + 1 + 4 * (o.data - 1))
    assert not any(o.kind == "BW" and o.layer == 1 for o in ops)


def test_minibatches_in_194_minutes_match_table_iii(parts):
    table_iii = {"vertical": 10750, "hybrid": 9356, "horizontal": 6128, "naive": 2400}
    for k, n in table_iii.items():
        got = minibatches_in_budget(parts[k], 194 * 60)
        assert got == pytest.approx(n, rel=0.002), (k, got)
        assert got <= n  # the paper rounded its budget up (194.22 min)
    # Table III's slot counts: exact for Hybrid and Naive, within 8 slots elsewhere
    assert slots_for(parts["hybrid"], 9356) == 37431
    assert slots_for(parts["naive"], 2400) == 26400
    assert slots_for(parts["vertical"], 10750) == pytest.approx(21510, abs=1)
    assert slots_for(parts["horizontal"], 6128) == pytest.approx(67416, abs=8)
    assert time_for_s(parts["hybrid"], 9356) / 60 == pytest.approx(194.22, abs=0.01)


def test_hybrid_takes_249_minutes_to_20_epochs_and_pipelines_275x_faster_than_model(parts):
    h = parts["hybrid"]
    assert round(time_for_s(h, 20 * 600) / 60) == 249
    assert throughput_ratio(h) == 2.75
    n = 4000  # the same ratio from the generated schedules
    assert total_slots(schedule(h, n, pipeline=False)) / total_slots(schedule(h, n)) == pytest.approx(2.75, abs=0.01)
    assert throughput_ratio(parts["vertical"]) == 5.5 and throughput_ratio(parts["horizontal"]) == 1.0
