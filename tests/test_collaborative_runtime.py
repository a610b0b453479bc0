"""PiPar, FL, SFL and SL on real processes: the same roles as on the simulator, over a real
mosquitto; a device process that dies is a dropout, the server's death fails the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import shutil
from pathlib import Path

import pytest
from framework.job import Job
from tests.conftest import compose_cfg

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed (bash setup.sh)")
ROOT = Path(__file__).resolve().parents[1]

# K = 3 devices, float64, a small VGG-5 without BN (so float64 sums are exact to 1e-10)
SMALL = ["cluster=pipar_wifi", "cluster.num_devices=3", "model=vgg5", "model.batchnorm=false", "dataset=synthetic_mnist", "dataset.n_train=120",
         "train.batch_size=20", "train.epochs=2", "runtime.dtype=float64"]
REAL = ["runtime=local", "transport=mqtt"]


def weights(job) -> dict:
    return {k: v.clone() for k, v in job.final_model().state_dict().items()}


def max_weight_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


CASES = {
    "pipar_P2_N4": pytest.param(["scheduler=pipar", "scheduler.P=2", "scheduler.N=4"], marks=pytest.mark.slow),  # ~30 s
    "fl": pytest.param(["scheduler=fl"], marks=pytest.mark.slow),
    "pipar_P1_N1": pytest.param(["scheduler=pipar", "scheduler.P=1", "scheduler.N=1", "scheduler.server_mode=sequential"], marks=pytest.mark.slow),
    "sfl": pytest.param(["scheduler=sfl", "scheduler.P=2"], marks=pytest.mark.slow),
    "sl": pytest.param(["scheduler=sl", "scheduler.P=2"], marks=pytest.mark.slow),
}


@pytest.mark.parametrize("overrides", list(CASES.values()), ids=list(CASES))
def test_collaborative_roles_on_real_processes_equal_the_simulator(tmp_path, overrides):
    sim = Job(compose_cfg(SMALL + overrides), tmp_path / "sim")
    sim.train()
    real = Job(compose_cfg(SMALL + overrides + REAL), tmp_path / "real")
    real.train()
    assert max_weight_diff(weights(sim), weights(real)) <= 1e-10
    init = {k: v for k, v in sim.model.state_dict().items()}
    assert max_weight_diff(weights(sim), init) > 1e-3  # it trained
    assert real.history["val/acc"] == pytest.approx(sim.history["val/acc"], abs=1e-12)
    assert real.iterations == sim.iterations > 0
    if "scheduler=sl" not in overrides:  # idle per epoch, measured on the wall clock from the roles' timelines
        assert len(real.history["idle/server_s"]) == 2 and all(v >= 0 for v in real.history["idle/device_mean_s"])
    assert all(p.poll() is not None for p in real.runtime.procs.values())


def test_a_role_process_builds_only_its_own_role_and_searches_nothing(tmp_path, monkeypatch):
    """What `python -m framework.worker role=dev1` builds from the coordinator's plan."""
    from framework.job import build_scheduler
    from framework.stage import Stage
    from plugins.schedulers.pipar import planner as pipar_planner

    coord = Job(compose_cfg(SMALL + ["scheduler=pipar", "cluster.num_devices=4"]), tmp_path)  # select=auto searches here
    plan = json.loads(json.dumps(coord.scheduler.plan()))  # as shipped: JSON
    built, searched = [], []
    monkeypatch.setattr(Stage, "__init__", _recording(Stage.__init__, built))
    monkeypatch.setattr(pipar_planner.Planner, "choose_plans", _recording(pipar_planner.Planner.choose_plans, searched))
    monkeypatch.setattr(pipar_planner.Planner, "__init__", _recording(pipar_planner.Planner.__init__, searched))
    cfg = compose_cfg(SMALL + ["scheduler=pipar", "cluster.num_devices=4"] + REAL)
    ctx, sched = build_scheduler(cfg, role="dev1", plan=plan)
    role = sched.build_role("dev1")
    assert searched == [] and len(built) == 1  # one stage: its own units [0, P)
    assert (role.stage.start, role.stage.stop) == (0, coord.scheduler.plans[1].P)
    assert sched.role_devices() == coord.scheduler.role_devices()


def _recording(fn, log):
    def wrapper(self, *a, **k):
        log.append(type(self).__name__)
        return fn(self, *a, **k)

    return wrapper


# ---- dropouts and failures on real processes --------------------------------------------------


def _children(pid: int) -> dict[int, str]:
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            try:
                out[k] = Path(f"/proc/{k}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                pass
    return out


def _alive(pids) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text().lower()]


# slow enough per epoch (compute stretched to the Pi-class devices' model) that a kill lands inside epoch 1
DROP = ["cluster=pipar_wifi", "cluster.num_devices=3", "model=vgg5", "model.batchnorm=false", "dataset=synthetic_mnist", "dataset.n_train=240",
        "train.batch_size=20", "train.epochs=3", "runtime.dtype=float64"]


def _run_and_kill(tmp_path, overrides, victim_role, after_line="epoch 0:"):
    db = tmp_path / "mlflow.db"
    cmd = [sys.executable, "-m", "framework", *REAL, *DROP, "runtime.emulate_compute=true", *overrides, "runtime.progress=true", f"tracking.uri=sqlite:///{db}",
           f"tracking.artifact_root={tmp_path / 'art'}", f"hydra.run.dir={tmp_path / 'run'}"]
    coord = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # one stream: no pipe fills unread
    err_lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the coordinator prints "epoch 0: val/acc ..." after epoch 0's evaluation
            line = coord.stdout.readline()
            assert line, "coordinator ended early:\n" + "".join(err_lines)
            err_lines.append(line)
            if after_line in line:
                break
        everyone = _children(coord.pid)
        victim = next(p for p, c in everyone.items() if f"role={victim_role} " in c + " ")
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        out, _ = coord.communicate(timeout=240)
        err = out
        elapsed = time.monotonic() - t_kill
    finally:
        if coord.poll() is None:
            coord.kill()
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("pipelab").experiment_id])
    return coord.returncode, out, "".join(err_lines) + err, elapsed, runs, list(everyone)


@pytest.mark.slow  # about 50 s: real processes, one killed mid-run
@pytest.mark.parametrize("sched", [["scheduler=fl"], ["scheduler=pipar", "scheduler.P=2", "scheduler.N=2"]], ids=["fl", "pipar"])
def test_a_killed_device_is_a_dropout_and_the_run_goes_on(tmp_path, sched):
    code, out, err, _, runs, _ = _run_and_kill(tmp_path, sched, "dev1")
    assert code == 0, err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [d["role"] for d in summary["dropouts"]] == ["dev1"] and summary["dropouts"][0]["epoch"] == 1
    assert summary["metrics"]["roles/dropouts"] == 1
    assert [r["devices"] for r in summary["rounds"]] == [[0, 1, 2], [0, 2], [0, 2]]
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.metrics["roles/dropouts"] == 1 and "dev1" in run.data.tags["pipelab.dropouts"]
    # the final model is the FedAvg of the devices that reported: as if dev1 trained nothing from epoch 1 on
    ref = Job(compose_cfg(DROP + sched + ["scheduler.failures=[[1,1,0],[1,2,0]]"]), tmp_path / "ref")
    ref.train()
    assert summary["metrics"]["test/acc"] == pytest.approx(ref._final["test/acc"], abs=1e-12)
    assert summary["history"]["val/loss"] == pytest.approx(ref.history["val/loss"], abs=1e-10)


@pytest.mark.slow  # about 30 s: real processes, one killed mid-run
@pytest.mark.parametrize("sched,victim", [(["scheduler=fl"], "fed"), (["scheduler=pipar", "scheduler.P=2", "scheduler.N=2"], "srv0")], ids=["fl-fed", "pipar-srv0"])
def test_killing_a_server_role_fails_fast_and_leaves_nothing(tmp_path, sched, victim):
    code, out, err, elapsed, runs, everyone = _run_and_kill(tmp_path, sched, victim)
    assert code != 0 and elapsed < 10, (elapsed, err[-2000:])
    assert f"role {victim}" in err
    time.sleep(0.5)
    assert _alive(everyone) == []
    assert [r.info.status for r in runs] == ["FAILED"]
    assert (tmp_path / "run" / "summary.json").exists()
