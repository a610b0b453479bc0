"""A test helper, not product code: a schedule (framework.pipeline.schedules) executed over stage
modules held in one process, float64, without the runtime, to check that a schedule's numbers are
the reference loop's (`scheduler=local`: every micro-batch's forward and backward on the whole
model, then one step). The numeric core of issue 48's "every synchronous schedule ends with
weights equal to scheduler=local"; the runtime's stage interpreter runs the same ops for real.

Each device's program runs in order; an action waits only for its message (a forward for the
activation of the stage before it, a backward for the gradient of the stage after it), which
lies in a dict until taken. The devices take turns, each running until it waits; nobody
able to run is a deadlock. One optimizer step per stage ends each mini-batch.

`DriverStage` runs the ops as the stage interpreter will: F keeps the input leaf and the output
(the scaled loss on the last stage), B is the full backward, I and W go through
framework.pipeline.split_backward.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from framework.data import split_microbatches
from framework.models import UnitModel
from framework.pipeline.actions import Op, PipelineOrder
from framework.pipeline.split_backward import WeightGradient, backward_input
from framework.stage import OptimizerSettings, make_optimizer

SGD = OptimizerSettings("sgd", lr=0.1, momentum=0.9, weight_decay=1e-3)


class DriverStage:
    def __init__(self, module: nn.Module, first: bool, last: bool):
        self.module, self.first, self.last = module, first, last
        self.weights = list(module.parameters())
        self.optimizer = make_optimizer(self.weights, SGD)
        self.saved: dict[int, tuple] = {}  # micro-batch -> (input leaf, output or scaled loss)
        self.pending_w: dict[int, WeightGradient] = {}  # micro-batch -> its W, after its I

    def forward(self, x, mb, target, scale):
        x_in = x if self.first else x.detach().requires_grad_(True)
        y = self.module(x_in)
        if self.last:
            self.saved[mb] = (x_in, nn.functional.cross_entropy(y, target, reduction="sum") * scale)
            return None
        self.saved[mb] = (x_in, y)
        return y.detach()

    def backward(self, mb, grad):
        x_in, out = self.saved.pop(mb)
        out.backward(grad)
        return None if self.first else x_in.grad

    def backward_input(self, mb, grad):
        x_in, out = self.saved.pop(mb)
        grad_in, self.pending_w[mb] = backward_input(out, grad, x_in, self.weights)
        return grad_in

    def backward_weight(self, mb):
        self.pending_w.pop(mb).accumulate()

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def stage_modules(model: UnitModel, bounds) -> list[DriverStage]:
    """A copy of `model` cut at `bounds` [(start, stop), ...], as pipeline stages."""
    model = copy.deepcopy(model)
    return [DriverStage(model.slice(a, b), a == 0, b == len(model)) for a, b in bounds]


def run_minibatch(order: PipelineOrder, stages: list[DriverStage], x, y, microbatches: int) -> None:
    """One mini-batch through `order`'s per-device programs, then every stage's step."""
    S = len(stages)
    assert order.num_stages == S, (order.num_stages, S)
    xs, ys = split_microbatches(x, microbatches), split_microbatches(y, microbatches)
    scale = 1.0 / x.shape[0]
    acts: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb) -> the stage's output, for stage + 1
    grads: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb) -> the stage's input gradient, for stage - 1

    def ready(a) -> bool:
        if a.op is Op.F:
            return a.stage == 0 or (a.stage - 1, a.mb) in acts
        if a.op in (Op.B, Op.I):
            return a.stage == S - 1 or (a.stage + 1, a.mb) in grads
        return True

    def run(a) -> None:
        st = stages[a.stage]
        if a.op is Op.F:
            x_mb = xs[a.mb] if a.stage == 0 else acts.pop((a.stage - 1, a.mb))
            out = st.forward(x_mb, a.mb, ys[a.mb] if a.stage == S - 1 else None, scale)
            if a.stage < S - 1:
                acts[a.stage, a.mb] = out
        elif a.op in (Op.B, Op.I):
            g = None if a.stage == S - 1 else grads.pop((a.stage + 1, a.mb))
            g_in = st.backward(a.mb, g) if a.op is Op.B else st.backward_input(a.mb, g)
            if a.stage > 0:
                grads[a.stage, a.mb] = g_in
        elif a.op is Op.W:
            st.backward_weight(a.mb)
        else:
            raise AssertionError(f"{a}: the driver runs compute actions only (the step ends the mini-batch)")

    pc = [0] * order.num_devices
    while any(pc[d] < len(p) for d, p in enumerate(order.programs)):
        progressed = False
        for d, prog in enumerate(order.programs):
            while pc[d] < len(prog) and ready(prog[pc[d]]):
                run(prog[pc[d]])
                pc[d] += 1
                progressed = True
        if not progressed:
            raise AssertionError(f"deadlock: devices wait at {[str(p[pc[d]]) if pc[d] < len(p) else '-' for d, p in enumerate(order.programs)]}")
    assert not acts and not grads, f"messages never taken: {sorted(acts)} {sorted(grads)}"
    for st in stages:
        assert not st.saved and not st.pending_w, "a micro-batch's backward never completed"
        st.step()


def reference_minibatch(model: UnitModel, optimizer, x, y, microbatches: int) -> None:
    """scheduler=local: each micro-batch's forward and backward on the whole model, then the step."""
    scale = 1.0 / x.shape[0]
    for xm, ym in zip(split_microbatches(x, microbatches), split_microbatches(y, microbatches)):
        (nn.functional.cross_entropy(model(xm), ym, reduction="sum") * scale).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
