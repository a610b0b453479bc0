"""PiPar's exhaustive (P, N) search, the paper's "Opt" reference (Tables VII/VIII).

For every candidate the search trains one iteration and keeps the fastest epoch. Here each
trial is one *timing-only* PiPar iteration of one device-server pair on a fresh virtual clock,
through the same role code, links and wire format as the run itself, so its time is what the run
would take. The pair's server replica runs on the share of the server that one of the run's K
replicas gets (C / K of a core once K > C: identical devices stay in step, so this is exact for
them), as on the testbed, where all K devices train the trial iteration at once. Its cost
(`search_s`) is the sum of the trial iterations, what running them one after another on the
testbed would cost.
"""

from __future__ import annotations

import torch

from framework.runtime.shared_processor import SharedProcessor
from framework.runtime.sim import SimRuntime
from framework.scheduler import ProgramRole
from framework.stage import Stage
from plugins.schedulers.pipar.iteration import SERVER, serve_iteration, split_iteration


def trial_iteration(planner, k: int, P: int, N: int) -> float:
    """Virtual seconds of one timing-only PiPar iteration of device k with (P, N), alone.

    `planner`: a pipar.planner.Planner (or anything with its ctx, devices, B and Q)."""
    ctx = planner.ctx
    cl = ctx.cluster
    dev = planner.devices[k]
    links = [cl.link(dev, SERVER), cl.link(SERVER, dev)]
    saved = [(ln.channel.free_at, ln.rng.getstate()) for ln in links]
    b = max(1, planner.B // N)
    train = ctx.cfg.train
    dev_st = Stage(ctx.model, 0, P, train, numerics=False)
    srv_st = Stage(ctx.model, P, planner.Q, train, numerics=False)
    x = torch.empty((b, *ctx.model.input_shape), dtype=ctx.dtype, device="meta")
    y = torch.empty((b,), dtype=torch.int64, device="meta")
    xs, ys = [x] * N, [y] * N

    async def device(ctx):
        await split_iteration(ctx, dev_st, "srv", 0, xs, ys, False)

    async def server(ctx):
        await serve_iteration(ctx, srv_st, "dev", N, 1.0 / (N * b), 0, False)

    try:
        for ln in links:
            ln.channel.free_at = 0.0
        runtime = SimRuntime(ctx.cfg.runtime, cl, ctx.new_compressor())
        share = planner.server_share()
        if share > 1.0:  # the pair's replica gets what one of K gets of the server's cores
            runtime.device_queues[SERVER] = SharedProcessor(1.0 / share)
        return runtime.run_roles({"dev": ProgramRole(dev, device), "srv": ProgramRole(SERVER, server)})
    finally:
        for ln, (free_at, state) in zip(links, saved):
            ln.channel.free_at = free_at
            ln.rng.setstate(state)


def exhaustive(planner, k: int, p_range, n_values=None) -> tuple[dict, list[dict]]:
    """Every P in `p_range` x every N in 1..B (or `n_values`): one trial each. Returns (best,
    trials), best by estimated epoch = trial iteration x floor(|D_k| / (B' N)).

    `planner`: a pipar.planner.Planner."""
    n_samples = planner.shard_sizes[k]
    trials = []
    for P in p_range:
        for N in n_values or range(1, planner.B + 1):
            b = max(1, planner.B // N)
            iters = max(1, n_samples // (b * N))
            it_s = trial_iteration(planner, k, P, N)
            trials.append({"P": P, "N": N, "micro_batch": b, "iterations": iters, "iter_s": it_s, "epoch_s": it_s * iters})
    best = min(trials, key=lambda t: (t["epoch_s"], t["P"], t["N"]))
    return best, trials
