"""Replicas' parameters and momentum buffers as rows of one tensor each: their optimizer steps as
one update over a few large tensors.

K identical replicas that step together (framework/replicas/batched.py `run_steps`) hold K x J small
parameters, gradients and momentum buffers. torch's update over them costs the host K
`_init_group` calls, which find each parameter's state by hashing it, and a multi-tensor update
over K x J tensors: on a GPU, a kernel launch per few dozen tensors per operation. A
`ReplicaBank` stacks the group's parameters once, as J tensors of K rows, and points each
replica's parameter at its row (`param.data = row`: the same Parameter object, which the module,
the Stage, the optimizer and its state keep, with its own autograd version counter); the momentum
buffers likewise. A step of the whole group is then one update over J parameters, J gradients
and J buffers. Each replica still owns its tensors: whatever a replica does alone (a lone step, a
FedAvg load, a restored module's copy) writes its row in place, and the next group step sees it.
This is storage, not semantics: no role program knows of it, and a role on its own device
holds its own tensors as before.

A group step runs over the bank only when, checked at each step (`ReplicaBank.ready`):
- the group is the bank's stages (in any order: the update runs in the bank's row order, and a
  batched forward runs its members in that order, `bank_order`, so that their gradients come out
  as rows in it);
- every parameter still lies in its row (data pointers as the bank left them);
- no member holds a graph of its own forward: a lone forward saves the parameter itself, whose
  version counter a bank update does not advance, so its backward would use the updated weights
  without autograd noticing (under torch's update that backward raises instead);
- every gradient is there. The gradients of each parameter that lie evenly spaced in one
  tensor's memory with one layout (the rows of a batched backward's stacked gradient,
  `replicas.run_backwards`) are viewed as one tensor, without a copy; others are stacked.
Otherwise the group takes the per-replica update (lean_torch.sgd_steps) on the same tensors.
Restoring a stage's optimizer state (Stage.restore) replaces its momentum buffers, so it retires
the stage's bank; the next group step builds a new one.

**Held gradients.** A batched backward of the whole bank (every row, in row order) leaves its J
stacked gradients in the bank (`hold`) instead of handing each replica its rows: K x J views and
`.grad` assignments a backward, K x J checks at the step that they are rows again, and K x J
`.grad = None` after it (5.2% of a batched FL epoch's host instructions, MLP proxy). A second
micro-batch's backward adds to them (`held + g`, each replica's `p.grad + g`), and the group's
step takes them as they are. Anything else that may read a replica's gradients first hands them
out (`hand_out`: a lone step or backward of a replica, its checkpoint, a role's own function run
in a flush, a step the bank cannot serve, retiring the bank), and so does every flush's end, so
role programs, which run between flushes, never see a bank holding their gradients.

Results are bit for bit those of each replica's own update: torch's SGD is elementwise, and the
same arithmetic runs on every element whichever tensor holds it (tests/test_replica_bank.py).
"""

from __future__ import annotations

import weakref

import torch

from framework import lean_torch


class ReplicaBank:
    def __init__(self, stages: list, params: list[torch.Tensor], momentum: list[torch.Tensor] | None):
        self.stages = stages  # row order
        self.names = stages[0].param_names
        self.params = params  # J tensors of K rows
        self.momentum = momentum  # J tensors of K rows; None until the first step makes them
        self.held: list[torch.Tensor] | None = None  # J tensors of K rows: the replicas' gradients, not handed out (`hold`)
        self.live = True
        self._ptrs = [[p.data_ptr() for p in st.params.values()] for st in stages]

    @classmethod
    def build(cls, stages: list) -> ReplicaBank | None:
        """A bank of `stages` (equal step signatures) in this order; None where some have momentum
        buffers and others none yet (replicas that have stepped different numbers of times)."""
        opt0 = stages[0].optimizer
        names = stages[0].param_names
        found = None
        if opt0.param_groups[0]["momentum"] != 0:
            found = [[_state(st.optimizer, p).get("momentum_buffer") for p in st.params.values()] for st in stages]
            made = {b is not None for bufs in found for b in bufs}
            if len(made) > 1:
                return None
            if made == {False}:
                found = None
        with torch.no_grad():
            params = [torch.stack([st.params[n] for st in stages]) for n in names]
            momentum = None if found is None else [torch.stack([bufs[j] for bufs in found]) for j in range(len(names))]
        for j, n in enumerate(names):
            for st, row in zip(stages, params[j].unbind(0)):
                st.params[n].data = row
            if momentum is not None:
                for bufs, row in zip(found, momentum[j].unbind(0)):
                    bufs[j].data = row
        for st in stages:
            if st.bank is not None:
                st.bank.retire()
        bank = cls(list(stages), params, momentum)
        for i, st in enumerate(stages):
            st.bank, st.bank_row = bank, i
        return bank

    def retire(self) -> None:
        """No more group steps over this bank (its rows stay where the replicas' tensors live)."""
        self.hand_out()
        self.live = False

    def hold(self, grads: list[torch.Tensor]) -> None:
        """Keep a batched backward's gradients of every replica (J tensors of K rows, in row
        order) here instead of handing each replica its rows: the group's step takes them as
        they are. Held gradients from an earlier backward (a first micro-batch) are added to, as
        each replica's `p.grad + g` would be. Any other use of a replica's gradients first hands
        them out (`hand_out`, `hand_out_all`)."""
        self._keep(list(grads) if self.held is None else [h + g for h, g in zip(self.held, grads)])

    def _keep(self, held: list[torch.Tensor] | None) -> None:
        """`held` as the bank's held gradients, and the bank in the registry of those holding any."""
        self.held = held
        if held is None:
            _HOLDING.discard(self)
        else:
            _HOLDING.add(self)

    def hand_out(self) -> None:
        """Each replica's held gradients into its parameters' `.grad` (rows, no copy)."""
        held = self.held
        if held is None:
            return
        self._keep(None)
        for n, rows in zip(self.names, held):
            for st, row in zip(self.stages, rows.unbind(0)):
                st.params[n].grad = row

    def ready(self, stages: list) -> bool:
        """Whether `stages`' step may run over this bank (see the module's docstring)."""
        if not self.live or len(stages) != len(self.stages) or any(st.bank is not self for st in stages):
            return False
        if len({st.bank_row for st in stages}) != len(stages):  # not each stage once
            return False
        for st, ptrs in zip(self.stages, self._ptrs):
            if st.holds_unbatched_graph():
                return False
            if [p.data_ptr() for p in st.params.values()] != ptrs:  # a parameter moved out of its row
                self.retire()
                return False
        return True

    def gradients(self) -> list[torch.Tensor] | None:
        """Each parameter's K gradients as one tensor (the held ones, or a view where they are a
        tensor's rows); None where one is missing."""
        if self.held is not None:
            return self.held
        out = []
        for n in self.names:
            grads = [st.params[n].grad for st in self.stages]
            if any(g is None for g in grads):
                return None
            rows = as_rows(grads)
            out.append(torch.stack(grads) if rows is None else rows)
        return out

    def step(self, grads: list[torch.Tensor]) -> None:
        """The group's optimizer update, as each replica's own step would make it (held gradients
        are used up: the step leaves no gradients)."""
        self._keep(None)
        group = self.stages[0].optimizer.param_groups[0]
        creates = group["momentum"] != 0 and self.momentum is None
        buffers = [None] * len(self.params) if self.momentum is None else self.momentum
        lean_torch.sgd_update(self.params, grads, buffers, group, foreach_on_cpu=True)
        if creates:  # a first step made the buffers: each replica's state holds its rows
            self.momentum = buffers
            for n, stacked in zip(self.names, buffers):
                for st, row in zip(self.stages, stacked.unbind(0)):
                    st.optimizer.state[st.params[n]]["momentum_buffer"] = row


def step(stages: list) -> bool:
    """The optimizer steps of `stages` (equal step signatures, lean_torch.SGD with one parameter
    group) as one update over their bank, built here where worthwhile; False where they must
    take the per-replica update instead (their held gradients handed out, nothing else changed)."""
    bank = stages[0].bank
    ready = bank is not None and bank.ready(stages)
    if not ready and bank is not None:
        bank.hand_out()
    if not ready:
        # build for a group larger than any live bank its members are in: a group that changes
        # from step to step (a server's replicas stepping in varying subsets) does not rebuild
        # at every step
        if len(stages) < 2 or any(st.bank is not None and st.bank.live and len(st.bank.stages) >= len(stages) for st in stages):
            return False
        if any(st.holds_unbatched_graph() for st in stages):
            return False
        if any(p.grad is None for st in stages for p in st.params.values()):
            # a bank built now must take this step: were its first step a per-replica one, the
            # momentum buffers that step makes would not be the bank's rows
            return False
        bank = ReplicaBank.build(stages)
        if bank is None:
            return False
    grads = bank.gradients()
    if grads is None:
        return False
    bank.step(grads)
    return True


# the banks with held gradients; weak, so that a run stopped mid-flush leaves no bank (nor its
# replicas) alive here once its roles are gone
_HOLDING: weakref.WeakSet = weakref.WeakSet()


def hand_out_all() -> None:
    """Every bank's held gradients to their replicas: before anything but a batched call of
    the group may read a gradient (framework/runtime/deferred.py: a lone call, a flush's end)."""
    for bank in list(_HOLDING):
        bank.hand_out()


def holding(stages: list) -> ReplicaBank | None:
    """The live bank whose rows `stages` are, in row order, all of them, where their gradients
    may be held there (none handed out: no replica has a gradient of its own); else None."""
    bank = stages[0].bank
    if bank is None or not bank.live or len(stages) != len(bank.stages):
        return None
    for i, st in enumerate(stages):
        if st.bank is not bank or st.bank_row != i:
            return None
    if bank.held is None and any(p.grad is not None for st in stages for p in st.params.values()):
        return None
    return bank


def bank_order(stages: list) -> list[int] | None:
    """The order of `stages` (all in one live bank) by their bank rows, where it is not theirs;
    None where it is, or where they are not all in one live bank."""
    bank = stages[0].bank
    if bank is None or not bank.live or any(st.bank is not bank for st in stages):
        return None
    rows = [st.bank_row for st in stages]
    if all(a < b for a, b in zip(rows, rows[1:])):
        return None
    return sorted(range(len(stages)), key=rows.__getitem__)


def _state(optimizer, p) -> dict:
    """`optimizer.state[p]` without adding an entry (the state is a defaultdict)."""
    return optimizer.state.get(p) or {}


def as_rows(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """`torch.stack(tensors)` as a view, without a copy, where the tensors are views of one tensor
    laid out evenly in its memory with one layout (the rows of a stacked tensor); else None."""
    t0 = tensors[0]
    base = t0._base
    if base is None or len(tensors) < 2:
        return None
    p0, stride = t0.data_ptr(), t0.stride()
    step = tensors[1].data_ptr() - p0
    size = t0.element_size()
    if step <= 0 or step % size:
        return None
    for i, t in enumerate(tensors):
        if t._base is not base or t.data_ptr() != p0 + i * step or t.stride() != stride:
            return None
    return t0.as_strided((len(tensors), *t0.shape), (step // size, *stride), t0.storage_offset())
