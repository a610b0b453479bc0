"""The classic schedules against closed forms and against the reference loop."""

from __future__ import annotations

import pytest
import torch

from framework.job import Job
from framework.pipeline.scheduler import STEP, B, F, one_f_one_b
from tests.conftest import compose_cfg

# Equal-cost units: an MLP whose every unit is Linear(64, 64) (the head too, with 64 classes);
# activations are priced at zero so that each unit costs exactly 2*64*64 + 64 FLOPs per sample.
UNIFORM_MLP = [
    "model=mlp",
    "model.hidden=64",
    "model.depth=8",
    "dataset=synthetic_mnist",
    "dataset.shape=[64]",
    "dataset.num_classes=64",
    "dataset.n_train=256",
    "dataset.n_val=64",
    "dataset.n_test=64",
    "cluster=uniform",
    "+cluster.device.kind_factors={act: 0.0}",
    "train.epochs=1",
    "train.batch_size=64",
    "train.iterations_per_epoch=2",
]


def run_job(tmp_path, overrides):
    job = Job(compose_cfg(overrides), tmp_path)
    return job, job.run()


def test_one_f_one_b_program_reads_like_the_literature():
    assert one_f_one_b(0, 4, 4) == [F(0), F(1), F(2), F(3), B(0), B(1), B(2), B(3)]
    assert one_f_one_b(3, 4, 4) == [F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)]
    assert one_f_one_b(1, 2, 3, step_after_backward=True) == [F(0), B(0), STEP, F(1), B(1), STEP, F(2), B(2), STEP]


def test_a_deeper_pipeline_warms_up_more_upstream_and_never_rises():
    def warmup(s, S, D):
        acts = one_f_one_b(s, S, 20, in_flight=D)
        return acts.index(B(0)) - 1  # F(warm-up) comes just before B(0)
    assert [warmup(s, 4, None) for s in range(4)] == [3, 2, 1, 0]  # the default: one per stage
    assert [warmup(s, 4, 4) for s in range(4)] == [3, 2, 1, 0]
    assert [warmup(s, 4, 7) for s in range(4)] == [6, 4, 2, 0]  # 2S-1: links count as stages
    assert [warmup(s, 3, 4) for s in range(3)] == [3, 2, 0]  # ceil((D-1)(S-1-s)/(S-1))
    assert [warmup(s, 3, 1) for s in range(3)] == [0, 0, 0]  # one at a time
    for S, D in [(3, 5), (4, 6), (5, 2)]:
        acts = one_f_one_b(0, S, 8, in_flight=D)
        assert sorted(a.mb for a in acts if a.op == "F") == list(range(8)) == sorted(a.mb for a in acts if a.op == "B")


def test_pipedream_in_flight_sets_staleness_and_fills_a_link_bound_pipeline(tmp_path):
    """With transfers as long as a stage's compute, S in flight leave the pipeline waiting on the
    round trip; 2S-1 (each link a stage) keeps it full: a shorter epoch, and stage s backpropagates
    through weights as old as its warm-up is long."""
    common = UNIFORM_MLP + ["scheduler=pipedream", "scheduler.microbatches=1", "cluster.num_devices=3", "train.iterations_per_epoch=16", "dataset.n_train=1024",
                            "cluster.link.bandwidth_bps=1e6", "cluster.device.flops_per_s=1e7"]
    base, s_base = run_job(tmp_path / "s", common)
    deep, s_deep = run_job(tmp_path / "d", common + ["scheduler.in_flight=5"])
    assert [deep.runtime.roles[f"stage{s}"].stats()["staleness"][-1] for s in range(3)] == [4, 2, 0]
    assert [base.runtime.roles[f"stage{s}"].stats()["staleness"][-1] for s in range(3)] == [2, 1, 0]
    assert s_deep["virtual_time_s"] < 0.9 * s_base["virtual_time_s"]
    assert s_deep["virtual_time_s"] == pytest.approx(deep.scheduler.plan()["predicted_epoch_s"], rel=0.02)


# timing-only runs for every (S, M); runs with real tensor math at M in {1, 8} (same timing)
@pytest.mark.parametrize("M,numerics", [(1, False), (4, False), (8, False), (1, True), (8, True)])
@pytest.mark.parametrize("scheduler", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S", [2, 4])
def test_bubble_fraction_matches_closed_form(tmp_path, scheduler, S, M, numerics):
    _, summary = run_job(tmp_path, UNIFORM_MLP + [f"scheduler={scheduler}", f"cluster.num_devices={S}", f"scheduler.microbatches={M}", f"runtime.numerics={numerics}"])
    assert summary["bubble_frac"] == pytest.approx((S - 1) / (M + S - 1), abs=1e-6)


def test_local_has_no_bubble(tmp_path):
    _, summary = run_job(tmp_path, UNIFORM_MLP + ["scheduler=local", "scheduler.microbatches=4"])
    assert summary["bubble_frac"] == 0.0


def test_peak_inflight_1f1b_at_most_S_gpipe_M(tmp_path):
    S, M = 4, 8
    common = UNIFORM_MLP + [f"cluster.num_devices={S}", f"scheduler.microbatches={M}", "runtime.numerics=false"]
    _, g = run_job(tmp_path / "g", common + ["scheduler=gpipe"])
    _, o = run_job(tmp_path / "o", common + ["scheduler=1f1b"])
    assert g["peak_inflight"] == {f"stage{s}": M for s in range(S)}
    assert o["peak_inflight"] == {f"stage{s}": S - s for s in range(S)}
    assert max(o["peak_inflight"].values()) <= S


def final_weights(job):
    return {k: v.clone() for k, v in job.model.state_dict().items()}


EXACT = [
    "model=mlp",
    "model.depth=4",
    "model.hidden=32",
    "dataset=synthetic_mnist",
    "dataset.n_train=384",
    "dataset.n_val=64",
    "dataset.n_test=64",
    "cluster=uniform",
    "runtime.dtype=float64",
    "train.epochs=2",
    "train.batch_size=48",
    "scheduler.microbatches=4",
]


@pytest.mark.parametrize("scheduler,S", [("gpipe", 2), ("gpipe", 4), ("1f1b", 2), ("1f1b", 4)])
def test_pipelines_equal_local_gradient_accumulation(tmp_path, scheduler, S):
    ref, _ = run_job(tmp_path / "local", EXACT + ["scheduler=local", "cluster.num_devices=1"])
    job, _ = run_job(tmp_path / "pipe", EXACT + [f"scheduler={scheduler}", f"cluster.num_devices={S}"])
    w_ref, w = final_weights(ref), final_weights(job)
    init = Job(compose_cfg(EXACT + ["scheduler=local", "cluster.num_devices=1"]), tmp_path / "init").model.state_dict()
    assert any((w_ref[k] - init[k]).abs().max() > 1e-3 for k in w_ref), "training must move the weights"
    for k in w_ref:
        assert w[k].dtype == torch.float64
        assert (w[k] - w_ref[k]).abs().max().item() <= 1e-10, k


def test_pipedream_is_stale_but_learns(tmp_path):
    common = ["model=mlp", "model.depth=4", "dataset=synthetic_mnist", "cluster=uniform", "cluster.num_devices=4", "train.epochs=2"]
    ref, _ = run_job(tmp_path / "local", common + ["scheduler=local"])
    job, summary = run_job(tmp_path / "pd", common + ["scheduler=pipedream"])
    # stage s backpropagates through weights S-1-s updates old
    assert summary["staleness"]["max"] == 3
    assert [job.runtime.roles[f"stage{s}"].stats()["staleness"][-1] for s in range(4)] == [3, 2, 1, 0]
    diff = max((a - b).abs().max().item() for a, b in zip(final_weights(ref).values(), final_weights(job).values()))
    assert diff > 1e-4, "asynchronous updates must differ from the synchronous reference"
    assert summary["metrics"]["val/acc"] > 0.6  # chance is 0.1


def test_pipedream_rejects_microbatches(tmp_path):
    from framework.errors import ConfigError

    with pytest.raises(ConfigError, match="scheduler.microbatches"):
        Job(compose_cfg(["scheduler=pipedream", "scheduler.microbatches=4"]), tmp_path)


def test_memory_estimate_follows_the_schedule_and_capacity_fails_early(tmp_path):
    from framework.errors import ConfigError

    common = UNIFORM_MLP + ["cluster.num_devices=4", "scheduler.microbatches=8", "runtime.numerics=false"]
    g = [st.memory_bytes for st in Job(compose_cfg(common + ["scheduler=gpipe"]), tmp_path).scheduler.pipeline_plan.stages]
    o = [st.memory_bytes for st in Job(compose_cfg(common + ["scheduler=1f1b"]), tmp_path).scheduler.pipeline_plan.stages]
    assert [m.microbatches_alive for m in g] == [8, 8, 8, 8]
    assert [m.microbatches_alive for m in o] == [4, 3, 2, 1]
    # 2 units of Linear(64,64) per stage: (2*64*64 + 2*64) params * 4 bytes * (weights, grad, momentum)
    assert g[0].weights_and_optimizer == (2 * 64 * 64 + 2 * 64) * 4 * 3
    # activations: 8 samples per micro-batch, two 64-wide unit outputs, float32
    assert g[0].activations == 8 * 8 * (2 * 64) * 4
    cap = (g[0].bytes + o[0].bytes) // 2  # fits 1F1B's stage 0, not GPipe's
    with pytest.raises(ConfigError, match=r"cluster.devices.dev0.memory_bytes.*stage0.*8 micro-batches"):
        Job(compose_cfg(common + ["scheduler=gpipe", f"+cluster.devices={{dev0: {{memory_bytes: {cap}}}}}"]), tmp_path)
    Job(compose_cfg(common + ["scheduler=1f1b", f"+cluster.devices={{dev0: {{memory_bytes: {cap}}}}}"]), tmp_path)


def test_timeline_labels_asynchronous_steps_by_their_mini_batch_and_says_its_clock(tmp_path):
    """PipeDream steps after every backward: each STEP carries that mini-batch's iteration, so the
    chart of the first iterations shows those only, not the whole epoch. A collaborative schedule
    has no pipeline flushes, so no bubble is reported for it."""
    job = Job(compose_cfg(UNIFORM_MLP + ["scheduler=pipedream", "scheduler.microbatches=1", "cluster.num_devices=3", "train.epochs=1", "train.iterations_per_epoch=12", "runtime.numerics=false"]), tmp_path)
    job.train()
    steps = [iv.iteration for iv in job.runtime.timeline.intervals if iv.kind == "step" and iv.resource == "stage0"]
    assert steps == list(range(job.iterations)) and job.iterations >= 4
    assert job.runtime.timeline.clock == "virtual" and job.runtime.timeline.has_flushes()
    collab = Job(compose_cfg(["scheduler=fl", "cluster=pipar_wifi", "cluster.num_devices=2", "train.epochs=1", "train.iterations_per_epoch=2", "runtime.numerics=false"]), tmp_path / "fl")
    collab.train()
    assert not collab.runtime.timeline.has_flushes()


def _carried_then_wired(tmp_path, monkeypatch, extra, collect):
    """`collect(job, result, out_dir)` of the EXACT config with `extra`, run with the in-process
    shortcut (Compressor.carry) and then through the wire bytes."""
    from framework.compression import Compressor

    cfg = [o for o in EXACT if not o.startswith("scheduler.microbatches")] + ["tracking=none", "runtime.progress=false", "train.epochs=1", *extra]
    if "scheduler=pipar" not in extra:
        cfg.append("scheduler.microbatches=4")
    runs = []
    for how in ("carry", "wire"):
        if how == "wire":
            monkeypatch.setattr(Compressor, "carry", lambda self, tensors, *, tag, copy=True: None)
        job, res = run_job(tmp_path / how, cfg)
        runs.append(collect(job, res, tmp_path / how))
    return runs


@pytest.mark.parametrize("extra", [["scheduler=gpipe", "cluster.num_devices=3", "compressor=none"], ["scheduler=1f1b", "cluster.num_devices=3", "compressor=minmax_ef"],
                                   ["scheduler=pipar", "cluster=pipar_wifi", "cluster.num_devices=3", "scheduler.P=1", "scheduler.N=2"]], ids=["gpipe-raw", "1f1b-minmax-ef", "pipar"])
def test_in_process_shortcut_equals_the_wire(tmp_path, monkeypatch, extra):
    """The simulator hands raw tensors over as copies (Compressor.carry) instead of wire bytes:
    the same virtual time and byte counts as through the wire, and the same weights and metrics
    but for BLAS's summation order (a decoded tensor views its packet at any offset, a copy is
    aligned: float64 weights differ by ~1e-17). minmax_ef sends its gradients raw and corrects
    them with what the sender kept (Compressor.received)."""
    (wa, ra), (wb, rb) = _carried_then_wired(tmp_path, monkeypatch, extra, lambda job, res, out: (final_weights(job), res))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-12, atol=1e-14)
    assert ra["virtual_time_s"] == rb["virtual_time_s"]
    net = {k: v for k, v in ra["metrics"].items() if k.startswith(("net/", "compression/"))}
    assert net and net == {k: rb["metrics"][k] for k in net}
    learned = {k: v for k, v in ra["metrics"].items() if k.startswith(("val/", "train/"))}
    assert learned and learned == pytest.approx({k: rb["metrics"][k] for k in learned}, rel=1e-12)


def test_moved_activations_and_gradients_train_as_copied_ones(tmp_path, monkeypatch):
    """A pipeline stage hands its outputs on without a copy (`moved=True`): the run is bit for bit
    the run in which every message is copied."""
    from framework.compression import Compressor

    cfg = [o for o in EXACT if not o.startswith("scheduler.microbatches")] + ["tracking=none", "runtime.progress=false", "train.epochs=1",
                                                                             "scheduler=gpipe", "cluster.num_devices=3", "compressor=none", "scheduler.microbatches=4"]
    runs = []
    for how in ("moved", "copied"):
        if how == "copied":
            carry = Compressor.carry
            monkeypatch.setattr(Compressor, "carry", lambda self, tensors, *, tag, copy=True: carry(self, tensors, tag=tag))
        job, res = run_job(tmp_path / how, cfg)
        runs.append((final_weights(job), res))
    (wa, ra), (wb, rb) = runs
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert ra["virtual_time_s"] == rb["virtual_time_s"] and ra["metrics"]["val/acc"] == rb["metrics"]["val/acc"]


@pytest.mark.parametrize("extra", [["scheduler=gpipe", "cluster.num_devices=3", "compressor=none"], ["scheduler=1f1b", "cluster.num_devices=3", "compressor=minmax_ef"],
                                   ["scheduler=pipar", "cluster=pipar_wifi", "cluster.num_devices=3", "scheduler.P=1", "scheduler.N=2"]], ids=["gpipe-raw", "1f1b-minmax-ef", "pipar"])
def test_timing_only_shortcut_equals_the_wire(tmp_path, monkeypatch, extra):
    """Timing-only (meta) tensors of an uncoded direction are handed over in-process too: the
    same virtual time, byte counts and timeline as header-only packets through the wire."""
    (ra, ta), (rb, tb) = _carried_then_wired(tmp_path, monkeypatch, [*extra, "runtime.numerics=false"], lambda job, res, out: (res, (out / "timeline.json").read_text()))
    assert ra["virtual_time_s"] == rb["virtual_time_s"]
    net = {k: v for k, v in ra["metrics"].items() if k.startswith(("net/", "compression/"))}
    assert net and net == {k: rb["metrics"][k] for k in net}
    assert ta == tb
