"""Identical replicas trained as one batched call: many simulated devices, few kernels.

FL, PiPar and SFL give every device (and every server-side replica) its own copy of the same
architecture. Run one at a time, K replicas launch K small kernels per layer, which leaves a GPU
idle; `torch.func.vmap` over their stacked parameters does the same work in one launch per layer.

`run_forwards(requests)` runs the forwards of G stages that slice the same units of the same
architecture, on inputs of one shape: parameters and buffers are stacked, the slice runs once
under vmap, BatchNorm's running statistics are written back to each replica, and every stage
keeps a `Slot` (the shared graph and its index) where it would keep its own graph. A last
stage's losses and correct counts stay on the device (`LossRow`) until a member's are asked for.
`run_backwards(requests)` runs the backwards of stages whose forwards ran together as one
autograd call over the shared graph (zero gradient for members not in the call; the graph is kept
until its last member is done) and adds each member's slice of the gradients to its own
parameters (where all members are in the call and hold gradients that are one tensor's rows, the
second micro-batch's, as one stacked add per parameter); where the members are all of a replica
bank's rows, the stacked gradients stay in the bank for the group's step (replica_bank.py, *Held
gradients*). `run_steps(stages)` runs the replicas'
SGD steps as one update over their bank (framework/replicas/bank.py). Results equal the
one-at-a-time calls up to rounding (float64: about 1e-15).

**Nothing in these calls waits for the device.** Reading a value back (`item`, `tolist`) and
copying host data to the device (`torch.tensor(..., device=)`, indexing with a Python list) each
make the host wait until the GPU has run everything queued before; inside a flush that would
happen at every iteration, and the host could never run ahead of the kernels it launched. So the
losses are read once, when asked for (after the round's work is queued), and the backward's
seed is made on the device (tests/test_replica_batching.py checks this on the CPU).

Which calls may run together is decided by `forward_signature`: same architecture slice, same
input shape and dtype, same loss or none, no weight stashing, and no random modules (dropout):
a batched call would draw other random numbers than the replicas one by one.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from framework import lean_torch
from framework.replicas import bank as replica_bank
from framework.replicas.conv import ConvAsMatmul

_RANDOM_MODULES = (nn.modules.dropout._DropoutNd, nn.RReLU)


def draws_random_numbers(module: nn.Module) -> bool:
    """Whether a training-mode call of `module` uses torch's random generator."""
    return any(isinstance(m, _RANDOM_MODULES) and m.training and getattr(m, "p", 1.0) > 0 for m in module.modules())


def architecture_key(module: nn.Module, start: int, stop: int, params: dict | None = None, buffers: dict | None = None) -> tuple:
    """What two stages must share to run as one vmapped call. `params` and `buffers`: the
    module's named parameters and buffers where the caller holds them already (a Stage does)."""
    params = dict(module.named_parameters()) if params is None else params
    buffers = dict(module.named_buffers()) if buffers is None else buffers
    return (
        start,
        stop,
        tuple((type(m).__name__, m.training) for m in module.modules()),
        tuple((n, tuple(p.shape), p.dtype, p.device) for n, p in params.items()),
        tuple((n, tuple(b.shape), b.dtype) for n, b in buffers.items()),
    )


@dataclass
class ForwardRequest:
    stage: object  # framework.stage.Stage
    x: torch.Tensor
    key: object
    target: torch.Tensor | None = None
    loss_scale: float = 1.0


@dataclass
class BackwardRequest:
    stage: object
    key: object
    grad: torch.Tensor | None = None


@dataclass
class SharedGraph:
    """One batched forward: stacked parameter leaves, the stacked input leaf and the output (the
    stacked activations, or the G losses of a last stage)."""

    params: list[torch.Tensor]
    x: torch.Tensor | None  # the stacked input leaf (None on a first stage: no input gradient)
    out: torch.Tensor
    is_last: bool
    inputs: torch.Tensor  # the stacked inputs, and the buffers as the forward found them:
    buffers_before: list[torch.Tensor]  # what a member's forward alone is recomputed from
    targets: torch.Tensor | None = None
    pending: set = field(default_factory=set)  # member indices whose backward has not run


@dataclass
class Slot:
    """A member's place in a SharedGraph: what its stage keeps instead of its own graph."""

    graph: SharedGraph
    index: int
    loss_scale: float


class LossRows:
    """The G summed losses and correct counts of one batched last-stage forward, on the device
    until the first member's are asked for; then read back together (one wait for the device)."""

    __slots__ = ("losses", "correct", "n", "_rows")

    def __init__(self, losses: torch.Tensor, correct: torch.Tensor, n: int):
        self.losses, self.correct, self.n = losses, correct, n
        self._rows: list | None = None

    def member(self, i: int) -> tuple[float, int, int]:
        """(loss_sum, correct, n) of member `i`: what its `Stage.forward` would have returned."""
        if self._rows is None:
            self._rows = list(zip(self.losses.tolist(), self.correct.tolist()))
            self.losses = self.correct = None
        loss, correct = self._rows[i]
        return loss, int(correct), self.n


class LossRow:
    """A member's share of `LossRows`: `get()` is its (loss_sum, correct, n)."""

    __slots__ = ("rows", "index")

    def __init__(self, rows: LossRows, index: int):
        self.rows, self.index = rows, index

    def get(self) -> tuple[float, int, int]:
        return self.rows.member(self.index)


def forward_signature(req: ForwardRequest) -> tuple | None:
    """Requests with equal signatures may run as one call; None: this one runs alone."""
    st = req.stage
    if not st.numerics or st.stash or st.draws_random:
        return None
    return (st.architecture, tuple(req.x.shape), req.x.dtype, req.x.device, req.target is not None)


def step_signature(stage) -> tuple | None:
    """Stages with equal signatures may take their optimizer steps as one update; None: alone.
    Plain SGD with one parameter group (what `train.optimizer=sgd` builds)."""
    opt = stage.optimizer
    if not stage.numerics or type(opt) is not lean_torch.SGD or len(opt.param_groups) != 1:
        return None
    g = opt.param_groups[0]
    if g["differentiable"] or g["fused"] or getattr(opt, "grad_scale", None) is not None:
        return None
    return (stage.architecture, *(g[k] for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach")))


def run_steps(stages: list) -> list:
    """The optimizer steps of `stages` (equal step signatures) as one update: over their
    parameters' bank (framework/replicas/bank.py) where it holds, else over each replica's tensors
    (lean_torch.sgd_steps)."""
    bank = stages[0].bank
    took_held = bank is not None and bank.held is not None  # no replica has a gradient to clear then
    if not replica_bank.step(stages):
        took_held = False
        lean_torch.sgd_steps([st.optimizer for st in stages])
    for st in stages:
        st.check_parameters()
        st.finish_step(clear_grads=not took_held)
    return [None] * len(stages)


def run_forwards(reqs: list[ForwardRequest], conv_as_matmul: bool = False) -> list:
    """The forwards of `reqs` (equal signatures, distinct stages) as one vmapped call; returns
    what each `Stage.forward` would have returned (on a last stage, a `LossRow` whose `get()`
    returns it). `conv_as_matmul`: 2-D convolutions as batched matrix products
    (framework/replicas/conv.py), not grouped convolutions."""
    order = replica_bank.bank_order([r.stage for r in reqs])
    if order is not None:  # in their bank's row order, so that their gradients come out as its rows
        results = run_forwards([reqs[i] for i in order], conv_as_matmul)
        out: list = [None] * len(reqs)
        for i, res in zip(order, results):
            out[i] = res
        return out
    stages = [r.stage for r in reqs]
    base = stages[0].module
    names = stages[0].param_names
    buffer_names = list(stages[0].buffers)
    with torch.no_grad():
        params = [torch.stack([st.params[n] for st in stages]) for n in names]
        buffers = [torch.stack([st.buffers[n] for st in stages]) for n in buffer_names]
        buffers_before = [b.clone() for b in buffers]
    for p in params:
        p.requires_grad_(True)
    first, last = stages[0].is_first, stages[0].is_last
    x = torch.stack([r.x for r in reqs])
    if not first:
        x.requires_grad_(True)

    def one(ps, bs, xi):
        return torch.func.functional_call(base, {**dict(zip(names, ps)), **dict(zip(buffer_names, bs))}, (xi,))

    with ConvAsMatmul() if conv_as_matmul else nullcontext():
        y = torch.func.vmap(one)(params, buffers, x)
    with torch.no_grad():  # BatchNorm updated the stacked statistics in place: back to each replica,
        # through .data as BatchNorm's own update does, so a replica's graph held from an earlier
        # forward (which saved these buffers) does not see them as modified
        # (one multi-tensor copy per dtype, not G copies per buffer: on a GPU each copy is a kernel
        # launch, and a list mixing BatchNorm's int64 counters with its float statistics takes
        # the foreach copy's one-tensor-at-a-time path)
        by_dtype: dict = {}
        for j, b in enumerate(buffers):
            dst, src = by_dtype.setdefault(b.dtype, ([], []))
            dst.extend(st.buffer_data[j] for st in stages)
            src.extend(b.unbind(0))
        for dst, src in by_dtype.values():
            torch._foreach_copy_(dst, src)
    graph = SharedGraph(params, None if first else x, y, last, x.detach(), buffers_before, pending=set(range(len(reqs))))
    results: list = []
    if last:
        g, b = y.shape[:2]
        target = graph.targets = torch.stack([r.target for r in reqs])
        losses = nn.functional.cross_entropy(y.flatten(0, 1), target.flatten(), reduction="none").view(g, b).sum(1)
        correct = (y.detach().argmax(-1) == target).sum(1)
        graph.out = losses
        rows = LossRows(losses.detach(), correct, b)
        results = [LossRow(rows, i) for i in range(len(reqs))]
    else:
        results = list(y.detach().unbind(0))  # one call, not one per member
    for i, r in enumerate(reqs):
        r.stage.keep(r.key, Slot(graph, i, r.loss_scale))
    return results


def run_backwards(reqs: list[BackwardRequest]) -> list:
    """The backwards of `reqs`, whose forwards ran in one `run_forwards` call (their Slots share
    a graph); returns each member's input gradient (None on a first stage).

    A backward through the shared graph costs the whole group's, whatever the number of members
    it serves. So it runs when it serves at least half of the group (or all who are left); fewer
    members (replicas fallen out of step: a server answering one device at a time) recompute
    their own forward alone from what the group's forward started from, and run its backward."""
    slots = [r.stage.release(r.key) for r in reqs]
    graph = slots[0].graph
    idx = [s.index for s in slots]
    completes = len(idx) == len(graph.pending)
    graph.pending.difference_update(idx)
    if not completes and 2 * len(idx) < len(graph.inputs):
        return [_recomputed_backward(r, s) for r, s in zip(reqs, slots)]
    seed = _seed(graph, reqs, slots)
    inputs = graph.params + ([] if graph.x is None else [graph.x])
    grads = lean_torch.grad(graph.out, inputs, seed, retain_graph=bool(graph.pending))
    # on a GPU, in the parameters' layout, as autograd's own .grad is: a Linear weight's gradient
    # comes out of the batched call transposed, and one such tensor (or a momentum buffer cloned
    # from it) keeps the optimizer's foreach update off CUDA's multi-tensor kernels for every
    # tensor of the step (an H100 profile of 64 FL replicas: 8,350 single-tensor adds, 26
    # November). A CPU's foreach update runs per tensor anyway, and there the copies cost more
    # than the strided update saves (batched FL, 64 LeNets: 1.28-1.42 s against 0.89-1.09 s)
    grads = [g if g is None or not g.is_cuda or g.is_contiguous() else g.contiguous() for g in grads]
    n_params = len(graph.params)
    bank = _holding_bank(graph, [r.stage for r in reqs], idx, grads[:n_params]) if completes else None
    if bank is not None:  # the group's gradients stay stacked in its bank, for its step
        bank.hold(grads[:n_params])
        x_rows = None if graph.x is None else grads[-1].unbind(0)
        return [None if x_rows is None else x_rows[i] for i in idx]
    summed = _add_held_gradients(graph, [r.stage for r in reqs], idx, grads) if completes else set()
    rows = [None if g is None else g.unbind(0) for g in grads]  # one call per tensor, not one per member (GPU: host time per op)
    out = []
    for r, i in zip(reqs, idx):
        r.stage.add_grads([None if g is None else g[i] for g in rows], replace=summed)
        out.append(None if graph.x is None else rows[-1][i])
    return out


def _holding_bank(graph: SharedGraph, stages: list, idx: list[int], grads: list):
    """The replica bank that may hold this backward's parameter gradients as they came out
    (framework/replicas/bank.py `hold`): every member of the graph is in the call, they are
    their bank's rows in order, and every parameter has a gradient; else None. Then no replica
    is handed its rows one by one (K x J views and assignments a backward, and as many checks
    that they are rows again at the step), unless something other than the group's step asks."""
    by_row = _members_by_row(graph, stages, idx)
    if by_row is None or any(g is None for g in grads):
        return None
    return replica_bank.holding(by_row)


def _members_by_row(graph: SharedGraph, stages: list, idx: list[int]) -> list | None:
    """`stages` in the order of their rows of `graph` (`idx`: each one's row), where the call
    holds every row; else None."""
    if len(idx) != len(graph.inputs):
        return None
    by_row = [None] * len(idx)
    for st, i in zip(stages, idx):
        by_row[i] = st
    return by_row


def _add_held_gradients(graph: SharedGraph, stages: list, idx: list[int], grads: list) -> set[int]:
    """Where every row of `graph` is in this backward and a parameter's gradients held from an
    earlier backward are the rows of one tensor (a batched backward's, as with several
    micro-batches per iteration), add them to the new gradients as one stacked add, not one per
    replica; returns the indices of the parameters done so (their new gradients replace the held
    ones). The same additions, element for element."""
    by_row = _members_by_row(graph, stages, idx)
    if by_row is None:
        return set()
    done = set()
    for j, name in enumerate(stages[0].param_names):
        if grads[j] is None or by_row[0].params[name].grad is None:  # nothing held (a first micro-batch)
            continue
        held = [st.params[name].grad for st in by_row]
        if any(g is None for g in held):
            continue
        rows = replica_bank.as_rows(held)
        if rows is not None and rows.shape == grads[j].shape:
            grads[j] = rows + grads[j]  # p.grad + g, as Stage.add_grads adds
            done.add(j)
    return done


def _seed(graph: SharedGraph, reqs: list[BackwardRequest], slots: list[Slot]) -> torch.Tensor:
    """The output gradient of a backward through `graph` for the members in `reqs` (zero for
    the others), made on the device: no host data copied in (see the module's docstring)."""
    if graph.is_last:  # each member's loss scale
        scales = {s.index: s.loss_scale for s in slots}
        if len(scales) == len(graph.out) and len(set(scales.values())) == 1:
            return torch.full_like(graph.out, slots[0].loss_scale)
        seed = torch.zeros_like(graph.out)
        for i, scale in scales.items():
            seed[i].fill_(scale)  # a scalar argument, not a host tensor
        return seed
    rows: list = [None] * len(graph.out)
    for r, s in zip(reqs, slots):
        rows[s.index] = r.grad
    if any(g is None for g in rows):
        zero = torch.zeros_like(reqs[0].grad)
        rows = [zero if g is None else g for g in rows]
    return torch.stack(rows)


def _recomputed_backward(req: BackwardRequest, slot: Slot):
    """One member's forward again, alone (its parameters, buffers and input as the group's forward
    found them), and its backward; returns its input gradient."""
    g, i, st = slot.graph, slot.index, req.stage
    params = {n: p[i].detach().requires_grad_(True) for n, p in zip(st.param_names, g.params)}
    buffers = {n: b[i].clone() for n, b in zip(st.buffers, g.buffers_before)}  # scratch: statistics stay as they are
    x = g.inputs[i] if g.x is None else g.inputs[i].detach().requires_grad_(True)
    y = torch.func.functional_call(st.module, {**params, **buffers}, (x,))
    if g.is_last:
        out = nn.functional.cross_entropy(y, g.targets[i], reduction="sum") * slot.loss_scale
        seed = None
    else:
        out, seed = y, req.grad
    inputs = list(params.values()) + ([] if g.x is None else [x])
    grads = lean_torch.grad(out, inputs, seed)
    st.add_grads(grads)
    return None if g.x is None else grads[-1]
