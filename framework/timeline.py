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
from collections import defaultdict
from dataclasses import dataclass

GANTT_ROWS = 40  # beyond this many roles and links, a chart summarises (Timeline.save_gantt)


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


class Timeline:
    def __init__(self):
        self.intervals: list[Interval] = []
        self.link_bytes: dict[str, int] = defaultdict(int)
        self.link_raw_bytes: dict[str, int] = defaultdict(int)
        self.link_messages: dict[str, int] = defaultdict(int)  # transmissions (attempts)
        self.link_lost: dict[str, int] = defaultdict(int)  # of them lost on the way
        self.link_dups: dict[str, int] = defaultdict(int)  # arrived again (an ARQ copy whose ACK was lost)
        self.roles: list[str] = []
        self.clock = "virtual"  # or "wall" on real runtimes: what the times mean
        self.links: list[str] = []

    def add_role(self, role: str) -> None:
        if role not in self.roles:
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
        out: dict[str, float] = defaultdict(float)
        for iv in self.intervals:
            out[iv.resource] += iv.end - iv.start
        return out

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

    # ---- checkpoints (framework.checkpoint): the intervals as columns -------------------------

    def checkpoint(self, bag, prefix: str) -> dict:
        import torch

        names = sorted({iv.resource for iv in self.intervals} | {iv.kind for iv in self.intervals})
        index = {n: i for i, n in enumerate(names)}
        ivs = self.intervals
        columns = bag.put(prefix, {
            "times": torch.tensor([[iv.start, iv.end] for iv in ivs], dtype=torch.float64).reshape(-1, 2),
            "ints": torch.tensor([[index[iv.resource], index[iv.kind], iv.iteration, iv.microbatch, iv.group, iv.nbytes] for iv in ivs], dtype=torch.int64).reshape(-1, 6),
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
        for l, (b, raw, n, *more) in desc["counters"].items():
            self.link_bytes[l], self.link_raw_bytes[l], self.link_messages[l] = b, raw, n
            self.link_lost[l], self.link_dups[l] = more or self._outcomes(l)

    def _outcomes(self, link: str) -> tuple[int, int]:
        """(lost, duplicate) transmissions on `link` from its intervals (checkpoints without the counters)."""
        kinds = [iv.kind for iv in self.intervals if iv.resource == link]
        return kinds.count("lost"), kinds.count("dup")

    # ---- exports ------------------------------------------------------------------------

    def _trace_events(self, max_events: int):
        tids = {r: i for i, r in enumerate(self.roles + self.links)}
        for r, tid in tids.items():
            yield {"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": r}}
        yield {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": f"pipelab ({self.clock} time)"}}
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
        """The same JSON as `chrome_trace`, written event by event (no list of every event in memory)."""
        with open(path, "w") as f:
            f.write('{"traceEvents": [')
            for i, ev in enumerate(self._trace_events(max_events)):
                f.write(",\n" if i else "\n")
                f.write(json.dumps(ev))
            f.write('\n], "displayTimeUnit": "ms", "otherData": ' + json.dumps({"truncated": len(self.intervals) > max_events}) + "}\n")

    def save_gantt(self, path, iterations: int = 3, title: str = "", max_rows: int = GANTT_ROWS) -> None:
        """A Gantt chart of the first `iterations` iterations: one row per role and link, in
        time linear in the number of intervals. With more rows than `max_rows` (hundreds of
        devices), it draws the first roles, the busiest ones and the roles that are not devices
        (servers, aggregators), each with its links, and sums up the others in two rows: how
        many of the other roles (links) are busy at each moment."""
        # a Figure on its own Agg canvas, not pyplot: no global figure state, no backend
        # selection, and 0.2 s less to import (measured, 2 cores)
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle

        ivs = [iv for iv in self.intervals if 0 <= iv.iteration < iterations] or self.intervals[:2000]
        by_resource: dict[str, list] = defaultdict(list)
        for iv in ivs:
            by_resource[iv.resource].append(iv)
        links = [l for l in self.links if l in by_resource]
        roles, shown_links, rest_roles, rest_links = gantt_rows(self.roles, links, by_resource, max_rows)
        rows = roles + shown_links + [""] * (bool(rest_roles) + bool(rest_links))  # summary labels below
        colors = {"fwd": "#4C72B0", "bwd": "#DD8452", "step": "#55A868", "encode": "#CCB974", "decode": "#64B5CD", "send": "#8172B3", "lost": "#C44E52", "dup": "#DA8BC3"}
        fig = Figure(figsize=(11, 0.45 * len(rows) + 1.4))
        ax = fig.subplots()
        # one collection of bars per kind for the whole chart (a collection per row and kind
        # cost a 10-device chart 0.3 s more to draw)
        bars: dict[str, list] = defaultdict(list)
        for y, r in enumerate(roles + shown_links):
            for iv in by_resource.get(r, ()):
                if iv.end > iv.start:
                    bars[iv.kind].append(((iv.start, y - 0.4), (iv.start, y + 0.4), (iv.end, y + 0.4), (iv.end, y - 0.4)))
        for kind, verts in bars.items():
            ax.add_collection(PolyCollection(verts, facecolors=colors.get(kind, "#937860"), edgecolors="white", linewidths=0.3))
        ax.autoscale_view()
        y = len(roles) + len(shown_links)
        t_end = max((iv.end for iv in ivs), default=1.0)
        for rest, what in ((rest_roles, "roles"), (rest_links, "links")):
            if not rest:
                continue
            t, frac = busy_profile([iv for r in rest for iv in by_resource.get(r, ())], len(rest), t_end)
            peak = float(frac.max()) if len(frac) else 0.0
            # drawn to its own peak, so the shape shows even when each of them is rarely busy
            ax.fill_between(t, y + 0.4 - 0.8 * frac / max(peak, 1e-12), y + 0.4, step="post", color="#7f7f7f", linewidth=0)
            rows[y] = f"{len(rest)} other {what}: busy share (peak {100 * peak:.0f}%)"
            y += 1
        ax.set_yticks(range(len(rows)), rows)
        ax.invert_yaxis()
        ax.set_xlabel(f"{self.clock} time (s)")
        handles = [Rectangle((0, 0), 1, 1, color=c) for k, c in colors.items()]
        ax.legend(handles, list(colors), ncol=len(colors), loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
        ax.set_title(title or f"first {iterations} iteration(s)", loc="left", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)



def gantt_rows(roles: list[str], links: list[str], by_resource: dict, max_rows: int = GANTT_ROWS):
    """(roles drawn, links drawn, roles summed up, links summed up). All of them when they fit.
    Otherwise roles fall into families by name (`dev12` is a `dev`): a role alone in its family
    (a server, an aggregator) is drawn; each large family gets an equal share of the rows, half
    to its first members and half to its busiest; links are drawn where a drawn role's device
    name is an end, up to the rows left."""
    if len(roles) + len(links) <= max_rows:
        return roles, links, [], []
    families: dict[str, list[str]] = defaultdict(list)
    for r in roles:
        families[r.rstrip("0123456789") or r].append(r)
    chosen = {members[0] for members in families.values() if len(members) == 1}
    large = [members for members in families.values() if len(members) > 1]
    share = max(2, (max_rows // 2 - len(chosen)) // max(1, len(large)))
    for members in large:
        first = members[: share // 2]
        busy = {r: sum(iv.end - iv.start for iv in by_resource.get(r, ())) for r in members[share // 2 :]}
        chosen.update(first, sorted(busy, key=lambda r: -busy[r])[: share - len(first)])
    shown_roles = [r for r in roles if r in chosen]  # in their own order
    shown_links = [l for l in links if any(end in chosen for end in l.split("->"))][: max(0, max_rows - 2 - len(shown_roles))]
    return shown_roles, shown_links, [r for r in roles if r not in chosen], [l for l in links if l not in set(shown_links)]


def busy_profile(intervals, n: int, t_end: float, bins: int = 600):
    """(bin starts, fraction of `n` resources busy in each bin) over [0, t_end], in time linear in
    the number of intervals. In bin units, the busy time before x is G(x) = sum over intervals of
    ramp(x - start) - ramp(x - end) with ramp(u) = max(0, u); a bin's busy time is
    G(b + 1) - G(b), and sum of ramp(x - p) over p < x is x * count - sum, from histograms."""
    import numpy as np

    width = max(t_end, 1e-12) / bins
    x = np.arange(bins + 1)

    def ramps(pos):
        k = np.clip(np.floor(pos).astype(np.int64) + 1, 0, bins + 1)  # p < x  <=>  floor(p) + 1 <= x
        count = np.cumsum(np.bincount(k, minlength=bins + 2)[: bins + 1])
        total = np.cumsum(np.bincount(k, weights=pos, minlength=bins + 2)[: bins + 1])
        return x * count - total

    starts = np.fromiter((iv.start for iv in intervals), dtype=float) / width
    ends = np.fromiter((iv.end for iv in intervals), dtype=float) / width
    g = ramps(starts) - ramps(ends)
    return x[:-1] * width, np.clip(np.diff(g) / max(n, 1), 0.0, 1.0)
