"""A pipeline stage: its spec (what the scheduler decided for it) and the role that runs it.

Stage s receives activations from stage s-1 and sends its own to s+1, and the reverse for
gradients, in the order its program says (framework.pipeline.schedule). Everything it reads of
the plan and of `scheduler.*` is in its `StageSpec`, made on the coordinator and shipped as
JSON; the rest comes from its process's parts (framework.scheduler.SchedulerContext).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from framework.data import split_microbatches
from framework.pipeline import repartition as rp
from framework.pipeline.cost import PipelinePlanner
from framework.pipeline.epoch_end import EpochEndSpec
from framework.pipeline.plan import Bounds
from framework.pipeline.schedule import Action, Schedule
from framework.scheduler import Role, SchedulerContext
from framework.specs import RoleSpec
from framework.stage import Stage


@dataclass(frozen=True)
class StageSpec(RoleSpec):
    stage: int  # this stage's index s
    roles: tuple[str, ...]  # every stage's role, in pipeline order
    devices: tuple[str, ...]  # every stage's device
    bounds: Bounds  # every stage's units at the start
    flush_per: str  # "iteration": a flush per mini-batch, split into micro-batches; "epoch": asynchronous, drained at the epoch's end
    microbatches: int  # micro-batches per mini-batch (a short last batch has fewer)
    mb_size: int  # samples per micro-batch, as the planner prices them
    stash: bool  # weight stashing (PipeDream)
    partition: str | list[int]  # scheduler.partition: what a re-plan cuts with
    repartitions: dict[int, Bounds]  # scheduler.repartition: epoch -> every stage's units from then on
    schedule: Schedule  # every stage's program per flush size (this stage runs its own)
    epoch_end: EpochEndSpec | None = None  # what every stage does between epochs (framework.pipeline.epoch_end)


class StageRole(Role):
    """Stage s: its units of the model, its optimizer, the flush interpreter."""

    def __init__(self, spec: StageSpec, parts: SchedulerContext):
        self.spec = spec
        self.parts = parts
        self.index = spec.stage
        self.device = spec.device
        self.name = spec.role
        self.roles, self.devices = spec.roles, spec.devices
        self.bounds = list(spec.bounds)
        self.programs: dict[int, list[Action]] = {n: spec.schedule.program(spec.stage, n) for n in spec.schedule.programs[spec.stage]}
        self.stage = self._new_stage(*self.bounds[self.index])
        self.peak_inflight = 0
        self.staleness: list[int] = []
        self.it_global = 0  # mini-batches this stage has run, over all epochs
        self.busy_s, self.batches = 0.0, 0  # this epoch's forward + backward seconds and mini-batches (what an epoch-end policy may report)
        self.epoch_end = spec.epoch_end.build() if spec.epoch_end is not None else None

    @cached_property
    def planner(self) -> PipelinePlanner:
        """This stage's own planner (an epoch-end policy may re-plan with it), pricing with this
        process's predictor and cluster."""
        sp = self.spec
        return PipelinePlanner(self.parts, partition=sp.partition, mb_size=sp.mb_size, microbatches=sp.microbatches, flush_per=sp.flush_per, schedule=sp.schedule)

    def _new_stage(self, a: int, b: int) -> Stage:
        parts = self.parts
        return Stage(parts.model, a, b, parts.optimizer, numerics=parts.numerics, stash=self.spec.stash)

    def program(self, n: int) -> list[Action]:
        """This stage's actions in a flush of n items."""
        try:
            return self.programs[n]
        except KeyError:
            raise ValueError(f"{self.name} has no program for a flush of {n} items (the scheduler computed it for {sorted(self.programs)})") from None

    def state(self) -> dict:
        """The weights this stage owns, by global unit index (they survive a repartition)."""
        st = self.stage
        return rp.pack_units(self.parts.model, None, list(range(st.start, st.stop)), True)

    def load_state(self, state: dict) -> None:
        rp.unpack_units(self.parts.model, state, True)

    def stats(self) -> dict:
        own = {"peak_inflight": max(self.peak_inflight, self.stage.peak_inflight), "staleness": self.staleness + self.stage.staleness}
        return own | (self.epoch_end.stats() if self.epoch_end is not None else {})

    def checkpoint(self, bag, prefix: str) -> dict:
        own = {"stage": self.stage.checkpoint(bag, f"{prefix}.stage"), "bounds": [list(b) for b in self.bounds], "it_global": self.it_global, "peak_inflight": self.peak_inflight,
               "staleness": self.staleness}
        return own | (self.epoch_end.checkpoint() if self.epoch_end is not None else {})

    def restore(self, bag, desc: dict) -> None:
        bounds = [tuple(b) for b in desc["bounds"]]
        if bounds != self.bounds:  # a repartition had moved units before the checkpoint
            self.bounds = bounds
            self.stage = self._new_stage(*bounds[self.index])
        self.stage.restore(bag, desc["stage"])
        self.it_global, self.peak_inflight, self.staleness = int(desc["it_global"]), int(desc["peak_inflight"]), list(desc["staleness"])
        if self.epoch_end is not None:
            self.epoch_end.restore(self, desc)

    async def repartition(self, ctx, new_bounds, epoch: int) -> None:
        """Hand the units this stage loses to their new stages and take the ones it gains."""
        s, model, numerics = self.index, self.parts.model, self.parts.numerics
        moved = rp.moves(self.bounds, new_bounds)
        old = self.stage
        for (src, dst), units in moved.items():
            if src == s:
                ctx.send(self.roles[dst], "units", rp.pack_units(model, old.optimizer, units, numerics), iteration=epoch)
        carried = dict(old.optimizer.state) if old.optimizer is not None else {}
        for (src, dst), units in moved.items():
            if dst == s:
                carried.update(rp.unpack_units(model, await ctx.recv(self.roles[src], "units"), numerics))
        self.peak_inflight = max(self.peak_inflight, old.peak_inflight)
        self.staleness += old.staleness
        self.bounds = list(new_bounds)
        self.stage = self._new_stage(*new_bounds[s])
        self.stage.version = old.version
        if self.stage.optimizer is not None:
            for p in self.stage.module.parameters():
                if p in carried:
                    self.stage.optimizer.state[p] = carried[p]

    async def run(self, ctx) -> None:
        spec, s = self.spec, self.index
        S = len(self.bounds)
        epochs = self.parts.cfg.train.epochs
        prev = self.roles[s - 1] if s > 0 else None
        nxt = self.roles[s + 1] if s < S - 1 else None
        numerics = self.parts.numerics
        per_epoch = spec.flush_per == "epoch"  # else a flush per iteration

        async def run_flush(items, group, epoch, first_it):
            """items[m] = (x or None, y or None, iteration, loss_scale)."""
            stage = self.stage
            sizes = {}
            last_it = first_it  # an asynchronous STEP belongs to the mini-batch its backward just finished
            for a in self.program(len(items)):
                x, y, it, scale = items[a.mb] if a.op != "STEP" else (None, None, last_it if per_epoch else first_it, 1.0)
                if a.op == "F":
                    inp = x if prev is None else await ctx.recv(prev, "act")
                    sizes[a.mb] = inp.shape[0]
                    c0 = ctx.compute_s
                    out = await ctx.compute(stage.fwd_work(sizes[a.mb]), stage.forward, inp, a.mb, y, scale, iteration=it, microbatch=a.mb, group=group)
                    self.busy_s += ctx.compute_s - c0
                    if nxt is not None:
                        ctx.send(nxt, "act", out, iteration=it, microbatch=a.mb, moved=True)  # the stage's output: nothing here keeps it
                    elif numerics:
                        ctx.report_train(*out)
                elif a.op == "B":
                    g = None if nxt is None else await ctx.recv(nxt, "grad")
                    c0 = ctx.compute_s
                    gin = await ctx.compute(stage.bwd_work(sizes[a.mb]), stage.backward, a.mb, g, iteration=it, microbatch=a.mb, group=group)
                    self.busy_s += ctx.compute_s - c0
                    last_it = it
                    if prev is not None:
                        ctx.send(prev, "grad", gin, iteration=it, microbatch=a.mb, moved=True)
                    if per_epoch and s == 0:
                        ctx.iteration_done(epoch, it, sizes[a.mb])
                else:
                    await ctx.compute(stage.step_work(), stage.step, iteration=it, group=-1)

        for epoch in range(self.first_epoch, epochs):
            if epoch in spec.repartitions:
                await self.repartition(ctx, spec.repartitions[epoch], epoch)
            batches = self.parts.train_batches(epoch)
            if not per_epoch:
                for x, y in batches:
                    m = min(spec.microbatches, x.shape[0])
                    xs = split_microbatches(x, m) if prev is None else [None] * m
                    ys = split_microbatches(y, m) if nxt is None else [None] * m
                    scale = 1.0 / x.shape[0]
                    it = self.it_global
                    items = [(xs[k], ys[k], it, scale) for k in range(m)]
                    await run_flush(items, it, epoch, it)
                    if s == 0:
                        ctx.iteration_done(epoch, it, x.shape[0])
                    self.it_global += 1
                    self.batches += 1
            else:
                items = []
                for x, y in batches:
                    items.append((x if prev is None else None, y if nxt is None else None, self.it_global, 1.0 / x.shape[0]))
                    self.it_global += 1
                await run_flush(items, epoch, epoch, items[0][2] if items else self.it_global)
                self.batches += len(items)
            if self.epoch_end is not None and epoch + 1 < epochs:
                await self.epoch_end.at_epoch_end(self, ctx, epoch)
            self.busy_s, self.batches = 0.0, 0
            await ctx.end_epoch(epoch)
