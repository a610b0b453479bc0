"""What the next systems build on: the clock (now, sleep, sleep_until), barriers over a set of
roles, device speed traces and moving units between pipeline stages, on both clocks."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
from omegaconf import OmegaConf

from framework.cluster import Cluster
from framework.compression import Compressor
from framework.config.schemas import ClusterConfig
from framework.errors import ConfigError
from framework.job import Job
from framework.runtime.sim import SimRuntime
from framework.scheduler import ProgramRole
from tests.conftest import compose_cfg


def cluster(**over):
    return Cluster(OmegaConf.merge(OmegaConf.structured(ClusterConfig(name="t")), over))


# ---- clock and barrier on the virtual clock ----------------------------------------------------


def test_sleep_and_barrier_on_the_virtual_clock():
    """Three roles reach a barrier at 1, 2 and 5 s; nobody leaves before the last one arrives, and
    the others only once its message has crossed their link (latency 0.1 s); sleep_until a past
    time returns at once."""
    c = cluster(num_devices=3, link={"latency_s": 0.1})
    left = {}

    def prog(name, arrive_at):
        async def run(ctx):
            await ctx.sleep(arrive_at / 2)
            await ctx.sleep_until(arrive_at)
            await ctx.sleep_until(0.0)
            assert ctx.now() == pytest.approx(arrive_at)
            await ctx.barrier("b0", ["a", "b", "c"])
            left[name] = ctx.now()

        return run

    rt = SimRuntime(None, c, Compressor())
    rt.run_roles({n: ProgramRole(f"dev{i}", prog(n, t)) for i, (n, t) in enumerate([("a", 1.0), ("b", 2.0), ("c", 5.0)])})
    # the last to arrive has everyone's message already; the others wait for its message (0.1 s)
    assert left == pytest.approx({"a": 5.1, "b": 5.1, "c": 5.0}, abs=1e-9)
    assert {iv.kind for iv in rt.timeline.intervals} == {"send"}  # the barrier is messages on the links


def test_a_moved_message_is_handed_over_without_a_copy():
    """The receiver gets its own copy of what it is sent, as over a real link, unless the sender
    declares it keeps nothing of it (`moved=True`, a Stage's fresh output): then the tensor itself
    (detached). Bytes on the link and arrival times are the same either way."""
    import torch

    c = cluster(num_devices=2, link={"latency_s": 0.1})
    sent = {"copied": torch.arange(6.0), "moved": torch.arange(6.0)}
    got = {}

    async def sender(ctx):
        ctx.send("b", "copied", sent["copied"])
        ctx.send("b", "moved", sent["moved"], moved=True)

    async def receiver(ctx):
        for tag in ("copied", "moved"):
            got[tag] = (await ctx.recv("a", tag), ctx.now())

    rt = SimRuntime(None, c, Compressor())
    rt.run_roles({"a": ProgramRole("dev0", sender), "b": ProgramRole("dev1", receiver)})
    assert torch.equal(got["copied"][0], sent["copied"]) and got["copied"][0].data_ptr() != sent["copied"].data_ptr()
    assert got["moved"][0].data_ptr() == sent["moved"].data_ptr()
    sends = [iv for iv in rt.timeline.intervals if iv.kind == "send"]
    assert len(sends) == 2 and sends[0].nbytes == sends[1].nbytes


def test_speed_trace_slows_exactly_the_compute_after_its_change():
    """dev1 computes 4x slower from t = T: its intervals that start after T take 4x as long as in
    the same run without the trace, those that end before T are unchanged, dev0's are unchanged."""
    base = ["scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2", "model=mlp", "train.epochs=1", "train.iterations_per_epoch=6", "runtime.numerics=false"]
    plain = Job(compose_cfg(base), "/tmp/never")
    plain.train()
    T = plain.virtual_time / 2
    slow = Job(compose_cfg(base + [f"+cluster.devices={{dev1: {{trace: [[0, 1.0], [{T}, 4.0]]}}}}"]), "/tmp/never")
    slow.train()

    def durations(job, role):
        return {(iv.kind, iv.iteration, iv.microbatch): (iv.start, iv.end - iv.start) for iv in job.runtime.timeline.intervals if iv.resource == role}

    for role, factor in (("stage0", 1.0), ("stage1", 4.0)):
        ref, got = durations(plain, role), durations(slow, role)
        assert ref.keys() == got.keys()
        after = before = 0
        for key, (start, d) in got.items():
            ref_d = ref[key][1]
            if start >= T:
                assert d == pytest.approx(factor * ref_d, rel=1e-9), (role, key)
                after += 1
            elif start + d <= T:
                assert d == pytest.approx(ref_d, rel=1e-9), (role, key)
                before += 1
        assert after > 0 and before > 0
    assert slow.virtual_time > plain.virtual_time
    with pytest.raises(ConfigError, match=r"cluster.devices.dev1.trace\[0\]"):
        Job(compose_cfg(base + ["+cluster.devices={dev1: {trace: [[0, -1.0]]}}"]), "/tmp/never")


def test_a_compute_interval_spanning_a_speed_change_is_integrated():
    c = cluster(num_devices=1, devices={"dev0": {"trace": [[0.0, 1.0], [1.0, 2.0]]}})
    from framework.cluster import Work

    dev = c.device("dev0")
    assert dev.duration(Work("x", seconds=2.0), 0.0) == pytest.approx(3.0)  # 1 s of work at 1x, 1 s at 2x
    assert dev.duration(Work("x", seconds=2.0), 5.0) == pytest.approx(4.0)
    assert dev.duration(Work("x", seconds=0.5), 0.2) == pytest.approx(0.5)


# ---- repartition -------------------------------------------------------------------------------

F64 = ["scheduler=gpipe", "cluster=uniform", "cluster.num_devices=2", "model=mlp", "dataset=synthetic_mnist", "runtime.dtype=float64",
       "train.epochs=2", "train.iterations_per_epoch=4", "train.batch_size=16", "cluster.link.bandwidth_bps=1e8"]


def final(job):
    return {k: v.clone() for k, v in job.final_model().state_dict().items()}


def test_repartition_moves_weights_and_momentum_exactly_and_its_bytes_cross_the_link(tmp_path):
    """GPipe is the same arithmetic under any partition, so a run that moves units 1..2 from
    stage0 to stage1 at the start of epoch 1 (weights and momentum as messages) must equal runs
    that keep either partition all along; the move's bytes appear on dev0 -> dev1."""
    moved = Job(compose_cfg(F64 + ["scheduler.partition=[3]", "scheduler.repartition=[[1,[1]]]"]), tmp_path / "moved")
    moved.train()
    for cuts in ("[3]", "[1]"):
        ref = Job(compose_cfg(F64 + [f"scheduler.partition={cuts}"]), tmp_path / cuts)
        ref.train()
        a, b = final(moved), final(ref)
        assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-10, cuts
    assert moved.scheduler.plan()["repartition"] == [{"epoch": 1, "bounds": [[0, 1], [1, 4]]}]
    assert (moved.runtime.roles["stage1"].stage.start, moved.runtime.roles["stage0"].stage.stop) == (1, 1)
    # units 1 and 2 (Linear 128x128 + bias each): weights and momentum buffers, float64
    params = 2 * (128 * 128 + 128)
    base = Job(compose_cfg(F64 + ["scheduler.partition=[3]"]), tmp_path / "base")
    base.train()
    extra = moved.runtime.timeline.link_stats()["dev0->dev1"]["bytes"] - base.runtime.timeline.link_stats()["dev0->dev1"]["bytes"]
    # activations after the move are 128 wide either way (fc0 and fc2 both output 128): only the move adds bytes
    assert 2 * 8 * params <= extra <= 2 * 8 * params + 4096


def test_repartition_config_errors_name_the_entry(tmp_path):
    with pytest.raises(ConfigError) as e:
        Job(compose_cfg(F64 + ["scheduler.repartition=[[1,[9]]]"]), tmp_path)
    assert e.value.key == "scheduler.repartition[0]"
    with pytest.raises(ConfigError) as e:
        Job(compose_cfg(F64 + ["scheduler.repartition=[[0,[2]]]"]), tmp_path)
    assert e.value.key == "scheduler.repartition[0]"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed")
def test_repartition_on_real_processes_equals_the_simulator(tmp_path):
    ov = F64 + ["scheduler.partition=[3]", "scheduler.repartition=[[1,[1]]]"]
    sim = Job(compose_cfg(ov), tmp_path / "sim")
    sim.train()
    real = Job(compose_cfg(ov + ["runtime=local", "transport=mqtt"]), tmp_path / "real")
    real.train()
    a, b = final(sim), final(real)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-10


# ---- clock and barrier on real processes -------------------------------------------------------


@pytest.mark.skipif(shutil.which("mosquitto") is None, reason="mosquitto not installed")
def test_sleep_and_barrier_on_the_wall_clock(tmp_path):
    from framework.runtime.role_process import LocalContext
    from plugins.transports.broker import Broker
    from plugins.transports.mqtt import MqttTransport

    cfg = compose_cfg(["runtime=local", "transport=mqtt", "scheduler=gpipe", "cluster=uniform", "cluster.num_devices=3", "model=mlp"])
    job = Job(cfg, tmp_path)
    devices = {"a": "dev0", "b": "dev1", "c": "dev2"}

    async def main():
        with Broker() as broker:
            ts = {r: MqttTransport(cfg.transport, broker.address) for r in devices}
            for r, t in ts.items():
                await t.start("barrier", r)
            t_ref = time.time()
            ctxs = {r: LocalContext(r, devices, job.cluster, job.compressor, t, t_ref, cfg.runtime) for r, t in ts.items()}
            left = {}

            async def role(r, arrive_at):
                ctx = ctxs[r]
                await ctx.sleep_until(arrive_at)
                await ctx.barrier("b0", list(devices))
                left[r] = ctx.now()

            await asyncio.gather(role("a", 0.2), role("b", 0.5), role("c", 1.0))
            for c in ctxs.values():
                c.close()
            for t in ts.values():
                await t.close()
            return left

    left = asyncio.run(main())
    assert all(1.0 <= t < 1.8 for t in left.values()), left


def test_a_zero_timeout_recv_on_the_wall_clock_polls_what_has_arrived():
    """recv(timeout=0) is a poll: what is queued comes back, nothing queued is a timeout (Python
    3.11's wait_for(get(), 0) cancelled the get before it looked, so a poll never saw a message)."""
    from framework.runtime.transport import Mailboxes

    async def main():
        box = Mailboxes()
        box.put("a", "t", b"one")
        got = await box.get("a", "t", 0.0)
        with pytest.raises(asyncio.TimeoutError):
            await box.get("a", "t", 0.0)
        return got

    assert asyncio.run(main()) == b"one"
