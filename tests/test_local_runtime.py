"""runtime=local over transport=mqtt: real processes, a real mosquitto, the same role programs."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from framework import registry
from framework.cli import CONF_DIR
from framework.errors import ConfigError
from framework.job import Job

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed (bash setup.sh)")
ROOT = Path(__file__).resolve().parents[1]


def cfg_for(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=["tracking=none", "runtime.progress=false", *overrides])


def final_weights(job) -> dict:
    return {k: v.clone() for k, v in job.final_model().state_dict().items()}


@pytest.mark.parametrize("sched,devices", [("local", 1), ("gpipe", 2), pytest.param("1f1b", 4, marks=pytest.mark.slow)])
def test_local_runtime_matches_the_simulator_exactly(tmp_path, sched, devices):
    common = [f"scheduler={sched}", "cluster=uniform", f"cluster.num_devices={devices}", "model=mlp", "dataset=synthetic_mnist",
              "runtime.dtype=float64", "train.epochs=2", "train.iterations_per_epoch=3", "train.batch_size=16"]
    registry.load_plugins()
    sim = Job(cfg_for(*common), tmp_path / "sim")
    sim.train()
    real = Job(cfg_for(*common, "runtime=local", "transport=mqtt", "runtime.dtype=float64"), tmp_path / "local")
    real.train()
    a, b = final_weights(sim), final_weights(real)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-10
    assert any(float((a[k] - Job(cfg_for(*common), tmp_path / "init").model.state_dict()[k]).abs().max()) > 0 for k in a)  # it trained
    assert real.history["val/acc"] == pytest.approx(sim.history["val/acc"], abs=1e-12)  # evaluated at each epoch barrier
    assert real.iterations == sim.iterations == 6
    assert all(p.poll() is not None for p in real.runtime.procs.values())  # every role process ended


def test_runtime_local_needs_a_network_transport_and_a_shipping_scheduler():
    registry.load_plugins()
    with pytest.raises(ConfigError, match=r"transport.name.*transport=mqtt"):
        Job(cfg_for("runtime=local", "scheduler=gpipe", "cluster=uniform"), "/tmp/never")
    from plugins.schedulers.classic.schedules import GPipe

    class SimOnly(GPipe):
        runtimes = ("sim",)

    job = Job(cfg_for("scheduler=gpipe", "cluster=uniform"), "/tmp/never")
    with pytest.raises(ConfigError, match=r"runtime.name.*runs on runtime=sim; got runtime=local"):
        SimOnly(job.cfg.scheduler, job.context).check_runtime("local")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow  # real processes stopped mid-run (15-20 s)
def test_killing_a_role_fails_the_run_fast_and_leaves_nothing_behind(tmp_path):
    db = tmp_path / "mlflow.db"
    cmd = [sys.executable, "-m", "framework", "runtime=local", "transport=mqtt", "scheduler=gpipe", "cluster=uniform", "cluster.num_devices=3",
           "model=mlp", "dataset=synthetic_mnist", "train.epochs=50", "runtime.progress=false", "runtime.emulate_compute=true",
           f"tracking.uri=sqlite:///{db}", f"tracking.artifact_root={tmp_path / 'art'}", f"hydra.run.dir={tmp_path / 'run'}"]
    coord = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        victim = None
        while victim is None and time.monotonic() < deadline:  # wait until stage1 runs its iterations
            kids = _children(coord.pid)
            roles = {k: _cmdline(k) for k in kids}
            victim = next((k for k, c in roles.items() if "role=stage1" in c), None)
            if victim is not None and not list((tmp_path / "run").glob("plan.json")):
                victim = None
            time.sleep(0.2)
        assert victim is not None, "stage1 never started"
        time.sleep(4.0)  # let it train a little
        everyone = _children(coord.pid)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = coord.communicate(timeout=30)
        assert time.monotonic() - t0 < 10, err
    finally:
        if coord.poll() is None:
            coord.kill()
    assert coord.returncode != 0
    assert "stage1" in err and ("killed by signal 9" in err or "was lost" in err), err
    time.sleep(0.5)
    assert [p for p in everyone if Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text().lower()] == []
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("pipelab")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert (tmp_path / "run" / "summary.json").exists()  # outputs stay readable


def test_link_emulation_prices_transfers_as_size_over_bandwidth_plus_latency(tmp_path):
    """Two role contexts in one process over the real broker; 10 Mbit/s, 20 ms: each 1 MiB
    payload arrives size/bandwidth + latency after it was sent (within 10%)."""
    from framework.runtime.role_process import LocalContext
    from plugins.transports.broker import Broker

    cfg = cfg_for("runtime=local", "transport=mqtt", "scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2", "model=mlp",
                  "dataset=synthetic_mnist", "runtime.emulate_links=true", "cluster.link.bandwidth_bps=10e6", "cluster.link.latency_s=0.02")
    job = Job(cfg, tmp_path)
    expected = (1 << 20) * 8 / 10e6 + 0.02

    async def main():
        with Broker() as b:
            from plugins.transports.mqtt import MqttTransport

            ta, tb = MqttTransport(cfg.transport, b.address), MqttTransport(cfg.transport, b.address)
            await ta.start("emul", "stage0")
            await tb.start("emul", "stage1")
            t_ref = time.time()
            a = LocalContext("stage0", {"stage0": "dev0", "stage1": "dev1"}, job.cluster, job.compressor, ta, t_ref, cfg.runtime)
            got = []
            for i in range(3):
                x = torch.zeros((1 << 20) // 4 - 64)  # 1 MiB with the wire header
                t0 = a.now()
                a.send("stage1", "act", x)
                y = await tb.recv("stage0", "act", timeout=30)
                got.append(a.now() - t0)
                assert abs(len(y) - (1 << 20)) < 256
            a.close()
            await ta.close()
            await tb.close()
            return got

    got = asyncio.run(main())
    for dt in got:
        assert abs(dt - expected) / expected < 0.10, (got, expected)


@pytest.mark.parametrize("sched,roles", [(["scheduler=gpipe", "cluster=uniform", "model=mlp"], ["stage0", "stage1"]),
                                         pytest.param(["scheduler=pipar", "cluster=pipar_wifi", "model=lenet", "dataset.n_train=200", "train.batch_size=20"], ["dev0", "dev1", "srv0", "srv1", "fed"], marks=pytest.mark.slow)], ids=["gpipe", "pipar"])
def test_remote_roles_join_with_the_printed_commands(tmp_path, sched, roles):
    cmd = [sys.executable, "-m", "framework", "runtime=remote", "transport=mqtt", *sched, "cluster.num_devices=2",
           "dataset=synthetic_mnist", "train.epochs=1", "train.iterations_per_epoch=3", "runtime.progress=false", "tracking=none",
           f"hydra.run.dir={tmp_path / 'run'}"]
    coord = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = []
    try:
        lines = []
        while len(lines) < len(roles):  # the coordinator prints one command per role
            line = coord.stderr.readline()
            assert line, "coordinator ended before printing the worker commands"
            if line.strip().startswith("python -m framework.worker"):
                lines.append(line.split())
        assert sorted(a.split("=", 1)[1] for argv in lines for a in argv if a.startswith("role=")) == sorted(roles)
        for argv in lines:
            assert any(a.startswith("runtime.run_id=") for a in argv)
            workers.append(subprocess.Popen([sys.executable, *argv[1:]], cwd=ROOT))
        out, err = coord.communicate(timeout=180)
        codes = [w.wait(30) for w in workers]  # a worker may still be closing when the coordinator ends
    finally:
        for p in [coord, *workers]:
            if p.poll() is None:
                p.kill()
    assert coord.returncode == 0, err
    assert f"{sched[0].split('=')[1]}:" in out and (tmp_path / "run" / "summary.json").exists()
    assert codes == [0] * len(roles)


def test_missing_remote_roles_are_named_when_the_join_times_out(tmp_path):
    cmd = [sys.executable, "-m", "framework", "runtime=remote", "transport=mqtt", "runtime.join_timeout_s=2", "scheduler=gpipe", "cluster=uniform",
           "cluster.num_devices=2", "model=mlp", "dataset=synthetic_mnist", "runtime.progress=false", "tracking=none", f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "did not join within runtime.join_timeout_s=2s: missing stage0, stage1" in p.stderr


@pytest.mark.slow  # real processes stopped mid-run (15-20 s)
def test_ctrl_c_stops_every_process_and_fails_the_mlflow_run(tmp_path):
    db = tmp_path / "mlflow.db"
    cmd = [sys.executable, "-m", "framework", "runtime=local", "transport=mqtt", "scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2",
           "model=mlp", "dataset=synthetic_mnist", "train.epochs=50", "runtime.progress=false", "runtime.emulate_compute=true",
           f"tracking.uri=sqlite:///{db}", f"tracking.artifact_root={tmp_path / 'art'}", f"hydra.run.dir={tmp_path / 'run'}"]
    coord = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum("role=stage" in _cmdline(k) for k in _children(coord.pid)) < 2:
            time.sleep(0.2)
        time.sleep(5.0)
        everyone = _children(coord.pid)
        assert len(everyone) >= 3  # two roles and the broker
        os.killpg(coord.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, err = coord.communicate(timeout=30)
    finally:
        if coord.poll() is None:
            coord.kill()
    assert coord.returncode == 130, err
    time.sleep(0.5)
    assert [p for p in everyone if Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text().lower()] == []
    import mlflow

    runs = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}").search_runs([mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}").get_experiment_by_name("pipelab").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
