"""A stage: a slice of the model's units on one device.

`forward(x, key)` runs the slice and keeps what backward needs under `key` (a micro-batch
or mini-batch id); `backward(key, grad)` runs backward from the gradient of the stage's output
(or from the loss, on the last stage), accumulates parameter gradients and returns the
gradient of the stage's input; `step()` applies the optimizer.

Weight stashing (PipeDream) is a stage option, not a scheduler trick: with `stash=True`,
forward runs on a snapshot of the current weights (`torch.func.functional_call` on detached
copies), backward computes gradients with respect to that snapshot, and `step()` applies them
to the live weights. The number of updates between a key's forward and its backward is its
staleness.

With `numerics=False` no tensor math runs: forward returns a meta tensor of the right shape so
that byte counts and timing stay exact (timing-only runs).

A schedule that needs more of a stage subclasses it (a plugin's stage lives in its plugin) and
uses two hooks made for that: `held_keys()`, which a subclass that keeps more per key than the
activations extends (a checkpoint is refused while any key is held), and `restamp(key, version)`,
which dates a held forward at an earlier weight version (a forward that recomputes an earlier one
counts its staleness from the original).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn
from torch.func import functional_call

from framework import lean_torch, nonfinite
from framework.checkpoints import state as ck
from framework.cluster import Work
from framework.lean_torch import SGD, optimizers_without_dynamo
from framework.replicas import batched as replicas


@dataclass(frozen=True)
class OptimizerSettings:
    """What `make_optimizer` reads of the run's `train` config, as plain values, read once.
    A config lookup costs 20-40 us, and a run of K simulated devices builds K to 2K stages: four
    lookups each were 10-20 ms of building 64 roles (`SchedulerContext.optimizer` holds the
    run's)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    # the run's non-finite checks (framework/nonfinite.py): one Guard for all its stages
    guard: nonfinite.Guard = field(default_factory=nonfinite.Guard, compare=False)

    @classmethod
    def of(cls, train) -> "OptimizerSettings":
        """`train` (the run's `cfg.train`, or settings already read) as settings."""
        if isinstance(train, cls):
            return train
        # a mapping (cfg.train, a DictConfig); one written by hand may leave the policy out
        return cls(train.optimizer, train.lr, train.momentum, train.weight_decay, nonfinite.Guard(train.get("on_nonfinite", "fail")))


def make_optimizer(params, train) -> torch.optim.Optimizer:
    """The optimizer `train` (`cfg.train` or `OptimizerSettings`) names, over `params`."""
    params = list(params)
    s = OptimizerSettings.of(train)
    if s.optimizer == "sgd":  # torch.optim.SGD without a 2-7 s import of torch._dynamo (framework/lean_torch.py)
        return SGD(params, lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)
    if s.optimizer == "adam":
        optimizers_without_dynamo()
        return torch.optim.Adam(params, lr=s.lr, weight_decay=s.weight_decay)
    raise ValueError(f"unknown optimizer {s.optimizer!r}; choices: sgd, adam")


class Stage:
    def __init__(self, model, start: int, stop: int, train, *, numerics: bool = True, stash: bool = False):
        self.model = model
        self.start, self.stop = start, stop
        self.module: nn.Module = model.slice(start, stop)
        self.is_first = start == 0
        self.is_last = stop == len(model)
        self.numerics = numerics
        self.stash = stash
        settings = OptimizerSettings.of(train)
        self.guard = settings.guard
        self.optimizer = make_optimizer(self.module.parameters(), settings) if numerics else None
        self.out_shape = model.infos[stop - 1].out_shape
        self.in_shape = model.infos[start].in_shape
        self.version = 0  # optimizer steps applied
        self._saved: dict = {}
        self.peak_inflight = 0
        self.staleness: list[int] = []
        self.params = dict(self.module.named_parameters())
        self.param_names = list(self.params)
        self.buffers = dict(self.module.named_buffers())
        self.bank = None  # the ReplicaBank whose rows hold this stage's parameters, if any (framework/replicas/bank.py)
        self.bank_row = -1  # and which row

    # what a batched call of identical replicas needs to know (framework/replicas/batched.py); asked only
    # when replicas are batched, so building thousands of timing-only stages does not pay for it

    @cached_property
    def architecture(self) -> tuple:
        return replicas.architecture_key(self.module, self.start, self.stop, self.params, self.buffers)

    @cached_property
    def draws_random(self) -> bool:
        return replicas.draws_random_numbers(self.module)

    @cached_property
    def buffer_data(self) -> list[torch.Tensor]:
        """The buffers' storage without their version counters (`.data`, made once): where a
        batched forward writes the replicas' BatchNorm statistics back, as BatchNorm's own update
        does, so that a graph saved from an earlier forward does not see them as modified."""
        return [b.data for b in self.buffers.values()]

    # ---- cost descriptions for the device time model -----------------------------------

    def fwd_work(self, batch: int) -> Work:
        return Work("fwd", self.start, self.stop, batch)

    def bwd_work(self, batch: int) -> Work:
        return Work("bwd", self.start, self.stop, batch)

    def step_work(self) -> Work:
        return Work("step", self.start, self.stop)

    @property
    def inflight(self) -> int:
        return len(self._saved)

    # ---- compute ------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, key, target: torch.Tensor | None = None, loss_scale: float = 1.0):
        """Run the slice. On the last stage, with `target`, returns (loss_sum, correct, n)
        of the cross-entropy (the graph is kept for backward, scaled by `loss_scale`)."""
        if key in self._saved:
            raise RuntimeError(f"stage [{self.start}:{self.stop}) already holds activations for {key!r}")
        n = x.shape[0]
        if not self.numerics:
            self._saved[key] = (n, None, None, self.version)
            self.peak_inflight = max(self.peak_inflight, len(self._saved))
            if self.is_last:
                return (0.0, 0, n)
            return torch.empty((n, *self.out_shape), device="meta")
        x_in = x if self.is_first else x.detach().requires_grad_(True)
        if self.stash:
            snapshot = {name: p.detach().clone().requires_grad_(True) for name, p in self.module.named_parameters()}
            y = functional_call(self.module, snapshot, (x_in,))
        else:
            snapshot = None
            y = self.module(x_in)
        if self.is_last:
            if target is None:
                raise ValueError("the last stage needs targets")
            loss_sum = nn.functional.cross_entropy(y, target, reduction="sum")
            correct = int((y.detach().argmax(1) == target).sum())
            loss = float(loss_sum.detach())  # checked for NaN where every loss arrives (the job's on_train hook)
            self._saved[key] = (x_in, loss_sum * loss_scale, snapshot, self.version)
            self.peak_inflight = max(self.peak_inflight, len(self._saved))
            return (loss, correct, n)
        self._saved[key] = (x_in, y, snapshot, self.version)
        self.peak_inflight = max(self.peak_inflight, len(self._saved))
        return y.detach()

    def keep(self, key, slot: replicas.Slot) -> None:
        """Hold a batched forward's share of its graph under `key` (framework/replicas/batched.py)."""
        if key in self._saved:
            raise RuntimeError(f"stage [{self.start}:{self.stop}) already holds activations for {key!r}")
        self._saved[key] = (slot, None, None, self.version)
        self.peak_inflight = max(self.peak_inflight, len(self._saved))

    def slot_of(self, key) -> replicas.Slot | None:
        """`key`'s share of a batched forward's graph; None if its forward ran alone (or never)."""
        entry = self._saved.get(key)
        return entry[0] if entry is not None and isinstance(entry[0], replicas.Slot) else None

    def holds_unbatched_graph(self) -> bool:
        """Whether a forward that ran alone (its graph saved this stage's own parameters) awaits
        its backward."""
        return any(type(entry[0]) is not replicas.Slot for entry in self._saved.values())

    def release(self, key) -> replicas.Slot:
        """Give up `key`'s share of a batched forward's graph, for its backward."""
        slot, _, _, version = self._saved.pop(key)
        self.staleness.append(self.version - version)
        return slot

    def backward(self, key, grad: torch.Tensor | None = None):
        """Backward of `key`'s forward; returns the input gradient (None on the first stage)."""
        if self.slot_of(key) is not None:  # its forward ran batched
            return replicas.run_backwards([replicas.BackwardRequest(self, key, grad)])[0]
        x_in, out, snapshot, version = self._saved.pop(key)
        self.staleness.append(self.version - version)
        if not self.numerics:
            return None if self.is_first else torch.empty((x_in, *self.in_shape), device="meta")  # x_in holds n
        grad_out = None if self.is_last else grad
        if snapshot is None:
            lean_torch.backward(out, grad_out)
            return None if self.is_first else x_in.grad
        inputs = list(snapshot.values()) + ([] if self.is_first else [x_in])
        grads = lean_torch.grad(out, inputs, grad_out)
        self.add_grads(grads)
        return None if self.is_first else grads[-1]

    # ---- hooks for subclasses ------------------------------------------------------------

    def held_keys(self) -> list:
        """The keys whose state this stage holds: activations awaiting their backward. A subclass
        that keeps more per key adds its keys; a checkpoint is refused while any is held."""
        return list(self._saved)

    def restamp(self, key, version: int) -> None:
        """Count `key`'s staleness from weight version `version` rather than from its forward's:
        for a forward that recomputes an earlier one, whose output's gradient was computed
        against the weights of that time."""
        entry = self._saved[key]
        self._saved[key] = (*entry[:3], version)

    def add_grads(self, grads, replace=()) -> None:
        """Accumulate parameter gradients given in `named_parameters` order (None: no gradient;
        entries beyond the parameters, such as an input gradient, are ignored). The parameters
        whose indices are in `replace` take theirs as given: the sum with the held gradient
        made already (framework/replicas/batched.py)."""
        self.hand_out_gradients()
        for j, (p, g) in enumerate(zip(self.params.values(), grads)):
            if g is not None:
                p.grad = g if p.grad is None or j in replace else p.grad + g

    def hand_out_gradients(self) -> None:
        """Gradients that this replica's bank holds for it (framework/replicas/bank.py `hold`) into
        its parameters' `.grad`, before anything but the group's step uses them."""
        if self.bank is not None:
            self.bank.hand_out()  # nothing where it holds none

    def step(self) -> None:
        if self.numerics:
            self.hand_out_gradients()
            self.optimizer.step()
            self.check_parameters()
        self.finish_step()

    def check_parameters(self) -> None:
        """After an update, before the gradients go: every parameter finite (framework/nonfinite.py)."""
        if self.numerics and self.guard.enabled:
            self.guard.parameters(self.params.items(), f"stage [{self.start}:{self.stop})")

    def finish_step(self, clear_grads: bool = True) -> None:
        """What follows the optimizer's update (also after identical replicas' batched update,
        framework/replicas/batched.py `run_steps`; `clear_grads=False` where that update used gradients
        its bank held, so that no replica has any)."""
        if self.numerics and clear_grads:  # optimizer.zero_grad(set_to_none=True) on the same parameters,
            for p in self.params.values():  # without its profiler record and dispatch wrapper (per replica per step)
                p.grad = None
        self.version += 1

    # ---- checkpoints --------------------------------------------------------------------

    def checkpoint(self, bag, prefix: str, weights: bool = True) -> dict:
        """The stage's weights (unless its owner stores the whole model), optimizer state and
        counters into `bag` (framework.checkpoints.state). Taken between flushes: no activations alive."""
        self.hand_out_gradients()
        held = self.held_keys()
        if held:
            raise ck.CheckpointError(f"stage [{self.start}:{self.stop}) still holds activations of {sorted(map(str, held))}")
        out = {"bounds": [self.start, self.stop], "version": self.version, "peak_inflight": self.peak_inflight, "staleness": list(self.staleness)}
        if self.numerics:
            if weights:
                out["module"] = ck.module_state(bag, f"{prefix}.module", self.module)
            out["optimizer"] = ck.optimizer_state(bag, f"{prefix}.optimizer", self.optimizer)
        return out

    def restore(self, bag, desc: dict) -> None:
        if list(desc["bounds"]) != [self.start, self.stop]:
            raise ck.CheckpointError(f"checkpoint of stage {desc['bounds']} restored into stage [{self.start}, {self.stop})")
        self.version, self.peak_inflight, self.staleness = int(desc["version"]), int(desc["peak_inflight"]), list(desc["staleness"])
        if self.numerics:
            if "module" in desc:
                ck.load_module_state(bag, desc["module"], self.module)
            ck.load_optimizer_state(bag, desc["optimizer"], self.optimizer)
            if self.bank is not None:  # the loaded momentum buffers are not the bank's rows
                self.bank.retire()
                self.bank = None

