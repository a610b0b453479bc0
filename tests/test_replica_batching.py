"""Identical replicas as one vmapped call (framework/replicas/batched.py, framework/runtime/deferred.py),
and tensor work on a GPU (`runtime.torch_device`).

Batching must change nothing but speed: the same virtual times, byte counts and metrics, and in
float64 the same weights up to rounding. Tests that need CUDA skip without it.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from framework.errors import ConfigError
from framework.job import Job
from framework.runtime import deferred
from tests.conftest import compose_cfg

SMALL = [
    "dataset=synthetic_cifar10",
    "dataset.n_train=384",
    "dataset.n_val=64",
    "dataset.n_test=64",
    "cluster=pipar_wifi",
    "cluster.num_devices=3",
    "train.epochs=1",
    "train.batch_size=32",
    "train.momentum=0.9",
    "train.weight_decay=1e-4",
]


def run(tmp_path, overrides):
    job = Job(compose_cfg(SMALL + overrides), tmp_path)
    res = job.run()
    weights = {k: v.detach().cpu().clone() for k, v in job.final_model().state_dict().items()}
    return job, res, weights


def assert_same_run(a, b, rtol):
    (_, ra, wa), (_, rb, wb) = a, b
    assert ra["virtual_time_s"] == rb["virtual_time_s"]
    net = {k: v for k, v in ra["metrics"].items() if k.startswith(("net/", "compression/", "time/")) and k != "time/wall_s"}
    assert net == {k: rb["metrics"][k] for k in net}
    learned = {k: v for k, v in ra["metrics"].items() if k.startswith(("val/", "train/", "test/"))}
    assert learned and learned == pytest.approx({k: rb["metrics"][k] for k in learned}, rel=rtol, abs=rtol)
    assert wa.keys() == wb.keys()
    for k in wa:
        if wa[k].is_floating_point():
            torch.testing.assert_close(wa[k], wb[k], rtol=rtol, atol=rtol)
        else:
            assert torch.equal(wa[k], wb[k]), k


@pytest.mark.parametrize(
    "extra,share",
    [
        (["scheduler=fl", "model=vgg5"], 0.9),  # whole-model replicas with BatchNorm, in lockstep
        # the server's one processor serves its replicas one after another (devices fall out of
        # step waiting on it): results on demand queue the round's work, and it runs batched
        pytest.param(["scheduler=pipar", "model=vgg5", "scheduler.P=2", "scheduler.N=2"], 0.9, marks=pytest.mark.slow),
        pytest.param(["scheduler=sfl", "model=lenet", "scheduler.P=1"], 0.9, marks=pytest.mark.slow),
    ],
    ids=["fl-vgg5", "pipar-vgg5", "sfl-lenet"],
)
def test_batched_replicas_train_as_one_at_a_time(tmp_path, extra, share):
    cfg = ["runtime.dtype=float64", *extra]
    alone = run(tmp_path / "alone", cfg + ["runtime.batch_replicas=false"])
    batched = run(tmp_path / "batched", cfg + ["runtime.batch_replicas=true"])
    assert alone[0].runtime.deferred is None
    d = batched[0].runtime.deferred
    assert d.batched > share * d.stage_calls  # the share of Stage calls that ran inside a call of several replicas
    assert_same_run(alone, batched, rtol=1e-10)


@pytest.mark.slow  # two VGG-5 runs (about 9 s); the CPU default, grouped convolutions, stays fast
def test_convolutions_as_matrix_products_train_as_one_at_a_time(tmp_path, monkeypatch):
    """`runtime.replica_conv=matmul` (the default on a GPU; framework/replicas/conv.py): the
    batched forwards' convolutions run as batched matrix products, and the run still equals
    the one-at-a-time run up to float64 rounding."""
    from framework.replicas import batched as replicas
    from framework.replicas import conv as batched_conv

    convs, forwards = [], []
    as_matmul, run_forwards = batched_conv.conv2d_as_matmul, replicas.run_forwards
    monkeypatch.setattr(batched_conv, "conv2d_as_matmul", lambda *a, **kw: convs.append(1) or as_matmul(*a, **kw))
    monkeypatch.setattr(replicas, "run_forwards", lambda *a, **kw: forwards.append(1) or run_forwards(*a, **kw))
    cfg = ["runtime.dtype=float64", "scheduler=fl", "model=vgg5"]
    alone = run(tmp_path / "alone", cfg + ["runtime.batch_replicas=false"])
    grouped = run(tmp_path / "grouped", cfg + ["runtime.batch_replicas=true"])  # the default on a CPU
    assert not convs and forwards
    forwards.clear()
    batched = run(tmp_path / "batched", cfg + ["runtime.batch_replicas=true", "runtime.replica_conv=matmul"])
    assert len(convs) == 3 * len(forwards) > 0  # VGG-5's three convolutions in every batched forward
    assert_same_run(alone, batched, rtol=1e-10)
    assert_same_run(grouped, batched, rtol=1e-10)


def test_deferring_alone_changes_no_bit(tmp_path, monkeypatch):
    """Running each call when its result is first needed, in admission order, is the same
    program: bit-identical weights and metrics (dropout's random draws included)."""
    cfg = ["scheduler=fl", "model=har_cnn", "dataset=synthetic_har", "dataset.n_train=384", "runtime.batch_replicas=true"]
    now = run(tmp_path / "now", cfg[:-1])
    monkeypatch.setattr(deferred.DeferredCompute, "__init__", lambda self, batch=True, **kw: _init(self, batch=False, **kw))
    later = run(tmp_path / "later", cfg)
    assert later[0].runtime.deferred.calls > 0 and later[0].runtime.deferred.batched == 0
    assert_same_run(now, later, rtol=0)


_init = deferred.DeferredCompute.__init__


def test_random_modules_run_alone(tmp_path):
    """HAR-CNN has dropout: a batched call would draw other random numbers, so its replicas'
    forwards and backwards run one at a time; their optimizer steps draw none and run as one
    update, which on the CPU is the same single-tensor arithmetic: the run equals the unbatched
    one exactly."""
    cfg = ["scheduler=fl", "model=har_cnn", "dataset=synthetic_har", "dataset.n_train=384", "train.momentum=0.9"]
    alone = run(tmp_path / "alone", cfg)
    batched = run(tmp_path / "batched", cfg + ["runtime.batch_replicas=true"])
    d = batched[0].runtime.deferred
    assert d.batched_by_kind["forward"] == d.batched_by_kind["backward"] == 0
    assert d.batched_by_kind["step"] > 0
    assert_same_run(alone, batched, rtol=0)


def test_bad_torch_device_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"runtime.torch_device.*choices: cpu, cuda, cuda:<n>"):
        Job(compose_cfg(SMALL + ["runtime.torch_device=gpu"]), tmp_path)
    with pytest.raises(ConfigError, match=r"runtime.torch_device.*timing-only"):
        Job(compose_cfg(SMALL + ["runtime.torch_device=cuda", "runtime.numerics=false"]), tmp_path)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"runtime.torch_device.*choices on this machine: cpu"):
            Job(compose_cfg(SMALL + ["runtime.torch_device=cuda"]), tmp_path)


def test_batching_refuses_measured_time(tmp_path):
    with pytest.raises(ConfigError, match=r"runtime.batch_replicas.*time_model=measured"):
        Job(compose_cfg(SMALL + ["scheduler=fl", "runtime.batch_replicas=true", "cluster.device.time_model=measured"]), tmp_path).run()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


GPU_SCHEDULERS = ["fl", "pipar", "sfl", "gpipe", "1f1b", "pipedream", "sl"]


@cuda
@pytest.mark.parametrize("scheduler", GPU_SCHEDULERS)
def test_gpu_run_equals_the_cpu_run_in_float64(tmp_path, scheduler):
    """Time comes from the device models, not from the GPU: the same virtual time and bytes. In
    float64 (where rounding decides no max-pool tie or ReLU sign) every weight and statistic of
    the GPU run, batched replicas included, equals the CPU run's one at a time to 1e-8."""
    cfg = [f"scheduler={scheduler}", "model=vgg5", "train.epochs=1", "runtime.dtype=float64"]
    on_cpu = run(tmp_path / "cpu", cfg)
    on_gpu = run(tmp_path / "gpu", cfg + ["runtime.torch_device=cuda"])
    assert on_gpu[0].runtime.deferred is not None  # batching is on by default on a GPU
    assert_same_run(on_cpu, on_gpu, rtol=1e-8)


@cuda
@pytest.mark.parametrize("scheduler", GPU_SCHEDULERS)
def test_gpu_run_matches_the_cpu_run_in_float32(tmp_path, scheduler):
    """In float32, training amplifies rounding: a max-pool tie or a ReLU at zero decided the other
    way moves a weight by a whole gradient step (measured on an H200, TF32 off, 12 steps: up to
    1.4e-2 in one BatchNorm statistic of SL, while the CPU's float32 run was 6e-6 from float64's).
    So: the same virtual time and bytes, the same accuracy within 5 points, and each tensor within
    10 % of the CPU run's in norm (at most 4.4 % measured, PipeDream's first BatchNorm bias)."""
    cfg = [f"scheduler={scheduler}", "model=vgg5", "train.epochs=1"]
    (_, rc, wc), (_, rg, wg) = run(tmp_path / "cpu", cfg), run(tmp_path / "gpu", cfg + ["runtime.torch_device=cuda"])
    assert rc["virtual_time_s"] == rg["virtual_time_s"]
    assert {k: v for k, v in rc["metrics"].items() if k.startswith("net/")} == {k: v for k, v in rg["metrics"].items() if k.startswith("net/")}
    assert rg["metrics"]["val/acc"] == pytest.approx(rc["metrics"]["val/acc"], abs=0.05)
    errors = sorted(((float((wg[k] - wc[k]).norm() / wc[k].norm().clamp_min(1e-6)), k) for k in wc if wc[k].is_floating_point()), reverse=True)
    print(f"{scheduler}: largest relative differences {errors[:3]}")
    assert errors[0][0] <= 0.10, errors[:3]


@cuda
def test_tf32_is_opt_in_and_changes_no_virtual_time(tmp_path):
    """float32 means float32 unless `runtime.tf32=true`; with it the run is priced the same (time
    comes from the device models) and learns about as much."""
    cfg = ["scheduler=fl", "model=vgg5", "train.epochs=1", "runtime.torch_device=cuda"]
    (_, rs, _) = run(tmp_path / "strict", cfg)
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    (_, rt, _) = run(tmp_path / "tf32", cfg + ["runtime.tf32=true"])
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    assert rs["virtual_time_s"] == rt["virtual_time_s"]
    assert rt["metrics"]["val/acc"] == pytest.approx(rs["metrics"]["val/acc"], abs=0.05)
    run(tmp_path / "again", cfg)  # the switch is per run, not left over from the last one
    assert not torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize("where", ["first", "middle", "last"], ids=["first-stage", "middle-stage", "last-stage"])
def test_shared_graph_backwards_equal_each_replica_alone(where):
    """Four replicas' forwards as one call; then the backward of one (recomputed alone), and of
    the other three together through the shared graph: every gradient, input gradient, loss
    and BatchNorm statistic equals the replica's own forward and backward (float64). On a last
    stage each replica has its own loss scale (the seed of a part of the group)."""
    from framework.models import build_model
    from framework.stage import Stage

    cfg = compose_cfg(["model=vgg5", "runtime.dtype=float64"])
    torch.manual_seed(0)
    model = build_model(cfg.model, (3, 16, 16), 10).to(torch.float64)
    start, stop = {"first": (0, 3), "middle": (1, 4), "last": (1, len(model))}[where]
    last = where == "last"

    def stages():
        out = []
        for k in range(4):
            m = __import__("copy").deepcopy(model)
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(0.01 * k)
            out.append(Stage(m, start, stop, cfg.train))
        return out

    g = torch.Generator().manual_seed(1)
    shape = model.infos[start].in_shape
    xs = [torch.randn(8, *shape, generator=g, dtype=torch.float64) for _ in range(4)]
    grads = [torch.randn(8, *model.infos[stop - 1].out_shape, generator=g, dtype=torch.float64) for _ in range(4)]
    targets = [torch.randint(0, 10, (8,), generator=g) for _ in range(4)] if last else [None] * 4
    scales = [1.0, 0.5, 0.25, 2.0] if last else [1.0] * 4
    grads = [None] * 4 if last else grads
    ref, bat = stages(), stages()
    ref_in = [st.forward(x, 0, t, sc) for st, x, t, sc in zip(ref, xs, targets, scales)]
    ref_dx = [st.backward(0, gr) for st, gr in zip(ref, grads)]
    from framework.replicas import batched as replicas

    outs = replicas.run_forwards([replicas.ForwardRequest(st, x, 0, t, sc) for st, x, t, sc in zip(bat, xs, targets, scales)])
    dx = replicas.run_backwards([replicas.BackwardRequest(bat[2], 0, grads[2])])  # alone: recomputed
    dx = dx[:0] + replicas.run_backwards([replicas.BackwardRequest(bat[k], 0, grads[k]) for k in (0, 1, 3)]) + dx
    dx = [dx[0], dx[1], dx[3], dx[2]]
    for k in range(4):
        if last:  # (loss_sum, correct, n), read back when asked for
            loss, correct, n = outs[k].get()
            assert (correct, n) == ref_in[k][1:] and loss == pytest.approx(ref_in[k][0], rel=1e-12)
        else:
            torch.testing.assert_close(outs[k], ref_in[k], rtol=1e-12, atol=1e-12)
        if where == "first":
            assert dx[k] is None and ref_dx[k] is None
        else:
            torch.testing.assert_close(dx[k], ref_dx[k], rtol=1e-12, atol=1e-12)
        for (n, p), q in zip(bat[k].module.named_parameters(), ref[k].module.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12, msg=n)
        for b, c in zip(bat[k].module.buffers(), ref[k].module.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-12, atol=1e-12)
        assert not bat[k].inflight


class _HostWaits(TorchDispatchMode):
    """Records the tensor calls that make the host wait for a GPU: a value read back
    (`item`, `float(t)`, `bool(t)`), or host data made into a tensor (`torch.tensor(...)`,
    indexing with a Python list), whose copy to the device waits for the queued kernels."""

    WAITS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.WAITS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "extra",
    [["scheduler=fl", "model=vgg5"], ["scheduler=pipar", "model=lenet", "scheduler.P=2", "scheduler.N=2"], ["scheduler=sfl", "model=lenet", "scheduler.P=1"]],
    ids=["fl", "pipar", "sfl"],
)
def test_a_batched_round_never_waits_for_the_device(tmp_path, monkeypatch, extra):
    """Inside a flush (the round's queued work, run batched) nothing reads a value back or copies
    host data in: on a GPU each would make the host wait for every kernel launched before it, at
    every iteration. Checked on the CPU, where the same calls are visible; the losses are read
    once asked for, after the flush (that they equal the unbatched run's is
    test_batched_replicas_train_as_one_at_a_time's)."""
    waits = _HostWaits()
    tolists: list = []
    run_calls = deferred.DeferredCompute._run

    def watched(self, calls):
        real_tolist = torch.Tensor.tolist

        def tolist(t):
            tolists.append(tuple(t.shape))
            return real_tolist(t)

        monkeypatch.setattr(torch.Tensor, "tolist", tolist)
        try:
            with waits:
                run_calls(self, calls)
        finally:
            monkeypatch.setattr(torch.Tensor, "tolist", real_tolist)

    monkeypatch.setattr(deferred.DeferredCompute, "_run", watched)
    batched = run(tmp_path, ["runtime.dtype=float64", *extra, "runtime.batch_replicas=true"])
    d = batched[0].runtime.deferred
    assert d.batched_by_kind["forward"] > 0 and d.batched_by_kind["backward"] > 0
    assert waits.seen == [] and tolists == []
    assert batched[1]["metrics"]["train/loss"] > 0  # read back after the flush


@pytest.mark.parametrize("foreach", [False, True], ids=["single-tensor", "foreach"])
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
@pytest.mark.parametrize("late", [False, True], ids=["all-at-once", "one-buffer-late"])
def test_sgd_steps_equal_each_optimizer_stepping_alone(foreach, momentum, nesterov, late):
    """Replicas' optimizer steps as one update (`lean_torch.sgd_steps`, what a batched `step`
    runs): every parameter and momentum buffer bit-equal to each optimizer's own step, over three
    steps (the buffers made, then used). The foreach path is the one torch takes on a GPU. With
    `late`, one replica's parameter has no gradient in the first step, so its buffer is made in
    the second, among buffers that exist: it must land in that replica's optimizer."""
    from framework.lean_torch import SGD, sgd_steps

    g = torch.Generator().manual_seed(0)
    shapes = [(8, 3), (8,), (5, 8)]

    def replicas():
        torch.manual_seed(1)
        out = []
        for k in range(3):
            ps = [torch.randn(s, generator=torch.Generator().manual_seed(10 * k + i)).requires_grad_() for i, s in enumerate(shapes)]
            out.append((ps, SGD(ps, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=1e-3, foreach=foreach)))
        return out

    grads = [[[torch.randn(s, generator=g) for s in shapes] for _ in range(3)] for _ in range(3)]
    alone, together = replicas(), replicas()
    for step in range(3):
        for ps_opts in (alone, together):
            for k, ((ps, _), gs) in enumerate(zip(ps_opts, grads[step])):
                for i, (p, gr) in enumerate(zip(ps, gs)):
                    p.grad = None if late and step == 0 and (k, i) == (1, 1) else gr.clone()
        for _, opt in alone:
            opt.step()
        sgd_steps([opt for _, opt in together])
        for (pa, oa), (pt, ot) in zip(alone, together):
            for a, t in zip(pa, pt):
                assert torch.equal(a, t)
                if momentum:
                    ba, bt = oa.state.get(a, {}).get("momentum_buffer"), ot.state.get(t, {}).get("momentum_buffer")
                    assert (ba is None and bt is None) if late and step == 0 and a is pa[1] and oa is alone[1][1] else torch.equal(ba, bt)


@cuda
def test_a_gpu_checkpoint_stores_identical_tensors_once(tmp_path):
    """The copies of the aggregate on the GPU are found with one read-back and stored once; each
    loads back as its own CPU tensor."""
    from framework.checkpoints import state as ck

    w = torch.randn(4, 3, device="cuda")
    bag = ck.Bag()
    for role in ("dev0", "dev1", "dev2"):
        bag.meta[role] = bag.put(role, {"w": w.clone(), "m": torch.randn(4, 3, device="cuda")})
    assert ck.duplicates(bag) == {"dev1.w": "dev0.w", "dev2.w": "dev0.w"}
    ck.save(tmp_path, bag)
    back = ck.load(tmp_path)
    for role in ("dev0", "dev1", "dev2"):
        got, want = back.take(back.meta[role]), bag.take(bag.meta[role])
        assert all(torch.equal(got[k], want[k].cpu()) for k in want), role


@cuda
def test_checkpoint_file_of_gpu_tensors(tmp_path):
    """A checkpoint fetches a GPU run's tensors to the host as one block per device; the file
    reads back (by safetensors' own reader) as the tensors were, whatever their dtype, shape or
    layout, beside CPU tensors."""
    from safetensors.torch import load_file

    from framework.checkpoints.state import save_file

    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(5, 3, generator=g).cuda(),
        "wt": torch.randn(3, 5, generator=g).cuda().t(),  # not contiguous
        "n": torch.tensor(7, dtype=torch.int64).cuda(),  # 0-dim
        "mask": (torch.randn(9, generator=g) > 0).cuda(),
        "half": torch.randn(4, generator=g).half().cuda(),
        "empty": torch.zeros(0, 2).cuda(),
        "on_cpu": torch.randn(6, generator=g, dtype=torch.float64),
    }
    save_file(tensors, tmp_path / "s.safetensors")
    back = load_file(str(tmp_path / "s.safetensors"))
    assert back.keys() == tensors.keys()
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t.cpu()), k
