"""AdaLearner's roles (plugins/schedulers/adalearner/scheduler.py): the group owner and the worker nodes.

- `GroupOwner` (go): the global model. Per global minibatch it takes the n gradients in the
  order they arrive (FIFO), sums them, steps, and answers the workers in that order: the fp32
  weights, or (1-bit) the sum quantized once more, which it also steps its own replica with. With
  n = 1 it trains alone on the whole minibatch.
- `Worker` (wn<i>): a replica of the whole model and its slice of every global minibatch; sends
  its gradient and waits for the answer (weights to load, or the 1-bit sum to decode and step
  with).

Everything a role learns from another travels as a message, so the same roles run on the
simulator and as processes over MQTT. A role is built from its spec (what the plan decided for
it: `GroupOwnerSpec`, `WorkerSpec`) and the run's parts (framework.scheduler.SchedulerContext).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import torch

from framework.checkpoints import state as ck
from framework.cluster import Work
from framework.scheduler import Role, SchedulerContext
from framework.specs import RoleSpec
from framework.stage import Stage
from plugins.schedulers.adalearner.gradients import aggregate_meta, decode_aggregate, gradient_codec, meta_grads, own_model, param_shapes
from plugins.schedulers.adalearner.plan import worker_slices

WEIGHTS = "weights"  # fp32: the updated parameters, GO -> WN
ONEBIT_AGG = "onebit_agg"  # 1-bit: the re-quantized sum (bits and scalars per tensor), GO -> WN


@dataclass(frozen=True)
class GroupOwnerSpec(RoleSpec):
    """The group owner's part of the plan."""

    workers: tuple[str, ...]  # the worker roles, in FIFO tie order; none: the GO trains alone
    scheme: str  # local, fp32 or onebit
    up_tag: str  # the tag the workers' gradients come under
    update_s: float  # its sum of the workers' gradients and its step (the scheduler's price)
    encode_s: float  # 1-bit: its second quantization of the sum (the plan's codec price)


@dataclass(frozen=True)
class WorkerSpec(RoleSpec):
    """A worker node's part of the plan."""

    index: int  # its place among the workers (its slice of every global minibatch)
    samples: tuple[int, ...]  # every worker's samples per global minibatch, in that order
    scheme: str  # fp32 or onebit
    up_tag: str  # the tag its gradient goes under
    decode_s: float  # 1-bit: its decode of the GO's answer (the plan's codec price)


async def in_arrival_order(ctx, sources: list[str], tag: str) -> tuple[list[str], dict]:
    """One message under `tag` from each of `sources`: (the sources in the order their messages
    arrived, ties in the order given; the messages by source)."""
    tasks = {asyncio.ensure_future(ctx.recv(src, tag)): src for src in sources}
    order: list[str] = []
    got: dict = {}
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for t in sorted(done, key=lambda t: sources.index(tasks[t])):
            order.append(tasks[t])
            got[tasks[t]] = t.result()
    return order, got


class _Replica(Role):
    """A role holding a replica of the whole model, built from its spec and the run's parts."""

    def __init__(self, spec, parts: SchedulerContext):
        self.spec, self.parts = spec, parts
        self.device = spec.device
        self.numerics, self.dtype = parts.numerics, parts.dtype
        self.shapes = param_shapes(parts.model)
        self.model = own_model(parts)
        self.stage = Stage(self.model, 0, len(parts.model), parts.optimizer, numerics=self.numerics)
        self.it = 0

    @property
    def codec(self):
        return gradient_codec(self.parts.compressor)

    def checkpoint(self, bag, prefix: str) -> dict:
        """Its model, its stage's optimizer state and counters, and its iteration count."""
        return {"it": self.it, **ck.model_and_stage(bag, prefix, self.model, self.stage, self.numerics)}

    def restore(self, bag, desc: dict) -> None:
        ck.load_model_and_stage(bag, desc, self.model, self.stage, self.numerics)
        self.it = int(desc["it"])


def _grads(role: _Replica) -> dict[str, torch.Tensor]:
    """The role's parameter gradients by name (zeros where none: an empty slice), cleared."""
    if not role.numerics:
        return meta_grads(role.shapes, role.dtype)
    out = {}
    for n, p in role.stage.params.items():
        out[n] = p.grad if p.grad is not None else torch.zeros_like(p)
        p.grad = None
    return out


def _set_grads(stage: Stage, grads: dict[str, torch.Tensor]) -> None:
    """Gradients into the stage, where its parameters are (a decoded 1-bit sum is on the CPU,
    where the codecs run, and the model may be on a GPU: `runtime.torch_device`)."""
    for n, p in stage.params.items():
        p.grad = grads[n].to(p.device, p.dtype)


class GroupOwner(_Replica):
    def __init__(self, spec: GroupOwnerSpec, parts: SchedulerContext):
        super().__init__(spec, parts)
        self.streams: dict = {}  # the second quantization's error feedback, per tensor
        self.iteration_s: list[float] = []
        self.arrivals: list[list[str]] = []  # FIFO order of the first iterations (for the summary)

    def state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()} if self.numerics else {}

    def stats(self) -> dict:
        return {"iteration_s": self.iteration_s, "fifo_order": self.arrivals}

    async def run(self, ctx) -> None:
        spec, parts = self.spec, self.parts
        workers = list(spec.workers)
        for epoch in range(self.first_epoch, parts.cfg.train.epochs):
            n_its = len(parts.train_batches(epoch))
            for i in range(n_its):
                t0 = ctx.now()
                if not workers:
                    samples = await self.train_alone(ctx, epoch, i)
                else:
                    samples = len(parts.train_batches(epoch)[i][1])
                    order, got = await in_arrival_order(ctx, workers, spec.up_tag)
                    if len(self.arrivals) < 8:
                        self.arrivals.append(order)
                    work = Work("update", seconds=spec.update_s)
                    await ctx.compute(work, self.update, [got[w] for w in order], iteration=self.it)
                    if spec.scheme == "fp32":
                        for w in order:
                            ctx.send(w, WEIGHTS, self.weights(), iteration=self.it)
                    else:
                        packet = await ctx.compute(Work("encode", seconds=spec.encode_s), self.requantize, iteration=self.it)
                        for w in order:
                            ctx.send(w, ONEBIT_AGG, packet, iteration=self.it)
                self.it += 1
                self.iteration_s.append(ctx.now() - t0)
                ctx.iteration_done(epoch, self.it, samples)
            await ctx.end_epoch(epoch)

    async def train_alone(self, ctx, epoch: int, i: int) -> int:
        """n = 1: the GO's own minibatch SGD step."""
        st = self.stage
        x, y = self.parts.train_batches(epoch)[i]
        out = await ctx.compute(st.fwd_work(len(y)), st.forward, x, self.it, y, 1.0 / len(y), iteration=self.it)
        if self.numerics:
            ctx.report_train(*out)
        await ctx.compute(st.bwd_work(len(y)), st.backward, self.it, iteration=self.it)
        await ctx.compute(st.step_work(), st.step, iteration=self.it)
        return len(y)

    def update(self, grads: list[dict]) -> None:
        """The sum of the workers' gradients (their losses are already over the global minibatch);
        fp32 steps with it; 1-bit keeps it for `requantize`."""
        if not self.numerics:
            return
        total = {n: sum(g[n].to(self.dtype) for g in grads) for n in grads[0]}
        if self.spec.scheme == "fp32":
            _set_grads(self.stage, total)
            self.stage.step()
        else:
            self._sum = total

    def weights(self) -> dict[str, torch.Tensor]:
        if not self.numerics:
            return meta_grads(self.shapes, self.dtype)
        return {n: p.detach() for n, p in self.stage.params.items()}

    def requantize(self) -> dict[str, torch.Tensor]:
        """Eq. 5-6 at the GO: the sum (plus the GO's residual) through the run's codec, once for
        all workers; the GO steps its replica with what the workers will decode."""
        codec = self.codec
        if not self.numerics:
            self.stage.finish_step()
            return aggregate_meta(codec, self.shapes)
        out, decoded = {}, {}
        for n, g in self._sum.items():
            enc = codec.encode(g, self.streams.setdefault(n, {}))
            out[f"{n}.meta"] = torch.frombuffer(bytearray(enc.meta), dtype=torch.uint8)
            out[f"{n}.bits"] = torch.frombuffer(bytearray(enc.payload), dtype=torch.uint8)
            decoded[n] = type(codec).decode(enc.meta, enc.payload, tuple(g.shape), g.dtype)
        self._sum = None
        _set_grads(self.stage, decoded)
        self.stage.step()
        return out

    def checkpoint(self, bag, prefix: str) -> dict:
        out = super().checkpoint(bag, prefix)
        out["streams"] = {n: bag.put(f"{prefix}.stream.{n}", st) for n, st in self.streams.items()}
        out["iteration_s"], out["arrivals"] = self.iteration_s, self.arrivals
        return out

    def restore(self, bag, desc: dict) -> None:
        super().restore(bag, desc)
        self.streams = {n: bag.take(d) for n, d in desc["streams"].items()}
        self.iteration_s, self.arrivals = list(desc["iteration_s"]), [list(o) for o in desc["arrivals"]]


class Worker(_Replica):
    def __init__(self, spec: WorkerSpec, parts: SchedulerContext):
        super().__init__(spec, parts)
        self.i, self.name = spec.index, spec.role

    async def run(self, ctx) -> None:
        spec, parts, st = self.spec, self.parts, self.stage
        for epoch in range(self.first_epoch, parts.cfg.train.epochs):
            for x, y in parts.train_batches(epoch):
                a, b = worker_slices(spec.samples, len(y))[self.i]
                if b > a:
                    out = await ctx.compute(st.fwd_work(b - a), st.forward, x[a:b], self.it, y[a:b], 1.0 / len(y), iteration=self.it)
                    if self.numerics:
                        ctx.report_train(*out)
                    await ctx.compute(st.bwd_work(b - a), st.backward, self.it, iteration=self.it)
                ctx.send("go", spec.up_tag, _grads(self), iteration=self.it)
                if spec.scheme == "fp32":
                    w = await ctx.recv("go", WEIGHTS)
                    if self.numerics:
                        self.load(w)
                else:
                    packet = await ctx.recv("go", ONEBIT_AGG)
                    agg = await ctx.compute(Work("decode", seconds=spec.decode_s), self.decode, packet, iteration=self.it)
                    await ctx.compute(st.step_work(), self.step, agg, iteration=self.it)
                self.it += 1
            await ctx.end_epoch(epoch)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self.stage.params.items():
                p.copy_(weights[n])

    def decode(self, packet: dict):
        return decode_aggregate(self.codec, self.shapes, self.dtype, packet) if self.numerics else None

    def step(self, agg) -> None:
        if agg is not None:
            _set_grads(self.stage, agg)
        self.stage.step()
