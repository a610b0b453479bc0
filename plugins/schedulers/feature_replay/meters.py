"""The upstream side's measurements: the links' rates from the other side's stamps, and the
drift of its weights over k updates.

Bandwidth estimates (the official code measures per message, from the server's timestamps):
a FIFO link carries one message at a time, so the uplink's rate is the packet's bytes over
(cloud arrival - max(edge send + encoding, previous cloud arrival)), and the downlink's likewise
from the edge's side. Arrival times come from a listener task on each side that is always
waiting on the link (the code's uploader/downloader processes), so it wakes when a message
arrives, whatever the role's main program is busy with. Both rates are smoothed by an EWMA
(`rate_beta`). Exact on a link without latency; with latency they underestimate small packets
(the paper's code shares this).
"""

from __future__ import annotations

import collections

import torch


class RateMeter:
    """The edge's estimates of the uplink and downlink rates (bytes/s) from the cloud's stamps."""

    def __init__(self, beta: float):
        self.beta = beta
        self.up: float | None = None
        self.down: float | None = None
        self.last_cloud_recv = -1.0
        self.last_edge_recv = -1.0

    def _ewma(self, old: float | None, sample: float) -> float:
        return sample if old is None else self.beta * old + (1.0 - self.beta) * sample

    def uplink(self, nbytes: float, ready: float, cloud_recv: float) -> None:
        """`ready`: when the packet could leave (sent and encoded)."""
        busy = cloud_recv - max(ready, self.last_cloud_recv)
        self.last_cloud_recv = cloud_recv
        if busy > 0 and nbytes > 0:
            self.up = self._ewma(self.up, nbytes / busy)

    def downlink(self, nbytes: float, cloud_sent: float, edge_recv: float) -> None:
        busy = edge_recv - max(cloud_sent, self.last_edge_recv)
        if busy > 0 and nbytes > 0:
            self.down = self._ewma(self.down, nbytes / busy)
        self.last_edge_recv = edge_recv


class DriftMeter:
    """The std of w^t - w^{t-k} over the edge's weights and the updates t of an epoch, per lag k
    (the paper's Fig. 4 evidence for choosing K: `scheduler.drift_lags: [4, 5, 6]`)."""

    def __init__(self, lags: list[int]):
        self.lags = sorted({int(k) for k in lags})
        self.per_epoch: dict[str, list[float]] = {str(k): [] for k in self.lags}
        self.buf: collections.deque = collections.deque(maxlen=(max(self.lags) + 1) if self.lags else 1)
        self.sums: dict[int, list[float]] = {}

    def new_epoch(self) -> None:
        self.buf.clear()
        self.sums = {k: [0.0, 0.0, 0] for k in self.lags}

    def after_step(self, stage) -> None:
        if not self.lags or stage is None:
            return
        w = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in stage.module.parameters()])
        self.buf.append(w)
        for k in self.lags:
            if len(self.buf) > k:
                d = w - self.buf[-1 - k]
                acc = self.sums[k]
                acc[0] += float(d.sum())
                acc[1] += float((d * d).sum())
                acc[2] += d.numel()

    def end_epoch(self) -> None:
        for k in self.lags:
            s, s2, n = self.sums.get(k, (0.0, 0.0, 0))
            self.per_epoch[str(k)].append(max(0.0, s2 / n - (s / n) ** 2) ** 0.5 if n else float("nan"))
