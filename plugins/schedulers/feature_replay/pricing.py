"""What one iteration of feature replay costs at each cut, priced as the simulator prices it: the
devices' time models, the compressor's codec seconds and the packets' real sizes. The plan's
module times and the profile the decision engine (and the edge's online engine) runs on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from framework.cluster import Work
from framework.scheduler import SchedulerContext
from plugins.schedulers.feature_replay.plan import Profile


@dataclass(frozen=True)
class CutTimes:
    """T1..T4 of one steady-state iteration at a cut, with the parts the policy-aware model needs:
    what the upstream side spends when it sends, the other side's step after the gradient has
    left, the packets' bytes."""

    T1: float
    T2: float
    T3: float
    T4: float
    encode_s: float
    send_s: float
    cloud_step_s: float
    uplink_bytes: int = 0
    downlink_bytes: int = 0

    @property
    def modules(self) -> list[float]:
        return [self.T1, self.T2, self.T3, self.T4]


class Pricing:
    """Prices cuts on the run's parts: `upstream` is the device of the party that holds the inputs
    and replays, `downstream` the other's; `labels_travel` (a discriminative model) sends the
    labels with the feature; `price_replay` charges the replay's forward."""

    def __init__(self, parts: SchedulerContext, upstream: str, downstream: str, labels_travel: bool, price_replay: bool):
        self.parts = parts
        self.upstream, self.downstream = upstream, downstream
        self.labels_travel = labels_travel
        self.price_replay = price_replay
        self.L = len(parts.model)

    def links(self):
        """(the feature's link, the gradient's link)."""
        cl = self.parts.cluster
        return cl.link(self.upstream, self.downstream), cl.link(self.downstream, self.upstream)

    def rates(self) -> tuple[float, float]:
        """Bytes per second up and down at the start (the links' configured bandwidths)."""
        up, down = self.links()
        return up.bandwidth_at(0.0) / 8.0, down.bandwidth_at(0.0) / 8.0

    def uplink_bits(self) -> int:
        comp = self.parts.compressor
        d = comp.directions[comp.forward_tag]
        return d.bits if d.codec is not None else 32

    def cut(self, cut: int) -> CutTimes:
        ctx, B = self.parts, int(self.parts.cfg.train.batch_size)
        edge, cloud = ctx.cluster.device(self.upstream), ctx.cluster.device(self.downstream)  # the replaying party, the other
        if cut == self.L:
            t1 = sum(edge.time(Work(k, 0, self.L, B)) for k in ("fwd", "bwd")) + edge.time(Work("step", 0, self.L))
            return CutTimes(t1, 0.0, 0.0, 0.0, encode_s=0.0, send_s=t1, cloud_step_s=0.0)
        fwd, bwd = edge.time(Work("fwd", 0, cut, B)), edge.time(Work("bwd", 0, cut, B))
        comp = ctx.new_compressor()
        feature = {"x": torch.empty((B, *ctx.model.infos[cut - 1].out_shape), device="meta")}
        if self.labels_travel:
            feature["y"] = torch.empty((B,), dtype=torch.int64, device="meta")
        _, up_bytes, _ = comp.encode(feature, src="edge", dst="cloud", tag=comp.forward_tag)
        _, down_bytes, _ = comp.encode({"x": feature["x"]}, src="cloud", dst="edge", tag=comp.backward_tag)
        enc = comp.codec_seconds("encode", comp.forward_tag, feature, 0.0)
        dec = comp.codec_seconds("decode", comp.forward_tag, feature, 0.0)
        up, down = self.links()
        t1 = fwd + (fwd if self.price_replay else 0.0) + bwd + edge.time(Work("step", 0, cut)) + enc
        cloud_step = cloud.time(Work("step", cut, self.L))
        t3 = dec + sum(cloud.time(Work(k, cut, self.L, B)) for k in ("fwd", "bwd")) + cloud_step
        return CutTimes(t1, up.tx_time(up_bytes, 0.0) + up.cfg.latency_s, t3, down.tx_time(down_bytes, 0.0) + down.cfg.latency_s,
                        encode_s=enc, send_s=fwd + enc, cloud_step_s=cloud_step, uplink_bytes=up_bytes, downlink_bytes=down_bytes)

    def profile(self) -> Profile:
        """Every cut's module times and packet sizes (shipped in the plan: the edge's online engine
        and its bandwidth estimates read them)."""
        itemsize = 8 if self.parts.cfg.runtime.dtype == "float64" else 4
        rows = [self.cut(c) for c in range(1, self.L + 1)]
        up, down = self.links()
        return Profile(
            edge_s=tuple(r.T1 for r in rows),
            edge_send_s=tuple(r.send_s for r in rows),
            cloud_s=tuple(r.T3 for r in rows),
            cloud_step_s=tuple(r.cloud_step_s for r in rows),
            uplink_bytes=tuple(r.uplink_bytes for r in rows),
            downlink_bytes=tuple(r.downlink_bytes for r in rows),
            encode_s=tuple(r.encode_s for r in rows),
            block_bytes=tuple(i.params * itemsize for i in self.parts.model.infos),
            latency_s=(up.cfg.latency_s, down.cfg.latency_s),
            overhead_s=(up.cfg.wakeup_s, down.cfg.wakeup_s),
        )
