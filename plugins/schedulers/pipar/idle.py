"""Idle time of a server and its devices in a window of a run's timeline (PiPar's Figs 4-7).

The server is idle while none of its roles computes (replicas computing side by side count once:
the notes' decision 11); a device is idle while it does not compute. Works on either clock: the
simulator's timeline, or the one real runtimes gather from their roles at each epoch end.
"""

from __future__ import annotations

from itertools import islice


def idle_times(timeline, start: float, end: float, device_roles: list[str], server_roles: set[str]) -> dict:
    """{"server_s", "device_mean_s", "device_max_s"} of idle seconds in [start, end)."""
    dev_busy = {r: 0.0 for r in device_roles}
    spans = []
    for iv in islice(timeline.intervals, timeline.first_overlapping(start), None):  # not the epochs before
        a, b = max(iv.start, start), min(iv.end, end)
        if b <= a:
            continue
        if iv.resource in dev_busy:
            dev_busy[iv.resource] += b - a
        elif iv.resource in server_roles:
            spans.append((a, b))
    spans.sort()
    busy, cur_a, cur_b = 0.0, None, None
    for a, b in spans:  # the union of the server roles' busy spans
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                busy += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        busy += cur_b - cur_a
    window = end - start
    dev_idle = [window - v for v in dev_busy.values()]
    return {"server_s": window - busy, "device_mean_s": sum(dev_idle) / len(dev_idle), "device_max_s": max(dev_idle)}
