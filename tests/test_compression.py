"""Compressors end to end: through the runtime, the wire (fuzzed) and training."""

from __future__ import annotations

import resource
import statistics

import pytest
import torch

from framework.codec import Encoded, codec_class
from framework.errors import WireError
from framework.job import Job
from framework.runtime import wire
from tests.conftest import compose_cfg

TINY = ["train.epochs=1", "train.iterations_per_epoch=4", "dataset.n_val=64", "dataset.n_test=64"]


def _valid_packets(g):
    """One valid packet per codec (and raw), with random shapes."""
    packets = []
    specs = [("raw", 32), ("fp16", 16), ("mbq", 2), ("mbq", 3), ("mbq_unpacked", 2), ("stochastic_uniform", 4), ("stochastic_uniform", 8), ("uniform_lsq", 2), ("minmax", 2), ("minmax", 8), ("onebit", 1)]
    for name, bits in specs:
        shape = tuple(int(d) for d in torch.randint(1, 9, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g))
        x = torch.randn(shape, generator=g)
        t = x if name == "raw" else codec_class(name)(bits=bits).encode(x, {})
        packets.append(bytes(wire.encode({"x": t, "y": torch.arange(3)}, iteration=5, microbatch=1)))
    return packets


def test_fuzzed_packets_raise_only_the_typed_error_with_bounded_memory():
    g = torch.Generator().manual_seed(0)
    packets = _valid_packets(g)
    for p in packets:  # the originals decode
        assert set(wire.decode(p).tensors) == {"x", "y"}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = {"ok": 0, "error": 0}
    for i in range(12_000):
        base = bytearray(packets[i % len(packets)])
        kind = i % 4
        if kind == 0:  # flip random bytes
            for j in torch.randint(0, len(base), (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist():
                base[j] = int(torch.randint(0, 256, (1,), generator=g))
        elif kind == 1:  # truncate or extend
            cut = int(torch.randint(0, len(base) + 8, (1,), generator=g))
            base = base[:cut] if cut <= len(base) else base + bytes(cut - len(base))
        elif kind == 2:  # absurd numbers in the header area (shapes, lengths)
            j = int(torch.randint(0, min(len(base), 80), (1,), generator=g))
            base[j : j + 4] = b"\xff\xff\xff\x7f"
        else:  # noise
            base = bytearray(torch.randint(0, 256, (int(torch.randint(0, 200, (1,), generator=g)),), generator=g, dtype=torch.uint8).numpy().tobytes())
            if i % 8 == 3:
                base[:4] = wire.MAGIC
        try:
            wire.decode(bytes(base))
            outcomes["ok"] += 1
        except WireError:
            outcomes["error"] += 1
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert outcomes["ok"] + outcomes["error"] == 12_000 and outcomes["error"] > 6_000
    assert grown_mib < 256, f"decoding fuzzed packets grew the peak RSS by {grown_mib:.0f} MiB"


def test_wire_size_matches_encode_for_every_codec():
    x = torch.randn(41, 3, 5)
    for name, bits in [("fp16", 16), ("mbq", 3), ("mbq_unpacked", 4), ("stochastic_uniform", 2), ("stochastic_uniform", 4), ("minmax", 4), ("onebit", 1)]:
        c = codec_class(name)(bits=bits)
        enc = c.encode(x, {})
        assert (len(enc.meta), len(enc.payload)) == c.wire_size(tuple(x.shape)), name


@pytest.mark.parametrize("compressor", ["mbq", "uniform", "uniform_stochastic", "fp16", "minmax_ef", "onebit_ef"])
def test_any_compressor_runs_with_any_schedule_and_reports_ratios(tmp_path, compressor):
    for scheduler in ("gpipe", "1f1b", "pipedream"):
        s = Job(compose_cfg(TINY + [f"scheduler={scheduler}", f"compressor={compressor}"]), tmp_path / scheduler).run()
        c = s["compression"]
        assert c["ratio_fwd"] >= 1.0 and c["ratio_bwd"] >= 1.0
        assert c["ratio_fwd"] > 1.5 or c["ratio_bwd"] > 1.5
        links = s["links"].values()
        assert sum(l["raw_bytes"] for l in links) > sum(l["bytes"] for l in links)
        assert s["metrics"]["net/compression_ratio"] > 1.0


def test_mbq_ratios_and_bit_overrides_from_the_command_line(tmp_path):
    s2 = Job(compose_cfg(TINY + ["compressor=mbq"]), tmp_path / "2").run()["compression"]
    s3 = Job(compose_cfg(TINY + ["compressor=mbq", "compressor.forward.bits=3", "compressor.backward.bits=4"]), tmp_path / "3").run()["compression"]
    assert (s2["bits_fwd"], s2["bits_bwd"], s3["bits_fwd"], s3["bits_bwd"]) == (2, 8, 3, 4)
    assert 0 < s3["rel_err_fwd"] < s2["rel_err_fwd"] < 1  # more bases, less error
    assert 0 < s2["rel_err_bwd"] < s3["rel_err_bwd"] < 1  # 8-bit gradients beat 4-bit ones
    # LeNet's cut is after conv1: 6x28x28 per sample; 16 samples per micro-batch (2 bytes at 2 bits per 8 samples)
    assert 14.5 < s2["ratio_fwd"] < 16.0 and 3.8 < s2["ratio_bwd"] < 4.0
    assert 10.0 < s3["ratio_fwd"] < 10.7 and 7.6 < s3["ratio_bwd"] < 8.0


def test_bit_schedule_follows_epochs(tmp_path):
    job = Job(compose_cfg(["train.epochs=3", "train.iterations_per_epoch=2", "compressor=mbq", "compressor.forward.schedule=[[0,2],[1,3],[2,4]]", "compressor.backward.schedule=[[2,4]]", "dataset.n_val=64", "dataset.n_test=64"]), tmp_path)
    seen = []
    orig = job.compressor.set_epoch

    def spy(e):
        orig(e)
        seen.append((e, job.compressor.directions["act"].bits, job.compressor.directions["grad"].bits))

    job.compressor.set_epoch = spy
    job.run()
    assert seen[:3] == [(1, 3, 8), (2, 4, 4), (3, 4, 4)]


def test_codec_time_is_charged_to_the_devices(tmp_path):
    base = TINY + ["cluster=uniform", "cluster.num_devices=2", "cluster.link.bandwidth_bps=1e6"]
    none = Job(compose_cfg(base + ["compressor=none"]), tmp_path / "n").run()
    mbq = Job(compose_cfg(base + ["compressor=mbq"]), tmp_path / "m").run()
    slow = Job(compose_cfg(base + ["compressor=mbq", "compressor.time.encode_s=2.0"]), tmp_path / "s").run()
    assert mbq["compression"]["encode_s_fwd"] > 0 and mbq["compression"]["decode_s_bwd"] > 0
    assert mbq["virtual_time_s"] < none["virtual_time_s"]  # 1 Mbit/s: compression wins
    assert slow["virtual_time_s"] > none["virtual_time_s"]  # a slow codec loses
    fast_link = base[:-1] + ["cluster.link.bandwidth_bps=inf"]
    n2 = Job(compose_cfg(fast_link + ["compressor=none"]), tmp_path / "n2").run()
    m2 = Job(compose_cfg(fast_link + ["compressor=mbq"]), tmp_path / "m2").run()
    assert m2["virtual_time_s"] > n2["virtual_time_s"]  # infinite bandwidth: the codec only costs


def test_timing_only_runs_count_compressed_bytes(tmp_path):
    on = Job(compose_cfg(TINY + ["compressor=mbq"]), tmp_path / "on").run()
    off = Job(compose_cfg(TINY + ["compressor=mbq", "runtime.numerics=false"]), tmp_path / "off").run()
    assert off["links"]["dev0->dev1"]["bytes"] == on["links"]["dev0->dev1"]["bytes"]
    assert off["links"]["dev1->dev0"]["bytes"] == on["links"]["dev1->dev0"]["bytes"]


def test_minmax_error_feedback_corrects_the_returned_gradient(tmp_path):
    job = Job(compose_cfg(TINY + ["compressor=minmax_ef", "compressor.forward.bits=2"]), tmp_path)
    calls = []
    import plugins.compressors.minmax_ef as mod

    orig = mod.minmax_error_feedback

    def spy(g, e):
        calls.append(float(e.abs().max()))
        return orig(g, e)

    mod.minmax_error_feedback = spy
    try:
        job.run()
    finally:
        mod.minmax_error_feedback = orig
    assert len(calls) == 4 * 4  # every micro-batch's gradient, 4 iterations x 4 micro-batches
    assert all(c > 0 for c in calls)
    assert not job.compressor._kept  # nothing left behind


# AccEPT's optimiser for its small model (HAR CNN: SGD lr 0.01, momentum 0.9, wd 4e-5), trained
# to near convergence (8 epochs) as the paper compares converged accuracy (Table 4).
ACCEPT_TRAINING = ["train.lr=0.01", "train.weight_decay=4e-5", "train.epochs=8"]


@pytest.mark.slow
def test_mbq_accuracy_table4_claims_at_convergence(tmp_path):
    """AccEPT Table 4's claims on the synthetic MNIST-shaped set (LeNet, 2-stage GPipe cut after
    conv1, seeds 0-2): MBQ (2-bit forward, 8-bit backward) and MBQ at 4 bits stay within 2 points
    of no compression, and the learned-scale uniform baseline at 2 bits is worse than MBQ at 2
    bits. Measured: none 0.961, MBQ-2 0.949, MBQ-4 0.958, uniform-2 0.644."""
    seeds = (0, 1, 2)
    runs = {"none": ["compressor=none"], "mbq2": ["compressor=mbq"], "mbq4": ["compressor=mbq", "compressor.forward.bits=4"], "uniform2": ["compressor=uniform"]}
    acc = {k: [Job(compose_cfg(ov + ACCEPT_TRAINING + [f"seed={s}"]), tmp_path / f"{k}{s}").run()["metrics"]["val/acc"] for s in seeds] for k, ov in runs.items()}
    mean = {k: statistics.mean(v) for k, v in acc.items()}
    print("val/acc per seed:", acc, "means:", mean)
    assert abs(mean["mbq2"] - mean["none"]) <= 0.02, acc
    assert abs(mean["mbq4"] - mean["none"]) <= 0.02, acc
    assert mean["uniform2"] < mean["mbq2"], acc


@pytest.mark.slow  # trains twice (about 9 s)
def test_mbq_beats_uniform_at_two_bits_one_seed(tmp_path):
    """The fast version of the ordering check (one seed, one epoch)."""
    acc = {c: Job(compose_cfg([f"compressor={c}", "train.epochs=1"]), tmp_path / c).run()["metrics"]["val/acc"] for c in ("mbq", "uniform")}
    assert acc["uniform"] < acc["mbq"], acc


def test_uniform_learns_its_scale_from_returned_gradients(tmp_path):
    job = Job(compose_cfg(TINY + ["compressor=uniform", "compressor.scale_lr=1.0"]), tmp_path)
    job.run()
    scales = [st["scale"] for (src, dst, tag), st in job.compressor._streams.items() if tag == "act"]
    assert scales and all(s != 0.25 for s in scales)  # moved away from the paper's initial 0.25
    assert not job.compressor._kept  # every micro-batch's gradient came back
