"""An asyncio event loop on a virtual clock.

`loop.time()` returns virtual seconds. Virtual waits (`await loop.sleep_until(t)`) go into the
loop's own heap ordered by (time, sequence number). When no callback is ready, instead of
blocking in `select()` the loop jumps the clock to the earliest virtual wait and wakes it. So
waiting costs no wall time, and the order of events depends only on the program (ties are
woken in the order they were scheduled): the same program gives the same virtual times, bit
for bit. asyncio's own timers (`asyncio.sleep`) are not used by pipelab; they still work but
with clock-resolution rounding.

If nothing is ready and no timer is pending, every coroutine waits on something that will
never happen: the loop raises `DeadlockError` with what the caller says is pending.
"""

from __future__ import annotations

import asyncio
import heapq
import selectors
from typing import Callable

from framework.errors import DeadlockError


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no real I/O: `select` advances the virtual clock."""

    def __init__(self):
        self._map: dict = {}
        self.loop: "VirtualClockLoop | None" = None

    def register(self, fileobj, events, data=None):
        key = selectors.SelectorKey(fileobj, id(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj):
        return self._map.pop(fileobj)

    def select(self, timeout=None):
        loop = self.loop
        if timeout == 0:  # callbacks are ready: no time passes
            return []
        asyncio_next = loop._scheduled[0].when() if loop._scheduled else None
        if loop._vheap and (asyncio_next is None or loop._vheap[0][0] <= asyncio_next):
            loop._wake_next()
        elif asyncio_next is not None:
            loop._now = max(loop._now, asyncio_next)
        else:  # nothing ready, nothing scheduled
            raise DeadlockError(loop.describe_pending())
        return []

    def get_map(self):
        return self._map

    def close(self):
        self._map.clear()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        self._now = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._clock_resolution = 1e-9
        self._vheap: list = []
        self._vseq = 0
        self.describe_pending: Callable[[], str] = lambda: "every role is waiting and no event is scheduled"

    def time(self) -> float:
        return self._now

    def sleep_until(self, t: float) -> asyncio.Future:
        """A future that completes when the virtual clock reaches t (now, if t is past)."""
        fut = self.create_future()
        self._vseq += 1
        heapq.heappush(self._vheap, (max(t, self._now), self._vseq, fut))
        return fut

    def sleep(self, d: float) -> asyncio.Future:
        return self.sleep_until(self._now + d)

    def _wake_next(self) -> None:
        t, _, fut = heapq.heappop(self._vheap)
        self._now = t
        if not fut.done():
            fut.set_result(None)


def run_virtual(coro, describe_pending: Callable[[], str] | None = None, start: float = 0.0):
    """Run `coro` to completion on a fresh virtual-clock loop whose clock starts at `start`
    (a resumed run's); return its result."""
    loop = VirtualClockLoop()
    loop._now = float(start)
    if describe_pending is not None:
        loop.describe_pending = describe_pending
    task = loop.create_task(coro)
    tasks = {task}
    try:
        return loop.run_until_complete(task)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            tasks.update(pending)
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except (DeadlockError, KeyboardInterrupt):
            pass
        for t in tasks:  # retrieved: a Ctrl-C inside a role must not print "exception was never retrieved"
            if t.done() and not t.cancelled():
                t.exception()
        loop.close()
