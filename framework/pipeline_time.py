"""The predicted time of a pipeline plan: each stage's actions (framework.pipeline) played out on
predicted costs, without tensors.

A stage runs its actions in order, one at a time, on its device; F(m) waits for its activation and
B(m) for its gradient; a message waits for its link (first come, first served; one channel for
every link on a shared medium) and arrives the link's latency after its last byte. That is the
simulator's model without its bookkeeping, so with `predictor=oracle` the prediction is the
simulated epoch when nothing is lost and no speed trace applies (tested: tests/test_partition_dp.py).
A codec's modelled time is charged to the actions that encode and decode; the simulator decodes a
message when it arrives, ahead of other work, so with a codec the prediction is close rather than
exact (MBQ: exact for GPipe, 3.6% short for 1F1B on the default run). The planner writes it to
plan.json as `predicted_epoch_s`, beside the per-stage costs it was computed from.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass
class Action:
    """One action of a stage's program, priced: `seconds` on the device, then (F and B, but
    not on the edge of the pipeline) the message it sends takes `send_s` on its link."""

    op: str  # F, B or STEP
    key: object  # the micro-batch, unique across iterations
    seconds: float
    send_s: float = 0.0


def makespan(programs: list[list[Action]], latency_down: list[float], latency_up: list[float], shared_medium: bool = False) -> float:
    """When the last action ends. `programs[s]`: stage s's actions in order; `latency_down[s]`
    and `latency_up[s]`: the latencies of the links between stages s and s + 1."""
    S = len(programs)
    free = [0.0] * S  # when each device is next idle
    pos = [0] * S
    arrive: dict = {}  # (stage, "act" | "grad", key) -> arrival time
    channel = {}  # link -> when it is next idle
    end = 0.0

    def ready(s: int) -> float | None:
        op, key = programs[s][pos[s]].op, programs[s][pos[s]].key
        if op == "F" and s > 0:
            return arrive.get((s, "act", key))
        if op == "B" and s < S - 1:
            return arrive.get((s, "grad", key))
        return 0.0

    def send(link, t: float, seconds: float, latency: float) -> float:
        start = max(t, channel.get(link, 0.0))
        channel[link] = start + seconds
        return start + seconds + latency

    # the stage whose next action can start first goes next, so a shared channel serves messages
    # in the order they are sent
    heap = []
    for s in range(S):
        if programs[s] and (r := ready(s)) is not None:
            heapq.heappush(heap, (max(free[s], r), s))
    waiting = {s for s in range(S) if programs[s]} - {s for _, s in heap}
    while heap:
        start, s = heapq.heappop(heap)
        a = programs[s][pos[s]]
        done = start + a.seconds
        free[s] = done
        end = max(end, done)
        if a.op == "F" and s < S - 1:
            arrive[(s + 1, "act", a.key)] = send("medium" if shared_medium else (s, "down"), done, a.send_s, latency_down[s])
        elif a.op == "B" and s > 0:
            arrive[(s - 1, "grad", a.key)] = send("medium" if shared_medium else (s - 1, "up"), done, a.send_s, latency_up[s - 1])
        pos[s] += 1
        for t in ([s] if pos[s] < len(programs[s]) else []) + sorted(waiting):
            r = ready(t)
            if r is not None:
                waiting.discard(t)
                heapq.heappush(heap, (max(free[t], r), t))
            else:
                waiting.add(t)
    if any(pos[s] < len(programs[s]) for s in range(S)):
        raise ValueError("the stages' programs wait on each other: no schedule finishes")
    return end
