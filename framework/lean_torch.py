"""Keep torch's lazy imports lazy: no `torch._dynamo` (and sympy) import for training.

`torch.optim` imports `torch._dynamo` the first time an optimizer is used: `Optimizer` wraps
`add_param_group`, `zero_grad`, `state_dict` and `load_state_dict` in `torch._disable_dynamo`,
and `SGD.step` in a wrapper that calls `torch._dynamo.graph_break()`, all to steer the compiler.
That import costs about 1.7 s once per process on an idle 2-core machine and 7 s when other
processes compete for the cores (found with `python -X importtime` and an import hook; measured
by experiments/bench_startup.py). pipelab compiles nothing, so:

- `optimizers_without_dynamo()` fills the `_disable_dynamo` wrappers' cache with the plain
  function, which they then call directly (once torch._dynamo is imported for another reason, a
  user's torch.compile, nothing is changed);
- `SGD` is torch.optim.SGD whose `step` on CPU tensors calls torch's own single-tensor SGD
  update (the one torch.optim.SGD picks on the CPU) under `torch.no_grad()`, without the
  compiler wrapper: the same arithmetic, bit for bit (tests/test_startup.py), the same state
  (`momentum_buffer`), the same state_dict. Other devices take torch's own `step`.
- `backward(out, grad)`, `grad(outs, inputs, grads)` and `grad_from_edges(edges, grads, inputs)` are
  `torch.autograd.backward` / `torch.autograd.grad` with given output gradients, without the shape check that imports
  `torch.fx.experimental.symbolic_shapes` and with it sympy (0.5 s at a pipeline stage's first
  backward; the check exists for symbolic and nested shapes, which a stage never has). They check
  the shapes themselves and call the same autograd engine entry point; where that is missing
  (another torch) or the shapes differ, torch's own function runs (and raises its own error).
"""

from __future__ import annotations

import sys

import torch
from torch.optim import sgd as _sgd

_done = False


def optimizers_without_dynamo() -> None:
    global _done
    if _done or "torch._dynamo" in sys.modules:
        return
    _done = True
    marker = torch._disable_dynamo(lambda: None).__code__  # every such wrapper shares this code
    for f in vars(torch.optim.Optimizer).values():
        f = getattr(f, "__func__", f)  # staticmethods
        inner = getattr(f, "__wrapped__", None)
        if getattr(f, "__code__", None) is marker and inner is not None and getattr(inner, "__dynamo_disable", None) is None:
            inner.__dynamo_disable = inner


class SGD(torch.optim.SGD):
    """torch.optim.SGD without the compiler hooks on the CPU (see the module docstring)."""

    def __init__(self, params, **kwargs):
        optimizers_without_dynamo()
        super().__init__(params, **kwargs)

    def step(self, closure=None):
        groups = self.param_groups
        if any(g["foreach"] or g["fused"] or g["differentiable"] for g in groups) or any(p.device.type != "cpu" for g in groups for p in g["params"]):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in groups:
            _update([(self, group)])
        return loss


def sgd_steps(optimizers: list[SGD]) -> None:
    """Each optimizer's `step()` as one update over all their parameters, for replicas stepping
    together (framework/replicas/batched.py): one kernel launch per operation instead of one per
    optimizer. Each must have one parameter group and all the same hyper-parameters; torch's
    update is elementwise, and the single-tensor or foreach path it picks for one it picks for all
    of them (same devices), so every parameter and momentum buffer ends as its own step leaves it.

    On the CPU the update takes torch's foreach path where one optimizer takes the single-tensor
    one: on the CPU a foreach op is the same elementwise op applied per tensor in C++ (bit-equal,
    tests/test_replica_batching.py), without a Python call per tensor (368 of a batched FL epoch's
    892 tensor calls per replica were this update's)."""
    _update([(opt, opt.param_groups[0]) for opt in optimizers], foreach_on_cpu=True)


def _update(pairs: list[tuple[SGD, dict]], foreach_on_cpu: bool = False) -> None:
    """torch's SGD update of every (optimizer, parameter group) in `pairs`, all of the first's
    hyper-parameters, as one `sgd_update`; a momentum buffer made by the update (a first step)
    goes into its optimizer's state."""
    group = pairs[0][1]
    params: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    buffers: list[torch.Tensor | None] = []
    spans = []
    sparse = False
    for opt, g in pairs:
        first = len(params)
        sparse |= opt._init_group(g, params, grads, buffers)
        spans.append((opt, first, len(params)))
    # torch's updates change an existing momentum buffer in place and put a new one only where
    # there was none (a first step): only those go back to their optimizer's state (a write-back
    # of every buffer hashed each parameter again, 896 a batched step of 64 VGG-5s)
    created = [i for i, b in enumerate(buffers) if b is None] if group["momentum"] != 0 else []
    sgd_update(params, grads, buffers, group, foreach_on_cpu, sparse)
    if created:
        owners = iter(spans)
        opt, _, stop = next(owners)
        for i in created:
            while i >= stop:
                opt, _, stop = next(owners)
            opt.state[params[i]]["momentum_buffer"] = buffers[i]


def sgd_update(params: list, grads: list, buffers: list, group: dict, foreach_on_cpu: bool = False, sparse: bool = False) -> None:
    """torch's SGD update of `params` with `grads` and momentum `buffers` (a None entry: made
    by the update, in place in the list) under the hyper-parameters of the parameter group
    `group`: the single-tensor update on the CPU (what torch.optim.SGD picks there; foreach with
    `foreach_on_cpu`), torch's own choice elsewhere."""
    hyper = dict(weight_decay=group["weight_decay"], momentum=group["momentum"], lr=group["lr"], dampening=group["dampening"],
                 nesterov=group["nesterov"], maximize=group["maximize"], has_sparse_grad=sparse)
    with torch.no_grad():
        single_tensor = not group["foreach"] and all(p.device.type == "cpu" for p in params)  # torch's pick here
        if single_tensor and foreach_on_cpu and not sparse:
            _sgd._multi_tensor_sgd(params, grads, buffers, None, None, **hyper)
        elif single_tensor:
            _sgd._single_tensor_sgd(params, grads, buffers, None, None, **hyper)
        else:
            _sgd.sgd(params, grads, buffers, foreach=group["foreach"], fused=group["fused"], **hyper)


_run_backward = getattr(torch.autograd.graph, "_engine_run_backward", None)


def _plain(outs, grads) -> bool:
    return _run_backward is not None and all(
        isinstance(o, torch.Tensor) and isinstance(g, torch.Tensor) and not o.is_nested and o.shape == g.shape for o, g in zip(outs, grads, strict=True)
    )


def backward(out: torch.Tensor, grad: torch.Tensor | None) -> None:
    """out.backward(grad) (see the module docstring)."""
    if grad is None or not _plain((out,), (grad,)):
        out.backward(grad)
        return
    _run_backward((out,), (grad,), False, False, (), allow_unreachable=True, accumulate_grad=True)


def grad(outs: torch.Tensor, inputs: list[torch.Tensor], grads: torch.Tensor | None, retain_graph: bool = False) -> tuple:
    """torch.autograd.grad(outs, inputs, grads, retain_graph, allow_unused=True) (see the module docstring)."""
    if grads is None or not _plain((outs,), (grads,)):
        return torch.autograd.grad(outs, inputs, grads, retain_graph=retain_graph, allow_unused=True)
    return _run_backward((outs,), (grads,), retain_graph, False, tuple(inputs), True, accumulate_grad=False)


def grad_from_edges(edges: list, grads: list[torch.Tensor], inputs: list[torch.Tensor], retain_graph: bool = False) -> tuple:
    """torch.autograd.grad(edges, inputs, grads, retain_graph) from `GradientEdge`s inside a graph
    (a split backward's weight gradient, framework/pipeline/split_backward.py; see the module docstring)."""
    plain = _run_backward is not None and all(
        isinstance(g, torch.Tensor) and not g.is_nested and g.shape == torch.Size(e.node._input_metadata[e.output_nr].shape) for e, g in zip(edges, grads, strict=True)
    )
    if not plain:
        return torch.autograd.grad(edges, inputs, grads, retain_graph=retain_graph)
    return _run_backward(tuple(edges), tuple(grads), retain_graph, False, tuple(inputs), False, accumulate_grad=False)
