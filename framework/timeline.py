"""Every compute interval and transfer of a run, and what follows from them.

Intervals are (resource, kind, start, end, iteration, microbatch, group). A resource is a
role (compute) or a link `src->dst` (transfers). From them: per-role busy/idle time, per-link
bytes and busy time, and the pipeline bubble fraction:

    bubble_frac = sum over groups g of (R * W_g - busy_g) / (R * W_g)   (pooled over groups)

where a group is one flush of the pipeline (an iteration for GPipe/1F1B, an epoch for the
asynchronous PipeDream), W_g the time from the first forward to the last backward of the
group across all R roles that compute in it, and busy_g their forward+backward busy time in
it. Optimizer steps, evaluation and data loading are outside the window, as in the GPipe
paper's (S-1)/(M+S-1).
"""

from __future__ import annotations

import itertools
import json
from array import array
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass

import torch

from framework.gantt import GANTT_ROWS, gantt_spec, render_gantt

_BLOCK = 4096  # intervals per entry of Timeline.first_overlapping's index


@dataclass
class Interval:
    resource: str
    kind: str
    start: float
    end: float
    iteration: int = -1
    microbatch: int = -1
    group: int = -1
    nbytes: int = 0


class _Columns:
    """The intervals of one list as typed arrays, one per field, extended by the intervals added
    since the last call: a checkpoint at every epoch end had turned the whole run's intervals
    into arrays again, a time quadratic in the epochs (at 1,000 devices an epoch adds 200,000
    intervals). Resources and kinds are coded in the order first seen (`code`)."""

    __slots__ = ("of", "done", "code", "d", "q")

    def __init__(self, intervals: list):
        self.of, self.done = intervals, 0
        self.code: dict[str, int] = {}
        self.d = (array("d"), array("d"))  # start, end
        self.q = tuple(array("q") for _ in range(6))  # resource, kind, iteration, microbatch, group, nbytes

    def extend(self) -> None:
        new = self.of[self.done :]
        self.done += len(new)
        code = self.code

        def coded(name: str) -> int:
            c = code.get(name)
            if c is None:
                c = code[name] = len(code)
            return c

        start, end = self.d
        resource, kind, iteration, microbatch, group, nbytes = self.q
        start.extend([iv.start for iv in new])
        end.extend([iv.end for iv in new])
        resource.extend([coded(iv.resource) for iv in new])
        kind.extend([coded(iv.kind) for iv in new])
        iteration.extend([iv.iteration for iv in new])
        microbatch.extend([iv.microbatch for iv in new])
        group.extend([iv.group for iv in new])
        nbytes.extend([iv.nbytes for iv in new])


class Timeline:
    def __init__(self):
        self.intervals: list[Interval] = []
        self.link_bytes: dict[str, int] = defaultdict(int)
        self.link_raw_bytes: dict[str, int] = defaultdict(int)
        self.link_messages: dict[str, int] = defaultdict(int)  # transmissions (attempts)
        self.link_lost: dict[str, int] = defaultdict(int)  # of them lost on the way
        self.link_dups: dict[str, int] = defaultdict(int)  # arrived again (an ARQ copy whose ACK was lost)
        self.roles: list[str] = []
        self._role_set: set[str] = set()  # `roles` as a set: a membership test per role added, not a scan
        self.clock = "virtual"  # or "wall" on real runtimes: what the times mean
        self.links: list[str] = []
        # `first_overlapping`'s index: the largest end among the first (b + 1) * _BLOCK intervals
        # of `_maxima_of` (the list they were taken from), b = 0, 1, ...
        self._maxima_of: list | None = None
        self._block_maxima: list[float] = []
        self._busy: tuple | None = None  # (intervals, their number, `busy()` of them)
        self._columns: _Columns | None = None  # `checkpoint`'s typed arrays, extended at each one

    def add_role(self, role: str) -> None:
        if role not in self._role_set:
            self._role_set.add(role)
            self.roles.append(role)

    def compute(self, role, kind, start, end, iteration=-1, microbatch=-1, group=-1):
        self.intervals.append(Interval(role, kind, start, end, iteration, microbatch, group))

    def transfer(self, link, start, end, nbytes, iteration=-1, microbatch=-1, kind="send", raw_bytes=None):
        """One transmission of `nbytes` (`raw_bytes`: the same message uncompressed); `kind` is
        "send" (delivered), "lost" or "dup" (a copy the receiver already had)."""
        if link not in self.link_bytes:
            self.links.append(link)
        self.link_bytes[link] += nbytes
        self.link_raw_bytes[link] += nbytes if raw_bytes is None else raw_bytes
        self.link_messages[link] += 1
        if kind == "lost":
            self.link_lost[link] += 1
        elif kind == "dup":
            self.link_dups[link] += 1
        self.intervals.append(Interval(link, kind, start, end, iteration, microbatch, -1, nbytes))

    @property
    def makespan(self) -> float:
        return max((iv.end for iv in self.intervals), default=0.0)

    def busy(self) -> dict[str, float]:
        """Seconds each resource was busy (read-only: the summary asks twice, a scan of a
        10,000-device run's 2 million intervals each time)."""
        ivs = self.intervals
        if self._busy is not None and self._busy[0] is ivs and self._busy[1] == len(ivs):
            return self._busy[2]
        out: dict[str, float] = defaultdict(float)
        for iv in ivs:
            out[iv.resource] += iv.end - iv.start
        self._busy = (ivs, len(ivs), out)
        return out

    def first_overlapping(self, t: float) -> int:
        """An index before which every interval ends by `t`: what overlaps [t, ...) lies at or
        after it. Each epoch's statistics scan only their own epoch this way, not the whole run
        again (at 1,000 devices an epoch adds 200,000 intervals: a run of E epochs scanned
        E^2 / 2 epochs' worth). The maxima are extended as intervals are added, so all the calls
        of a run together read each interval once."""
        ivs = self.intervals
        if self._maxima_of is not ivs:  # a new list (a restored checkpoint's)
            self._maxima_of, self._block_maxima = ivs, []
        maxima = self._block_maxima
        top = maxima[-1] if maxima else float("-inf")
        while (len(maxima) + 1) * _BLOCK <= len(ivs):
            lo = len(maxima) * _BLOCK
            top = max(top, max(iv.end for iv in ivs[lo : lo + _BLOCK]))
            maxima.append(top)
        return bisect_right(maxima, t) * _BLOCK

    def role_stats(self, total: float | None = None) -> dict[str, dict[str, float]]:
        total = self.makespan if total is None else total
        busy = self.busy()
        return {r: {"busy_s": busy.get(r, 0.0), "idle_s": max(0.0, total - busy.get(r, 0.0))} for r in self.roles}

    def link_stats(self) -> dict[str, dict[str, float]]:
        busy = self.busy()
        return {
            l: {"bytes": int(self.link_bytes[l]), "raw_bytes": int(self.link_raw_bytes[l]), "messages": int(self.link_messages[l]),
                "lost": int(self.link_lost[l]), "duplicates": int(self.link_dups[l]), "busy_s": busy.get(l, 0.0)}
            for l in self.links
        }

    def has_flushes(self) -> bool:
        """Whether compute is grouped into pipeline flushes (where a bubble fraction means something)."""
        return any(iv.group >= 0 for iv in self.intervals)  # transfers carry no group

    def bubble_frac(self) -> float:
        windows: dict[int, list] = {}
        busy: dict[int, float] = defaultdict(float)
        roles: dict[int, set] = defaultdict(set)
        for iv in self.intervals:
            if iv.kind not in ("fwd", "bwd") or iv.group < 0:
                continue
            w = windows.setdefault(iv.group, [iv.start, iv.end])
            w[0] = min(w[0], iv.start)
            w[1] = max(w[1], iv.end)
            busy[iv.group] += iv.end - iv.start
            roles[iv.group].add(iv.resource)
        capacity = sum(len(roles[g]) * (w[1] - w[0]) for g, w in windows.items())
        if capacity <= 0:
            return 0.0
        return max(0.0, (capacity - sum(busy.values())) / capacity)

    # ---- checkpoints (framework.checkpoints.state): the intervals as columns -------------------------

    def checkpoint(self, bag, prefix: str) -> dict:
        cols = self._columns
        if cols is None or cols.of is not self.intervals:  # a new list (a restored checkpoint's)
            cols = self._columns = _Columns(self.intervals)
        cols.extend()
        names = sorted(cols.code)  # the names in the file, sorted; the arrays hold first-seen codes
        rank = {n: i for i, n in enumerate(names)}
        to_sorted = torch.tensor([rank[n] for n in cols.code], dtype=torch.int64)

        def column(values: array) -> torch.Tensor:
            # a view of the array (frombuffer takes no empty buffer), copied by the stacks below: no
            # view may outlive this call, since the next checkpoint extends the arrays
            dtype = torch.float64 if values.typecode == "d" else torch.int64
            return torch.frombuffer(values, dtype=dtype) if values else torch.zeros(0, dtype=dtype)

        resource, kind, *ints = (column(q) for q in cols.q)
        columns = bag.put(prefix, {
            "times": torch.stack([column(d) for d in cols.d], 1),
            "ints": torch.stack([to_sorted[resource], to_sorted[kind], *ints], 1),
        })
        counters = {l: [self.link_bytes[l], self.link_raw_bytes[l], self.link_messages[l], self.link_lost[l], self.link_dups[l]] for l in self.links}
        return {"columns": columns, "names": names, "roles": self.roles, "links": self.links, "counters": counters, "clock": self.clock}

    def restore(self, bag, desc: dict) -> None:
        names = desc["names"]
        columns = bag.take(desc["columns"])
        times, ints = columns["times"], columns["ints"]
        self.intervals = [
            Interval(names[r], names[k], start, end, it, mb, g, nb)
            for (start, end), (r, k, it, mb, g, nb) in zip(times.tolist(), ints.tolist())
        ]
        self.roles, self.links, self.clock = list(desc["roles"]), list(desc["links"]), desc["clock"]
        self._role_set = set(self.roles)
        for l, (b, raw, n, *more) in desc["counters"].items():
            self.link_bytes[l], self.link_raw_bytes[l], self.link_messages[l] = b, raw, n
            self.link_lost[l], self.link_dups[l] = more or self._outcomes(l)

    def _outcomes(self, link: str) -> tuple[int, int]:
        """(lost, duplicate) transmissions on `link` from its intervals (checkpoints without the counters)."""
        kinds = [iv.kind for iv in self.intervals if iv.resource == link]
        return kinds.count("lost"), kinds.count("dup")

    # ---- exports ------------------------------------------------------------------------

    def _trace_rows(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.roles + self.links)}

    def _trace_names(self, tids: dict[str, int]):
        """The trace's metadata events: each row's name and the process's."""
        for r, tid in tids.items():
            yield {"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": r}}
        yield {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": f"pipelab ({self.clock} time)"}}

    def _trace_events(self, max_events: int):
        tids = self._trace_rows()
        yield from self._trace_names(tids)
        for iv in itertools.islice(self.intervals, max_events):
            args = {"iteration": iv.iteration, "microbatch": iv.microbatch}
            if iv.nbytes:
                args["bytes"] = iv.nbytes
            name = iv.kind if iv.microbatch < 0 else f"{iv.kind} {iv.microbatch}"
            yield {"ph": "X", "name": name, "cat": iv.kind, "pid": 0, "tid": tids.get(iv.resource, 0), "ts": iv.start * 1e6, "dur": (iv.end - iv.start) * 1e6, "args": args}

    def chrome_trace(self, max_events: int = 200_000) -> dict:
        """Chrome trace-event JSON (open in https://ui.perfetto.dev or chrome://tracing)."""
        return {"traceEvents": list(self._trace_events(max_events)), "displayTimeUnit": "ms", "otherData": {"truncated": len(self.intervals) > max_events}}

    def save_chrome_trace(self, path, max_events: int = 200_000) -> None:
        """The same JSON as `chrome_trace`, written event by event (no list of every event in memory).
        Each interval's line is formatted directly rather than by `json.dumps` of a dict (3-4x
        less time at 100,000 intervals); every string in it is JSON-quoted once per distinct value."""
        quoted: dict[str, str] = {}

        def q(text: str) -> str:
            out = quoted.get(text)
            if out is None:
                out = quoted[text] = json.dumps(text)
            return out

        tids = self._trace_rows()
        with open(path, "w") as f:
            f.write('{"traceEvents": [\n' + ",\n".join(json.dumps(ev) for ev in self._trace_names(tids)))  # never empty: the process's name
            lines = []
            for iv in itertools.islice(self.intervals, max_events):
                name = iv.kind if iv.microbatch < 0 else f"{iv.kind} {iv.microbatch}"
                extra = f', "bytes": {iv.nbytes}' if iv.nbytes else ""
                lines.append(
                    f'{{"ph": "X", "name": {q(name)}, "cat": {q(iv.kind)}, "pid": 0, "tid": {tids.get(iv.resource, 0)}, '
                    f'"ts": {float(iv.start) * 1e6!r}, "dur": {float(iv.end - iv.start) * 1e6!r}, '
                    f'"args": {{"iteration": {int(iv.iteration)}, "microbatch": {int(iv.microbatch)}{extra}}}}}'
                )
                if len(lines) == 4096:
                    f.write(",\n" + ",\n".join(lines))
                    lines.clear()
            if lines:
                f.write(",\n" + ",\n".join(lines))
            f.write('\n], "displayTimeUnit": "ms", "otherData": ' + json.dumps({"truncated": len(self.intervals) > max_events}) + "}\n")

    def save_gantt(self, path, iterations: int = 3, title: str = "", max_rows: int = GANTT_ROWS) -> None:
        """timeline.png: the Gantt chart of the first `iterations` iterations (framework.gantt)."""
        render_gantt(gantt_spec(self, iterations, title, max_rows), path)
