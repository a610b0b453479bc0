"""`python -m framework.schedule export|check`: built-in schedules written in torch's CSV format,
schedules in that format checked, bad ones refused in one line with exit code 2, no torch imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from framework.pipeline.schedule_csv import load_csv
from framework.pipeline.schedules import BUILTIN, build
from framework.schedule import main
from tests.test_cli_and_tracking import REPO

PROBE = """
import sys
from framework.schedule import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "mlflow", "numpy", "matplotlib", "aiomqtt") if m in sys.modules)  # tests/test_startup.py's list
print("HEAVY:" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_export_and_check_import_no_torch(tmp_path):
    out = tmp_path / "zbv.csv"
    for args, code in [(["--help"], 0), (["export", "zbv", "--stages", "8", "--microbatches", "8", "-o", str(out)], 0), (["check", str(out)], 0), (["check", str(tmp_path / "none.csv")], 2)]:
        res = run(*args)
        assert res.returncode == code, res.stderr[-2000:]
        assert [line for line in res.stderr.splitlines() if line.startswith("HEAVY:")] == ["HEAVY:"], res.stderr[-2000:]
    assert "ok: 8 stages on 4 devices, 8 micro-batches" in run("check", str(out)).stdout


def test_the_module_runs_as_documented(tmp_path):
    res = subprocess.run([sys.executable, "-m", "framework.schedule", "export", "1f1b", "--stages", "2", "--microbatches", "3"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.splitlines() == ["0F0,0F1,0B0,0F2,0B1,0B2", "1F0,1B0,1F1,1B1,1F2,1B2"], res.stderr


@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_builtin_exports_what_it_builds(tmp_path, name, capsys):
    V = BUILTIN[name].default_per_device
    path = tmp_path / f"{name}.csv"
    assert main(["export", name, "--stages", str(4 * V), "--microbatches", "8", "-o", str(path)]) == 0
    assert f"-> {path}" in capsys.readouterr().out
    assert load_csv(path).text() == build(name, 4 * V, 8).compute_only().text()
    assert main(["check", str(path)]) == 0
    assert "peak in flight per device" in capsys.readouterr().out


def test_interleaved_export_takes_stages_per_device(capsys):
    assert main(["export", "interleaved_1f1b", "--stages", "12", "--stages-per-device", "3", "--microbatches", "8"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 4 and rows[0].startswith("0F0,0F1,0F2,0F3,4F0,4F1,4F2,4F3,8F0")  # stages 0, 4, 8 on device 0, rounds of D = 4


@pytest.mark.parametrize("csv_text,message", [
    ("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", "deadlock: device 0 waits in 0RECV_B0 for device 1's 1SEND_B0; device 1 waits in 1RECV_F1 for device 0's 0SEND_F1"),
    ("0F0,0B1,0F1,0B0\n1F0,1B0,1F1,1B1\n", "device 0 runs 0B1 (a backward) before its forward 0F1, which comes later"),
    ("0F0,0I0,0W0\n1F0,1W0,1I0\n", "device 1 runs 1W0 (a weight gradient) before its input gradient 1I0, which comes later"),
    ("0F0,0B0\n2F0,2B0\n", "stage(s) [1] run nowhere, but stages up to 2 do: stages are numbered 0..S-1 in pipeline order"),
    ("0F0,0Z0\n", "row 1 (device 0), column 2: '0Z0' is not an action"),
])
def test_check_refuses_a_bad_schedule_in_one_line(tmp_path, capsys, csv_text, message):
    path = tmp_path / "bad.csv"
    path.write_text(csv_text)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {message}") and err.count("\n") == 1, err


def test_pipedream_exports_its_in_flight_knob(capsys):
    """A deeper pipeline (2S-1 in flight) warms stage 0 up with 6 forwards instead of 3 (its STEPs, pipelab's, are not in the CSV)."""
    assert main(["export", "pipedream", "--stages", "4", "--microbatches", "10", "--in-flight", "7"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("0F0,0F1,0F2,0F3,0F4,0F5,0F6,0B0,")


def test_check_applies_a_memory_bound(tmp_path, capsys):
    path = tmp_path / "gpipe.csv"
    assert main(["export", "gpipe", "--stages", "2", "--microbatches", "4", "-o", str(path)]) == 0
    assert main(["check", str(path), "--max-in-flight", "3"]) == 2
    assert "with 4 micro-batches in flight on stage 0, more than the bound of 3" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["export", "nope", "--stages", "2", "--microbatches", "2"], "error: no built-in schedule 'nope'; choose one of gpipe, 1f1b"),
    (["export", "dualpipev", "--stages", "8", "--microbatches", "4"], "error: dualpipev needs at least as many micro-batches as stages (2D = 8), got M = 4"),
    (["export", "zbv", "--stages", "4", "--stages-per-device", "1", "--microbatches", "4"], "error: zbv runs 2 stage(s) per device, got 1"),
    (["export", "interleaved_1f1b", "--stages", "5", "--microbatches", "4"], "error: 5 stages do not spread over devices at 2 per device"),
    (["export", "1f1b", "--stages", "4", "--microbatches", "4", "--in-flight", "7"], "error: in_flight is PipeDream's knob; 1f1b fixes its own warm-up"),
    (["export", "pipedream", "--stages", "4", "--microbatches", "4", "--in-flight", "0"], "error: in_flight must be at least 1"),
])
def test_export_refuses_a_shape_the_schedule_cannot_take(capsys, args, message):
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(message)
