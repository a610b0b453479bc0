"""Replicas' parameters and momentum as rows of one tensor each (framework/replicas/bank.py): a
group step over the bank leaves every parameter and momentum buffer bit for bit where each
replica's own step leaves it, whatever happens to a replica between group steps; where the bank
cannot serve a group, the per-replica update runs instead."""

from __future__ import annotations

import copy

import pytest
import torch

from framework.models import build_model
from framework.replicas import bank as replica_bank
from framework.replicas import batched as replicas
from framework.stage import Stage
from tests.conftest import compose_cfg
from tests.test_replica_batching import run

K = 4


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _stages(overrides=(), k=K, device="cpu"):
    cfg = compose_cfg(["model=lenet", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.model, (1, 28, 28), 10).to(device)
    out = []
    for i in range(k):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * i)
        out.append(Stage(m, 0, len(m), cfg.train))
    return out


def _set_grads(stages, step: int, as_rows: bool) -> None:
    """Gradients for `step`: as the rows of one stacked tensor per parameter (what a batched
    backward leaves) or as tensors of their own."""
    g = torch.Generator().manual_seed(100 + step)
    for n in stages[0].param_names:
        shape = stages[0].params[n].shape
        stacked = torch.randn(len(stages), *shape, generator=g).to(stages[0].params[n].device)
        for st, row in zip(stages, stacked.unbind(0) if as_rows else [t.clone() for t in stacked]):
            st.params[n].grad = row


def _assert_equal(a: list[Stage], b: list[Stage]) -> None:
    for sa, sb in zip(a, b):
        for (n, p), q in zip(sa.params.items(), sb.params.values()):
            assert torch.equal(p, q), n
            ba, bb = sa.optimizer.state.get(p, {}).get("momentum_buffer"), sb.optimizer.state.get(q, {}).get("momentum_buffer")
            assert (ba is None) == (bb is None) and (ba is None or torch.equal(ba, bb)), n


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("as_rows", [True, False], ids=["grad-rows", "grad-tensors"])
@pytest.mark.parametrize(
    "optim",
    [["train.momentum=0.0"], ["train.momentum=0.9", "train.weight_decay=1e-3"], ["train.momentum=0.9", "nesterov"]],
    ids=["plain", "momentum-decay", "nesterov"],
)
def test_bank_steps_equal_each_replica_stepping_alone(optim, as_rows, device):
    """Three group steps over the bank, the group arriving in a different order each time: every
    parameter and momentum buffer bit-equal to each replica's own `step()` (on CUDA: torch's
    foreach update over 4 x 10 tensors against over 10); the parameters stay the module's, the
    optimizer's and the Stage's objects, and their values are the bank's rows."""
    settings = [o for o in optim if o != "nesterov"]
    alone, banked = _stages(settings, device=device), _stages(settings, device=device)
    for st in alone + banked:  # no config key sets it; the update reads it from the group
        st.optimizer.param_groups[0]["nesterov"] = "nesterov" in optim
    objects = [[id(p) for p in st.module.parameters()] for st in banked]
    for step, order in enumerate([[0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0]]):
        _set_grads(alone, step, as_rows)
        _set_grads(banked, step, as_rows)
        for st in alone:
            st.step()
        assert replica_bank.step([banked[i] for i in order])
        for st in banked:
            st.finish_step()
        _assert_equal(alone, banked)
    bank = banked[0].bank
    assert all(st.bank is bank for st in banked) and [st.bank_row for st in banked] == [0, 1, 2, 3]
    assert objects == [[id(p) for p in st.module.parameters()] for st in banked]
    assert all(st.params[n] is p and p in st.optimizer.state or not st.optimizer.defaults["momentum"] for st in banked for n, p in st.module.named_parameters())
    for i, st in enumerate(banked):
        for j, p in enumerate(st.params.values()):
            assert p.data_ptr() == bank.params[j][i].data_ptr()


def test_what_a_replica_does_alone_between_group_steps_lands_in_its_rows():
    """A lone step, a load into the module and a restored optimizer state between group steps:
    the next group step starts from them (a restored state retires the bank, and a new one is
    built), and all stays bit-equal to the replicas stepping alone."""
    opts = ["train.momentum=0.9", "train.weight_decay=1e-3"]
    alone, banked = _stages(opts), _stages(opts)

    def group_step(step):
        _set_grads(alone, step, True)
        _set_grads(banked, step, True)
        for st in alone:
            st.step()
        assert replica_bank.step(banked)
        for st in banked:
            st.finish_step()

    group_step(0)
    for stages in (alone, banked):  # replica 1 steps alone
        _set_grads(stages, 10, False)
        stages[1].step()
        for st in stages:
            st.finish_step() if st is not stages[1] else None
    group_step(1)
    _assert_equal(alone, banked)
    first = banked[0].bank
    state = {k: v.clone() for k, v in alone[3].module.state_dict().items()}
    for stages in (alone, banked):  # a FedAvg-style load into replica 3's module, in place
        stages[3].module.load_state_dict(state)
    from framework.checkpoints import state as ck

    for stages in (alone, banked):  # replica 2's optimizer state restored from a checkpoint
        bag = ck.Bag()
        desc = stages[2].checkpoint(bag, "s")
        stages[2].restore(bag, desc)
    assert not first.live and banked[2].bank is None
    group_step(2)
    assert banked[0].bank is not first and banked[0].bank.live
    _assert_equal(alone, banked)


def test_groups_the_bank_cannot_serve_take_the_per_replica_update():
    """A smaller group, a replica holding a lone forward's graph, a missing gradient, a moved
    parameter: `step` declines (the caller runs lean_torch.sgd_steps) and changes nothing; a
    moved parameter retires the bank, and the next group step builds one afresh."""
    stages = _stages(["train.momentum=0.9"])
    _set_grads(stages, 0, True)
    assert replica_bank.step(stages)
    for st in stages:
        st.finish_step()
    bank = stages[0].bank
    before = [p.clone() for st in stages for p in st.params.values()]

    def unchanged():
        return all(torch.equal(a, p) for a, p in zip(before, [p for st in stages for p in st.params.values()]))

    _set_grads(stages, 1, True)
    assert not replica_bank.step(stages[:3]) and unchanged() and stages[0].bank is bank  # no smaller bank
    x = torch.randn(2, 1, 28, 28)
    stages[2].forward(x, "k", torch.tensor([1, 2]))
    assert stages[2].holds_unbatched_graph()
    assert not replica_bank.step(stages) and unchanged()
    stages[2].backward("k")
    stages[1].params[stages[1].param_names[0]].grad = None
    assert not replica_bank.step(stages) and unchanged()
    _set_grads(stages, 1, True)
    p = stages[3].params[stages[3].param_names[0]]
    p.data = p.data.clone()  # out of its row
    assert replica_bank.step(stages) and stages[0].bank is not bank and not bank.live
    assert not unchanged()


def test_a_replica_whose_buffer_comes_a_step_late_joins_the_bank_with_it():
    """One parameter of one replica has no gradient in the first group step (so no momentum
    buffer after it): the group takes the per-replica update, then (some buffers made, one not)
    again, and once every buffer exists a bank takes them in; bit-equal to stepping alone
    throughout."""
    from framework import lean_torch

    opts = ["train.momentum=0.9", "train.weight_decay=1e-3"]
    alone, grouped = _stages(opts), _stages(opts)
    late = alone[1].param_names[2]
    for step in range(4):
        for stages in (alone, grouped):
            _set_grads(stages, step, True)
            if step == 0:
                stages[1].params[late].grad = None
        for st in alone:
            st.step()
        if not replica_bank.step(grouped):
            lean_torch.sgd_steps([st.optimizer for st in grouped])
        for st in grouped:
            st.finish_step()
        assert (grouped[0].bank is not None) == (step >= 2), step
        _assert_equal(alone, grouped)


def test_mixed_momentum_builds_no_bank():
    """Replicas of which some have momentum buffers and some not yet (stepped different numbers
    of times) are not banked: their group takes the per-replica update."""
    stages = _stages(["train.momentum=0.9"])
    _set_grads(stages, 0, False)
    stages[0].step()
    assert replica_bank.ReplicaBank.build(stages) is None
    _set_grads(stages, 1, False)
    assert not replica_bank.step(stages)
    assert all(st.bank is None for st in stages)


def test_as_rows_views_only_a_tensors_rows():
    base = torch.randn(5, 3, 4)
    rows = list(base.unbind(0))
    view = replica_bank.as_rows(rows)
    assert view is not None and view.data_ptr() == base.data_ptr() and torch.equal(view, base)
    t = torch.randn(5, 4, 3).transpose(1, 2)  # rows of a transposed gradient (a Linear weight's)
    assert torch.equal(replica_bank.as_rows(list(t.unbind(0))), t)
    assert replica_bank.as_rows([r.clone() for r in rows]) is None  # tensors of their own
    assert replica_bank.as_rows([rows[1], rows[0], *rows[2:]]) is None  # not in row order
    assert replica_bank.as_rows(rows[::2]) is not None and torch.equal(replica_bank.as_rows(rows[::2]), base[::2])


@pytest.mark.parametrize(
    "extra",
    [["scheduler=fl", "model=vgg5"], pytest.param(["scheduler=pipar", "model=lenet", "scheduler.P=2", "scheduler.N=2"], marks=pytest.mark.slow)],
    ids=["fl", "pipar"],
)
def test_batched_runs_step_over_the_bank_bit_for_bit(tmp_path, monkeypatch, extra):
    """Two epochs of a batched run (the devices' order changes between them) with the bank and
    with the per-replica update only: the same weights bit for bit, and every group step ran over
    the bank. PiPar's two micro-batches per iteration: the second backward adds the gradients
    held from the first as one stacked add per parameter (`_add_held_gradients`), and that too
    changes no bit against each replica's own additions; once the bank exists, it holds the
    gradients of both micro-batches and adds them there (`ReplicaBank.hold`)."""
    used, summed, held = [], [], []
    step, add_held, hold = replica_bank.step, replicas._add_held_gradients, replica_bank.ReplicaBank.hold
    monkeypatch.setattr(replica_bank, "step", lambda stages: used.append(step(stages)) or used[-1])
    monkeypatch.setattr(replicas, "_add_held_gradients", lambda *a: summed.append(add_held(*a)) or summed[-1])
    monkeypatch.setattr(replica_bank.ReplicaBank, "hold", lambda bank, grads: held.append(bank.held is not None) or hold(bank, grads))
    cfg = [*extra, "runtime.batch_replicas=true", "train.epochs=2"]
    banked = run(tmp_path / "bank", cfg)
    monkeypatch.setattr(replica_bank, "step", lambda stages: False)
    monkeypatch.setattr(replicas, "_add_held_gradients", lambda *a: set())
    monkeypatch.setattr(replicas, "_holding_bank", lambda *a: None)
    plain = run(tmp_path / "plain", cfg)
    assert used and all(used) and held  # every group step over the bank; gradients held there
    if "scheduler.N=2" in extra:  # each iteration's second micro-batch: every parameter summed stacked
        stacked = sum(1 for s in summed if s) + sum(held)
        assert stacked == (len(summed) + len(held)) // 2 and all(s == set(range(len(s))) for s in summed)
    assert banked[0].runtime.deferred.batched_by_kind["step"] > 0
    assert banked[2].keys() == plain[2].keys() and all(torch.equal(banked[2][k], plain[2][k]) for k in banked[2])
    assert banked[1]["metrics"]["val/acc"] == plain[1]["metrics"]["val/acc"]


def test_run_forwards_returns_results_in_request_order_when_it_runs_them_in_bank_order():
    """A batched forward of banked stages arriving out of row order runs them in row order (so
    their gradients come out as the bank's rows) and hands each request its own result."""
    stages = _stages()
    _set_grads(stages, 0, True)
    assert replica_bank.step(stages)
    for st in stages:
        st.finish_step()
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(2, 1, 28, 28, generator=g) for _ in stages]
    order = [2, 0, 3, 1]
    outs = replicas.run_forwards([replicas.ForwardRequest(stages[i], xs[i], "k", torch.tensor([0, 1])) for i in order])
    got = [o.get() for o in outs]
    want = []
    for i in order:
        with torch.no_grad():
            y = stages[i].module(xs[i])
        want.append(torch.nn.functional.cross_entropy(y, torch.tensor([0, 1]), reduction="sum").item())
    assert [g[0] for g in got] == pytest.approx(want, rel=1e-6)
    assert [st.slot_of("k").index for st in stages] == [0, 1, 2, 3]  # the shared graph's rows: bank order
    replicas.run_backwards([replicas.BackwardRequest(st, "k") for st in stages])
    bank = stages[0].bank  # the group's gradients stay in its bank, in its row order
    assert bank.held is not None and all(p.grad is None for st in stages for p in st.params.values())
    bank.hand_out()
    assert replica_bank.as_rows([st.params[st.param_names[0]].grad for st in stages]) is not None


def _held_and_handed(monkeypatch):
    """Two identical banked groups after one batched forward and backward: the first holds its
    gradients in its bank, the second (holding switched off) handed each replica its rows."""
    groups = (_stages(), _stages())
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(3, 1, 28, 28, generator=g) for _ in range(K)]
    y = torch.tensor([0, 1, 2])
    for i, group in enumerate(groups):
        _set_grads(group, 0, True)
        assert replica_bank.step(group)
        for st in group:
            st.finish_step()
        with monkeypatch.context() as m:
            if i:
                m.setattr(replicas, "_holding_bank", lambda *a: None)
            replicas.run_forwards([replicas.ForwardRequest(st, x, "k", y) for st, x in zip(group, xs)])
            replicas.run_backwards([replicas.BackwardRequest(st, "k") for st in group])
    return groups


def _grads_equal(a: Stage, b: Stage) -> None:
    for (n, p), q in zip(a.params.items(), b.params.values()):
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), n


@pytest.mark.parametrize("use", ["step", "checkpoint", "add_grads"])
def test_held_gradients_are_handed_out_before_a_replica_uses_its_own(monkeypatch, use):
    """A batched backward of a whole bank keeps the gradients stacked in the bank; no replica has
    any until something but the group's step asks: a lone step of one replica, a checkpoint,
    a lone backward's accumulation. Then every replica gets its rows, bit for bit what it would
    have been handed at the backward."""
    held, handed = _held_and_handed(monkeypatch)
    bank = held[0].bank
    assert bank.held is not None and all(p.grad is None for st in held for p in st.params.values())
    assert all(p.grad is not None for st in handed for p in st.params.values())
    if use == "step":
        held[1].step()
        handed[1].step()
        _assert_equal(held, handed)
    elif use == "checkpoint":
        from framework.checkpoints import state as ck

        held[0].checkpoint(ck.Bag(), "s")
    else:
        held[2].add_grads([None] * len(held[2].params))
    assert bank.held is None
    for a, b in zip(held, handed):
        _grads_equal(a, b)


def test_the_group_step_takes_held_gradients_and_leaves_none(monkeypatch):
    """The group's step over the bank uses the held gradients as they are (no replica handed
    any) and ends bit for bit where the step over handed-out rows ends."""
    held, handed = _held_and_handed(monkeypatch)
    replicas.run_steps(held)
    replicas.run_steps(handed)
    _assert_equal(held, handed)
    assert held[0].bank.held is None and all(p.grad is None for st in held for p in st.params.values())


@pytest.mark.parametrize("reader", ["role-function", "after-the-flush"])
def test_a_flush_ends_with_every_gradient_handed_out(monkeypatch, reader):
    """Role code runs only between flushes and may read its gradients (AdaLearner's workers send
    theirs): a role's own function run in the flush after a batched backward (a read of its
    model) sees them, and so does the role once the flush is over."""
    from framework.runtime.deferred import DeferredCompute

    held, handed = _held_and_handed(monkeypatch)
    for group in (held, handed):  # from here on, through the simulator's queue
        replicas.run_steps(group)
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(3, 1, 28, 28, generator=g) for _ in range(K)]
    y = torch.tensor([0, 1, 2])
    seen = []
    for i, group in enumerate(groups := (held, handed)):
        with monkeypatch.context() as m:
            if i:
                m.setattr(replicas, "_holding_bank", lambda *a: None)
            d = DeferredCompute()
            for st, x in zip(group, xs):
                d.submit(st.forward, (x, "j", y), {})
            for st in group:
                d.submit(st.backward, ("j",), {})
            def look(group=group):
                seen.append([p.grad is not None for st in group for p in st.params.values()])

            if reader == "role-function":  # queued behind the last replica's backward, in the same flush
                d.submit_read(look, (), group[-1].model, {})
            d.flush()
            if reader == "after-the-flush":
                look()
            assert d.batched_by_kind["backward"] == K
    assert seen[0] == seen[1] == [True] * len(seen[0])
    assert held[0].bank.held is None
    for a, b in zip(*groups):
        _grads_equal(a, b)
