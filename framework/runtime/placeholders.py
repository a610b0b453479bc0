"""Placeholders for results that deferred work has not made yet (framework/runtime/deferred.py),
and the job's hooks held until it has.

A `Pending` knows what its value will be shaped as (a tensor's shape, dtype and device, or one
element of a returned tuple or dict), so a role can pass it on and a link can price the message
that carries it. `DeferredHooks` holds the hook calls that carry placeholders (a batch's loss),
and every later one, and makes them in order once a flush has made the numbers: the job logs the
same metrics at the same steps as without deferral.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from framework.runtime.base import RuntimeHooks


class Producer(Protocol):
    """What a placeholder waits for: a deferred call (framework.runtime.deferred.DeferredCall)."""

    def result(self):
        """The call's value, made now if it has not run yet (raises what the call raised)."""

    def describe(self) -> str:
        """The call, in words, for errors."""


_SPECS: dict = {}  # (shape, dtype) -> a meta tensor of it (Pending.spec)


class Pending:
    """What a deferred call will produce, before it runs: a tensor of known shape, dtype and
    device (or one element of a returned tuple or dict: `pick`). Pass it on (to a computation,
    into a message); `value()` runs what it waits for."""

    __slots__ = ("call", "pick", "copy", "shape", "dtype", "device", "_value")

    def __init__(self, call: Producer, pick: int | str | None = None, shape=None, dtype=None, device=None, copy: bool = False):
        self.call, self.pick, self.copy = call, pick, copy
        self.shape = None if shape is None else torch.Size(shape)
        self.dtype, self.device = dtype, device
        self._value = self

    @property
    def spec(self) -> torch.Tensor:
        """A meta tensor of the promised shape and dtype (what byte counts are computed from;
        read only). One per shape and dtype, made once: every deferred message asks, and making a
        meta tensor cost 3.5% of a batched PiPar epoch's host time."""
        key = (self.shape, self.dtype)
        t = _SPECS.get(key)
        if t is None:
            if len(_SPECS) > 4096:  # a run has a few shapes; a sweep of many models in one process must not grow this without end
                _SPECS.clear()
            t = _SPECS[key] = torch.empty(self.shape, dtype=self.dtype, device="meta")
        return t

    def copied(self) -> "Pending":
        """A placeholder for a fresh contiguous copy (what a message carries in-process)."""
        return Pending(self.call, self.pick, self.shape, self.dtype, self.device, copy=True)

    def value(self):
        if self._value is self:
            v = self.call.result()
            if self.pick is not None:
                v = v[self.pick]
            if self.shape is not None:
                if not isinstance(v, torch.Tensor) or v.shape != self.shape or v.dtype != self.dtype:
                    got = f"{tuple(v.shape)} {v.dtype}" if isinstance(v, torch.Tensor) else type(v).__name__
                    raise RuntimeError(f"{self.call.describe()} returned {got} where its placeholder promised {tuple(self.shape)} {self.dtype}")
                if self.copy:
                    v = v.detach().clone(memory_format=torch.contiguous_format)
            self._value = v
        return self._value


_NESTED = (Pending, dict, list, tuple)  # what may hold a placeholder


def resolve(obj):
    """`obj` with every placeholder in it (in dicts, lists, tuples) replaced by its value; a
    container that holds none is returned as it is (every deferred call's arguments pass here)."""
    if isinstance(obj, Pending):
        return obj.value()
    if isinstance(obj, dict):
        for v in obj.values():
            if isinstance(v, _NESTED):
                return {k: resolve(v) for k, v in obj.items()}
        return obj
    if isinstance(obj, (list, tuple)):
        for v in obj:
            if isinstance(v, _NESTED):
                return type(obj)([resolve(v) for v in obj])
        return obj
    return obj


def pending_in(obj, out: list | None = None) -> list:
    """Every placeholder in `obj` (in dicts, lists, tuples)."""
    out = [] if out is None else out
    if isinstance(obj, Pending):
        out.append(obj)
    elif isinstance(obj, (dict, list, tuple)):
        for v in obj.values() if isinstance(obj, dict) else obj:
            if isinstance(v, Pending):
                out.append(v)
            elif isinstance(v, (dict, list, tuple)):
                pending_in(v, out)
    return out


class DeferredHooks(RuntimeHooks):
    """`hooks`, called once the numbers they are given exist (`release`, after each flush)."""

    def __init__(self, hooks: RuntimeHooks, flush: Callable[[], None]):
        self.hooks, self.flush = hooks, flush
        self._held: list[tuple] = []

    def on_iteration(self, epoch: int, iteration: int, samples: int, now: float) -> None:
        self._call(self.hooks.on_iteration, (epoch, iteration, samples, now))

    def on_train(self, loss_sum, correct, n, role=None) -> None:
        self._call(self.hooks.on_train, (loss_sum, correct, n, role))

    def on_epoch_end(self, epoch: int, now: float, states) -> None:
        self.flush()  # the epoch's work, and with it the held calls
        self.release()
        self.hooks.on_epoch_end(epoch, now, states)

    def _call(self, hook: Callable, args: tuple) -> None:
        if self._held or any(isinstance(a, Pending) for a in args):
            self._held.append((hook, args))
        else:
            hook(*args)

    def release(self) -> None:
        held, self._held = self._held, []
        for hook, args in held:
            hook(*resolve(args))
