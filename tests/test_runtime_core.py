"""The virtual clock, links, devices and the wire format, on their own."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from omegaconf import OmegaConf

from framework.cluster import Cluster, Work, host_profile
from framework.compression import Compressor
from framework.config.schemas import ClusterConfig
from framework.errors import ConfigError, DeadlockError, WireError
from framework.models import UnitModel
from framework.runtime import wire
from framework.runtime.clock import run_virtual
from framework.runtime.sim import SimRuntime
from framework.scheduler import ProgramRole


def cluster(**over):
    cfg = OmegaConf.merge(OmegaConf.structured(ClusterConfig(name="t")), over)
    return Cluster(cfg)


# ---- clock ---------------------------------------------------------------------------------


def test_virtual_clock_jumps_without_sleeping_and_orders_ties_fifo():
    order = []

    async def sleeper(name, d):
        loop = asyncio.get_running_loop()
        await loop.sleep(d)
        order.append((name, loop.time()))

    async def main():
        await asyncio.gather(sleeper("a", 3600.0), sleeper("b", 1.0), sleeper("c", 1.0))
        return asyncio.get_running_loop().time()

    import time

    t0 = time.perf_counter()
    assert run_virtual(main()) == 3600.0
    assert time.perf_counter() - t0 < 1.0
    assert order == [("b", 1.0), ("c", 1.0), ("a", 3600.0)]


def test_deadlock_is_reported_with_what_each_role_waits_on():
    c = cluster(num_devices=2)

    async def a(ctx):
        await ctx.recv("b", "x")

    async def b(ctx):
        await ctx.recv("a", "y")

    rt = SimRuntime(None, c, Compressor())
    with pytest.raises(DeadlockError, match=r"a waits on recv 'x' from b; b waits on recv 'y' from a"):
        rt.run_roles({"a": ProgramRole("dev0", a), "b": ProgramRole("dev1", b)})


# ---- links ---------------------------------------------------------------------------------


def _send_times(c, sizes, src="dev0", dst="dev1", reliable=True, retries=0):
    """Arrival time of each message, all sent at t=0, through the runtime."""
    arrivals = []

    async def sender(ctx):
        for i, n in enumerate(sizes):
            ctx.send("rx", "t", torch.zeros(n // 4, dtype=torch.float32), reliable=reliable, retries=retries)

    async def receiver(ctx):
        for _ in sizes:
            got = await ctx.recv("tx", "t", timeout=1e6)
            arrivals.append((ctx.now(), None if got is None else got.numel() * 4))

    rt = SimRuntime(None, c, Compressor())
    rt.run_roles({"tx": ProgramRole(src, sender), "rx": ProgramRole(dst, receiver)})
    return arrivals, rt


def test_link_fifo_bandwidth_latency_and_real_byte_counts():
    c = cluster(num_devices=2, link={"bandwidth_bps": 8e6, "latency_s": 0.01})
    arrivals, rt = _send_times(c, [1_000_000, 1_000_000])
    pkt = wire.encoded_size({"x": torch.zeros(250_000)})
    assert pkt > 1_000_000
    t1 = pkt * 8 / 8e6
    assert arrivals[0][0] == pytest.approx(t1 + 0.01, rel=1e-12)
    assert arrivals[1][0] == pytest.approx(2 * t1 + 0.01, rel=1e-12)  # queued behind the first
    assert rt.timeline.link_stats()["dev0->dev1"]["bytes"] == 2 * pkt


def test_full_duplex_links_vs_shared_medium():
    def both_ways(shared):
        c = cluster(num_devices=2, link={"bandwidth_bps": 1e6}, shared_medium=shared)
        done = {}

        def prog(me, other):
            async def p(ctx):
                ctx.send(other, "t", torch.zeros(1000))
                await ctx.recv(other, "t")
                done[me] = ctx.now()

            return p

        SimRuntime(None, c, Compressor()).run_roles({"a": ProgramRole("dev0", prog("a", "b")), "b": ProgramRole("dev1", prog("b", "a"))})
        return max(done.values())

    one = wire.encoded_size({"x": torch.zeros(1000)}) * 8 / 1e6
    assert both_ways(False) == pytest.approx(one)
    assert both_ways(True) == pytest.approx(2 * one)  # one transfer at a time on a hotspot


def test_bandwidth_trace_is_integrated():
    c = cluster(num_devices=2, link={"bandwidth_bps": 1e6, "trace": [[0.0, 1e6], [0.5, 4e6]]})
    link = c.link("dev0", "dev1")
    # 1 Mbit: 0.5 Mbit in the first half second, the rest at 4 Mbit/s
    assert link.tx_time(125_000, 0.0) == pytest.approx(0.5 + 0.5e6 / 4e6)
    assert link.tx_time(125_000, 1.0) == pytest.approx(1e6 / 4e6)


def test_lossy_link_retransmits_reliable_and_drops_unreliable():
    c = cluster(num_devices=2, link={"bandwidth_bps": 1e6, "loss": 0.5, "retransmit_timeout_s": 0.1}, )
    arrivals, rt = _send_times(c, [4000] * 40)
    assert all(n == 4000 for _, n in arrivals)
    assert rt.timeline.link_stats()["dev0->dev1"]["messages"] > 40  # retransmissions crossed the link
    c2 = cluster(num_devices=2, link={"bandwidth_bps": 1e6, "loss": 0.5})
    arrivals, rt = _send_times(c2, [4000] * 40, reliable=False)
    lost = sum(n is None for _, n in arrivals)
    assert rt.messages_lost == lost and 5 < lost < 35



def test_a_link_set_to_lose_everything_drops_unreliable_sends_and_refuses_reliable_ones():
    c = cluster(num_devices=2, link={"bandwidth_bps": 1e6})
    link = c.link("dev0", "dev1")
    with pytest.raises(ConfigError, match=r"cluster.links.dev0->dev1.loss.*\[0, 1\]"):
        link.set_loss(1.5)
    link.set_loss(1.0)
    assert c.link("dev1", "dev0").cfg.loss == 0.0  # one link's setting, not the cluster's
    arrivals, rt = _send_times(c, [4000] * 10, reliable=False)
    assert all(n is None for _, n in arrivals) and rt.messages_lost == 10
    with pytest.raises(ConfigError, match=r"retransmitted for ever"):
        link.schedule(4000, 0.0, reliable=True)
    with pytest.raises(ConfigError, match=r"retransmit_timeout_s.*>= 0"):
        link.set_retransmit_timeout(-1.0)
    back = c.link("dev1", "dev0")
    back.set_loss(0.5)
    back.set_retransmit_timeout(0.25)
    attempts, _ = back.schedule(4000, 10.0, reliable=True)
    assert all(b[0] >= a[1] + 0.25 for a, b in zip(attempts, attempts[1:]))  # each resend waits the set timeout
    attempts, arrival = link.schedule(4000, 0.0, reliable=False, retries=3)  # bounded: gives up
    assert arrival is None and [o for _, _, o in attempts] == ["lost"] * 4


def test_bounded_arq_delivers_one_minus_loss_to_the_retries_plus_one():
    p, k, n, rto = 0.5, 2, 3000, 0.01
    c = cluster(num_devices=2, link={"bandwidth_bps": 1e6, "loss": p, "retransmit_timeout_s": rto})
    link = c.link("dev0", "dev1")
    delivered, t = 0, 0.0
    for _ in range(n):
        attempts, arrival = link.schedule(4000, t, reliable=False, retries=k)
        outcomes = [o for _, _, o in attempts]
        assert 1 <= len(attempts) <= 1 + k and "dup" not in outcomes  # ACKs never lost here
        assert outcomes[:-1] == ["lost"] * (len(attempts) - 1)  # it stops at the first copy through
        for (_, e0, _), (s1, _, _) in zip(attempts, attempts[1:]):
            assert s1 >= e0 + rto  # each retry waits for the ACK timeout
        if arrival is not None:
            delivered += 1
            assert outcomes[-1] == "send" and arrival == attempts[-1][1]
        t = attempts[-1][1]
    assert abs(delivered / n - (1 - (1 - p) ** (1 + k))) < 0.04  # 0.875; sd 0.006


def test_arq_resends_a_frame_whose_ack_was_lost_and_the_receiver_sees_it_once():
    c = cluster(num_devices=2, link={"bandwidth_bps": 1e6, "retransmit_timeout_s": 0.001}, links={"dev1->dev0": {"loss": 0.5}})
    arrivals, rt = _send_times(c, [4000] * 200, reliable=False, retries=3)
    assert all(n == 4000 for _, n in arrivals) and rt.messages_lost == 0  # the data link loses nothing
    st = rt.timeline.link_stats()["dev0->dev1"]
    assert st["lost"] == 0 and 200 < st["messages"] <= 4 * 200 and st["duplicates"] == st["messages"] - 200
    assert 0.6 < st["duplicates"] / 200 < 0.9  # 0.5 + 0.25 + 0.125 = 0.875 copies more per message
    kinds = [iv.kind for iv in rt.timeline.intervals if iv.resource == "dev0->dev1"]
    assert kinds[0] == "send" and kinds.count("send") == 200 and len(kinds) == st["messages"]
    # both ways lossy: undelivered messages are the ones whose every copy was lost
    c = cluster(num_devices=2, link={"bandwidth_bps": 1e6, "loss": 0.5, "retransmit_timeout_s": 0.001})
    arrivals, rt = _send_times(c, [4000] * 400, reliable=False, retries=1)
    st = rt.timeline.link_stats()["dev0->dev1"]
    got = sum(n is not None for _, n in arrivals)
    assert rt.messages_lost == 400 - got and st["messages"] - st["lost"] - st["duplicates"] == got
    assert st["messages"] <= 2 * 400 and st["duplicates"] > 0 and 0.65 < got / 400 < 0.85  # 0.75


def test_arq_with_no_retries_is_the_plain_unreliable_send_and_needs_an_unreliable_send():
    def old_schedule(link, nbytes, now):  # before the ARQ: one transmission, one draw
        start = max(now, link.channel.free_at)
        end = link.channel.free_at = start + link.tx_time(nbytes, start)
        lost = link.rng.random() < link.cfg.loss
        return [(start, end, "lost" if lost else "send")], None if lost else end + link.cfg.latency_s

    cfg = {"num_devices": 2, "link": {"bandwidth_bps": 1e6, "loss": 0.3, "latency_s": 0.002}}
    new, old = cluster(**cfg).link("dev0", "dev1"), cluster(**cfg).link("dev0", "dev1")
    for i in range(200):
        assert new.schedule(1000 + i, 0.001 * i, reliable=False, retries=0, ack_loss=0.9) == old_schedule(old, 1000 + i, 0.001 * i)
    assert new.rng.getstate() == old.rng.getstate()
    with pytest.raises(ValueError, match="retries"):
        new.schedule(1000, 0.0, reliable=True, retries=2)
    with pytest.raises(ValueError, match="retries=2"):
        _send_times(cluster(num_devices=2), [4000], retries=2)  # reliable=True with retries

def test_cluster_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"cluster.links.dev0->dev9"):
        cluster(num_devices=2, links={"dev0->dev9": {"latency_s": 1.0}})
    with pytest.raises(ConfigError, match=r"cluster.devices.dev1.speed.*valid keys"):
        cluster(num_devices=2, devices={"dev1": {"speed": 2}})
    with pytest.raises(ConfigError, match=r"time_model.*analytic, profile, measured"):
        cluster(num_devices=1, device={"time_model": "guess"})
    c = cluster(num_devices=2, devices={"server": {"flops_per_s": 1e12}}, links={"dev*->server": {"bandwidth_bps": 10e6}})
    assert c.names == ["dev0", "dev1", "server"]
    assert c.link("dev1", "server").cfg.bandwidth_bps == 10e6
    assert math.isinf(c.link("server", "dev1").cfg.bandwidth_bps)


# ---- devices -------------------------------------------------------------------------------


def _tiny_model():
    units = [("a", torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU())), ("b", torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 10)))]
    return UnitModel("tiny", units, (1, 8, 8), 10)


def test_analytic_time_is_flops_over_rate_with_kind_factors():
    m = _tiny_model()
    cfg = OmegaConf.merge(OmegaConf.structured(ClusterConfig(name="t")), {"num_devices": 1, "device": {"flops_per_s": 1e6, "kind_factors": {"conv": 2.0}}})
    dev = Cluster(cfg, m).device("dev0")
    conv = m.infos[0].flops_by_kind["conv"]
    expected = (m.infos[0].flops + conv) * 16 / 1e6  # conv FLOPs counted twice
    assert dev.time(Work("fwd", 0, 1, 16)) == pytest.approx(expected)
    assert dev.time(Work("bwd", 0, 1, 16)) == pytest.approx(2 * expected)
    assert dev.time(Work("step", 0, 2)) == pytest.approx(4.0 * sum(i.params for i in m.infos) / 1e6)


def test_memory_streams_add_activation_and_weight_bytes_per_sample():
    """Unit a: conv 1->4 (input 64, output 256 floats) and ReLU (256 in, 256 out) read and write
    (64 + 256 + 256 + 256) x 4 bytes per sample; its weights (40 parameters) go once per sample.
    Both streams add to compute, the backward takes its ratio of them, and .inf costs nothing."""
    m = _tiny_model()
    assert m.infos[0].act_bytes == (64 + 256 + 256 + 256) * 4 and m.infos[0].param_bytes == 40 * 4
    base = {"num_devices": 1, "device": {"flops_per_s": 1e6}}
    plain = Cluster(OmegaConf.merge(OmegaConf.structured(ClusterConfig(name="t")), base), m).device("dev0")
    streams = {"activation_bytes_per_s": 1e5, "weight_bytes_per_s": 2e4}
    dev = Cluster(OmegaConf.merge(OmegaConf.structured(ClusterConfig(name="t")), base, {"device": streams}), m).device("dev0")
    extra = 16 * (m.infos[0].act_bytes / 1e5 + m.infos[0].param_bytes / 2e4)
    assert dev.time(Work("fwd", 0, 1, 16)) == pytest.approx(plain.time(Work("fwd", 0, 1, 16)) + extra)
    assert dev.time(Work("bwd", 0, 1, 16)) == pytest.approx(plain.time(Work("bwd", 0, 1, 16)) + 2 * extra)
    assert dev.time(Work("step", 0, 2)) == plain.time(Work("step", 0, 2))  # the optimizer's cost is its own


def test_profile_time_model_is_cached_and_deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELAB_CACHE", str(tmp_path))
    m = _tiny_model()
    p1 = host_profile(m, 8)
    p2 = host_profile(m, 8)
    assert p1 == p2 and p1["batches"] == [1, 2, 4, 8]
    for table in (p1["fwd"], p1["bwd"]):
        for row in table:  # one time per sampled batch size, never decreasing with it
            assert all(t > 0 for t in row) and row == sorted(row)
    cfg = OmegaConf.merge(OmegaConf.structured(ClusterConfig(name="t")), {"num_devices": 1, "device": {"time_model": "profile", "slowdown": 3.0}})
    dev = Cluster(cfg, m, batch_size=8).device("dev0")
    assert dev.time(Work("fwd", 0, 2, 4)) == pytest.approx(3.0 * (p1["fwd"][0][2] + p1["fwd"][1][2]))
    f = p1["bwd"][0]  # between samples: linear; beyond the largest: proportional
    assert dev.time(Work("bwd", 0, 1, 3)) == pytest.approx(3.0 * (f[1] + f[2]) / 2)
    assert dev.time(Work("bwd", 0, 1, 16)) == pytest.approx(3.0 * 2 * f[3])


def test_curve_time_interpolates_sampled_batch_sizes():
    from framework.cluster import curve_time, profile_batches

    assert profile_batches(100) == [1, 2, 4, 8, 16, 32, 64, 100] and profile_batches(1) == [1]
    times, batches = [1.0, 1.5, 2.0, 4.0], [1, 2, 4, 8]
    assert [curve_time(times, batches, b) for b in (1, 2, 3, 6, 8, 16)] == [1.0, 1.5, 1.75, 3.0, 4.0, 8.0]


# ---- wire ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool])
def test_wire_round_trip(dtype):
    t = (torch.randn(3, 5, 2) * 10).to(dtype)
    data = wire.encode({"x": t, "y": torch.arange(4)}, iteration=7, microbatch=3, weight_version=2)
    p = wire.decode(data)
    assert p.iteration == 7 and p.microbatch == 3 and p.weight_version == 2
    assert torch.equal(p.tensors["x"], t) and p.tensors["x"].dtype == dtype
    assert len(data) == wire.encoded_size({"x": t, "y": torch.arange(4)})


def test_wire_rejects_malformed_packets_with_one_error_type():
    good = wire.encode({"x": torch.randn(4, 4)})
    bad = [b"", good[:10], b"XXXX" + good[4:], good[:-1], good + b"\0", good[:4] + b"\x09" + good[5:]]
    # a shape that claims more elements than the payload holds
    bad.append(good.replace(b"\x04\x00\x00\x00\x04\x00\x00\x00", b"\xff\xff\xff\x7f\xff\xff\xff\x7f", 1))
    for b in bad:
        with pytest.raises(WireError):
            wire.decode(b)
    with pytest.raises(WireError):
        wire.decode("not bytes")
    g = torch.Generator().manual_seed(0)
    for _ in range(500):  # random mutations: WireError or a valid packet, nothing else
        buf = bytearray(good)
        for i in torch.randint(0, len(buf), (3,), generator=g).tolist():
            buf[i] = int(torch.randint(0, 256, (1,), generator=g))
        try:
            wire.decode(bytes(buf))
        except WireError:
            pass


def test_timing_only_packets_carry_shapes_not_payloads():
    t = torch.empty(64, 32, 16, 16, device="meta")
    data = wire.encode({"x": t})
    assert len(data) < 100
    packet, size, raw = Compressor().encode({"x": t})
    assert packet == data and size == raw == wire.encoded_size({"x": torch.empty(64, 32, 16, 16)})
    assert wire.decode(data).tensors["x"].shape == (64, 32, 16, 16)
