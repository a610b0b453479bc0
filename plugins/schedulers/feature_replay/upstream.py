"""Feature replay's upstream role (P1 and the sender of P2): forwards, the history queue, replays,
the staleness policy and the online decision engine.

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

from framework.cluster import Work
from framework.scheduler import SchedulerContext
from plugins.schedulers.feature_replay import cost
from plugins.schedulers.feature_replay.engine import Engine
from plugins.schedulers.feature_replay.meters import DriftMeter, RateMeter
from plugins.schedulers.feature_replay.replay_stage import ReplayStage
from plugins.schedulers.feature_replay.role_specs import UpstreamSpec
from plugins.schedulers.feature_replay.side import GRADIENT, PROBE_BYTES, STAMPS_BYTES, STOP, Side, int_tensor


class UpstreamRole(Side):
    """P1 (and the sender of P2): forwards, the history queue, replays, the decision engine. The
    edge, or the cloud for a generative model (`scheduler.upstream=cloud`)."""

    stage_class = ReplayStage

    def __init__(self, spec: UpstreamSpec, parts: SchedulerContext):
        super().__init__(spec, parts)
        self.spec = spec
        self.B = int(parts.train.batch_size)
        self.inflight: collections.deque[int] = collections.deque()  # sent, gradient not applied yet
        self.outstanding: collections.deque[tuple[float, float, float]] = collections.deque()  # (ready, bytes up, bytes back) per message awaiting its reply
        self.last_applied = -1
        self.discarded = 0
        self.K: int | None = spec.K.at(0)
        self.profile = spec.profile
        # M of Alg. 2: the policy's pipeline, or Eq. 12 (`cost_model: paper`)
        self.engine = Engine(spec.profile, spec.cost_model, spec.staleness_policy, spec.include_edge_only)
        self.tau = cost.TauEstimator(spec.iterations_per_epoch, spec.tau_beta)
        self.rates = RateMeter(spec.rate_beta)
        self.migrations: list[dict] = []
        self.drift = DriftMeter(list(spec.drift_lags) if self.numerics else [])

    def carry_over(self, old: ReplayStage, new: ReplayStage) -> None:
        super().carry_over(old, new)
        new.peak_history = old.peak_history

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

    async def run(self, ctx) -> None:
        self.replies = asyncio.Queue()
        listener = asyncio.ensure_future(self.listen(ctx))
        for epoch in range(self.first_epoch, self.epochs):
            K = self.K = self.spec.K.at(epoch)
            self.drift.new_epoch()
            for i, (x, y) in enumerate(self.parts.train_batches(epoch)):
                t = self.it
                if self.cut == self.L:
                    await self.train_alone(ctx, epoch, x, y)
                else:
                    await self.send_batch(ctx, x, y, t)
                    await self.keep_bound(ctx, t, K, group_end=K is not None and ((i + 1) % (K + 1) == 0))
                self.it += 1
                if self.spec.adaptive and K != 0:  # the code: the engine runs while K > 0
                    await self.engine_step(ctx, t)
            while self.outstanding:  # the epoch's flush (the code's EndTrain); probe replies too
                await self.apply_next(ctx, self.it - 1)
            ctx.send(self.peer, "act", {"end": int_tensor(epoch)}, iteration=self.it)
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
        if self.reversed:  # the targets stay with the downstream party (the edge's ground truth)
            ctx.send(self.peer, "act", {"feature": h}, iteration=t)  # (a lone "x" would arrive unwrapped)
        else:  # labels travel with the feature (the official code)
            y = y if self.numerics else torch.empty(y.shape, dtype=y.dtype, device="meta")
            ctx.send(self.peer, "act", {"x": h, "y": y}, iteration=t)
        c = self.cut - 1
        self.outstanding.append((ctx.now() + self.profile.encode_s[c], self.profile.uplink_bytes[c], self.profile.downlink_bytes[c] + STAMPS_BYTES))
        self.inflight.append(t)

    async def keep_bound(self, ctx, t: int, K: int | None, group_end: bool) -> None:
        policy = self.spec.staleness_policy
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
        if self.spec.staleness_policy == "discard" and self.K is not None and t - old > self.K:
            st.forget(old)
            self.discarded += 1
            return True
        replay_work = st.fwd_work(self.B) if self.spec.price_replay else Work("replay", seconds=0.0)
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
        if self.numerics:
            ctx.report_train(*out)
        await ctx.compute(st.bwd_work(len(x)), st.backward, t, iteration=t)
        await ctx.compute(st.step_work(), st.step, iteration=t)
        self.drift.after_step(st)
        ctx.iteration_done(epoch, t + 1, len(y))
        if self.spec.adaptive and self.K != 0:
            while await self.next_reply(wait=False) is not None:  # replies that have come back
                pass
            ctx.send(self.peer, "act", {"probe": int_tensor(t)}, iteration=t)
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
        return self.engine.decide(self.cut, self.K, self.rates.up, self.rates.down, self.tau.tau).deployment.cut

    async def migrate(self, ctx, new_cut: int, t: int) -> None:
        old = self.cut
        start = ctx.now()
        ctx.send(self.peer, "act", {"change": int_tensor(new_cut)}, iteration=t)
        if new_cut < old:  # blocks new_cut+1..old go up
            self.send_units(ctx, range(new_cut, old), iteration=t)
        else:  # blocks old+1..new_cut come down
            await self.take_units(ctx)
        self.migrations.append({"iteration": t + 1, "time_s": start, "done_s": ctx.now(), "from": old, "to": new_cut,
                                "rate_up_Bps": self.rates.up, "rate_down_Bps": self.rates.down, "tau": self.tau.tau})
        self.move_cut(new_cut)
        self.drift.buf.clear()  # other weights from here on: lags restart
