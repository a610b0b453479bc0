"""The predicted time of a pipeline plan: each stage's actions (framework.pipeline.scheduler) played out on
predicted costs, without tensors.

A stage runs its actions in order, one at a time, on its device; F(m) waits for its activation and
B(m) for its gradient; a message waits for its link (first come, first served; one channel for
every link on a shared medium) and arrives the link's latency after its last byte. That is the
simulator's model without its bookkeeping, so with `predictor=oracle` the prediction is the
simulated epoch when nothing is lost and no speed trace applies (tested: tests/test_partition_dp.py).
A codec's modelled time is charged as the simulator charges it: encoding to the sending action (the
device encodes right after computing), decoding to the receiver's device when the message
arrives, in turn with that stage's own actions (first claimed, first served), and the message is
ready once decoded. The planner writes it to plan.json as `predicted_epoch_s`, beside the
per-stage costs it was computed from.
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
    recv_s: float = 0.0  # the receiver's device decoding the message on arrival


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

    # events in time order: a stage's next action (kind 1) or a message's decoding on arrival
    # (kind 0, first at a tie, as the simulator's device queue serves the earlier claim); an
    # action is re-queued when a decoding took its device in the meantime
    heap = []
    seq = 0  # ties beyond (time, kind) in the order pushed

    def push(t: float, kind: int, s: int, payload=None) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, kind, seq, s, payload))
        seq += 1

    for s in range(S):
        if programs[s] and (r := ready(s)) is not None:
            push(max(free[s], r), 1, s)
    waiting = {s for s in range(S) if programs[s]} - {h[3] for h in heap}

    def wake(t: int) -> None:
        r = ready(t)
        if r is not None:
            waiting.discard(t)
            push(max(free[t], r), 1, t)
        else:
            waiting.add(t)

    def deliver(s: int, key, arrival: float, recv_s: float) -> None:
        if recv_s > 0:
            push(arrival, 0, s, (key, recv_s))
        else:
            arrive[key] = arrival
            if s in waiting:
                wake(s)

    while heap:
        t, kind, _, s, payload = heapq.heappop(heap)
        if kind == 0:  # decode on arrival
            key, recv_s = payload
            free[s] = max(t, free[s]) + recv_s
            end = max(end, free[s])
            arrive[key] = free[s]
            if s in waiting:
                wake(s)
            continue
        start = max(free[s], ready(s))
        if start > t:  # a decoding took the device since this was queued
            push(start, 1, s)
            continue
        a = programs[s][pos[s]]
        done = start + a.seconds
        free[s] = done
        end = max(end, done)
        if a.op == "F" and s < S - 1:
            deliver(s + 1, (s + 1, "act", a.key), send("medium" if shared_medium else (s, "down"), done, a.send_s, latency_down[s]), a.recv_s)
        elif a.op == "B" and s > 0:
            deliver(s - 1, (s - 1, "grad", a.key), send("medium" if shared_medium else (s - 1, "up"), done, a.send_s, latency_up[s - 1]), a.recv_s)
        pos[s] += 1
        if pos[s] < len(programs[s]):
            wake(s)
        for w in sorted(waiting):
            wake(w)
    if any(pos[s] < len(programs[s]) for s in range(S)):
        raise ValueError("the stages' programs wait on each other: no schedule finishes")
    return end
