"""Deferred tensor work on the virtual clock, so that identical replicas can run as one call.

On the simulator a computation's virtual time comes from the device model, not from running
it, and its result is needed only when the role resumes, `duration` virtual seconds later. Until
then no other role can see it: roles share nothing. So `runtime.batch_replicas` makes
`SimContext.compute` hand the call to `DeferredCompute` and sleep; the first role that needs a
result runs every call admitted so far, in admission order, except that the forwards (and then
the backwards) of identical replicas run together as one vmapped call, and their optimizer
steps as one update (framework/replicas.py). A role awaits each result before it admits its
next call, so a flush holds at most one call per role: a batch run where its first member stood
runs no member ahead of that member's own earlier work.
With homogeneous devices, the K devices of FL or PiPar admit their computations at the same
virtual instant, and one call does the work of K.

The relative order of calls that use torch's random generator is kept (batched calls use none),
so a run with batching on draws the same random numbers as one without.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from framework import replicas
from framework.stage import Stage


class DeferredCall:
    __slots__ = ("owner", "fn", "args", "kwargs", "done", "value", "error")

    def __init__(self, owner: "DeferredCompute", fn: Callable, args: tuple, kwargs: dict):
        self.owner, self.fn, self.args, self.kwargs = owner, fn, args, kwargs
        self.done, self.value, self.error = False, None, None

    def result(self):
        if not self.done:
            self.owner.flush()
        if self.error is not None:
            raise self.error
        return self.value

    def settle(self, value=None, error: BaseException | None = None) -> None:
        self.done, self.value, self.error = True, value, error
        self.fn = self.args = self.kwargs = None  # free the inputs


_OPS = {Stage.forward: "forward", Stage.backward: "backward", Stage.step: "step"}


def _stage_op(call: DeferredCall) -> tuple[str, Stage] | None:
    """('forward' | 'backward' | 'step', stage) when `call` is one of a Stage's."""
    stage = getattr(call.fn, "__self__", None)
    if not isinstance(stage, Stage):
        return None
    kind = _OPS.get(call.fn.__func__)
    return None if kind is None else (kind, stage)


def _group_key(call: DeferredCall):
    """Calls with equal keys run as one batched call; None: alone."""
    op = _stage_op(call)
    if op is None:
        return None
    kind, stage = op
    if kind == "forward":
        sig = replicas.forward_signature(replicas.ForwardRequest(stage, *call.args, **call.kwargs))
        return None if sig is None else ("forward", sig)
    if kind == "step":
        sig = replicas.step_signature(stage)
        return None if sig is None else ("step", sig)
    slot = stage.slot_of(call.args[0])
    return None if slot is None else ("backward", id(slot.graph))


class DeferredCompute:
    def __init__(self, batch: bool = True):
        self.batch = batch
        self.pending: list[DeferredCall] = []
        self.calls = 0  # calls run, and how many of them ran inside a batched call (by kind)
        self.batched_by_kind: Counter = Counter()

    @property
    def batched(self) -> int:
        return sum(self.batched_by_kind.values())

    def submit(self, fn: Callable, args: tuple, kwargs: dict) -> DeferredCall:
        call = DeferredCall(self, fn, args, kwargs)
        self.pending.append(call)
        return call

    def flush(self) -> None:
        """Run every pending call (a batch runs where its first member stood)."""
        calls, self.pending = self.pending, []
        groups: dict = {}
        if self.batch:
            for c in calls:
                key = _group_key(c)
                if key is not None:
                    groups.setdefault(key, []).append(c)
        placed: dict[int, list[DeferredCall]] = {}
        for members in groups.values():
            members = _distinct_stages(members)
            if len(members) > 1:
                placed[id(members[0])] = members
                for m in members[1:]:
                    placed[id(m)] = []
        for c in calls:
            members = placed.get(id(c))
            if members is None:
                self._run_alone(c)
            elif members:
                self._run_batched(members)
        self.calls += len(calls)

    @staticmethod
    def _run_alone(c: DeferredCall) -> None:
        try:
            c.settle(c.fn(*c.args, **c.kwargs))
        except Exception as e:  # noqa: BLE001 - raised in the role that made the call
            c.settle(error=e)

    def _run_batched(self, members: list[DeferredCall]) -> None:
        kind, _ = _stage_op(members[0])
        try:
            if kind == "forward":
                out = replicas.run_forwards([replicas.ForwardRequest(c.fn.__self__, *c.args, **c.kwargs) for c in members])
            elif kind == "step":
                out = replicas.run_steps([c.fn.__self__ for c in members])
            else:
                out = replicas.run_backwards([replicas.BackwardRequest(c.fn.__self__, *c.args, **c.kwargs) for c in members])
        except Exception as e:  # noqa: BLE001
            for c in members:
                c.settle(error=e)
            return
        for c, v in zip(members, out):
            c.settle(v)
        self.batched_by_kind[kind] += len(members)


def _distinct_stages(members: list[DeferredCall]) -> list[DeferredCall]:
    """The members up to the first that repeats a stage (one stage cannot be stacked with itself);
    the rest run alone."""
    seen, out = set(), []
    for c in members:
        sid = id(c.fn.__self__)
        if sid in seen:
            break
        seen.add(sid)
        out.append(c)
    return out
