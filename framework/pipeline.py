"""Pipeline schedules as readable programs of actions per stage.

A schedule says, for stage s of S and M micro-batches in one flush, the ordered actions
that stage performs: `F(m)` forward of micro-batch m, `B(m)` backward of it, `STEP` the
optimizer. `PipelineScheduler` turns that list into one role program per stage that
receives activations from stage s-1, sends them to s+1, and the reverse for gradients. A
classic schedule plugin (GPipe, 1F1B, PipeDream) is then only its action list, as in
`torch.distributed.pipelining.schedules`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from framework.data import split_microbatches
from framework.partition import partition
from framework.runtime.base import RoleSpec
from framework.stage import Stage


@dataclass(frozen=True)
class Action:
    op: str  # "F", "B" or "STEP"
    mb: int = -1

    def __repr__(self) -> str:
        return self.op if self.op == "STEP" else f"{self.op}{self.mb}"


def F(m: int) -> Action:
    return Action("F", m)


def B(m: int) -> Action:
    return Action("B", m)


STEP = Action("STEP")


def one_f_one_b(stage: int, num_stages: int, num_mb: int, *, step_after_backward: bool = False) -> list[Action]:
    """PipeDream's 1F1B order: warm-up forwards, alternate one forward and one backward,
    then drain the backwards. Stage s holds at most S - s micro-batches of activations."""
    warmup = min(num_stages - stage - 1, num_mb)
    acts = [F(m) for m in range(warmup)]
    b = 0
    for m in range(warmup, num_mb):
        acts.append(F(m))
        acts.append(B(b))
        if step_after_backward:
            acts.append(STEP)
        b += 1
    for m in range(b, num_mb):
        acts.append(B(m))
        if step_after_backward:
            acts.append(STEP)
    return acts


class PipelineScheduler:
    """Stages on devices dev0..dev{S-1}; each iteration runs `actions(s, S, M)` per stage.

    Subclasses set:
    - `actions(stage, num_stages, num_mb)`: the per-stage program of one flush;
    - `flush_per = "iteration"` (a flush per mini-batch, split into micro-batches) or
      `"epoch"` (asynchronous: each mini-batch is one item, the pipeline drains at epoch end);
    - `stash`: weight stashing on the stages (PipeDream).
    """

    flush_per = "iteration"
    stash = False

    def __init__(self, cfg, job):
        self.cfg = cfg
        self.job = job
        cluster_devices = [n for n in job.cluster.names if n.startswith("dev")]
        num_stages = cfg.stages if cfg.stages is not None else job.cluster.cfg.num_devices
        num_stages = self.num_stages_override(num_stages)
        if num_stages > len(cluster_devices):
            from framework.errors import ConfigError

            raise ConfigError("scheduler.stages", f"{num_stages} stages need {num_stages} devices but the cluster has {len(cluster_devices)}; set cluster.num_devices={num_stages}")
        self.devices = cluster_devices[:num_stages]
        self.microbatches = self.num_microbatches()
        mb_size = max(1, job.cfg.train.batch_size // self.microbatches)
        self.bounds = partition(cfg.partition, [job.cluster.device(d) for d in self.devices], len(job.model), job.model.name, job.predictor, mb_size)
        self.roles_ = [f"stage{s}" for s in range(num_stages)]
        self.stages = [Stage(job.model, a, b, job.cfg.train, numerics=job.numerics, stash=self.stash) for a, b in self.bounds]

    # -- hooks for subclasses -----------------------------------------------------------------

    def num_stages_override(self, num_stages: int) -> int:
        return num_stages

    def num_microbatches(self) -> int:
        return int(self.cfg.microbatches)

    def actions(self, stage: int, num_stages: int, num_mb: int) -> list[Action]:
        raise NotImplementedError

    # -- what the job asks of a scheduler --------------------------------------------------

    def plan(self) -> dict:
        return {
            "scheduler": self.cfg.name,
            "stages": [{"role": r, "device": d, "units": [a, b], "unit_names": self.job.model.unit_names[a:b]} for r, d, (a, b) in zip(self.roles_, self.devices, self.bounds)],
            "microbatches": self.microbatches,
            "flush_per": self.flush_per,
            "weight_stashing": self.stash,
        }

    def eval_model(self) -> nn.Module:
        return nn.Sequential(*[st.module for st in self.stages])

    def stats(self) -> dict:
        staleness = [x for st in self.stages for x in st.staleness]
        return {
            "peak_inflight": {r: st.peak_inflight for r, st in zip(self.roles_, self.stages)},
            "staleness": sum(staleness) / len(staleness) if staleness else 0.0,
            "staleness_max": max(staleness, default=0),
        }

    def roles(self) -> dict[str, RoleSpec]:
        return {r: RoleSpec(d, self._program(s)) for s, (r, d) in enumerate(zip(self.roles_, self.devices))}

    # -- the interpreter ----------------------------------------------------------------------

    def _program(self, s: int):
        job = self.job
        S = len(self.stages)
        stage = self.stages[s]
        prev = self.roles_[s - 1] if s > 0 else None
        nxt = self.roles_[s + 1] if s < S - 1 else None

        async def run_flush(ctx, items, group, epoch, first_it):
            """items[m] = (x or None, y or None, iteration, loss_scale)."""
            sizes = {}
            for a in self.actions(s, S, len(items)):
                x, y, it, scale = items[a.mb] if a.op != "STEP" else (None, None, first_it, 1.0)
                if a.op == "F":
                    inp = x if prev is None else await ctx.recv(prev, "act")
                    sizes[a.mb] = inp.shape[0]
                    out = await ctx.compute(stage.fwd_work(sizes[a.mb]), stage.forward, inp, a.mb, y, scale, iteration=it, microbatch=a.mb, group=group)
                    if nxt is not None:
                        ctx.send(nxt, "act", out, iteration=it, microbatch=a.mb)
                    elif job.numerics:
                        ctx.report_train(*out)
                elif a.op == "B":
                    g = None if nxt is None else await ctx.recv(nxt, "grad")
                    gin = await ctx.compute(stage.bwd_work(sizes[a.mb]), stage.backward, a.mb, g, iteration=it, microbatch=a.mb, group=group)
                    if prev is not None:
                        ctx.send(prev, "grad", gin, iteration=it, microbatch=a.mb)
                    if self.flush_per == "epoch" and s == 0:
                        ctx.iteration_done(epoch, it, sizes[a.mb])
                else:
                    await ctx.compute(stage.step_work(), stage.step, iteration=it, group=-1)

        async def program(ctx):
            it_global = 0
            for epoch in range(job.cfg.train.epochs):
                batches = job.train_batches(epoch)
                if self.flush_per == "iteration":
                    for it, (x, y) in enumerate(batches):
                        m = min(self.microbatches, x.shape[0])
                        xs = split_microbatches(x, m) if prev is None else [None] * m
                        ys = split_microbatches(y, m) if nxt is None else [None] * m
                        scale = 1.0 / x.shape[0]
                        items = [(xs[k], ys[k], it_global, scale) for k in range(m)]
                        await run_flush(ctx, items, it_global, epoch, it_global)
                        if s == 0:
                            ctx.iteration_done(epoch, it_global, x.shape[0])
                        it_global += 1
                else:
                    items = []
                    for x, y in batches:
                        items.append((x if prev is None else None, y if nxt is None else None, it_global, 1.0 / x.shape[0]))
                        it_global += 1
                    await run_flush(ctx, items, epoch, epoch, items[0][2] if items else it_global)
                await ctx.end_epoch(epoch)

        return program
