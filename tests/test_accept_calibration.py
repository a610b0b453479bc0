"""AccEPT's scenario presets are what their sources give (docs/calibration.md): the per-core
slowdowns are experiments/accept_calibrate.py's fit to Table 4.2.2, the devices are columns of the
profile table measured here, and the pipeline admits one mini-batch per stage (FTPipeHD's
semaphore)."""

from __future__ import annotations

import pytest

from experiments import accept_calibrate as cal
from framework import profile_tables
from tests.conftest import compose_cfg


@pytest.fixture(scope="module")
def fitted():
    return cal.calibrate(verbose=False)


@pytest.mark.parametrize("scenario", ["accept_s1", "accept_s2"])
def test_the_presets_slowdowns_are_the_fit(scenario, fitted):
    cfg = compose_cfg(["experiment=accept", f"cluster={scenario}"]).cluster
    for i, (cpu, column) in enumerate(cal.DEVICES[scenario]):
        dev = dict(cfg.device) | dict(cfg.devices.get(f"dev{i}") or {})
        assert dev["time_model"] == "table" and dev["table"] == cal.TABLE and dev["table_device"] == column
        assert dev["slowdown"] == pytest.approx(fitted[cpu], rel=5e-4), (scenario, cpu)


@pytest.mark.parametrize("scenario", ["accept_s1", "accept_s2"])
def test_the_fit_reproduces_its_rows_and_holds_the_lp_row_out(scenario, fitted):
    """Each fitted row's slowest stage takes the paper's time per mini-batch exactly; the LP row
    is priced by the same constants without having been used."""
    for name in cal.FIT_ROWS:
        r = cal.row(scenario, name)
        assert max(r.stage_seconds(fitted)) == pytest.approx(r.per_batch_s, rel=1e-9)
    held = cal.row(scenario, "lp")
    assert "lp" not in cal.FIT_ROWS and max(held.stage_seconds(fitted)) > 0


def test_the_fit_finds_every_consistent_assignment():
    """solve() searches which stage binds each row: slowdowns scaled up from a solution no longer
    fit, and a row set with no consistent binding has no solution."""
    rows = [cal.row("accept_s1", n) for n in cal.FIT_ROWS]
    sols = cal.solve(rows, {}, ["xeon_e5_2640", "xeon_gold_6133"])
    assert len(sols) == 1
    doubled = [cal.Row(r.scenario, r.name, r.bounds, 2 * r.per_batch_s) for r in rows]
    again = cal.solve(doubled, {}, ["xeon_e5_2640", "xeon_gold_6133"])
    assert again[0]["slowdown"] == pytest.approx({k: 2 * v for k, v in sols[0]["slowdown"].items()})
    clash = [rows[0], cal.Row("accept_s1", "x", rows[0].bounds, 1.5 * rows[0].per_batch_s)]  # the same cuts, two times
    assert cal.solve(clash, {}, ["xeon_e5_2640", "xeon_gold_6133"]) == []


def test_the_profile_table_holds_the_core_count_columns():
    t = profile_tables.load(cal.TABLE)
    assert (t.model, t.units, t.batch) == ("mobilenetv2", 20, 128)
    assert sorted(t.prefix) == ["host_1c", "host_2c", "host_3c"]
    for col in t.prefix.values():
        assert all(b > a > 0 for a, b in zip(col, col[1:]))  # cumulative seconds of a per-unit profile
    whole = {c: t.iteration_seconds(c, 0, 20) for c in t.prefix}
    assert whole["host_1c"] > whole["host_2c"] > whole["host_3c"]


def test_the_accept_experiment_admits_one_mini_batch_per_stage():
    cfg = compose_cfg(["experiment=accept"])
    assert cfg.scheduler.in_flight is None  # the scheduler's default: S, FTPipeHD's Semaphore(worker_num)
