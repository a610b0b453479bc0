"""Feature replay's downstream role (P3 and the sender of P4): trains on each fresh feature and
returns its gradient, with the stamps from which the upstream side measures the links."""

from __future__ import annotations

import asyncio

import torch

from plugins.schedulers.feature_replay.side import GRADIENT, PROBE_REPLY, STOP, Side, stamps


class DownstreamRole(Side):
    """P3 (and the sender of P4): trains on each fresh feature, returns its gradient. The cloud,
    or the edge with its ground truth for a generative model (`scheduler.upstream=cloud`)."""

    upstream = False  # built from a DownstreamSpec

    async def run(self, ctx) -> None:
        arrivals: asyncio.Queue = asyncio.Queue()
        listener = asyncio.ensure_future(self.listen(ctx, arrivals))
        for epoch in range(self.first_epoch, self.epochs):
            # reversed (generative): the targets are this party's own, drawn in the seeded order
            # every process draws alike, the i-th feature of the epoch being the i-th batch's
            own = iter([y for _, y in self.parts.train_batches(epoch)]) if self.reversed else None
            while True:
                msg, received = await arrivals.get()
                if "end" in msg:
                    break
                if "change" in msg:
                    await self.migrate(ctx, int(msg["change"][0]))
                elif "probe" in msg:
                    ctx.send(self.peer, "stamps", stamps(PROBE_REPLY, received, ctx.now()))
                else:
                    y = next(own) if own is not None else msg["y"]
                    if own is not None and not self.numerics:
                        y = torch.empty(y.shape, dtype=y.dtype, device="meta")
                    await self.train_on(ctx, epoch, msg["feature"] if own is not None else msg["x"], y, received)
            await ctx.end_epoch(epoch)
        await listener
        ctx.send(self.peer, "stamps", stamps(STOP, 0.0, 0.0))

    async def listen(self, ctx, arrivals: asyncio.Queue) -> None:
        """The code's receiver: always waiting, so a message's arrival time is when it wakes."""
        left = self.epochs - self.first_epoch
        while left:
            msg = await ctx.recv(self.peer, "act")
            arrivals.put_nowait((msg, ctx.now()))
            left -= "end" in msg

    async def train_on(self, ctx, epoch: int, a, y, received: float) -> None:
        st, t = self.stage, self.it
        out = await ctx.compute(st.fwd_work(a.shape[0]), st.forward, a, t, y, 1.0 / a.shape[0], iteration=t)
        if self.numerics:
            ctx.report_train(*out)
        g = await ctx.compute(st.bwd_work(a.shape[0]), st.backward, t, iteration=t)
        ctx.send(self.peer, "grad", g, iteration=t)  # P4 starts as soon as the gradient exists
        ctx.send(self.peer, "stamps", stamps(GRADIENT, received, ctx.now()), iteration=t)
        await ctx.compute(st.step_work(), st.step, iteration=t)
        self.it += 1
        ctx.iteration_done(epoch, self.it, int(a.shape[0]))

    async def migrate(self, ctx, new_cut: int) -> None:
        if new_cut > self.cut:  # blocks old+1..new_cut go down to the edge
            self.send_units(ctx, range(self.cut, new_cut))
        else:
            await self.take_units(ctx)
        self.move_cut(new_cut)
