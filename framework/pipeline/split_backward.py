"""One micro-batch's backward split in two, as zero-bubble schedules run it: ops I and W
(framework.pipeline.actions).

A stage's full backward (op B) turns the gradient of its output into two things: the gradient of
its input, which the upstream stage waits for, and its parameters' gradients, which nothing needs
until the optimizer step. `backward_input` (op I) computes the first alone and keeps what the
second needs; `WeightGradient.accumulate` (op W), any time later, adds the second into the
parameters' `.grad`, as the full backward would have: gradient accumulation over micro-batches
and the step are unchanged, and any number of micro-batches may wait between their I and their W.

How (torch.distributed.pipelining's `stage_backward_input` / `stage_backward_weight`, rewritten).
In the autograd graph of one forward, the nodes whose output depends on the stage's input are
the *input path*. A parameter reaches the output through nodes that do not depend on the input
(an AccumulateGrad, perhaps a transpose: its *weight side*) until it enters the input path at a
*join* (the Linear's addmm, the convolution, the BatchNorm). I runs autograd from the output to
the input alone, so every join runs with exactly the gradient the full backward gives it, and a
hook records that gradient. W starts autograd at the joins with the recorded gradients and runs
the weight sides only. No node of the input path runs twice, except between two joins of a
parameter used more than once: there the later join's gradient flows down the input path to the
earlier join, which then takes its recorded gradient instead of what arrives (counted once).

Memory. After I the output (the caller drops it) and the graph above the topmost join are
released; the joins keep the graph below them alive until W: most of the micro-batch's saved
activations (what W needs, each parameterised layer's input, and what it does not but the nodes
hold: ReLU masks, pooling indices), plus the recorded gradient at every join (the gradient of
each parameterised layer's output). After W nothing of the micro-batch is held.

Decisions:
- No input gradient to compute (the first stage, whose input is data; an output that does not
  depend on the input): I does nothing and returns None, W runs the whole backward, as torch
  does. Nothing upstream waits on such an I, so all the work goes where W's goes (into the
  bubbles); the work and the memory are B's, only later.
- Nothing runs forward twice: BatchNorm's running statistics are updated once, by the forward.
- Parameters the output does not reach (unused, frozen) get no gradient, as from the full
  backward; a stage without parameters has no joins, and its W does nothing.
- float64 on the CPU, the zoo's models: input and parameter gradients are bit-equal to the full
  backward's; a parameter used twice may sum its contributions in another order (equal to 1e-12).
  tests/test_split_backward.py.
"""

from __future__ import annotations

from collections import deque
from functools import partial

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

from framework import lean_torch

AccumulateGrad = torch._C._functions.AccumulateGrad  # a leaf's node: where its gradient lands


class _Group:
    """Parameters whose weight sides meet the input path at shared joins: one autograd call in W.
    `joins[node]`: the gradient that arrived at the join in I (None until then)."""

    def __init__(self, weight: torch.Tensor, joins: list[Node]):
        self.weights = [weight]
        self.joins: dict[Node, tuple | None] = dict.fromkeys(joins)

    def absorb(self, other: _Group) -> None:
        self.weights += other.weights
        self.joins |= other.joins


class WeightGradient:
    """Op W of one micro-batch: what I kept, and `accumulate()`, which runs once."""

    def __init__(self, groups: list[_Group] | None = None, whole: tuple[torch.Tensor, torch.Tensor | None] | None = None):
        self._groups = groups or []
        self._whole = whole  # (output, output gradient): W runs the whole backward
        self.done = False

    def accumulate(self) -> None:
        """Add this micro-batch's parameter gradients into `.grad` (set where None), then hold nothing."""
        if self.done:
            raise RuntimeError("this micro-batch's weight gradient (W) was accumulated already")
        self.done = True
        groups, whole = self._groups, self._whole
        self._groups, self._whole = [], None
        if whole is not None:
            lean_torch.backward(*whole)
        for group in groups:
            _accumulate(group)


def backward_input(output: torch.Tensor, grad_output: torch.Tensor | None, input: torch.Tensor | None, weights) -> tuple[torch.Tensor | None, WeightGradient]:
    """Op I: the gradient of the stage's input, and what W needs later.

    `output`: the stage's output, or on the last stage its (scaled) loss with `grad_output` None;
    `input`: what the forward ran on, a leaf (`x.detach().requires_grad_()`), or data that needs no
    gradient (the first stage; None too); `weights`: the leaves the forward used as parameters
    (the module's parameters, or a weight-stashing snapshot). No parameter gradient is touched.
    The caller drops `output` afterwards (what the graph above the joins holds goes with it)."""
    if not output.requires_grad:
        return None, WeightGradient()  # nothing to differentiate (a stage of no parameters on data)
    if input is None or not input.requires_grad:
        return None, WeightGradient(whole=(output, grad_output))
    if input.grad_fn is not None:
        raise ValueError("a stage's input must be a leaf (x.detach().requires_grad_()): its graph stops there")
    users, leaves = _graph(output.grad_fn or get_gradient_edge(output).node)
    input_node = leaves.get(id(input))
    if input_node is None:
        return None, WeightGradient(whole=(output, grad_output))  # the output does not depend on the input
    input_path = _above(input_node, users)
    reached = {id(w): (w, leaves[id(w)]) for w in weights if id(w) in leaves}  # each once, even if listed twice
    groups = _groups(list(reached.values()), users, input_path)
    handles = [join.register_prehook(partial(_record, group, join)) for group in groups for join in group.joins]
    try:
        (grad_input,) = lean_torch.grad(output, [input], grad_output, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    return grad_input, WeightGradient(groups)


def _record(group: _Group, join: Node, grad_outputs):
    group.joins[join] = tuple(grad_outputs)


def _graph(root: Node) -> tuple[dict[Node, list[Node]], dict[int, Node]]:
    """Every node the root reaches, with the nodes that take its output (the graph's reverse
    edges); and the leaves it reaches (AccumulateGrad nodes) by the id of their tensor."""
    users: dict[Node, list[Node]] = {root: []}
    leaves: dict[int, Node] = {}
    todo = deque([root])
    while todo:
        node = todo.popleft()
        if type(node) is AccumulateGrad:
            leaves[id(node.variable)] = node
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if nxt not in users:
                users[nxt] = []
                todo.append(nxt)
            users[nxt].append(node)
    return users, leaves


def _above(start: Node, users: dict[Node, list[Node]]) -> dict[Node, None]:
    """`start` and every node whose output depends on it (an ordered set)."""
    seen = {start: None}
    todo = deque([start])
    while todo:
        for user in users[todo.popleft()]:
            if user not in seen:
                seen[user] = None
                todo.append(user)
    return seen


def _joins(weight_node: Node, users: dict[Node, list[Node]], input_path) -> list[Node]:
    """The input-path nodes where the weight side starting at `weight_node` ends."""
    side, joins = {weight_node: None}, {}
    todo = deque([weight_node])
    while todo:
        for user in users[todo.popleft()]:
            if user in input_path:
                joins[user] = None
            elif user not in side:
                side[user] = None
                todo.append(user)
    return list(joins)


def _groups(weights: list[tuple[torch.Tensor, Node]], users, input_path) -> list[_Group]:
    """The weights the output reaches (with their AccumulateGrad nodes), grouped by shared joins.
    A weight the output does not reach is in none: no gradient, as in the full backward."""
    group_of: dict[Node, _Group] = {}
    for w, node in weights:
        group = _Group(w, _joins(node, users, input_path))
        for join in list(group.joins):
            other = group_of.get(join)
            if other is not None and other is not group:
                group.absorb(other)
                for j in other.joins:
                    group_of[j] = group
        for join in group.joins:
            group_of[join] = group
    return list({id(g): g for g in group_of.values()}.values())


def _accumulate(group: _Group) -> None:
    """W for one group: autograd from its joins, with the gradients I recorded, to its weights."""
    edges, grads = [], []
    for join, recorded in group.joins.items():
        for i, g in enumerate(recorded or ()):
            if g is not None:
                edges.append(GradientEdge(join, i))
                grads.append(g)
    if not edges:
        return  # no gradient reached this group's joins in I
    # a parameter used twice: the later join's gradient runs down the input path into the earlier
    # join, which must see only its own recorded gradient (else that share counts twice)
    clamps = [join.register_prehook(partial(_recorded, recorded)) for join, recorded in group.joins.items()] if len(group.joins) > 1 else []
    try:
        # retain_graph: a join of one group may lie on another group's path between two joins
        # (a parameter used twice); the graph goes when the joins are dropped, below
        dws = lean_torch.grad_from_edges(edges, grads, group.weights, retain_graph=True)
    finally:
        for h in clamps:
            h.remove()
    group.joins.clear()
    for w, dw in zip(group.weights, dws):
        # out of place, as framework.stage.Stage.add_grads: dw may be a gradient another holds
        # (a parameter added to the input passes its join's gradient on unchanged)
        w.grad = dw if w.grad is None else w.grad + dw


def _recorded(recorded, arriving):
    return recorded if recorded is not None else (None,) * len(arriving)  # None: nothing arrived in I
