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
from framework.errors import ConfigError
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
        cluster_devices = [f"dev{i}" for i in range(job.cluster.cfg.num_devices)]  # not extra named devices
        num_stages = cfg.stages if cfg.stages is not None else job.cluster.cfg.num_devices
        num_stages = self.num_stages_override(num_stages)
        if num_stages > len(cluster_devices):
            raise ConfigError("scheduler.stages", f"{num_stages} stages need {num_stages} devices but the cluster has {len(cluster_devices)}; set cluster.num_devices={num_stages}")
        self.devices = cluster_devices[:num_stages]
        self.microbatches = self.num_microbatches()
        mb_size = max(1, job.cfg.train.batch_size // self.microbatches)
        self.bounds = partition(cfg.partition, [job.cluster.device(d) for d in self.devices], len(job.model), job.model.name, job.predictor, mb_size)
        self.roles_ = [f"stage{s}" for s in range(num_stages)]
        self.memory = [self.memory_estimate(s, mb_size) for s in range(num_stages)]
        self.check_memory()
        self.stages = [Stage(job.model, a, b, job.cfg.train, numerics=job.numerics, stash=self.stash) for a, b in self.bounds]

    # -- hooks for subclasses -----------------------------------------------------------------

    def num_stages_override(self, num_stages: int) -> int:
        return num_stages

    def num_microbatches(self) -> int:
        return int(self.cfg.microbatches)

    def actions(self, stage: int, num_stages: int, num_mb: int) -> list[Action]:
        raise NotImplementedError

    # -- memory -------------------------------------------------------------------------------

    def memory_estimate(self, s: int, mb_size: int) -> dict:
        """Bytes stage s holds at its peak: weights, gradients and optimizer state, plus the
        activations of the micro-batches its schedule keeps alive at once (read off the action
        list) and, with weight stashing, one weight copy per batch in flight."""
        job = self.job
        a, b = self.bounds[s]
        infos = job.model.infos[a:b]
        itemsize = 8 if job.cfg.runtime.dtype == "float64" else 4
        param_bytes = sum(i.params for i in infos) * itemsize
        states = {"sgd": 3 if job.cfg.train.momentum else 2, "adam": 4}.get(job.cfg.train.optimizer, 3)
        # an asynchronous schedule's peak shows within its first S items (the warm-up)
        items = self.microbatches if self.flush_per == "iteration" else len(self.bounds)
        live = peak = 0
        for act in self.actions(s, len(self.bounds), items):
            live += {"F": 1, "B": -1}.get(act.op, 0)
            peak = max(peak, live)
        per_mb = mb_size * sum(i.out_numel for i in infos) * itemsize
        stash = param_bytes * peak if self.stash else 0
        total = param_bytes * states + per_mb * peak + stash
        return {"bytes": total, "weights_and_optimizer": param_bytes * states, "activations": per_mb * peak, "stashed_weights": stash, "microbatches_alive": peak}

    def check_memory(self) -> None:
        for s, (dev_name, est) in enumerate(zip(self.devices, self.memory)):
            cap = self.job.cluster.device(dev_name).cfg.memory_bytes
            if cap is not None and est["bytes"] > cap:
                a, b = self.bounds[s]
                mib = 1 << 20
                raise ConfigError(
                    f"cluster.devices.{dev_name}.memory_bytes",
                    f"stage{s} (units {a}..{b - 1}) needs about {est['bytes'] / mib:.1f} MiB (weights, gradients and optimizer state "
                    f"{est['weights_and_optimizer'] / mib:.1f} MiB, activations of {est['microbatches_alive']} micro-batches "
                    f"{est['activations'] / mib:.1f} MiB, stashed weights {est['stashed_weights'] / mib:.1f} MiB) but {dev_name} has "
                    f"{cap / mib:.1f} MiB; use more stages, a schedule with fewer micro-batches alive (1f1b) or a smaller batch",
                )

    # -- what the job asks of a scheduler --------------------------------------------------

    def plan(self) -> dict:
        return {
            "scheduler": self.cfg.name,
            "stages": [
                {"role": r, "device": d, "units": [a, b], "unit_names": self.job.model.unit_names[a:b], "memory_bytes": mem}
                for r, d, (a, b), mem in zip(self.roles_, self.devices, self.bounds, self.memory)
            ],
            "microbatches": self.microbatches,
            "flush_per": self.flush_per,
            "weight_stashing": self.stash,
        }

    def role_state(self, role: str) -> dict:
        """The weights (and buffers) a role owns: what real runtimes ship between processes."""
        return {k: v.detach().clone() for k, v in self.stages[self.roles_.index(role)].module.state_dict().items()}

    def load_role_state(self, role: str, state: dict) -> None:
        self.stages[self.roles_.index(role)].module.load_state_dict(state)

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
