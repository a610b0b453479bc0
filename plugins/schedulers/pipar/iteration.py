"""One PiPar iteration, as programs the roles run: the device side (Alg. 1), the server side
(Alg. 2) and FL's whole-model iteration. Also run alone by the exhaustive search's trials
(pipar.search), so they live apart from the roles, which hold the planner's state."""

from __future__ import annotations

import torch

from framework.stage import Stage

SERVER = "server"  # the device the server side runs on (its roles: srv<k>, server, fed)


async def split_iteration(ctx, st: Stage, server_role: str, it: int, xs, ys, numerics: bool) -> None:
    """Alg. 1, one iteration on the device: N forwards, each activation uploaded with its labels
    as soon as it exists; then the N backwards in order as the gradients come back; one step."""
    for n, (x, y) in enumerate(zip(xs, ys)):
        a = await ctx.compute(st.fwd_work(len(x)), st.forward, x, n, iteration=it, microbatch=n)
        y = y if numerics else torch.empty(y.shape, dtype=y.dtype, device="meta")
        ctx.send(server_role, "act", {"x": a, "y": y}, iteration=it, microbatch=n)
    for n, x in enumerate(xs):
        g = await ctx.recv(server_role, "grad")
        await ctx.compute(st.bwd_work(len(x)), st.backward, n, g, iteration=it, microbatch=n)
    await ctx.compute(st.step_work(), st.step, iteration=it)


async def serve_iteration(ctx, st: Stage, device_role: str, n_mb: int, loss_scale: float, it: int, numerics: bool) -> None:
    """Alg. 2, one iteration on the server: per micro-batch as it arrives, forward, loss (scaled
    by 1/(N B'), so the N gradients sum to the mini-batch mean), backward, gradient back; one
    step after the N-th."""
    for n in range(n_mb):
        msg = await ctx.recv(device_role, "act")
        a, y = msg["x"], msg["y"]
        out = await ctx.compute(st.fwd_work(a.shape[0]), st.forward, a, n, y, loss_scale, iteration=it, microbatch=n)
        if numerics:
            ctx.report_train(*out)
        g = await ctx.compute(st.bwd_work(a.shape[0]), st.backward, n, iteration=it, microbatch=n)
        ctx.send(device_role, "grad", g, iteration=it, microbatch=n)
    await ctx.compute(st.step_work(), st.step, iteration=it)


async def local_iteration(ctx, st: Stage, it: int, xs, ys, numerics: bool) -> None:
    """FL: forward, loss, backward and step of the whole model on the device."""
    total = sum(len(y) for y in ys)
    for n, (x, y) in enumerate(zip(xs, ys)):
        out = await ctx.compute(st.fwd_work(len(x)), st.forward, x, n, y, 1.0 / total, iteration=it, microbatch=n)
        if numerics:
            ctx.report_train(*out)
        await ctx.compute(st.bwd_work(len(x)), st.backward, n, iteration=it, microbatch=n)
    await ctx.compute(st.step_work(), st.step, iteration=it)
