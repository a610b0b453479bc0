"""What a role sees of `runtime=sim`: its context (compute on its device's FIFO slots, send and
receive through mailboxes, the virtual clock), and the two queues the runtime keeps per device and
per (source, destination, tag).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Protocol

from framework.cluster import Cluster, Work
from framework.nonfinite import NonFiniteError
from framework.runtime.base import RoleContext, RuntimeHooks
from framework.runtime.clock import VirtualClockLoop
from framework.runtime.deferred import DeferredCompute
from framework.runtime.placeholders import pending_in, resolve
from framework.runtime.shared_processor import SharedProcessor
from framework.timeline import Timeline


class DeviceQueue:
    """FIFO admission to a device's compute slots, in virtual time: a computation waits for a slot,
    then runs at full speed (`SharedProcessor` is the other discipline: cores shared)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.free = slots
        self.waiters: deque = deque()

    @property
    def idle(self) -> bool:
        return not self.waiters and self.free == self.slots

    async def hold(self, loop, seconds: float) -> float:
        """Run a computation of `seconds` on the slot it holds; returns its end."""
        if seconds > 0:
            await loop.sleep(seconds)
        return loop.time()

    def try_acquire(self, loop) -> asyncio.Future | None:
        """Take a slot now (None), or get in line: the future completes when the slot is ours."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return None
        fut = loop.create_future()
        self.waiters.append(fut)
        return fut

    async def acquire(self, loop) -> None:
        fut = self.try_acquire(loop)
        if fut is not None:
            await fut

    def release(self) -> None:
        if self.waiters:
            self.waiters.popleft().set_result(None)  # the slot passes straight on
        else:
            self.free += 1


class Mailbox:
    def __init__(self):
        self.items: deque = deque()
        self.waiters: deque = deque()

    def put(self, item) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(item)
                return
        self.items.append(item)


class SimHost(Protocol):
    """What a role's context uses of the runtime that hosts it (framework.runtime.sim.SimRuntime):
    the virtual clock, the device queues, the deferred work, the hooks and the timeline, and
    message delivery between roles."""

    loop: VirtualClockLoop
    cluster: Cluster
    device_queues: dict[str, DeviceQueue | SharedProcessor]
    deferred: DeferredCompute | None  # identical replicas' work, batched (runtime.batch_replicas)
    hooks: RuntimeHooks
    timeline: Timeline

    def states(self) -> dict[str, dict]: ...

    def mailbox(self, src: str, dst: str, tag: str) -> Mailbox: ...

    def send(self, src, dst, tag, payload, iteration, microbatch, reliable, retries=0, moved=False) -> None: ...

    async def barrier(self, key, role: str, on_complete: Callable[[], None]) -> None: ...


class SimContext(RoleContext):
    def __init__(self, runtime: SimHost, role: str, device_name: str):
        self.rt = runtime
        self.role = role
        self.device_name = device_name
        self.device = runtime.cluster.device(device_name)
        self.waiting_on: tuple = ("starting",)
        self.deferring = 0  # depth of deferred_results() blocks

    @contextmanager
    def deferred_results(self):
        """Placeholders for the results of Stage calls while the work is queued (with
        `runtime.batch_replicas`; framework/runtime/deferred.py); leaving the block runs it."""
        if self.rt.deferred is None:
            yield
            return
        self.deferring += 1
        try:
            yield
        finally:
            self.deferring -= 1
        self.rt.deferred.flush()  # the role may read its state again

    def deferred_read(self, fn: Callable, *args, model, like: dict):
        if self.deferring and self.rt.deferred is not None:
            return self.rt.deferred.submit_read(fn, args, model, like)
        return fn(*args)

    def now(self) -> float:
        return self.rt.loop.time()

    async def sleep_until(self, t: float) -> None:
        self.waiting_on = ("sleep", t)
        await self.rt.loop.sleep_until(t)

    async def compute(self, work: Work, fn: Callable | None = None, *args, iteration=-1, microbatch=-1, group=-1, **kwargs) -> Any:
        rt = self.rt
        queue = rt.device_queues[self.device_name]
        self.waiting_on = ("device", work.kind)
        await queue.acquire(rt.loop)
        try:
            start = rt.loop.time()
            if rt.deferred is not None and fn is not None:  # run when a result is first needed
                call, known, stand_in = rt.deferred.submit(fn, args, kwargs, on_demand=self.deferring > 0)
                duration = self.device.duration(work, start)
            else:
                call, known = None, False
                t0 = time.perf_counter()
                try:
                    result = fn(*args, **kwargs) if fn is not None else None
                except NonFiniteError as e:  # this role's own computation (a deferred one may be any role's: not located)
                    raise e.locate(self.role, iteration) from None
                duration = self.device.duration(work, start, time.perf_counter() - t0)
            self.waiting_on = ("compute", work.kind)
            end = await queue.hold(rt.loop, duration)  # longer than `duration` on a shared processor
            self.compute_s += end - start
            rt.timeline.compute(self.role, work.kind, start, end, iteration, microbatch, group)
        finally:
            queue.release()
        if known:
            return stand_in
        return result if call is None else call.result()

    def send(self, dst: str, tag: str, tensor, *, iteration=0, microbatch=0, reliable=True, retries=0, moved=False) -> None:
        self.rt.send(self.role, dst, tag, tensor, iteration, microbatch, reliable, retries, moved)

    async def recv(self, src: str, tag: str, timeout: float | None = None):
        box = self.rt.mailbox(src, self.role, tag)
        if box.items:
            return self._usable(box.items.popleft())
        fut = self.rt.loop.create_future()
        box.waiters.append(fut)
        self.waiting_on = ("recv", tag, src)
        if timeout is not None:
            timer = self.rt.loop.sleep(timeout)
            timer.add_done_callback(lambda _: fut.done() or fut.set_result(None))
        return self._usable(await fut)

    def _usable(self, item):
        """A message's placeholders pass on inside deferred_results(); elsewhere the role
        reads values."""
        # not checked for NaN here (framework/nonfinite.py): in this process a message is what a
        # role computed, and a non-finite one reaches a checked loss or update in the same iteration
        if self.deferring or self.rt.deferred is None or not pending_in(item):
            return item
        return resolve(item)

    async def end_epoch(self, epoch: int) -> None:
        self.waiting_on = ("epoch", epoch)
        rt = self.rt
        await rt.barrier(("epoch", epoch), self.role, lambda: rt.hooks.on_epoch_end(epoch, self.now(), rt.states))

    def iteration_done(self, epoch: int, iteration: int, samples: int) -> None:
        self.rt.hooks.on_iteration(epoch, iteration, samples, self.now())

    def report_train(self, loss_sum: float, correct: int, n: int) -> None:
        self.rt.hooks.on_train(loss_sum, correct, n, self.role)
