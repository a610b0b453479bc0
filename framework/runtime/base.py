"""What a role program sees: the role context.

A scheduler plugin is a set of role programs, `async def program(ctx)`, each bound to a
device. They talk only through this interface, so the same program runs on the virtual clock
(`runtime=sim`) and, later, as real processes over a real transport:

    out = await ctx.compute(work, fn, *args)   # run fn; the device's time model prices `work`
    ctx.send(dst_role, tag, tensor)            # non-blocking; the link carries the bytes
    x = await ctx.recv(src_role, tag)          # FIFO per (src, dst, tag)
    await ctx.end_epoch(epoch)                 # barrier of all roles; evaluation runs there
    ctx.iteration_done(epoch, it, samples)     # one role marks training progress
    ctx.report_train(loss_sum, correct, n)     # training loss/accuracy of a (micro-)batch
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import torch

from framework.cluster import Work


@dataclass
class RoleSpec:
    device: str
    program: Callable[["RoleContext"], Awaitable[None]]


class RoleContext(ABC):
    role: str
    device_name: str

    @property
    @abstractmethod
    def now(self) -> float:
        """Seconds since the run started (virtual on the simulator)."""

    @abstractmethod
    async def compute(self, work: Work, fn: Callable | None = None, *args, iteration=-1, microbatch=-1, group=-1, **kwargs) -> Any:
        ...

    @abstractmethod
    def send(self, dst: str, tag: str, tensor: torch.Tensor | dict, *, iteration=0, microbatch=0, reliable=True) -> None:
        ...

    @abstractmethod
    async def recv(self, src: str, tag: str, timeout: float | None = None):
        ...

    @abstractmethod
    async def end_epoch(self, epoch: int) -> None:
        ...

    @abstractmethod
    def iteration_done(self, epoch: int, iteration: int, samples: int) -> None:
        ...

    @abstractmethod
    def report_train(self, loss_sum: float, correct: int, n: int) -> None:
        ...
