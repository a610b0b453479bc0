"""AdaLearner's plan for a run: Algorithm 1 over the run's devices (its predictor), links and codec.

`scheduler.planner` picks the estimate Algorithm 1 compares the n's with:

- `fifo` (default): the iteration as the roles run it on the shared channel, FIFO answers and
  all (plugins/schedulers/adalearner/fifo.py): what the simulator measures, so the plan's
  predicted epoch is the run's (`plan/epoch_over_predicted`), and the n it picks is the fastest
  the run can have. Per n it takes fp32 or 1-bit, whichever is faster (Sec. VII: "estimates the
  time consumption with and without data compression and pick the one with less time").
- `paper`: Eq. 4 with Eq. 7-9 (adalearner.plan.CommModel `eq4`): compute plus the 2n transfers one
  after another, one wake-up per worker (Eq. 4's D[j]), and Eq. 8's codec terms; the overlap of a
  worker computing while the others are answered is not in it.
- `paper_printed`: Eq. 7 and 8 as printed (one direction, one constant D).

Both paper planners predict their own formula's iteration (plus the group owner's update), so a
run records how far the paper's estimate is from the simulated epoch.
"""

from __future__ import annotations

import math

from framework.cluster import Work
from framework.errors import ConfigError
from plugins.schedulers.adalearner import plan as ap
from plugins.schedulers.adalearner.fifo import StarCosts, fifo_epoch_s


class Costs:
    """What one iteration of a split costs, from the run's predictor, links and codec."""

    def __init__(self, sched):
        self.s = sched
        ctx = sched.ctx
        self.W = sched.W
        grads = sched.meta_grads()
        self.codec = sched.codec is not None
        self.bytes = {
            "fp32": (ctx.compressor.packet_bytes(grads, tag="fp32_grad"), ctx.compressor.packet_bytes(grads, tag="weights")),
            "onebit": (ctx.compressor.packet_bytes(grads, tag=ctx.compressor.backward_tag), ctx.compressor.packet_bytes(sched.aggregate_meta(), tag="onebit_agg"))
            if self.codec else None,
        }
        self.encode_s, self.decode_s = (sched.price_codec("encode"), sched.price_codec("decode")) if self.codec else (0.0, 0.0)
        self.iterations = ctx.iterations_per_epoch()
        samples = sched.samples_per_epoch()
        self.last_batch = samples - (self.iterations - 1) * self.W  # a short last minibatch, or W
        self._fwd_bwd = {d: sched.profile(d) for d in [*sched.candidates, sched.go_device]}

    def compute_s(self, device: str, batch: int) -> float:
        return self._fwd_bwd[device](batch) if batch > 0 else 0.0

    def step_s(self, device: str) -> float:
        return self.s.ctx.cluster.device(device).time(Work("step", 0, self.s.Q))

    def link(self, a: str, b: str):
        return self.s.ctx.cluster.link(a, b)

    def star(self, split: ap.Split, scheme: str, batch: int | None = None) -> StarCosts:
        """The FIFO star's costs of one iteration of `batch` samples (default: the minibatch)."""
        batch = self.W if batch is None else batch
        sizes = list(split.sizes) if batch == sum(split.sizes) else ap.largest_remainder(batch, list(split.sizes))
        go, up_b, down_b = self.s.go_device, *self.bytes[scheme]
        ups = [self.link(d, go) for d in split.nodes]
        downs = [self.link(go, d) for d in split.nodes]
        n = len(split.nodes)
        onebit = scheme == "onebit"
        return StarCosts(
            compute_s=tuple(self.compute_s(d, b) for d, b in zip(split.nodes, sizes)),
            up_s=tuple(lk.tx_time(up_b, 0.0) for lk in ups),
            down_s=tuple(lk.tx_time(down_b, 0.0) for lk in downs),
            go_update_s=self.s.update_s(go, n),
            encode_s=self.encode_s if onebit else 0.0,
            go_decode_s=self.decode_s if onebit else 0.0,
            go_encode_s=self.encode_s if onebit else 0.0,
            finish_s=(self.decode_s + max(self.step_s(d) for d in split.nodes)) if onebit else 0.0,
            latency_s=max(lk.cfg.latency_s for lk in ups + downs),
        )

    def fifo_epoch_s(self, split: ap.Split, scheme: str) -> float:
        last = self.star(split, scheme, self.last_batch) if self.last_batch != self.W else None
        return fifo_epoch_s(self.star(split, scheme), self.iterations, last)

    def local_epoch_s(self) -> float:
        go, step = self.s.go_device, self.step_s(self.s.go_device)
        return (self.iterations - 1) * (self.compute_s(go, self.W) + step) + self.compute_s(go, self.last_batch) + step

    def paper_comm(self, mode: str) -> ap.CommModel:
        """Eq. 4/7/8's inputs: B of the first candidate's uplink, D[j] the wake-ups of its two
        transfers (and their latency), S_q and S_uq from the codec's time model."""
        s = self.s
        up, down = self.link(s.candidates[0], s.go_device), self.link(s.go_device, s.candidates[0])
        fp32 = self.bytes["fp32"][0]
        return ap.CommModel(bandwidth_Bps=up.cfg.bandwidth_bps / 8.0, wake_s=up.cfg.wakeup_s + down.cfg.wakeup_s + up.cfg.latency_s + down.cfg.latency_s,
                            quantize_Bps=fp32 / self.encode_s if self.encode_s > 0 else math.inf,
                            unquantize_Bps=fp32 / self.decode_s if self.decode_s > 0 else math.inf, mode=mode)


def make_plan(s) -> ap.AdaLearnerPlan:
    cfg, W = s.cfg, s.W
    costs = Costs(s)
    prof = {d: s.profile(d) for d in s.candidates}
    go_t = costs.compute_s(s.go_device, W)
    if cfg.partition == "linear":  # t(b) = a + b / C from two points (the profiles are linear in b)
        rate = {d: (W - 1) / max(p(W) - p(1), 1e-12) if W > 1 else 1.0 / max(p(1), 1e-12) for d, p in prof.items()}
        over = {d: max(0.0, p(1) - 1.0 / rate[d]) for d, p in prof.items()}
        split = lambda n: ap.linear_split(W, n, rate, over)  # noqa: E731
        table = thresholds = None
    else:
        top = max(p(W) for p in prof.values())
        thresholds = [cfg.lookup_step_s * (j + 1) for j in range(int(math.ceil(top / cfg.lookup_step_s)))]
        table = {d: [max([b for b in range(1, W + 1) if p(b) <= t], default=0) for t in thresholds] for d, p in prof.items()}
        split = lambda n: ap.lookup_split(W, n, table, thresholds)  # noqa: E731
    go_alone = ap.Split((s.go_device,), (W,), go_t)
    split_n = (lambda n: go_alone if n == 1 else split(n)) if cfg.local_when_n1 else split  # noqa: E731
    arch = cfg.architecture if costs.codec else "fp32"
    forced = cfg.workers is not None
    max_n = int(cfg.workers) if forced else len(s.candidates)
    early = cfg.early_stop and not forced

    def paper(mode: str):
        est = ap.paper_estimate(costs.paper_comm(mode), costs.bytes["fp32"][0], onebit_bytes=costs.bytes["onebit"][0] if costs.codec else None, architecture=arch)
        local = (lambda sp: ap.Estimate(1, sp, "local", 0.0, sp.compute_s)) if cfg.local_when_n1 else None  # noqa: E731
        return ap.schedule(split_n, max_n, est, early_stop=early, local=local)

    def fifo():
        schemes = ("fp32", "onebit") if arch == "auto" else (arch,)

        def est(n: int, sp: ap.Split) -> ap.Estimate:
            if not math.isfinite(sp.compute_s):
                return ap.Estimate(n, sp, schemes[0], math.inf, math.inf)
            options = [(costs.fifo_epoch_s(sp, sc) / costs.iterations, sc) for sc in schemes]
            total, scheme = min(options)  # ties: fp32 (listed first)
            slowest = max(costs.star(sp, scheme).compute_s)
            return ap.Estimate(n, sp, scheme, total - slowest, total)

        local = (lambda sp: ap.Estimate(1, sp, "local", 0.0, costs.local_epoch_s() / costs.iterations)) if cfg.local_when_n1 else None  # noqa: E731
        return ap.schedule(split_n, max_n, est, early_stop=early, local=local)

    sched = fifo() if cfg.planner == "fifo" else paper("eq4" if cfg.planner == "paper" else "printed")
    best = sched.tried[-1] if forced else sched.best
    if not math.isfinite(best.total_s):
        raise ConfigError("scheduler.partition", f"no split of the minibatch of {W} fits the lookup table's thresholds (step {cfg.lookup_step_s} s)")
    local = best.scheme == "local"
    go_update = s.update_s(s.go_device, 1 if local else best.n)
    if cfg.planner == "fifo":
        predicted = best.total_s
        epoch = costs.local_epoch_s() if local else costs.fifo_epoch_s(best.split, best.scheme)
    else:
        predicted = best.total_s + go_update
        epoch = predicted * costs.iterations
    comm = costs.paper_comm("eq4")
    return ap.AdaLearnerPlan(
        scheduler="adalearner", planner=cfg.planner, scheme=best.scheme, n=best.n,
        workers=() if local else tuple(ap.WorkerShare(d, n) for d, n in zip(best.split.nodes, best.split.sizes)),
        estimate_s=best.total_s, compute_s=best.split.compute_s, comm_s=best.comm_s, go_update_s=go_update,
        predicted_iteration_s=predicted, predicted_epoch_s=epoch,
        local_iteration_s=go_t + s.update_s(s.go_device, 1),
        tried=tuple(e.tried() for e in sched.tried),
        fp32_bytes=costs.bytes["fp32"][0], onebit_bytes=costs.bytes["onebit"][0] if costs.codec else None,
        downlink_bytes={k: v[1] for k, v in costs.bytes.items() if v},
        link=ap.LinkFacts(comm.bandwidth_Bps, comm.wake_s, bool(s.ctx.cluster.cfg.shared_medium)),
        codec_s=ap.CodecSeconds(costs.encode_s, costs.decode_s),
        partition=cfg.partition, architecture=cfg.architecture,
        lookup_table=ap.LookupTable(tuple(thresholds), {d: tuple(b) for d, b in table.items()}) if table else None,
    )
