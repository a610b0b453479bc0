"""Bubble fraction and peak in-flight activations from the schedule simulation
(framework.pipeline.bubble), against the closed forms on D identical devices, links free.

GPipe and 1F1B: (D-1)/(M+D-1) (Huang et al., GPipe, 2019), whatever T_F and T_B.
ZB-H1, M >= D, P = T_F + T_I + T_W: makespan T = M·P + (D-1)·max(T_F + T_I - T_W, T_I, T_F), the
longest of three dependency paths (derived in framework/pipeline/bubble.py's docstring); bubble
(T - M·P) / T. With T_W <= min(T_F, T_I) that is the zero-bubble paper's ZB-H1 bubble (Qi et al.,
"Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 3.1): (D-1)(T_F + T_I - T_W) of idle time
per device, against 1F1B's (D-1)(T_F + T_I + T_W).
Interleaved 1F1B and looped BFS, V stages per device, M >= D: (D-1)/(V·M + D-1).
ZBV and DualPipeV with T_F = T_I = T_W = 1: (D-1)/(6M + D-1), the pipeline's fill alone.
"""

from __future__ import annotations

import itertools

import pytest

from framework.pipeline.bubble import Durations, simulate
from framework.pipeline.schedules import build

SHAPES = [(2, 4), (2, 8), (4, 4), (4, 8), (3, 7), (5, 12)]  # (D, M)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("D,M", SHAPES)
def test_gpipe_and_1f1b_bubble_is_gpipes(name, D, M):
    for f, b in [(1.0, 2.0), (0.3, 0.7), (2.5, 1.0)]:
        sim = simulate(build(name, D, M), Durations(f, b / 2, b / 2))
        assert sim.bubble_frac == pytest.approx((D - 1) / (M + D - 1), abs=1e-9)
        assert sim.makespan == pytest.approx((M + D - 1) * (f + b), abs=1e-9)


@pytest.mark.parametrize("D,M", SHAPES)
def test_zb_h1_bubble_is_the_zero_bubble_papers(D, M):
    """T_W <= min(T_F, T_I): the paper's regime, its formula exactly."""
    for f, i, w in [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0.5), (1.3, 2.1, 0.4), (1, 1, 0)]:
        P = f + i + w
        T = M * P + (D - 1) * (f + i - w)
        sim = simulate(build("zero_bubble", D, M), Durations(f, i, w))
        assert sim.bubble_frac == pytest.approx((D - 1) * (f + i - w) / T, abs=1e-9), (f, i, w)
        one_f_one_b = simulate(build("1f1b", D, M), Durations(f, i, w))
        assert (one_f_one_b.makespan - M * P) == pytest.approx((D - 1) * (f + i + w), abs=1e-9)  # 1F1B idles 2(D-1)T_W more
    equal = simulate(build("zero_bubble", D, M), Durations(1, 1, 1))
    assert equal.makespan - 3 * M == pytest.approx(D - 1, abs=1e-9)  # a third of 1F1B's 3(D-1)


def test_zb_h1_makespan_is_its_longest_path():
    """Any T_F, T_I, T_W (M >= D): the longest of the three paths."""
    values = [0.25, 0.5, 1.0, 2.0, 3.0]
    for (f, i, w), (D, M) in itertools.product(itertools.product(values, repeat=3), [(2, 4), (4, 4), (4, 8), (3, 7)]):
        T = M * (f + i + w) + (D - 1) * max(f + i - w, i, f)
        assert simulate(build("zero_bubble", D, M), Durations(f, i, w)).makespan == pytest.approx(T, abs=1e-9), (f, i, w, D, M)


@pytest.mark.parametrize("name", ["interleaved_1f1b", "looped_bfs"])
def test_virtual_stages_divide_the_bubble(name):
    """V looped stages per device, M >= D: (D-1)/(V·M + D-1), Megatron-LM's interleaved bubble
    ((p-1)/(v·m) of the ideal time, Narayanan et al., SC 2021, Sec. 2.2.2); looped BFS's is the same."""
    for D, M, V in [(2, 4, 2), (4, 4, 2), (4, 8, 2), (3, 6, 3), (2, 8, 3)]:
        for f, b in [(1.0, 2.0), (2.0, 1.0)]:
            sim = simulate(build(name, D * V, M, V), Durations(f, b / 2, b / 2))
            assert sim.bubble_frac == pytest.approx((D - 1) / (V * M + D - 1), abs=1e-9), (D, M, V, f, b)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_v_shaped_schedules_idle_only_while_the_pipeline_fills(name):
    """T_F = T_I = T_W = 1 per stage, 2 stages per device: each device computes 6M and idles D-1,
    the first forward's way to the last device (the zero-bubble paper's ZB-V claim, Sec. 6)."""
    for D, M in [(2, 4), (2, 8), (3, 9), (4, 8), (4, 16)]:
        sim = simulate(build(name, 2 * D, M), Durations(1, 1, 1))
        assert sim.makespan == pytest.approx(6 * M + D - 1, abs=1e-9)
        assert sim.bubble_frac == pytest.approx((D - 1) / (6 * M + D - 1), abs=1e-9)


def test_peak_in_flight_per_schedule():
    """GPipe holds every micro-batch; 1F1B D-d on device d; ZB-H1 D everywhere (device d's W waits
    d backwards: the first device's 1F1B peak, as the paper says); ZBV 2D chunks of half a stage
    each on every device (1F1B's first-device peak, as the paper says); interleaved 1F1B at least
    its warm-up, (V-1)·D + 2(D-1-d) forwards plus the one beside the first backward."""
    unit = Durations(1, 1, 1)
    assert simulate(build("gpipe", 4, 8), unit).peak_in_flight_device == (8, 8, 8, 8)
    assert simulate(build("1f1b", 4, 8), unit).peak_in_flight_device == (4, 3, 2, 1)
    assert simulate(build("zero_bubble", 4, 8), unit).peak_in_flight_device == (4, 4, 4, 4)
    assert simulate(build("zbv", 8, 8), unit).peak_in_flight_device == (8, 8, 8, 8)
    D, V = 4, 2
    peaks = simulate(build("interleaved_1f1b", D * V, 8, V), unit).peak_in_flight_device
    assert all(peaks[d] >= (V - 1) * D + 2 * (D - 1 - d) + 1 for d in range(D)) and list(peaks) == sorted(peaks, reverse=True), peaks


def test_links_and_heterogeneous_stages_stretch_the_makespan():
    """A slow last stage sets GPipe's pace; a link's delay lengthens every crossing."""
    D, M = 3, 4
    slow_last = simulate(build("gpipe", D, M), Durations([1, 1, 2], [1, 1, 2], 0.0))
    assert slow_last.makespan == pytest.approx(2 + M * 2 + M * 2 + 2, abs=1e-9)  # F reaches it at 2; it runs 2M·2; its last B's gradient crosses 2 more
    linked = simulate(build("gpipe", D, M), Durations(1, 1, 0.0, link=0.5))
    free = simulate(build("gpipe", D, M), Durations(1, 1, 0.0))
    assert linked.makespan == pytest.approx(free.makespan + 2 * (D - 1) * 0.5, abs=1e-9)
    assert linked.bubble_frac > free.bubble_frac


@pytest.mark.parametrize("name,S,V", [("interleaved_1f1b", 8, 2), ("looped_bfs", 8, 2), ("zero_bubble", 8, 2), ("zbv", 8, 2), ("dualpipev", 8, 2)])
def test_the_multi_stage_schedules_play_out(name, S, V):
    """Every multi-stage schedule runs to the end on unit durations, each device busy 3 units per
    micro-batch and local stage; the V-shaped zero-bubble ones leave less idle than 1F1B."""
    M = 8
    sim = simulate(build(name, S, M, V), Durations(1, 1, 1))
    assert sim.busy == pytest.approx([3 * M * V] * (S // V))
    assert 0 < sim.bubble_frac < 0.5
    if name in ("zbv", "dualpipev"):
        assert sim.bubble_frac < simulate(build("1f1b", S // V, M), Durations(V, V, V)).bubble_frac
