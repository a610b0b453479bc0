"""Pipeline schedules as readable programs of actions per stage.

A schedule says, for stage s of S and M micro-batches in one flush, the ordered actions
that stage performs: `F(m)` forward of micro-batch m, `B(m)` backward of it, `STEP` the
optimizer. `PipelineScheduler` turns that list into one role program per stage that
receives activations from stage s-1, sends them to s+1, and the reverse for gradients. A
classic schedule plugin (GPipe, 1F1B, PipeDream) is then only its action list, as in
`torch.distributed.pipelining.schedules`.

`scheduler.repartition: [[epoch, cuts], ...]` moves units between stages at the start of an
epoch (framework.repartition): weights and optimizer state travel stage to stage as messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import copy

from torch import nn

from framework import pipeline_cost
from framework import replan
from framework import repartition as rp
from framework.cluster import Work
from framework.data import split_microbatches
from framework.errors import ConfigError
from framework.partition import partition
from framework.scheduler import Role, Scheduler
from framework.specs import RoleSpec
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


def one_f_one_b(stage: int, num_stages: int, num_mb: int, *, step_after_backward: bool = False, in_flight: int | None = None) -> list[Action]:
    """PipeDream's 1F1B order: warm-up forwards, alternate one forward and one backward,
    then drain the backwards. Stage s holds at most S - s micro-batches of activations.

    `in_flight` D (default S): stage 0 admits D micro-batches before its first backward, and
    stage s warms up with ceil((D - 1)(S - 1 - s) / (S - 1)) forwards, so the warm-ups fall
    from D - 1 to 0 across the stages (never rising: a stage's backward would then wait on
    forwards its upstream holds back). D = 2S - 1 counts each link as a stage of its own, as
    PipeDream's planner treats communication: the round trip of S computations and 2(S - 1)
    transfers then stays full."""
    depth = num_stages if in_flight is None else in_flight
    warmup = min(-(-(depth - 1) * (num_stages - 1 - stage) // max(num_stages - 1, 1)), num_mb)
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


class PipelineScheduler(Scheduler):
    """Stages on devices dev0..dev{S-1}; each iteration runs `actions(s, S, M)` per stage.

    Subclasses set:
    - `actions(stage, num_stages, num_mb)`: the per-stage program of one flush;
    - `flush_per = "iteration"` (a flush per mini-batch, split into micro-batches) or
      `"epoch"` (asynchronous: each mini-batch is one item, the pipeline drains at epoch end);
    - `stash`: weight stashing on the stages (PipeDream);
    - `min_stages`: the fewest stages it runs on (2: one stage is the local loop, `local`'s 1).
    """

    flush_per = "iteration"
    stash = False
    min_stages = 2  # a pipeline of one stage is the local loop: scheduler=local says so

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.microbatches = self.num_microbatches()
        self.mb_size = max(1, int(ctx.cfg.train.batch_size) // self.microbatches)
        self._plan = ctx.plan if ctx.plan is not None else self._make_plan()
        self.bounds = [tuple(st["units"]) for st in self._plan["stages"]]
        self.devices = [st["device"] for st in self._plan["stages"]]
        self.roles_ = [st["role"] for st in self._plan["stages"]]
        self.memory = [st["memory_bytes"] for st in self._plan["stages"]]
        self.repartitions = {int(r["epoch"]): [tuple(b) for b in r["bounds"]] for r in self._plan.get("repartition", [])}
        self.replan_epsilon = cfg.get("replan_epsilon")
        replan.check(self)
        self._eval = None

    # -- hooks for subclasses -----------------------------------------------------------------

    def num_stages_override(self, num_stages: int) -> int:
        return num_stages

    def num_microbatches(self) -> int:
        return int(self.cfg.microbatches)

    def actions(self, stage: int, num_stages: int, num_mb: int) -> list[Action]:
        raise NotImplementedError

    # -- the plan -----------------------------------------------------------------------------

    def _make_plan(self) -> dict:
        ctx = self.ctx
        cluster_devices = [f"dev{i}" for i in range(ctx.cluster.cfg.num_devices)]  # not extra named devices
        num_stages = self.cfg.stages if self.cfg.stages is not None else ctx.cluster.cfg.num_devices
        num_stages = self.num_stages_override(num_stages)
        if num_stages < self.min_stages:
            key, more = ("scheduler.stages", "scheduler.stages=2") if self.cfg.stages is not None else ("cluster.num_devices", "cluster.num_devices=2")
            raise ConfigError(key, f"scheduler={self.cfg.name} pipelines a model over at least {self.min_stages} stages, got {num_stages}; one stage is scheduler=local (the same micro-batches, no pipeline), or use more stages ({more})")
        if num_stages > len(cluster_devices):
            raise ConfigError("scheduler.stages", f"{num_stages} stages need {num_stages} devices but the cluster has {len(cluster_devices)}; set cluster.num_devices={num_stages}")
        devices = cluster_devices[:num_stages]
        dev_objs = [ctx.cluster.device(d) for d in devices]
        link_cost = self.boundary_seconds(devices)
        bounds = self.plan_bounds(devices)
        memory = [self.memory_estimate(s, bounds) for s in range(num_stages)]
        self.check_memory(devices, bounds, memory)
        later = []
        for i, entry in enumerate(self.cfg.get("repartition") or []):
            key = f"scheduler.repartition[{i}]"
            if len(entry) != 2 or int(entry[0]) < 1:
                raise ConfigError(key, f"{list(entry)} is not [epoch >= 1, cuts]")
            try:
                new = partition(entry[1], dev_objs, len(ctx.model), ctx.model.name, ctx.predictor, self.mb_size, link_cost)
            except ConfigError as e:
                raise ConfigError(key, e.message) from None
            self.check_memory(devices, new, [self.memory_estimate(s, new) for s in range(num_stages)])
            later.append({"epoch": int(entry[0]), "bounds": [list(b) for b in new]})
        def compute_s(s, a, b):
            return sum(ctx.predictor.predict(dev_objs[s], Work(k, a, b, self.mb_size)) for k in ("fwd", "bwd"))

        return {
            "scheduler": self.cfg.name,
            "partition": self.cfg.partition if isinstance(self.cfg.partition, str) else "cuts",
            "stages": [
                {"role": f"stage{s}", "device": d, "units": [a, b], "unit_names": ctx.model.unit_names[a:b], "memory_bytes": mem,
                 "predicted_compute_s": compute_s(s, a, b), "predicted_link_s": link_cost(s, b) if s < num_stages - 1 else 0.0}
                for s, (d, (a, b), mem) in enumerate(zip(devices, bounds, memory))
            ],
            "microbatches": self.microbatches,
            "predicted_epoch_s": self.predicted_epoch_s(devices, bounds),
            "flush_per": self.flush_per,
            "weight_stashing": self.stash,
            "repartition": sorted(later, key=lambda r: r["epoch"]),
        }

    def plan(self) -> dict:
        return self._plan

    def planned_epoch_s(self) -> float:
        return float(self._plan["predicted_epoch_s"])

    def plan_bounds(self, devices: list[str]) -> list[tuple[int, int]]:
        """The partitioner's cuts over `devices`, with the predictor as it stands (also when a
        run re-plans, framework/replan.py)."""
        if self.cfg.partition == "search":
            return self.searched_bounds(devices)
        ctx = self.ctx
        dev_objs = [ctx.cluster.device(d) for d in devices]
        return partition(self.cfg.partition, dev_objs, len(ctx.model), ctx.model.name, ctx.predictor, self.mb_size, self.boundary_seconds(devices))

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        out = super().report(total, timeline, role_stats, dropouts)
        if self.replan_epsilon is not None:  # stage 0's decisions, with the plans they chose
            events = [e for st in role_stats.values() for e in st.get("replans", [])]
            out["summary"]["replans"] = events
            out["metrics"]["pipe/replans"] = len(events)
        return out

    # -- what a plan costs (framework.pipeline_cost) -------------------------------------------

    def predicted_epoch_s(self, devices: list[str], bounds) -> float:
        return pipeline_cost.predicted_epoch_s(self, devices, bounds)

    def searched_bounds(self, devices: list[str]) -> list[tuple[int, int]]:
        return pipeline_cost.searched_bounds(self, devices)

    def boundary_seconds(self, devices: list[str]):
        return pipeline_cost.boundary_seconds(self, devices)

    def memory_estimate(self, s: int, bounds) -> dict:
        """Bytes stage s holds at its peak: weights, gradients and optimizer state, plus the
        activations of the micro-batches its schedule keeps alive at once (read off the action
        list) and, with weight stashing, one weight copy per batch in flight."""
        ctx = self.ctx
        a, b = bounds[s]
        infos = ctx.model.infos[a:b]
        itemsize = 8 if ctx.cfg.runtime.dtype == "float64" else 4
        param_bytes = sum(i.params for i in infos) * itemsize
        states = {"sgd": 3 if ctx.cfg.train.momentum else 2, "adam": 4}.get(ctx.cfg.train.optimizer, 3)
        # an asynchronous schedule's peak shows within its first S items (the warm-up)
        items = self.microbatches if self.flush_per == "iteration" else len(bounds)
        live = peak = 0
        for act in self.actions(s, len(bounds), items):
            live += {"F": 1, "B": -1}.get(act.op, 0)
            peak = max(peak, live)
        per_mb = self.mb_size * sum(i.out_numel for i in infos) * itemsize
        stash = param_bytes * peak if self.stash else 0
        total = param_bytes * states + per_mb * peak + stash
        return {"bytes": total, "weights_and_optimizer": param_bytes * states, "activations": per_mb * peak, "stashed_weights": stash, "microbatches_alive": peak}

    def check_memory(self, devices, bounds, memory) -> None:
        for s, (dev_name, est) in enumerate(zip(devices, memory)):
            cap = self.ctx.cluster.device(dev_name).cfg.memory_bytes
            if cap is not None and est["bytes"] > cap:
                a, b = bounds[s]
                mib = 1 << 20
                raise ConfigError(
                    f"cluster.devices.{dev_name}.memory_bytes",
                    f"stage{s} (units {a}..{b - 1}) needs about {est['bytes'] / mib:.1f} MiB (weights, gradients and optimizer state "
                    f"{est['weights_and_optimizer'] / mib:.1f} MiB, activations of {est['microbatches_alive']} micro-batches "
                    f"{est['activations'] / mib:.1f} MiB, stashed weights {est['stashed_weights'] / mib:.1f} MiB) but {dev_name} has "
                    f"{cap / mib:.1f} MiB; use more stages, a schedule with fewer micro-batches alive (1f1b) or a smaller batch",
                )

    # -- what the runtimes ask of a scheduler -----------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return dict(zip(self.roles_, self.devices))

    def role_spec(self, role: str) -> RoleSpec:
        return RoleSpec(role, self.role_devices()[role])  # issue 45: the stage's slice of the plan moves here

    def role_from_spec(self, role: str, spec: dict) -> "StageRole":
        return StageRole(self, self.roles_.index(role))

    def eval_model(self, states: dict[str, dict]) -> nn.Module:
        """The whole model with every stage's reported units loaded (stages may have moved them)."""
        if self._eval is None:
            self._eval = copy.deepcopy(self.ctx.model)
        for state in states.values():
            rp.unpack_units(self._eval, state, True)
        return self._eval


class StageRole(Role):
    """Stage s: its units of the model, its optimizer, the flush interpreter."""

    def __init__(self, sched: PipelineScheduler, s: int):
        self.sched = sched
        self.s = s
        self.device = sched.devices[s]
        self.name = sched.roles_[s]
        self.bounds = list(sched.bounds)
        self.stage = self._new_stage(*self.bounds[s])
        self.peak_inflight = 0
        self.staleness: list[int] = []
        self.it_global = 0  # mini-batches this stage has run, over all epochs
        self.busy_s, self.batches = 0.0, 0  # this epoch's forward + backward seconds and mini-batches (re-planning's report)
        self.replans: list[dict] = []  # stage 0's re-planning decisions (framework/replan.py)

    def _new_stage(self, a: int, b: int) -> Stage:
        ctx = self.sched.ctx
        return Stage(ctx.model, a, b, ctx.optimizer, numerics=ctx.numerics, stash=self.sched.stash)

    def state(self) -> dict:
        """The weights this stage owns, by global unit index (they survive a repartition)."""
        st = self.stage
        return rp.pack_units(self.sched.ctx.model, None, list(range(st.start, st.stop)), True)

    def load_state(self, state: dict) -> None:
        rp.unpack_units(self.sched.ctx.model, state, True)

    def stats(self) -> dict:
        return {"peak_inflight": max(self.peak_inflight, self.stage.peak_inflight), "staleness": self.staleness + self.stage.staleness, "replans": self.replans}

    def checkpoint(self, bag, prefix: str) -> dict:
        return {"stage": self.stage.checkpoint(bag, f"{prefix}.stage"), "bounds": [list(b) for b in self.bounds], "it_global": self.it_global, "peak_inflight": self.peak_inflight, "staleness": self.staleness,
                "replans": self.replans}

    def restore(self, bag, desc: dict) -> None:
        bounds = [tuple(b) for b in desc["bounds"]]
        if bounds != self.bounds:  # a repartition had moved units before the checkpoint
            self.bounds = bounds
            self.stage = self._new_stage(*bounds[self.s])
        self.stage.restore(bag, desc["stage"])
        self.it_global, self.peak_inflight, self.staleness = int(desc["it_global"]), int(desc["peak_inflight"]), list(desc["staleness"])
        self.replans = list(desc.get("replans", []))
        if self.s == 0:  # the central node's predictor: what the reports had taught it
            replan.restore(self.sched, self.replans)

    async def repartition(self, ctx, new_bounds, epoch: int) -> None:
        """Hand the units this stage loses to their new stages and take the ones it gains."""
        sched, s = self.sched, self.s
        model, numerics = sched.ctx.model, sched.ctx.numerics
        moved = rp.moves(self.bounds, new_bounds)
        old = self.stage
        for (src, dst), units in moved.items():
            if src == s:
                ctx.send(sched.roles_[dst], "units", rp.pack_units(model, old.optimizer, units, numerics), iteration=epoch)
        carried = dict(old.optimizer.state) if old.optimizer is not None else {}
        for (src, dst), units in moved.items():
            if dst == s:
                carried.update(rp.unpack_units(model, await ctx.recv(sched.roles_[src], "units"), numerics))
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
        sched, s = self.sched, self.s
        S = len(self.bounds)
        cfg = sched.ctx.cfg
        prev = sched.roles_[s - 1] if s > 0 else None
        nxt = sched.roles_[s + 1] if s < S - 1 else None
        numerics = sched.ctx.numerics

        async def run_flush(items, group, epoch, first_it):
            """items[m] = (x or None, y or None, iteration, loss_scale)."""
            stage = self.stage
            sizes = {}
            last_it = first_it  # an asynchronous STEP belongs to the mini-batch its backward just finished
            for a in sched.actions(s, S, len(items)):
                x, y, it, scale = items[a.mb] if a.op != "STEP" else (None, None, last_it if sched.flush_per == "epoch" else first_it, 1.0)
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
                    if sched.flush_per == "epoch" and s == 0:
                        ctx.iteration_done(epoch, it, sizes[a.mb])
                else:
                    await ctx.compute(stage.step_work(), stage.step, iteration=it, group=-1)

        for epoch in range(self.first_epoch, cfg.train.epochs):
            if epoch in sched.repartitions:
                await self.repartition(ctx, sched.repartitions[epoch], epoch)
            batches = sched.ctx.train_batches(epoch)
            if sched.flush_per == "iteration":
                for x, y in batches:
                    m = min(sched.microbatches, x.shape[0])
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
            if sched.replan_epsilon is not None and epoch + 1 < cfg.train.epochs:
                await replan.exchange(self, ctx, epoch)
            self.busy_s, self.batches = 0.0, 0
            await ctx.end_epoch(epoch)
