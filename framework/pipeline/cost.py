"""What a pipeline plan costs and where it cuts, priced by the predictor and the links: the
pipeline's planner. The scheduler plans with one on the coordinator; a stage that re-plans at
an epoch's end builds its own from its spec and its process's parts (framework.pipeline.stage),
so both price with the same schedule data and the same code:

- `boundary_seconds`: `partition=dp`'s link term, per micro-batch, at the compressor's wire size;
- `predicted_epoch_s`: the epoch the plan is expected to take (the stages' actions played out by
  framework.pipeline.timing), written to plan.json;
- `searched_bounds`: `partition=search`, every partition judged by its predicted epoch;
- `plan_bounds`: the run's partitioner over given devices, with the predictor as it stands.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from framework.cluster import Work
from framework.errors import ConfigError
from framework.pipeline import timing as pt
from framework.pipeline.partition import check_stage_count, partition
from framework.pipeline.schedule import Action, Schedule

SEARCH_LIMIT = 5000  # partitions `search` plays out at most (C(19, 3) = 969 for 20 units on 4 stages)


def boundary(parts, unit: int, n: int) -> dict:
    """The message crossing the boundary before `unit` for n samples (shapes only)."""
    return {"x": torch.empty((n, *parts.model.infos[unit - 1].out_shape), dtype=parts.dtype, device="meta")}


class PipelinePlanner:
    """Prices and cuts plans of one pipeline schedule with this process's parts.

    `parts`: the run's parts (framework.scheduler.SchedulerContext: model, dataset, cluster,
    compressor, predictor), read when asked, so a predictor that learned since prices anew;
    `partition`: scheduler.partition ("dp", "even", "search" or cut indices); `mb_size`: samples
    per micro-batch; `microbatches` and `flush_per` ("iteration" or "epoch"): how the schedule
    flushes; `schedule`: every stage's program per flush size (framework.pipeline.schedule)."""

    def __init__(self, parts, *, partition: Any, mb_size: int, microbatches: int, flush_per: str, schedule: Schedule):
        self.parts = parts
        self.partition = partition
        self.mb_size = mb_size
        self.microbatches = microbatches
        self.flush_per = flush_per
        self.schedule = schedule
        self._programs: dict[tuple[int, int], list[Action]] = {}  # parsed once: `search` plays each out per partition

    def program(self, stage: int, n: int) -> list[Action]:
        """Stage `stage`'s actions in a flush of `n` items."""
        if (stage, n) not in self._programs:
            self._programs[stage, n] = self.schedule.program(stage, n)
        return self._programs[stage, n]

    def plan_bounds(self, devices: list[str]) -> list[tuple[int, int]]:
        """The partitioner's cuts over `devices`, with the predictor as it stands (also when a
        run re-plans at an epoch's end)."""
        if self.partition == "search":
            return self.searched_bounds(devices)
        parts = self.parts
        dev_objs = [parts.cluster.device(d) for d in devices]
        return partition(self.partition, dev_objs, len(parts.model), parts.model.name, parts.predictor, self.mb_size, self.boundary_seconds(devices))

    def predicted_epoch_s(self, devices: list[str], bounds, memo: dict | None = None) -> float:
        """An epoch of this plan as the predictor and the links price it (framework.pipeline.timing).
        `memo` keeps priced actions across calls on the same devices (`search` prices each stage's
        units once, not once per partition)."""
        parts = self.parts
        S, cl, comp, pred = len(bounds), parts.cluster, parts.compressor, parts.predictor
        dev = [cl.device(d) for d in devices]
        memo = {} if memo is None else memo

        def codec(kind: str, tag: str, x: dict) -> float:
            return comp.codec_estimate(kind, tag, x) or 0.0  # a measured codec time is not predicted

        def priced(s: int, op: str, key, n: int) -> pt.Action:
            """The action's device seconds (computing, encoding what it sends), its message's link
            seconds and the receiver's decoding of it (charged on arrival, as the simulator does)."""
            a, b = bounds[s]
            k = (s, a, b, op, n)  # stage s's device and neighbours are fixed by `devices`
            if k not in memo:
                if op == "STEP":
                    memo[k] = (pred.predict(dev[s], Work("step", a, b)), 0.0)
                else:
                    secs = pred.predict(dev[s], Work("fwd" if op == "F" else "bwd", a, b, n))
                    fwd = op == "F"
                    tag = comp.forward_tag if fwd else comp.backward_tag
                    # to whom it sends, and the boundary unit of its message
                    to, sent = (s + 1, b) if fwd else (s - 1, a)
                    link = cl.link(devices[s], devices[to]) if 0 <= to < S else None
                    send = recv = 0.0
                    if link is not None:
                        x = boundary(parts, sent, n)
                        secs += codec("encode", tag, x)
                        send = link.tx_time(comp.packet_bytes(x, tag=tag), 0.0)
                        recv = codec("decode", tag, x)
                    memo[k] = (secs, send, recv)
            return pt.Action(op, key, *memo[k])

        N, B = len(parts.dataset.x_train), int(parts.cfg.train.batch_size)
        sizes = [min(B, N - i * B) for i in range(parts.iterations_per_epoch())]
        programs = []
        for s in range(S):
            prog = []
            if self.flush_per == "iteration":
                for it, size in enumerate(sizes):
                    m = min(self.microbatches, size)
                    mb = [size // m + (k < size % m) for k in range(m)]  # torch.tensor_split's sizes
                    prog += [priced(s, a.op, (it, a.mb), 0 if a.op == "STEP" else mb[a.mb]) for a in self.program(s, m)]
            else:
                prog = [priced(s, a.op, a.mb, 0 if a.op == "STEP" else sizes[a.mb]) for a in self.program(s, len(sizes))]
            programs.append(prog)
        lat = [(cl.link(devices[s], devices[s + 1]), cl.link(devices[s + 1], devices[s])) for s in range(S - 1)]
        return pt.makespan(programs, [d.cfg.latency_s if d else 0.0 for d, _ in lat], [u.cfg.latency_s if u else 0.0 for _, u in lat], bool(cl.cfg.shared_medium))

    def searched_bounds(self, devices: list[str]) -> list[tuple[int, int]]:
        """`partition=search`: every contiguous partition, each judged by its predicted epoch
        (framework.pipeline.timing on the predictor's and the links' costs), the fastest taken; ties
        go to the earlier cuts. Eq. 10's bottleneck leaves out what an asynchronous pipeline's round
        trips cost: with exact costs, AccEPT's scenario 1 at 1 Mbit/s with one mini-batch per stage in
        flight ran its DP plan in 88.5 s and the searched one in 71.4 s (59.5 and 56.4 s with 2S-1 in
        flight, where the slowest stage or link binds, as Eq. 10 assumes)."""
        L, S = len(self.parts.model), len(devices)
        check_stage_count(S, L, self.parts.model.name)
        if math.comb(L - 1, S - 1) > SEARCH_LIMIT:
            raise ConfigError("scheduler.partition", f"search would play out {math.comb(L - 1, S - 1)} partitions of {L} units on {S} stages (at most {SEARCH_LIMIT}); use dp")
        best, memo = None, {}
        for cuts in itertools.combinations(range(1, L), S - 1):
            edges = [0, *cuts, L]
            bounds = list(zip(edges[:-1], edges[1:]))
            t = self.predicted_epoch_s(devices, bounds, memo)
            if best is None or t < best[0] - 1e-12 * abs(t):
                best = (t, bounds)
        return best[1]

    def boundary_seconds(self, devices: list[str]):
        """link_cost(s, p) for `partition=dp`: per micro-batch, the slower direction of the boundary
        before unit p between stages s and s + 1 (the activation down, its gradient up, each on its
        own link; both, on a shared medium), at the compressor's wire size (framework.pipeline.partition)."""
        parts = self.parts
        comp, cl = parts.compressor, parts.cluster

        def cost(s: int, p: int) -> float:
            x = boundary(parts, p, self.mb_size)
            a, b = devices[s], devices[s + 1]
            down, up = cl.link(a, b), cl.link(b, a)
            times = (down.tx_time(comp.packet_bytes(x, tag=comp.forward_tag), 0.0) if down else 0.0,
                     up.tx_time(comp.packet_bytes(x, tag=comp.backward_tag), 0.0) if up else 0.0)
            # one shared medium carries both directions in turn (the other boundaries' traffic too,
            # which a per-boundary program cannot price)
            return sum(times) if cl.cfg.shared_medium else max(times)

        return cost
