"""timeline.png: a Gantt chart of a run's first iterations, as plain data and as a picture.

`gantt_spec` chooses what to draw from a `framework.timeline.Timeline` (rows, bars, the summary
rows of large runs) as JSON-able data, in time linear in the number of intervals; `render_gantt`
draws it with matplotlib (on 2 cores 0.5 s to import, 0.5 s to draw 10 devices). Apart, the
choice is testable without a picture, and the picture can be drawn by any process that is handed
the data. (Drawing it in the MLflow recorder, beside the run, was measured: no faster for a
10-device run on 2 cores, where that process is as busy as the run's.)
"""

from __future__ import annotations

from collections import defaultdict

GANTT_ROWS = 40  # beyond this many roles and links, a chart summarises
COLORS = {"fwd": "#4C72B0", "bwd": "#DD8452", "step": "#55A868", "encode": "#CCB974", "decode": "#64B5CD", "send": "#8172B3", "lost": "#C44E52", "dup": "#DA8BC3"}


def gantt_spec(timeline, iterations: int = 3, title: str = "", max_rows: int = GANTT_ROWS) -> dict:
    """What the chart of the first `iterations` iterations shows: one row per role and link. With
    more rows than `max_rows` (hundreds of devices), the first roles, the busiest ones and the
    roles that are not devices (servers, aggregators), each with its links, and two rows that sum
    up the others: how many of the other roles (links) are busy at each moment."""
    ivs = [iv for iv in timeline.intervals if 0 <= iv.iteration < iterations] or timeline.intervals[:2000]
    by_resource: dict[str, list] = defaultdict(list)
    for iv in ivs:
        by_resource[iv.resource].append(iv)
    links = [l for l in timeline.links if l in by_resource]
    roles, shown_links, rest_roles, rest_links = gantt_rows(timeline.roles, links, by_resource, max_rows)
    rows = roles + shown_links
    bars: dict[str, list] = defaultdict(list)
    for y, r in enumerate(rows):
        for iv in by_resource.get(r, ()):
            if iv.end > iv.start:
                bars[iv.kind].append((iv.start, iv.end, y))
    summaries = []
    t_end = max((iv.end for iv in ivs), default=1.0)
    for rest, what in ((rest_roles, "roles"), (rest_links, "links")):
        if rest:
            t, frac = busy_profile([iv for r in rest for iv in by_resource.get(r, ())], len(rest), t_end)
            peak = float(frac.max()) if len(frac) else 0.0
            summaries.append({"row": len(rows), "t": t.tolist(), "frac": frac.tolist(), "peak": peak})
            rows.append(f"{len(rest)} other {what}: busy share (peak {100 * peak:.0f}%)")
    return {"rows": rows, "bars": dict(bars), "summaries": summaries, "clock": timeline.clock, "title": title or f"first {iterations} iteration(s)"}


def render_gantt(spec: dict, path) -> None:
    """Draw `gantt_spec`'s chart into the PNG file `path`."""
    # a Figure on its own Agg canvas, not pyplot: no global figure state, no backend
    # selection, and 0.2 s less to import (measured, 2 cores)
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    rows = spec["rows"]
    fig = Figure(figsize=(11, 0.45 * len(rows) + 1.4))
    ax = fig.subplots()
    # one collection of bars per kind for the whole chart (a collection per row and kind cost a
    # 10-device chart 0.3 s more to draw)
    for kind, bars in spec["bars"].items():
        verts = [((a, y - 0.4), (a, y + 0.4), (b, y + 0.4), (b, y - 0.4)) for a, b, y in bars]
        ax.add_collection(PolyCollection(verts, facecolors=COLORS.get(kind, "#937860"), edgecolors="white", linewidths=0.3))
    ax.autoscale_view()
    for s in spec["summaries"]:
        # drawn to its own peak, so the shape shows even when each of them is rarely busy
        y, frac = s["row"], [f / max(s["peak"], 1e-12) for f in s["frac"]]
        ax.fill_between(s["t"], [y + 0.4 - 0.8 * f for f in frac], y + 0.4, step="post", color="#7f7f7f", linewidth=0)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel(f"{spec['clock']} time (s)")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), ncol=len(COLORS), loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title(spec["title"], loc="left", fontsize=10)
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
