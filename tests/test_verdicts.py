"""Two-sided verdicts (experiments/verdicts.py): an overshoot misses as a shortfall does."""

import math

from experiments.verdicts import Claim, NotRun, Ordering, as_json, verdict_table


def test_a_point_claim_hits_within_the_band_on_both_sides():
    assert Claim("x", paper=2.0, ours=2.39).hit
    assert Claim("x", paper=2.0, ours=1.61).hit
    assert not Claim("x", paper=2.0, ours=2.41).hit  # an overshoot is a miss
    assert not Claim("x", paper=2.0, ours=1.59).hit
    assert Claim("x", paper=2.0, ours=2.5, band=0.3).hit
    assert Claim("x", paper=2.0, ours=2.41).ratio == 2.41 / 2.0


def test_a_range_claim_hits_inside_it_only():
    assert Claim("x", paper=(1.4, 3.4), ours=1.4).hit
    assert Claim("x", paper=(1.4, 3.4), ours=3.4).hit
    assert not Claim("x", paper=(1.4, 3.4), ours=5.3).hit  # the old one-sided gate passed this
    assert not Claim("x", paper=(1.4, 3.4), ours=1.3).hit
    assert Claim("x", paper=(1.4, 3.4), ours=2.0).ratio is None


def test_non_finite_numbers_miss_and_orderings_follow_their_statement():
    assert not Claim("x", paper=1.0, ours=math.nan).hit
    assert not Claim("x", paper=1.0, ours=math.inf).hit
    assert Ordering("a < b", paper="a < b", ours="1 < 2", holds=True).hit
    assert not Ordering("a < b", paper="a < b", ours="3 > 2", holds=False).hit


def test_the_table_counts_hits_and_misses():
    claims = [Claim("a", paper=1.0, ours=1.1), Claim("b", paper=1.0, ours=2.0), Ordering("c", paper="p", ours="o", holds=True)]
    lines = verdict_table(claims)
    assert lines[-1] == "2 of 3 claims hit, 1 miss."
    assert sum("**miss**" in line for line in lines) == 1
    js = as_json(claims)
    assert [c["hit"] for c in js] == [True, False, True] and js[1]["ratio"] == 2.0


def test_a_claim_not_run_is_listed_but_neither_hit_nor_miss():
    claims = [Claim("a", paper=1.0, ours=1.1), NotRun("b", paper="1.12-2.2", why="no such model")]
    lines = verdict_table(claims)
    assert lines[-1] == "1 of 1 claims hit, 0 miss; 1 not run."
    assert any("not run" in line and "no such model" in line for line in lines)
    assert as_json(claims)[1]["kind"] == "not_run"
