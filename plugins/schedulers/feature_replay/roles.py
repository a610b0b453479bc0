"""Feature replay's two roles (plugins.schedulers.feature_replay.scheduler explains the schedule).

`EdgeRole` owns units [0, cut), the raw data, the history queue (its ReplayStage) and the
online decision engine; `CloudRole` owns units [cut, L). Everything between them is a message
on the edge->cloud / cloud->edge links:

- `act`: a batch's feature and labels; or a control message alone: `change` (the new cut,
  sent once the history queue is empty) or `end` (the epoch's last batch was flushed);
- `grad`: the gradient of a batch's feature; `stamps`: when the cloud received that batch and
  sent its gradient back (the official code's timestamps), from which the edge measures both
  links' rates;
- `units`: the weights of the blocks that change sides in a migration (Eq. 13's cost is then
  simply their bytes on the link).

Bandwidth estimates (the official code measures per message, from the server's timestamps):
a FIFO link carries one message at a time, so the uplink's rate is the packet's bytes over
(cloud arrival - max(edge send + encoding, previous cloud arrival)), and the downlink's likewise
from the edge's side. Arrival times come from a listener task on each side that is always
waiting on the link (the code's uploader/downloader processes), so it wakes when a message
arrives, whatever the role's main program is busy with. Both rates are smoothed by an EWMA
(`rate_beta`). Exact on a link without latency; with latency they underestimate small packets
(the paper's code shares this).

Migration (Alg. 2 lines 10-15, the code's protocol): when the engine prefers another cut, the
edge stops taking new batches, applies every outstanding gradient (the history queue empties),
re-runs the engine with what the drained messages measured, and moves the cut only if it still
prefers the new one. The moved blocks' optimizer state does not move (the code's behaviour);
the blocks that stay keep theirs.
"""

from __future__ import annotations

import asyncio
import collections

import torch

from framework import repartition as rp
from framework import wire
from framework.cluster import Work
from framework.models import clone_module
from framework.scheduler import Role
from plugins.schedulers.feature_replay.replay_stage import ReplayStage
from plugins.schedulers.feature_replay import cost


def _int_tensor(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


GRADIENT, PROBE_REPLY, STOP = 0, 1, 2  # what a `stamps` message answers


def _stamps(kind: int, received: float, sent: float) -> torch.Tensor:
    """[kind, when the cloud received the message, when it sent the reply]."""
    return torch.tensor([kind, received, sent], dtype=torch.float64)


PROBE_BYTES = wire.encoded_size({"probe": _int_tensor(0)})
STAMPS_BYTES = wire.encoded_size({"x": _stamps(0, 0.0, 0.0)})


def own_model(ctx):
    """A role's private copy of the initial model: the blocks a migration moves must arrive as
    messages even on the simulator (timing-only runs share the untouched one)."""
    return clone_module(ctx.model) if ctx.numerics else ctx.model


class _Side(Role):
    upstream = True  # holds units [0, cut) and the inputs, replays; the downstream side [cut, L) and the loss

    def __init__(self, sched, role: str, cut: int):
        self.sched = sched
        self.name = role
        self.peer = "cloud" if role == "edge" else "edge"
        self.device = sched.role_devices()[role]
        self.cut = cut
        self.model = own_model(sched.ctx)
        self.stage = self._new_stage()
        self.it = 0  # batches this role has handled, over all epochs (the messages' iteration ids)

    def _bounds(self) -> tuple[int, int]:
        return (0, self.cut) if self.upstream else (self.cut, self.sched.L)

    def _new_stage(self) -> ReplayStage | None:
        a, b = self._bounds()
        ctx = self.sched.ctx
        return ReplayStage(self.model, a, b, ctx.optimizer, numerics=ctx.numerics) if b > a else None

    def move_cut(self, new_cut: int) -> None:
        """Rebuild the stage for `new_cut`, keeping the optimizer state of the blocks that stay."""
        old = self.stage
        self.cut = new_cut
        self.stage = self._new_stage()
        if old is None or self.stage is None:
            return
        self.stage.version = old.version
        self.stage.staleness = old.staleness
        self.stage.peak_history = old.peak_history
        if old.optimizer is not None:
            for p in self.stage.module.parameters():
                if p in old.optimizer.state:
                    self.stage.optimizer.state[p] = old.optimizer.state[p]

    def state(self) -> dict:
        st = self.stage
        return rp.pack_units(self.model, None, list(range(st.start, st.stop)), True) if st is not None and self.sched.ctx.numerics else {}

    def checkpoint(self, bag, prefix: str) -> dict:
        return {"it": self.it, "cut": self.cut, "stage": self.stage.checkpoint(bag, f"{prefix}.stage") if self.stage is not None else None}

    def restore(self, bag, desc: dict) -> None:
        self.it = int(desc["it"])
        if int(desc["cut"]) != self.cut:
            self.move_cut(int(desc["cut"]))
        if self.stage is not None:
            self.stage.restore(bag, desc["stage"])


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


class UpstreamRole(_Side):
    """P1 (and the sender of P2): forwards, the history queue, replays, the decision engine. The
    edge, or the cloud for a generative model (`scheduler.upstream=cloud`)."""

    def __init__(self, sched, role: str = "edge"):
        super().__init__(sched, role, sched.cut)
        plan = sched.plan()
        self.inflight: collections.deque[int] = collections.deque()  # sent, gradient not applied yet
        self.outstanding: collections.deque[tuple[float, float, float]] = collections.deque()  # (ready, bytes up, bytes back) per message awaiting its reply
        self.last_applied = -1
        self.discarded = 0
        self.K: int | None = sched.K_at(0)
        self.profile = cost_profile = plan["profile"]
        self.engine = sched.engine_profile(cost_profile)
        self.engine_cost = sched.cost_model()  # M of Alg. 2: the policy's pipeline, or Eq. 12 (`cost_model: paper`)
        self.tau = cost.TauEstimator(plan["iterations_per_epoch"], float(sched.cfg.tau_beta))
        self.rates = RateMeter(float(sched.cfg.rate_beta))
        self.migrations: list[dict] = []
        self.drift = DriftMeter(list(sched.cfg.drift_lags or []) if sched.ctx.numerics else [])
        self.decisions: list[dict] = []  # (iteration, rates, tau, preferred cut) at every change of preference

    def stats(self) -> dict:
        st = self.stage
        return {"staleness": list(st.staleness) if st else [], "peak_history": st.peak_history if st else 0, "discarded": self.discarded,
                "migrations": self.migrations, "cut": self.cut, "drift_std": self.drift.per_epoch, "rates": {"up": self.rates.up, "down": self.rates.down}, "tau": self.tau.tau}

    def checkpoint(self, bag, prefix: str) -> dict:
        return {**super().checkpoint(bag, prefix), "last_applied": self.last_applied, "discarded": self.discarded, "migrations": self.migrations,
                "tau": [self.tau.tau, self.tau.since], "rates": [self.rates.up, self.rates.down]}

    def restore(self, bag, desc: dict) -> None:
        super().restore(bag, desc)
        self.last_applied, self.discarded, self.migrations = int(desc["last_applied"]), int(desc["discarded"]), list(desc["migrations"])
        self.tau.tau, self.tau.since = float(desc["tau"][0]), int(desc["tau"][1])
        self.rates.up, self.rates.down = desc["rates"]

    @property
    def B(self) -> int:
        return int(self.sched.ctx.cfg.train.batch_size)

    async def run(self, ctx) -> None:
        s = self.sched
        self.replies = asyncio.Queue()
        listener = asyncio.ensure_future(self.listen(ctx))
        for epoch in range(self.first_epoch, s.ctx.cfg.train.epochs):
            K = self.K = s.K_at(epoch)
            self.drift.new_epoch()
            for i, (x, y) in enumerate(s.ctx.train_batches(epoch)):
                t = self.it
                if self.cut == s.L:
                    await self.train_alone(ctx, epoch, x, y)
                else:
                    await self.send_batch(ctx, x, y, t)
                    await self.keep_bound(ctx, t, K, group_end=K is not None and ((i + 1) % (K + 1) == 0))
                self.it += 1
                if s.adaptive and K != 0:  # the code: the engine runs while K > 0
                    await self.engine_step(ctx, t)
            while self.outstanding:  # the epoch's flush (the code's EndTrain); probe replies too
                await self.apply_next(ctx, self.it - 1)
            ctx.send(self.peer, "act", {"end": _int_tensor(epoch)}, iteration=self.it)
            self.drift.end_epoch()
            await ctx.end_epoch(epoch)
        await listener

    async def listen(self, ctx) -> None:
        """The code's downloader: always waiting, so a reply's arrival time is when it wakes."""
        while True:
            stamps = await ctx.recv(self.peer, "stamps")
            arrived = ctx.now()
            kind = int(stamps[0])
            if kind == STOP:
                return
            g = await ctx.recv(self.peer, "grad") if kind == GRADIENT else None  # sent just before its stamps
            self.replies.put_nowait((g, stamps, arrived))

    async def send_batch(self, ctx, x, y, t: int) -> None:
        st = self.stage
        h = await ctx.compute(st.fwd_work(len(x)), st.forward_to_replay, x, t, iteration=t)
        if self.sched.reversed:  # the targets stay with the downstream party (the edge's ground truth)
            ctx.send(self.peer, "act", {"feature": h}, iteration=t)  # (a lone "x" would arrive unwrapped)
        else:  # labels travel with the feature (the official code)
            y = y if self.sched.ctx.numerics else torch.empty(y.shape, dtype=y.dtype, device="meta")
            ctx.send(self.peer, "act", {"x": h, "y": y}, iteration=t)
        c = self.cut - 1
        self.outstanding.append((ctx.now() + self.profile["encode_s"][c], self.profile["uplink_bytes"][c], self.profile["downlink_bytes"][c] + STAMPS_BYTES))
        self.inflight.append(t)

    async def keep_bound(self, ctx, t: int, K: int | None, group_end: bool) -> None:
        policy = self.sched.cfg.staleness_policy
        if policy == "fixed":
            while self.inflight and K is not None and self.inflight[0] <= t - K:
                await self.apply_next(ctx, t)
            return
        while self.inflight and await self.apply_next(ctx, t, wait=False):  # what has come back
            pass
        if K is None:
            return
        if policy == "block":
            while t - self.last_applied > K:
                await self.apply_next(ctx, t)
        elif policy == "group" and group_end:
            while self.inflight:
                await self.apply_next(ctx, t)
        elif policy == "discard":
            while len(self.inflight) >= 2 * (K + 1):
                await self.apply_next(ctx, t)

    async def next_reply(self, wait: bool):
        """The oldest reply (a gradient or a probe's), its stamps taken into the rate estimates;
        None if `wait` is off and none has come back."""
        if not wait and self.replies.empty():
            return None
        g, stamps, arrived = await self.replies.get()
        ready, up_bytes, down_bytes = self.outstanding.popleft()
        self.rates.uplink(up_bytes, ready, float(stamps[1]))
        self.rates.downlink(down_bytes, float(stamps[2]), arrived)
        return (g,)

    async def apply_next(self, ctx, t: int, wait: bool = True) -> bool:
        """Take the next reply (False if `wait` is off and none has come back); for a gradient,
        replay its batch through the current weights, backpropagate, step (Eq. 3)."""
        reply = await self.next_reply(wait)
        if reply is None:
            return False
        g = reply[0]
        if g is None:  # a probe's reply (edge-only): only its stamps mattered
            return True
        st = self.stage
        old = self.inflight.popleft()
        self.last_applied = old
        if self.sched.cfg.staleness_policy == "discard" and self.K is not None and t - old > self.K:
            st.forget(old)
            self.discarded += 1
            return True
        replay_work = st.fwd_work(self.B) if self.sched.cfg.price_replay else Work("replay", seconds=0.0)
        await ctx.compute(replay_work, st.replay, old, iteration=old)
        await ctx.compute(st.bwd_work(self.B), st.backward, old, g, iteration=old)
        await ctx.compute(st.step_work(), st.step, iteration=old)
        self.drift.after_step(st)
        return True

    async def train_alone(self, ctx, epoch: int, x, y) -> None:
        """Edge-only: the whole model, local training. An adaptive edge also sends a tiny probe
        per batch (the code's 'Edge' message), so that it keeps measuring the links."""
        st, t = self.stage, self.it
        out = await ctx.compute(st.fwd_work(len(x)), st.forward, x, t, y, 1.0 / len(y), iteration=t)
        if self.sched.ctx.numerics:
            ctx.report_train(*out)
        await ctx.compute(st.bwd_work(len(x)), st.backward, t, iteration=t)
        await ctx.compute(st.step_work(), st.step, iteration=t)
        self.drift.after_step(st)
        ctx.iteration_done(epoch, t + 1, len(y))
        if self.sched.adaptive and self.K != 0:
            while await self.next_reply(wait=False) is not None:  # replies that have come back
                pass
            ctx.send(self.peer, "act", {"probe": _int_tensor(t)}, iteration=t)
            self.outstanding.append((ctx.now(), PROBE_BYTES, STAMPS_BYTES))

    # ---- the decision engine and migrations ------------------------------------------------

    async def engine_step(self, ctx, t: int) -> None:
        """Alg. 2 once per iteration, once both rates have been measured (the code)."""
        redeploy = False
        want = self.preferred_cut()
        if want is not None and want != self.cut:
            # stop taking batches and empty the history queue, then ask again (the code re-checks)
            while self.outstanding:
                await self.apply_next(ctx, t)
            want = self.preferred_cut()
            if want is not None and want != self.cut:
                await self.migrate(ctx, want, t)
                redeploy = True
        self.tau.update(redeploy)

    def preferred_cut(self) -> int | None:
        if self.rates.up is None or self.rates.down is None:
            return None
        d = cost.decide(self.engine, cost.Deployment(self.cut, 32), self.K, self.rates.up, self.rates.down, self.tau.tau,
                        bits_candidates=(32,), include_edge_only=bool(self.sched.cfg.include_edge_only), model=self.engine_cost)
        return d.deployment.cut

    async def migrate(self, ctx, new_cut: int, t: int) -> None:
        s, old = self.sched, self.cut
        start = ctx.now()
        ctx.send(self.peer, "act", {"change": _int_tensor(new_cut)}, iteration=t)
        if new_cut < old:  # blocks new_cut+1..old go up
            ctx.send(self.peer, "units", rp.pack_units(self.model, None, list(range(new_cut, old)), s.ctx.numerics), iteration=t)
        else:  # blocks old+1..new_cut come down
            rp.unpack_units(self.model, await ctx.recv(self.peer, "units"), s.ctx.numerics)
        self.migrations.append({"iteration": t + 1, "time_s": start, "done_s": ctx.now(), "from": old, "to": new_cut,
                                "rate_up_Bps": self.rates.up, "rate_down_Bps": self.rates.down, "tau": self.tau.tau})
        self.move_cut(new_cut)
        self.drift.buf.clear()  # other weights from here on: lags restart


class DownstreamRole(_Side):
    """P3 (and the sender of P4): trains on each fresh feature, returns its gradient. The cloud,
    or the edge with its ground truth for a generative model (`scheduler.upstream=cloud`)."""

    upstream = False

    def __init__(self, sched, role: str = "cloud"):
        super().__init__(sched, role, sched.cut)

    async def run(self, ctx) -> None:
        s = self.sched
        arrivals: asyncio.Queue = asyncio.Queue()
        listener = asyncio.ensure_future(self.listen(ctx, arrivals))
        for epoch in range(self.first_epoch, s.ctx.cfg.train.epochs):
            # reversed (generative): the targets are this party's own, drawn in the seeded order
            # every process draws alike, the i-th feature of the epoch being the i-th batch's
            own = iter([y for _, y in s.ctx.train_batches(epoch)]) if s.reversed else None
            while True:
                msg, received = await arrivals.get()
                if "end" in msg:
                    break
                if "change" in msg:
                    await self.migrate(ctx, int(msg["change"][0]))
                elif "probe" in msg:
                    ctx.send(self.peer, "stamps", _stamps(PROBE_REPLY, received, ctx.now()))
                else:
                    y = next(own) if own is not None else msg["y"]
                    if own is not None and not s.ctx.numerics:
                        y = torch.empty(y.shape, dtype=y.dtype, device="meta")
                    await self.train_on(ctx, epoch, msg["feature"] if own is not None else msg["x"], y, received)
            await ctx.end_epoch(epoch)
        await listener
        ctx.send(self.peer, "stamps", _stamps(STOP, 0.0, 0.0))

    async def listen(self, ctx, arrivals: asyncio.Queue) -> None:
        """The code's receiver: always waiting, so a message's arrival time is when it wakes."""
        left = self.sched.ctx.cfg.train.epochs - self.first_epoch
        while left:
            msg = await ctx.recv(self.peer, "act")
            arrivals.put_nowait((msg, ctx.now()))
            left -= "end" in msg

    async def train_on(self, ctx, epoch: int, a, y, received: float) -> None:
        st, t = self.stage, self.it
        out = await ctx.compute(st.fwd_work(a.shape[0]), st.forward, a, t, y, 1.0 / a.shape[0], iteration=t)
        if self.sched.ctx.numerics:
            ctx.report_train(*out)
        g = await ctx.compute(st.bwd_work(a.shape[0]), st.backward, t, iteration=t)
        ctx.send(self.peer, "grad", g, iteration=t)  # P4 starts as soon as the gradient exists
        ctx.send(self.peer, "stamps", _stamps(GRADIENT, received, ctx.now()), iteration=t)
        await ctx.compute(st.step_work(), st.step, iteration=t)
        self.it += 1
        ctx.iteration_done(epoch, self.it, int(a.shape[0]))

    async def migrate(self, ctx, new_cut: int) -> None:
        s, old = self.sched, self.cut
        if new_cut > old:  # blocks old+1..new_cut go down to the edge
            ctx.send(self.peer, "units", rp.pack_units(self.model, None, list(range(old, new_cut)), s.ctx.numerics))
        else:
            rp.unpack_units(self.model, await ctx.recv(self.peer, "units"), s.ctx.numerics)
        self.move_cut(new_cut)
