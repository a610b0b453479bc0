"""Deferred tensor work on the virtual clock, so that identical replicas can run as one call.

On the simulator a computation's virtual time comes from the device model, not from running
it, and its result is needed only when the role resumes, `duration` virtual seconds later. Until
then no other role can see it: roles share nothing. So `runtime.batch_replicas` makes
`SimContext.compute` hand the call to `DeferredCompute` and sleep; the first role that needs a
result runs every call admitted so far (`flush`), and the forwards (and then the backwards) of
identical replicas run together as one vmapped call, and their optimizer steps as one update
(framework/replicas/batched.py). With homogeneous devices, the K devices of FL or PiPar admit their
computations at the same virtual instant, and one call does the work of K.

**Results on demand.** A role that only passes a result on (to its next computation, into a
message, to `report_train`) need not wait for it: inside `ctx.deferred_results()` a Stage's
forward, backward or step returns a `Pending` placeholder of known shape (the model's unit
shapes say it, as for timing-only runs), and the work stays queued. PiPar's server, which
serves its devices one at a time on one processor, then admits the work of all its replicas
before anything runs, and they batch as the devices' do. A read of a model's state inside the
block (a round's upload, `ctx.deferred_read`) queues behind the model's work the same way, so in
FL, PiPar and SFL nothing runs until the aggregator averages the round. A flush runs the queued calls as a
dataflow program: a call waits for the calls whose placeholders it takes and for the earlier
calls on the same model (a role's program order on its state); among the calls that are ready,
the earliest admitted runs first, with every ready call of its kind and signature.

The relative order of calls that use torch's random generator is kept: such a call (a forward
through dropout, or any function that is not a Stage's) first runs everything admitted before it,
so a run with batching on draws the same random numbers as one without.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Callable

import torch

from framework import nonfinite
from framework.replicas import bank as replica_bank
from framework.replicas import batched as replicas
from framework.runtime.placeholders import Pending, pending_in, resolve
from framework.stage import Stage


class DeferredCall:
    __slots__ = ("owner", "fn", "args", "kwargs", "done", "value", "error", "index", "waiting", "dependents", "handed_out", "model", "name", "key", "op")

    def __init__(self, owner: "DeferredCompute", fn: Callable, args: tuple, kwargs: dict, index: int):
        self.owner, self.fn, self.args, self.kwargs = owner, fn, args, kwargs
        self.done, self.value, self.error = False, None, None
        self.index = index  # admission order
        self.waiting = 0  # calls this one waits for that have not run
        self.dependents: list[DeferredCall] = []
        self.handed_out = False  # a placeholder stands for its result: its failure fails the flush
        self.model = None  # id of the model a Stage's call works on (its program order)
        self.name = getattr(fn, "__qualname__", None)  # for errors, after the call let go of fn
        self.key = None  # its group key, once its inputs are ready (None: it runs alone)
        self.op = None  # ('forward' | 'backward' | 'step', stage) for a Stage's call (`_stage_op`), else None

    def result(self):
        if not self.done:
            self.owner.flush()
        if self.error is not None:
            raise self.error
        if isinstance(self.value, replicas.LossRow):  # read back from the device when first asked for
            self.value = self.value.get()
        return self.value

    def describe(self) -> str:
        return "a deferred call" if self.name is None else f"deferred {self.name}"

    def settle(self, value=None, error: BaseException | None = None) -> None:
        self.done, self.value, self.error = True, value, error
        self.fn = self.args = self.kwargs = None  # free the inputs


_OPS = {Stage.forward: "forward", Stage.backward: "backward", Stage.step: "step"}


def _stage_op(fn) -> tuple[str, Stage] | None:
    """('forward' | 'backward' | 'step', stage) when `fn` is one of a Stage's bound methods."""
    stage = getattr(fn, "__self__", None)
    if not isinstance(stage, Stage):
        return None
    kind = _OPS.get(fn.__func__)
    return None if kind is None else (kind, stage)


def _group_key(call: DeferredCall):
    """Calls with equal keys run as one batched call; None: alone. Asked once the call's inputs
    are ready (a backward's key is its forward's shared graph)."""
    op = call.op
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
    def __init__(self, batch: bool = True, conv_as_matmul: bool = False):
        self.batch = batch
        self.conv_as_matmul = conv_as_matmul  # replicas.run_forwards' choice (runtime.replica_conv)
        self.pending: list[DeferredCall] = []
        self.calls = 0  # calls run; of them, a Stage's (by kind), and those inside a batched call
        self.calls_by_kind: Counter = Counter()
        self.batched_by_kind: Counter = Counter()
        self.flushes = 0
        self.on_flushed: Callable[[], None] | None = None  # the runtime's: what waited on the results
        self._admitted = 0
        self._last_on: dict[int, DeferredCall] = {}  # id(model) -> its latest call not yet run
        self._inputs: dict = {}  # (stage, key) -> (shape, dtype, device) of a deferred forward's input

    @property
    def batched(self) -> int:
        return sum(self.batched_by_kind.values())

    @property
    def stage_calls(self) -> int:
        """The Stage calls run (forwards, backwards, steps): what could batch."""
        return sum(self.calls_by_kind.values())

    def submit(self, fn: Callable, args: tuple, kwargs: dict, on_demand: bool = False) -> tuple[DeferredCall, bool, object]:
        """Queue `fn(*args, **kwargs)`; returns (the call, whether a placeholder stands for its
        result, the placeholder). `on_demand`: the caller takes a placeholder where one can be
        known without running the call (a Stage's forward, backward or step)."""
        op = _stage_op(fn)
        if op is None or (op[0] == "forward" and op[1].draws_random):
            self.flush()  # unknown state, or torch's random numbers: after everything before it
        call = self._queue(fn, args, kwargs, None if op is None else op[1].model)
        call.op = op
        if op is not None:
            self.calls_by_kind[op[0]] += 1
        known, stand_in = (False, None) if op is None else self._placeholder(call, *op, on_demand)
        call.handed_out = known
        return call, known, stand_in

    def submit_read(self, fn: Callable, args: tuple, model, like: dict) -> dict:
        """Queue `fn(*args)`, a read of `model`'s state, after the model's earlier calls; returns
        placeholders for its result, a dict shaped as `like` (meta tensors)."""
        call = self._queue(fn, args, {}, model)
        call.handed_out = True
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        return {k: Pending(call, k, shape=t.shape, dtype=t.dtype, device=device) for k, t in like.items()}

    def _queue(self, fn: Callable, args: tuple, kwargs: dict, model) -> DeferredCall:
        """A pending call that waits for the placeholders in its arguments and, where it works
        on `model`, for the model's latest call (a role's program order on its own state)."""
        call = DeferredCall(self, fn, args, kwargs, self._admitted)
        self._admitted += 1
        deps = {id(p.call): p.call for p in pending_in((args, kwargs)) if not p.call.done}
        if model is not None:
            call.model = id(model)
            prev = self._last_on.get(call.model)
            if prev is not None and not prev.done:
                deps[id(prev)] = prev
            self._last_on[call.model] = call
        for d in deps.values():
            d.dependents.append(call)
        call.waiting = len(deps)
        self.pending.append(call)
        return call

    def _placeholder(self, call: DeferredCall, kind: str, stage: Stage, on_demand: bool):
        """(True, what stands for the result of `call` until it runs) or (False, None). The
        shapes are the model's (as in timing-only runs); `Pending.value` checks them."""
        args, kwargs = call.args, call.kwargs
        if kind == "step":
            return on_demand, None
        if kind == "backward":
            spec = self._inputs.pop((stage, args[0] if args else kwargs["key"]), None)
            if not on_demand or spec is None:
                return False, None
            return True, (None if stage.is_first else Pending(call, shape=spec[0], dtype=spec[1], device=spec[2]))
        x = args[0] if args else kwargs["x"]
        key = args[1] if len(args) > 1 else kwargs["key"]
        n = x.shape[0]
        self._inputs[(stage, key)] = (tuple(x.shape), x.dtype, x.device)
        if not on_demand:
            return False, None
        target = args[2] if len(args) > 2 else kwargs.get("target")
        if target is not None:  # (loss_sum, correct, n)
            return True, (Pending(call, 0), Pending(call, 1), n)
        return True, Pending(call, shape=(n, *stage.out_shape), dtype=x.dtype, device=x.device)

    def flush(self) -> None:
        """Run every pending call (a dataflow program: see the module's docstring)."""
        try:
            with nonfinite.held():  # the updated parameters' checks are read once the flush is done
                while self.pending:
                    calls, self.pending = self.pending, []
                    self.flushes += 1
                    self._run(calls)
                    self.calls += len(calls)
                    lost = next((c.error for c in calls if c.error is not None and c.handed_out), None)
                    if lost is not None:  # a placeholder's call failed: nobody would ask for its error
                        raise lost
        finally:
            replica_bank.hand_out_all()  # the roles run again: each sees its own gradients
        if self.on_flushed is not None:
            self.on_flushed()

    def _run(self, calls: list[DeferredCall]) -> None:
        """Calls on one model wait for each other (program order), so a group of ready calls
        never stacks a stage with itself."""
        ready: list = []  # heap of (admission index, call)
        by_key: dict = {}  # group key -> the ready calls of that key, as they became ready

        def admit(c: DeferredCall) -> None:
            try:
                c.args, c.kwargs = resolve(c.args), resolve(c.kwargs)
            except Exception as e:  # noqa: BLE001 - what it waited for failed
                c.settle(error=e)
                release(c)
                return
            c.key = _group_key(c) if self.batch else None
            if c.key is not None:
                by_key.setdefault(c.key, []).append(c)
            heapq.heappush(ready, (c.index, id(c), c))

        def release(c: DeferredCall) -> None:
            for d in c.dependents:
                d.waiting -= 1
                if d.waiting == 0:
                    admit(d)
            c.dependents = []

        for c in calls:
            if c.waiting == 0:
                admit(c)
        while ready:
            _, _, c = heapq.heappop(ready)
            if c.done:
                continue
            members = [c] if c.key is None else by_key.pop(c.key)
            if len(members) > 1:
                self._run_batched(members)
            else:
                self._run_alone(c)
            for m in members:
                if self._last_on.get(m.model) is m:
                    del self._last_on[m.model]
                release(m)

    @staticmethod
    def _run_alone(c: DeferredCall) -> None:
        if c.op is None:  # a role's own function may read any replica's gradients
            replica_bank.hand_out_all()
        try:
            c.settle(c.fn(*c.args, **c.kwargs))
        except Exception as e:  # noqa: BLE001 - raised in the role that made the call
            c.settle(error=e)

    def _run_batched(self, members: list[DeferredCall]) -> None:
        kind, _ = members[0].op
        try:
            if kind == "forward":
                out = replicas.run_forwards([replicas.ForwardRequest(c.fn.__self__, *c.args, **c.kwargs) for c in members], self.conv_as_matmul)
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

