"""A device whose cores its computations share (processor sharing), in virtual time.

A server that trains one model replica per device, as PiPar's does (one process per replica on
an 8-core i7), does not serve them one after another: the operating system shares its cores among
every replica that has work. With n computations running on C cores, each runs on a core of its
own while n <= C, and at C / n of its speed alone once n > C; arrivals and departures change the
share. That is egalitarian processor sharing (PS), exact here through its attained-service clock:

    V(t)   the service each running computation has received (seconds of its time alone);
           dV/dt = min(1, C / n(t))
    F_j    = V(arrival_j) + w_j, where w_j is computation j's seconds alone (the time model's)

j completes when V reaches F_j, so the earliest F completes first, and computations with equal F
(identical replicas that start together) complete at the same instant. The next completion time
is recomputed whenever a computation arrives or leaves; stale wake-ups are ignored. Everything is
deterministic float arithmetic in event order, so runs stay bit for bit reproducible.

`DeviceQueue` (framework/runtime/sim_context.py) is the other discipline: FIFO admission to
`slots`, each computation at full speed once admitted.
"""

from __future__ import annotations

import heapq


class SharedProcessor:
    """`cores` shared by every computation on one device (processor sharing). A fraction of a
    core is allowed: one replica of K on C cores, alone, is a computation on C / K of a core
    (PiPar's trial iterations, plugins/schedulers/pipar/search.py)."""

    def __init__(self, cores: float):
        if not cores > 0:
            raise ValueError(f"a shared processor needs cores > 0, got {cores}")
        self.cores = float(cores)
        self._v = 0.0  # attained service per running computation, in seconds alone
        self._t = 0.0  # virtual time `_v` was last brought up to
        self._running: list = []  # heap of (finish tag F, sequence, future)
        self._seq = 0
        self._generation = 0  # of the pending wake-up; older ones are stale

    @property
    def idle(self) -> bool:
        return not self._running

    # the queue interface of framework.runtime.sim_context (admission is immediate here)

    def try_acquire(self, loop) -> None:
        return None

    async def acquire(self, loop) -> None:
        return None

    def release(self) -> None:
        pass

    async def hold(self, loop, seconds: float) -> float:
        """Run a computation of `seconds` (its time alone) among the others; returns its end."""
        if seconds <= 0:
            return loop.time()
        self._advance(loop.time())
        if not self._running:
            # an idle processor starts its service clock again: its state is then the same
            # whatever ran before (a run resumed from a checkpoint, taken when every device is
            # idle, continues bit for bit as the run that went on)
            self._v = 0.0
        fut = loop.create_future()
        self._seq += 1
        heapq.heappush(self._running, (self._v + seconds, self._seq, fut))
        self._reschedule(loop)
        await fut
        return loop.time()

    def _rate(self) -> float:
        n = len(self._running)
        return min(1.0, self.cores / n) if n else 0.0

    def _advance(self, now: float) -> None:
        if self._running:
            self._v += (now - self._t) * self._rate()
        self._t = now

    def _reschedule(self, loop) -> None:
        self._generation += 1
        if not self._running:
            return
        gen = self._generation
        finish = self._running[0][0]
        when = self._t + max(0.0, finish - self._v) / self._rate()
        loop.sleep_until(when).add_done_callback(lambda _: self._wake(loop, gen))

    def _wake(self, loop, gen: int) -> None:
        if gen != self._generation:
            return  # an arrival or a departure since has moved the next completion
        self._advance(loop.time())
        # the earliest finish is due now; others due within rounding of it complete with it
        due = self._running[0][0]
        tol = 1e-12 * max(1.0, abs(due))
        while self._running and self._running[0][0] <= max(self._v, due) + tol:
            _, _, fut = heapq.heappop(self._running)
            if not fut.done():
                fut.set_result(None)
        self._v = max(self._v, due)  # no drift: the finished computations got exactly their service
        self._reschedule(loop)
