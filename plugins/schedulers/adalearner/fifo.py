"""AdaLearner's iteration as the FIFO star runs it (notes 2.5, 2.6, 2.9): the overlap-aware
estimate the default planner (`scheduler.planner=fifo`) plans with.

The paper's Eq. 4 adds compute and communication: every worker computes, then the 2n transfers
run one after another. On the group owner's hotspot they do run one after another (half duplex),
but the group owner answers in the order the gradients arrived (FIFO), so a worker answered first
computes its next slice while the others are still being answered, and its upload may queue
behind their answers. In steady state, with equal slices of compute c, uploads of u and answers
of d channel seconds and the group owner's update g, an fp32 iteration takes

    max(c, (n - 1) d) + n u + g + d          (Eq. 4 reads c + n u + g + n d: (n - 1) d too long
                                               while the channel keeps up with compute)

The functions here play that protocol out iteration by iteration (max-plus: each event starts
when what it waits for is done), with the pieces the roles really run (plugins/schedulers/
adalearner.roles): a worker computes its slice and, with 1-bit, encodes; its upload takes the
channel when it is free (requests in time order); the group owner decodes each upload as it
arrives (1-bit; one at a time, on its own device), then sums and steps, (1-bit) quantizes the sum
once more, and queues the answers in arrival order; a worker goes on when its answer arrived
(1-bit: after decoding it and stepping). An epoch starts with every role at the same instant
(the runtimes end each epoch at a barrier) and ends when the last role is done.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StarCosts:
    """Seconds of one iteration's pieces, per worker in their tie order (ties in request time
    go to the lower index, as the roles are started)."""

    compute_s: tuple[float, ...]  # each worker's forward + backward of its slice
    up_s: tuple[float, ...]  # channel seconds of each worker's upload (its wake-up + bytes / B)
    down_s: tuple[float, ...]  # channel seconds of each worker's answer
    go_update_s: float  # the group owner's sum of n gradients and its step
    encode_s: float = 0.0  # a worker's encode of its gradient before the upload (1-bit)
    go_decode_s: float = 0.0  # the group owner's decode of one upload, on arrival (1-bit)
    go_encode_s: float = 0.0  # the group owner's second quantization (1-bit)
    finish_s: float = 0.0  # a worker's work after its answer: decode and step (1-bit), none (fp32)
    latency_s: float = 0.0  # from the end of a transfer to its arrival (the links' one-way latency)

    def __post_init__(self):
        if not (len(self.compute_s) == len(self.up_s) == len(self.down_s)) or not self.compute_s:
            raise ValueError(f"one compute, upload and answer time per worker; got {len(self.compute_s)}, {len(self.up_s)}, {len(self.down_s)}")


def fifo_epoch_s(costs: StarCosts, iterations: int, last: StarCosts | None = None) -> float:
    """Seconds of an epoch of `iterations` iterations from a synchronized start; `last`: the costs
    of the final iteration where they differ (a short last minibatch)."""
    if iterations < 1:
        return 0.0
    n = len(costs.compute_s)
    ready = [0.0] * n  # when each worker may start computing
    channel = 0.0  # when the shared channel is next free
    go_free = 0.0  # when the group owner's device is next free
    t_go = 0.0
    for k in range(iterations):
        c = last if (last is not None and k == iterations - 1) else costs
        request = [ready[i] + c.compute_s[i] + c.encode_s for i in range(n)]
        order = sorted(range(n), key=lambda i: (request[i], i))
        for i in order:  # uploads, first come first served
            channel = max(request[i], channel) + c.up_s[i]
            go_free = max(channel + c.latency_s, go_free) + c.go_decode_s
        t_go = go_free + c.go_update_s + c.go_encode_s  # the sum, the step, the second quantization
        go_free = t_go
        for i in order:  # answers in arrival order (FIFO), all queued at once
            channel = max(t_go, channel) + c.down_s[i]
            ready[i] = channel + c.latency_s + c.finish_s
    return max(max(ready), t_go)


def fifo_iteration_s(costs: StarCosts, iterations: int, last: StarCosts | None = None) -> float:
    """The mean iteration of such an epoch."""
    return fifo_epoch_s(costs, iterations, last) / max(1, iterations)
