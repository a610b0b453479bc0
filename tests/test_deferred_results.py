"""Results on demand (framework/runtime/deferred.py): placeholders for Stage results, queued work
run as a dataflow program, batched across replicas whatever the virtual time they were admitted.

Deferring changes nothing but when the tensor work runs: the same values (float64, to rounding),
the same messages and byte counts, the same hook calls in the same order.
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from framework.cluster import Work
from framework.compression import Compressor
from framework.models import build_model
from framework.runtime import wire
from framework.runtime.base import RuntimeHooks
from framework.runtime.deferred import DeferredCall, DeferredCompute, Pending
from framework.runtime.sim import SimRuntime
from framework.scheduler import ProgramRole
from framework.stage import Stage
from tests.conftest import compose_cfg
from tests.test_replica_batching import run

K, CUT = 4, 2


def split_replicas():
    """K (device stage, server stage) pairs of LeNet cut at unit CUT, each pair with its own
    weights (float64), and each device's inputs and labels."""
    cfg = compose_cfg(["model=lenet", "runtime.dtype=float64", "train.momentum=0.9"])
    torch.manual_seed(0)
    model = build_model(cfg.model, (1, 28, 28), 10).to(torch.float64)
    g = torch.Generator().manual_seed(1)
    pairs, data = [], []
    for k in range(K):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * k)
        pairs.append((Stage(m, 0, CUT, cfg.train), Stage(copy.deepcopy(m), CUT, len(m), cfg.train)))
        data.append((torch.randn(6, 1, 28, 28, generator=g, dtype=torch.float64), torch.randint(0, 10, (6,), generator=g)))
    return pairs, data


def test_a_serial_servers_replicas_run_as_one_call_each_and_equal_the_eager_run():
    """PiPar's shape of work: every device's forward admitted together, then the server's
    forward, backward and step for one device after another, each device's backward on the
    gradient that came back. Admitted with placeholders, nothing runs until asked; then every
    kind of call runs once for all K replicas, and the weights, losses and gradients equal the
    eager run's."""
    eager, data = split_replicas()
    for (dev, srv), (x, y) in zip(eager, data):
        a = dev.forward(x, 0)
        loss, correct, n = srv.forward(a.clone(), 0, y, 1 / 6)
        dev.backward(0, srv.backward(0))
        srv.step()
        dev.step()
        eager_out = (loss, correct, n)

    lazy, _ = split_replicas()
    d = DeferredCompute()
    acts = [d.submit(dev.forward, (x, 0), {}, on_demand=True) for (dev, _), (x, _) in zip(lazy, data)]
    reports = []
    for (dev, srv), (_, y), (_, known, a) in zip(lazy, data, acts):
        assert known and isinstance(a, Pending) and a.shape == (6, *dev.out_shape)
        _, known, out = d.submit(srv.forward, (a.copied(), 0, y, 1 / 6), {}, on_demand=True)
        reports.append(out)
        _, known, grad = d.submit(srv.backward, (0,), {}, on_demand=True)
        assert known and grad.shape == a.shape
        d.submit(srv.step, (), {}, on_demand=True)
        _, known, none = d.submit(dev.backward, (0, grad), {}, on_demand=True)
        assert known and none is None  # a first stage has no input gradient
        d.submit(dev.step, (), {}, on_demand=True)
    assert d.calls == 0 and all(not st.inflight and st.version == 0 for pair in lazy for st in pair)
    loss, correct, n = reports[-1]
    assert n == 6 and isinstance(loss, Pending)
    assert loss.value() == pytest.approx(eager_out[0], rel=1e-12) and correct.value() == eager_out[1]
    assert d.flushes == 1 and d.calls == 6 * K
    assert dict(d.batched_by_kind) == {"forward": 2 * K, "backward": 2 * K, "step": 2 * K}
    for pe, pl in zip(eager, lazy):
        for se, sl in zip(pe, pl):
            for (name, p), q in zip(se.module.named_parameters(), sl.module.parameters()):
                torch.testing.assert_close(q, p, rtol=1e-12, atol=1e-12, msg=name)


def test_calls_on_one_model_keep_their_order_and_random_calls_wait_for_all_before():
    """Two iterations of one stage: the second forward waits for the first step (same model),
    whatever the batching; a function that is not a Stage's runs only after everything
    admitted before it (it may draw random numbers, or read any state)."""
    pairs, data = split_replicas()
    (dev, _), (x, _) = pairs[0], data[0]
    d = DeferredCompute()
    order = []
    d.submit(dev.forward, (x, 0), {}, on_demand=True)
    d.submit(dev.backward, (0, torch.ones(6, *dev.out_shape, dtype=torch.float64)), {}, on_demand=True)
    d.submit(dev.step, (), {}, on_demand=True)
    d.submit(dev.forward, (x, 0), {}, on_demand=True)  # the same key again: only after the backward
    assert d.calls == 0
    d.submit(lambda: order.append(dev.version), (), {})  # not a Stage's: the queue runs first
    assert d.calls == 4 and dev.version == 1 and dev.inflight == 1
    d.flush()
    assert order == [1]


def test_a_placeholder_that_breaks_its_promise_is_an_error():
    d = DeferredCompute()
    call = DeferredCall(d, None, (), {}, 0)
    call.settle(torch.zeros(3, 3))
    with pytest.raises(RuntimeError, match=r"a deferred call returned \(3, 3\) torch.float32 where its placeholder promised \(2, 3\) torch.float32"):
        Pending(call, shape=(2, 3), dtype=torch.float32).value()


def test_a_failing_call_behind_a_placeholder_fails_the_flush_and_what_waits_on_it():
    pairs, data = split_replicas()
    (dev, srv), (x, y) = pairs[0], data[0]
    d = DeferredCompute()
    _, _, a = d.submit(dev.forward, (x.expand(6, 3, 28, 28), 0), {}, on_demand=True)  # 3 channels for 1
    srv_fwd, _, _ = d.submit(srv.forward, (a.copied(), 0, y), {}, on_demand=True)
    with pytest.raises(RuntimeError, match="channels"):
        d.flush()
    assert srv_fwd.done and srv_fwd.error is not None


def _runtime():
    from framework.cluster import Cluster
    from framework.config.schemas import ClusterConfig

    cluster = Cluster(OmegaConf.merge(OmegaConf.structured(ClusterConfig(name="t")), {"num_devices": 2}))
    cfg = OmegaConf.create({"name": "sim", "numerics": True, "batch_replicas": True, "torch_device": "cpu"})
    return cluster, cfg


class Recorder(RuntimeHooks):
    def __init__(self):
        self.calls = []

    def on_train(self, loss_sum, correct, n, role=None):
        self.calls.append(("train", loss_sum, correct, n))

    def on_iteration(self, epoch, iteration, samples, now):
        self.calls.append(("iteration", epoch, iteration, samples, now))


def test_messages_carry_placeholders_and_a_role_outside_a_block_reads_values():
    """A role in `deferred_results()` sends a placeholder; the bytes on the link are the
    tensor's; a receiver inside a block gets a placeholder, one outside gets the value. Reports
    of deferred numbers reach the hooks once the numbers exist, in the order they were made."""
    pairs, data = split_replicas()
    (dev, srv), (x, y) = pairs[0], data[0]
    expect = dev.module(x).detach()
    cluster, cfg = _runtime()
    hooks = Recorder()
    rt = SimRuntime(cfg, cluster, Compressor(), hooks)
    got = {}

    async def device(ctx):
        with ctx.deferred_results():
            a = await ctx.compute(Work("fwd", seconds=0.01), dev.forward, x, 0)
            assert isinstance(a, Pending)
            ctx.send("server", "act", {"x": a, "y": y})
            ctx.send("reader", "act", a)

    async def server(ctx):
        with ctx.deferred_results():
            msg = await ctx.recv("device", "act")
            assert isinstance(msg["x"], Pending) and isinstance(msg["y"], torch.Tensor)
            out = await ctx.compute(Work("fwd", seconds=0.01), srv.forward, msg["x"], 0, msg["y"])
            ctx.report_train(*out)
            ctx.iteration_done(0, 1, 6)
            assert hooks.calls == []  # the loss is not known yet
        got["loss"] = hooks.calls[0][1]

    async def reader(ctx):
        got["act"] = await ctx.recv("device", "act")

    rt.run_roles({"device": ProgramRole("dev0", device), "server": ProgramRole("dev1", server), "reader": ProgramRole("dev1", reader)})
    assert isinstance(got["act"], torch.Tensor)
    torch.testing.assert_close(got["act"], expect, rtol=1e-12, atol=1e-12)
    assert [c[0] for c in hooks.calls] == ["train", "iteration"] and hooks.calls[0][3] == 6
    assert isinstance(got["loss"], float)
    sent = rt.codec.directions["act"]
    assert sent.raw_bytes == sent.wire_bytes == wire.encoded_size({"x": expect}) + wire.encoded_size({"x": expect, "y": y})


def _iteration_stream(monkeypatch):
    """Every on_iteration call of the jobs that follow, with the training numbers it logs."""
    from framework.job import Job

    stream = []
    real = Job.on_iteration

    def spy(self, epoch, iteration, samples, now):
        stream.append((epoch, iteration, samples, now, *self._train))
        real(self, epoch, iteration, samples, now)

    monkeypatch.setattr(Job, "on_iteration", spy)
    return stream


def test_pipar_with_results_on_demand_logs_what_the_eager_run_logs(tmp_path, monkeypatch):
    """PiPar over three devices and one server: deferred, the server's replicas run batched
    (few flushes, most calls inside a batched call), and every per-iteration metric equals the
    eager run's: the same virtual times and samples exactly, losses to rounding (float64)."""
    stream = _iteration_stream(monkeypatch)
    cfg = ["scheduler=pipar", "model=lenet", "scheduler.P=2", "scheduler.N=2", "runtime.dtype=float64", "dataset=synthetic_mnist", "dataset.n_train=384"]
    run(tmp_path / "eager", cfg + ["runtime.batch_replicas=false"])
    eager, stream[:] = list(stream), []
    job, _, _ = run(tmp_path / "deferred", cfg + ["runtime.batch_replicas=true"])
    d = job.runtime.deferred
    assert d.batched > 0.9 * d.stage_calls and d.flushes <= 2
    assert len(stream) == len(eager) > 0
    for a, b in zip(stream, eager):
        assert a[:4] == b[:4]
        assert a[4:] == pytest.approx(b[4:], rel=1e-10)


def test_a_stage_whose_output_is_not_the_models_unit_shape_is_caught():
    """Byte counts of a placeholder's message come from the model's unit shapes: a forward that
    returns another shape (here: a smaller input than the model was built for) is an error
    that names the call, not a silently wrong byte count."""
    pairs, data = split_replicas()
    (dev, _), (x, _) = pairs[0], data[0]
    d = DeferredCompute()
    _, _, a = d.submit(dev.forward, (x[:, :, :20], 0), {}, on_demand=True)
    d.flush()
    with pytest.raises(RuntimeError, match=r"deferred Stage.forward returned \(6, 16, 3, 5\) torch.float64 where its placeholder promised \(6, 16, 5, 5\)"):
        a.value()


def test_a_deferred_read_sees_the_model_after_its_queued_work():
    """A round's upload read (`submit_read`) queues behind the model's forward, backward and
    step: its placeholders hold the weights after the step, and reading runs the queue."""
    pairs, data = split_replicas()
    (dev, _), (x, _) = pairs[0], data[0]
    d = DeferredCompute()
    d.submit(dev.forward, (x, 0), {}, on_demand=True)
    d.submit(dev.backward, (0, torch.ones(6, *dev.out_shape, dtype=torch.float64)), {}, on_demand=True)
    d.submit(dev.step, (), {}, on_demand=True)
    first = next(dev.module.parameters())
    before = first.detach().clone()
    got = d.submit_read(lambda: {"w": first.detach().clone()}, (), dev.model, {"w": torch.empty(first.shape, dtype=first.dtype, device="meta")})
    assert d.calls == 0 and got["w"].shape == first.shape
    w = got["w"].value()
    assert dev.version == 1 and torch.equal(w, first.detach()) and not torch.equal(w, before)
