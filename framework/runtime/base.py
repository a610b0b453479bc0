"""What a role program sees (the role context), and what a runtime is.

A scheduler plugin is a set of roles (framework.scheduler.Role), each bound to a device. Role
programs talk only through this interface, so the same program runs on the virtual clock
(`runtime=sim`) and as real processes over a real transport (`runtime=local`/`remote`):

    out = await ctx.compute(work, fn, *args)   # run fn; the device's time model prices `work`
    ctx.send(dst_role, tag, tensor)            # non-blocking; the link carries the bytes
    ctx.send(dst_role, tag, tensor, reliable=False, retries=3)  # lossy; a bounded ARQ
    x = await ctx.recv(src_role, tag)          # FIFO per (src, dst, tag); PeerLost if src died
    t = ctx.now()                              # seconds since the run started (virtual on sim)
    await ctx.sleep(dt); await ctx.sleep_until(t)
    await ctx.barrier("sync", roles)           # every role in `roles` arrives before any leaves
    await ctx.end_epoch(epoch)                 # barrier of all roles; evaluation runs there
    ctx.iteration_done(epoch, it, samples)     # one role marks training progress
    ctx.report_train(loss_sum, correct, n)     # training loss/accuracy of a (micro-)batch
    with ctx.deferred_results(): ...           # results may be placeholders until the block ends
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import nullcontext
from typing import Any, Callable, Iterable

import torch

from framework import nonfinite
from framework.cluster import Work
from framework.errors import PipelabError
from framework.timeline import Timeline


class PeerLost(PipelabError):
    """`recv` from a role that a real runtime lost (its process died) and whose messages so far
    have all been delivered. Only roles the scheduler declares optional can be lost without
    failing the run."""

    def __init__(self, role: str):
        super().__init__(f"role {role} was lost")
        self.role = role


def check_retries(reliable: bool, retries: int) -> None:
    if reliable and retries:
        raise ValueError(f"send: retries={retries} is for unreliable sends (reliable=False); a reliable send retransmits until delivered")
    if retries < 0:
        raise ValueError(f"send: retries must be >= 0, got {retries}")


class RoleContext(ABC):
    role: str
    device_name: str
    compute_s: float = 0.0  # seconds this role's computations took (not their wait for the device), summed; what a worker would time around its calls

    @abstractmethod
    def now(self) -> float:
        """Seconds since the run started (virtual on the simulator)."""

    @abstractmethod
    async def compute(self, work: Work, fn: Callable | None = None, *args, iteration=-1, microbatch=-1, group=-1, **kwargs) -> Any:
        ...

    @abstractmethod
    def send(self, dst: str, tag: str, tensor: torch.Tensor | dict, *, iteration=0, microbatch=0, reliable=True, retries=0, moved=False) -> None:
        """Send `tensor` (or a dict of tensors) to role `dst`; returns at once. The receiver gets
        its own copy, as over a real link.

        `moved`: the sender keeps no reference to these tensors and nothing else holds them (a
        Stage's output, just computed): on the simulator the receiver then gets them without a
        copy. A copy per message cost GPipe 2-5% of its wall time (four stages, eight
        micro-batches of VGG-5). Either side writing into them in place would then change the
        other's, and autograd refuses a backward through a saved tensor that changed, so such a
        role fails loudly rather than learning from shared values. Real runtimes ignore it (the
        bytes cross a transport).

        `reliable`: the link retransmits until the message arrives (as TCP). Unreliable: a lost
        message never arrives (the link's loss), unless `retries` = k > 0 asks for the link's
        stop-and-wait ARQ: the receiver acknowledges each copy it gets over the reverse link (as
        lossy), the sender sends again after the link's `retransmit_timeout_s` while no ACK came
        back, at most k times; the receiver gets the message once (framework.cluster.Link.schedule)."""

    @abstractmethod
    async def recv(self, src: str, tag: str, timeout: float | None = None):
        """The next message from `src` under `tag`; None after `timeout`; PeerLost if `src` is gone."""

    @abstractmethod
    async def sleep_until(self, t: float) -> None:
        """Wait until the run's clock reads `t` (returns at once if it is past)."""

    async def sleep(self, dt: float) -> None:
        await self.sleep_until(self.now() + max(0.0, dt))

    def deferred_results(self):
        """A block in which a Stage's forward, backward or step may return a placeholder for its
        result, to be passed on (to `compute`, `send`, `report_train`) but not read; the work
        runs later, batched with identical replicas' (framework/runtime/deferred.py), and at the
        latest when the block ends. Inside it a role must not read its model's state directly.
        Only the simulator with `runtime.batch_replicas` defers; elsewhere results are values."""
        return nullcontext()

    def deferred_read(self, fn: Callable, *args, model, like: dict):
        """`fn(*args)`, which reads `model`'s state (and nothing that changes later) and returns
        a dict of tensors shaped as `like` (meta tensors). Inside `deferred_results()` on the
        simulator it may return placeholders and run after the model's queued work (a model's
        upload at the end of a round); elsewhere it runs now."""
        return fn(*args)

    async def barrier(self, name: str, roles: Iterable[str]) -> None:
        """Wait until every role in `roles` (this one included) has reached barrier `name`.

        Built from messages (one tiny packet to each other member, then one from each), so it
        costs what it costs on the links, on either clock. Call it with the same `name` and
        member set in every member; use a fresh name (e.g. with the epoch) for each crossing."""
        others = [r for r in roles if r != self.role]
        flag = torch.zeros(1, dtype=torch.uint8)
        for r in others:
            self.send(r, f"barrier.{name}", flag)
        for r in others:
            await self.recv(r, f"barrier.{name}")

    @abstractmethod
    async def end_epoch(self, epoch: int) -> None:
        ...

    @abstractmethod
    def iteration_done(self, epoch: int, iteration: int, samples: int) -> None:
        ...

    @abstractmethod
    def report_train(self, loss_sum: float, correct: int, n: int) -> None:
        ...


class RuntimeHooks:
    """What a runtime tells the job about. The default does nothing.

    `states()` returns the roles' `state()` at that epoch end (gathered only when asked)."""

    def on_iteration(self, epoch: int, iteration: int, samples: int, now: float) -> None: ...

    def on_train(self, loss_sum: float, correct: int, n: int, role: str | None = None) -> None: ...

    def on_epoch_end(self, epoch: int, now: float, states: Callable[[], dict[str, dict]]) -> None: ...


class Runtime(ABC):
    """Runs a scheduler's roles to the end. Afterwards: `timeline` (every compute interval and
    transfer), `final_states` (each role's last `state()`), `role_stats` (each role's
    `stats()`), `dropouts` (optional roles lost on the way) and `messages_lost`."""

    def __init__(self, cfg, cluster, codec, hooks: RuntimeHooks | None = None, *, network=None, run_config=None):
        """`network`: the run's transport (real runtimes need one); `run_config`: the whole
        config, which real runtimes ship to their role processes."""
        self.cfg = cfg
        self.network = network
        self.run_config = run_config
        self.cluster = cluster
        self.codec = codec
        self.hooks = hooks or RuntimeHooks()
        self.timeline = Timeline()
        self.final_states: dict[str, dict] = {}
        self.role_stats: dict[str, dict] = {}
        self.dropouts: list[dict] = []
        self.process_stats: dict[str, dict] = {}  # real runtimes: each role process's start-up and peak memory
        self.messages_lost = 0
        # non-finite numbers (framework/nonfinite.py): `prepare` takes the run's guard, its stages'
        self.guard = nonfinite.Guard()

    checkpoints = False  # whether `checkpoint`/`resume` work here (framework.checkpoints.state)

    def checkpoint(self, bag, prefix: str) -> dict:
        """At an epoch end where every role waits: the roles' and the runtime's state."""
        raise NotImplementedError(f"runtime={self.cfg.name} writes no checkpoints")

    def resume(self, bag, desc: dict, epoch: int) -> None:
        """Make `run` continue from a checkpoint taken at the end of `epoch`."""
        raise NotImplementedError(f"runtime={self.cfg.name} cannot resume")

    def prepare(self, scheduler) -> None:
        """Checks that need the scheduler, before the run starts (config errors fail here)."""
        scheduler.check_runtime(self.cfg.name)
        self.guard = scheduler.ctx.optimizer.guard

    @abstractmethod
    def run(self, scheduler) -> float:
        """Run every role program to the end; returns the makespan in seconds."""
