"""AdaLearner's roles (plugins/schedulers/adalearner/scheduler.py): the group owner and the worker nodes.

- `GroupOwner` (go): the global model. Per global minibatch it takes the n gradients in the
  order they arrive (FIFO), sums them, steps, and answers the workers in that order: the fp32
  weights, or (1-bit) the sum quantized once more, which it also steps its own replica with. With
  n = 1 it trains alone on the whole minibatch.
- `Worker` (wn<i>): a replica of the whole model and its slice of every global minibatch; sends
  its gradient and waits for the answer (weights to load, or the 1-bit sum to decode and step
  with).

Everything a role learns from another travels as a message, so the same roles run on the
simulator and as processes over MQTT.
"""

from __future__ import annotations

import asyncio

import torch

from framework import checkpoint as ck
from framework.cluster import Work
from framework.scheduler import Role
from framework.stage import Stage

WEIGHTS = "weights"  # fp32: the updated parameters, GO -> WN
ONEBIT_AGG = "onebit_agg"  # 1-bit: the re-quantized sum (bits and scalars per tensor), GO -> WN


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


def _grads(stage: Stage, sched) -> dict[str, torch.Tensor]:
    """The stage's parameter gradients by name (zeros where none: an empty slice), cleared."""
    if not sched.numerics:
        return sched.meta_grads()
    out = {}
    for n, p in stage.params.items():
        out[n] = p.grad if p.grad is not None else torch.zeros_like(p)
        p.grad = None
    return out


def _set_grads(stage: Stage, grads: dict[str, torch.Tensor]) -> None:
    """Gradients into the stage, where its parameters are (a decoded 1-bit sum is on the CPU,
    where the codecs run, and the model may be on a GPU: `runtime.torch_device`)."""
    for n, p in stage.params.items():
        p.grad = grads[n].to(p.device, p.dtype)


class GroupOwner(Role):
    def __init__(self, sched):
        self.sched = sched
        self.device = sched.go_device
        self.model = sched.own_model()
        self.stage = Stage(self.model, 0, sched.Q, sched.ctx.optimizer, numerics=sched.numerics)
        self.streams: dict = {}  # the second quantization's error feedback, per tensor
        self.it = 0
        self.iteration_s: list[float] = []
        self.arrivals: list[list[str]] = []  # FIFO order of the first iterations (for the summary)

    def state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()} if self.sched.numerics else {}

    def stats(self) -> dict:
        return {"iteration_s": self.iteration_s, "fifo_order": self.arrivals}

    async def run(self, ctx) -> None:
        s = self.sched
        workers = [r for r, _, _ in s.workers()]
        for epoch in range(self.first_epoch, s.ctx.cfg.train.epochs):
            n_its = len(s.ctx.train_batches(epoch))
            for i in range(n_its):
                t0 = ctx.now()
                if not workers:
                    samples = await self.train_alone(ctx, epoch, i)
                else:
                    samples = len(s.ctx.train_batches(epoch)[i][1])
                    order, got = await in_arrival_order(ctx, workers, s.up_tag)
                    if len(self.arrivals) < 8:
                        self.arrivals.append(order)
                    work = Work("update", seconds=s.update_s(self.device, len(workers)))
                    await ctx.compute(work, self.update, [got[w] for w in order], iteration=self.it)
                    if s.scheme == "fp32":
                        for w in order:
                            ctx.send(w, WEIGHTS, self.weights(), iteration=self.it)
                    else:
                        packet = await ctx.compute(Work("encode", seconds=s.codec_s("encode")), self.requantize, iteration=self.it)
                        for w in order:
                            ctx.send(w, ONEBIT_AGG, packet, iteration=self.it)
                self.it += 1
                self.iteration_s.append(ctx.now() - t0)
                ctx.iteration_done(epoch, self.it, samples)
            await ctx.end_epoch(epoch)

    async def train_alone(self, ctx, epoch: int, i: int) -> int:
        """n = 1: the GO's own minibatch SGD step."""
        s, st = self.sched, self.stage
        x, y = s.ctx.train_batches(epoch)[i]
        out = await ctx.compute(st.fwd_work(len(y)), st.forward, x, self.it, y, 1.0 / len(y), iteration=self.it)
        if s.numerics:
            ctx.report_train(*out)
        await ctx.compute(st.bwd_work(len(y)), st.backward, self.it, iteration=self.it)
        await ctx.compute(st.step_work(), st.step, iteration=self.it)
        return len(y)

    def update(self, grads: list[dict]) -> None:
        """The sum of the workers' gradients (their losses are already over the global minibatch);
        fp32 steps with it; 1-bit keeps it for `requantize`."""
        s = self.sched
        if not s.numerics:
            return
        total = {n: sum(g[n].to(s.dtype) for g in grads) for n in grads[0]}
        if s.scheme == "fp32":
            _set_grads(self.stage, total)
            self.stage.step()
        else:
            self._sum = total

    def weights(self) -> dict[str, torch.Tensor]:
        if not self.sched.numerics:
            return self.sched.meta_grads()
        return {n: p.detach() for n, p in self.stage.params.items()}

    def requantize(self) -> dict[str, torch.Tensor]:
        """Eq. 5-6 at the GO: the sum (plus the GO's residual) through the run's codec, once for
        all workers; the GO steps its replica with what the workers will decode."""
        s = self.sched
        codec = s.codec
        if not s.numerics:
            self.stage.finish_step()
            return s.aggregate_meta()
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
        out = _replica_checkpoint(self, bag, prefix)
        out["streams"] = {n: bag.put(f"{prefix}.stream.{n}", st) for n, st in self.streams.items()}
        out["iteration_s"], out["arrivals"] = self.iteration_s, self.arrivals
        return out

    def restore(self, bag, desc: dict) -> None:
        _replica_restore(self, bag, desc)
        self.streams = {n: bag.take(d) for n, d in desc["streams"].items()}
        self.iteration_s, self.arrivals = list(desc["iteration_s"]), [list(o) for o in desc["arrivals"]]


def _replica_checkpoint(role, bag, prefix: str) -> dict:
    """A role's model, its stage's optimizer state and counters, and its iteration count."""
    return {"it": role.it, **ck.model_and_stage(bag, prefix, role.model, role.stage, role.sched.numerics)}


def _replica_restore(role, bag, desc: dict) -> None:
    ck.load_model_and_stage(bag, desc, role.model, role.stage, role.sched.numerics)
    role.it = int(desc["it"])


def decode_aggregate(sched, packet: dict) -> dict[str, torch.Tensor]:
    """The GO's 1-bit sum, per tensor, as a worker decodes it (a malformed packet: WireError), on
    the CPU, where the codecs run (a message's tensors arrive where the roles' tensor work runs:
    on a GPU run, its bytes come back from there)."""
    codec_cls = type(sched.codec)
    out = {}
    for n, shape in sched.param_shapes().items():
        meta = packet[f"{n}.meta"].cpu().numpy().tobytes()
        bits = packet[f"{n}.bits"].cpu().numpy()
        out[n] = codec_cls.decode(meta, memoryview(bits), shape, sched.dtype)
    return out


class Worker(Role):
    def __init__(self, sched, i: int):
        self.sched, self.i = sched, i
        self.name, self.device, _ = sched.workers()[i]
        self.model = sched.own_model()
        self.stage = Stage(self.model, 0, sched.Q, sched.ctx.optimizer, numerics=sched.numerics)
        self.it = 0

    async def run(self, ctx) -> None:
        s, st = self.sched, self.stage
        for epoch in range(self.first_epoch, s.ctx.cfg.train.epochs):
            for x, y in s.ctx.train_batches(epoch):
                a, b = s.slices(len(y))[self.i]
                if b > a:
                    out = await ctx.compute(st.fwd_work(b - a), st.forward, x[a:b], self.it, y[a:b], 1.0 / len(y), iteration=self.it)
                    if s.numerics:
                        ctx.report_train(*out)
                    await ctx.compute(st.bwd_work(b - a), st.backward, self.it, iteration=self.it)
                ctx.send("go", s.up_tag, _grads(st, s), iteration=self.it)
                if s.scheme == "fp32":
                    w = await ctx.recv("go", WEIGHTS)
                    if s.numerics:
                        self.load(w)
                else:
                    packet = await ctx.recv("go", ONEBIT_AGG)
                    agg = await ctx.compute(Work("decode", seconds=s.codec_s("decode")), self.decode, packet, iteration=self.it)
                    await ctx.compute(st.step_work(), self.step, agg, iteration=self.it)
                self.it += 1
            await ctx.end_epoch(epoch)

    def checkpoint(self, bag, prefix: str) -> dict:
        return _replica_checkpoint(self, bag, prefix)

    def restore(self, bag, desc: dict) -> None:
        _replica_restore(self, bag, desc)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self.stage.params.items():
                p.copy_(weights[n])

    def decode(self, packet: dict):
        return decode_aggregate(self.sched, packet) if self.sched.numerics else None

    def step(self, agg) -> None:
        if agg is not None:
            _set_grads(self.stage, agg)
        self.stage.step()
