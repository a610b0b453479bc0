"""timeline.png: a Gantt chart of a run's first iterations, as plain data and as a picture.

`gantt_spec` chooses what to draw from a `framework.timeline.Timeline` (rows, bars, the summary
rows of large runs) as JSON-able data, in time linear in the number of intervals; `render_gantt`
draws it with Pillow. Apart, the choice is testable without a picture, and the picture can be
drawn by any process that is handed the data. (Drawing it in the MLflow recorder, beside the run,
was measured: no faster for a 10-device run on 2 cores, where that process is as busy as the run's.)
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

GANTT_ROWS = 40  # beyond this many roles and links, a chart summarises
COLORS = {"fwd": "#4C72B0", "bwd": "#DD8452", "step": "#55A868", "encode": "#CCB974", "decode": "#64B5CD", "send": "#8172B3", "lost": "#C44E52", "dup": "#DA8BC3"}
OTHER_COLOR = "#937860"  # a kind of work not listed above (a plugin's own)
WIDTH, ROW = 1210, 26  # pixels: the picture's width, one row's height


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
    """Draw `gantt_spec`'s chart into the PNG file `path` with Pillow: bars are rectangles on a
    pixel grid, so a chart is a few thousand fills. (matplotlib, which drew it before, cost a
    10-device run 1.0-1.2 s of its 4-5 s to import and draw, measured on 2 cores; Pillow
    0.1-0.2 s.) A bar shorter than a pixel is drawn one pixel wide, so short work stays visible."""
    from PIL import Image, ImageDraw, ImageFont  # Pillow: start-up (only a run that draws timeline.png pays for it)

    font = ImageFont.load_default(size=12)  # Pillow's own TrueType font: nothing to find on disk
    rows = spec["rows"]
    ends = [b for bars in spec["bars"].values() for _, b, _ in bars] + [t for s in spec["summaries"] for t in s["t"][-1:]]
    starts = [a for bars in spec["bars"].values() for a, _, _ in bars]
    lo, hi = min(0.0, min(starts, default=0.0)), max(ends, default=1.0)
    hi = hi if hi > lo else lo + 1.0
    pad = 0.02 * (hi - lo)  # as matplotlib's default margins
    lo, hi = lo - pad, hi + pad

    label_w = max((font.getlength(r) for r in rows), default=0)
    left, right, top, bottom = int(label_w) + 18, 24, 40, 52
    plot_w = max(WIDTH - left - right, 200)
    height = top + ROW * max(len(rows), 1) + bottom
    img = Image.new("RGB", (left + plot_w + right, height), "white")
    d = ImageDraw.Draw(img)

    def x_of(t: float) -> float:
        return left + (t - lo) / (hi - lo) * plot_w

    def y_of(row: float) -> float:
        return top + (row + 0.5) * ROW

    step, ticks = _ticks(lo, hi)
    decimals = next(n for n in range(13) if abs(step * 10**n - round(step * 10**n)) < 1e-6 * step * 10**n)  # as many as the step has
    for t in ticks:  # light grid lines and labels under the bars
        x = round(x_of(t))
        d.line([(x, top), (x, top + ROW * len(rows))], fill="#e6e6e6")
        d.line([(x, top + ROW * len(rows)), (x, top + ROW * len(rows) + 4)], fill="black")
        d.text((x, top + ROW * len(rows) + 7), f"{t:.{decimals}f}", font=font, fill="black", anchor="mt")
    for kind, bars in spec["bars"].items():
        color = COLORS.get(kind, OTHER_COLOR)
        for a, b, y in bars:
            x0, x1 = round(x_of(a)), round(x_of(b))
            x1 = max(x1 - 2, x0)  # a one-pixel gap between back-to-back bars
            d.rectangle([x0, round(y_of(y) - 0.4 * ROW), x1, round(y_of(y) + 0.4 * ROW)], fill=color)
    for s in spec["summaries"]:
        # drawn to its own peak, so the shape shows even when each of them is rarely busy
        base, peak, t = y_of(s["row"]) + 0.4 * ROW, max(s["peak"], 1e-12), s["t"]
        width = t[1] - t[0] if len(t) > 1 else 0.0
        for i, f in enumerate(s["frac"]):
            if f > 0:
                x0 = round(x_of(t[i]))
                d.rectangle([x0, round(base - 0.8 * ROW * f / peak), max(x0, round(x_of(t[i] + width)) - 1), round(base)], fill="#7f7f7f")
    for i, r in enumerate(rows):
        d.text((left - 8, y_of(i)), r, font=font, fill="black", anchor="rm")
    d.rectangle([left, top, left + plot_w, top + ROW * len(rows)], outline="black")
    d.text((left + plot_w / 2, height - 8), f"{spec['clock']} time (s)", font=font, fill="black", anchor="md")
    d.text((left, top - 8), spec["title"], font=font, fill="black", anchor="ld")
    x = left + plot_w  # the legend of the kinds drawn, right-aligned above the plot
    for kind in reversed([k for k in COLORS if k in spec["bars"]] + sorted(k for k in spec["bars"] if k not in COLORS)):
        x -= font.getlength(kind)
        d.text((x, top - 8), kind, font=font, fill="black", anchor="ld")
        d.rectangle([x - 18, top - 19, x - 5, top - 10], fill=COLORS.get(kind, OTHER_COLOR))
        x -= 32
    img.save(path, optimize=False)


def _ticks(lo: float, hi: float, target: int = 8) -> tuple[float, list[float]]:
    """A step of 1, 2, 2.5 or 5 times a power of ten giving about `target` ticks in [lo, hi], and the ticks."""
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9)
    return step, [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]


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
