"""One EdgePipe super neuron as a role (plugins.schedulers.edgepipe.scheduler explains the plan).

A super neuron owns its neuron chunks (notes 2.5, destination partitioning): for each layer
l >= 2 it holds, of neurons S = [lo, hi), the incoming weights W_l[S, :] and biases b_l[S]
(torch's row-major Linear layout), and their SGD momentum. It runs its ops of Eq. 2's schedule
(edgepipe.timing.schedule), each at the start of its slot on the global slot clock:

- FW_1: sends its slice of the input (local data) to the other holders of layer 2;
- FW_l: assembles the full previous activation a_{l-1} from its own slice and the slices the
  other holders of l-1 sent (a missing one is zero: forward zero-fill), computes
  z_l[:, S] = a_{l-1} W_l[S]^T + b_l[S] (ReLU below the output), stashes what its backward needs
  (a_{l-1}, z, the weights it used: Eq. 3's stashing) and sends its slice to the holders of
  l + 1, or, on the output layer, its logits to the other output holders (output sharing);
- BW_L: assembles the logits, softmax cross-entropy, delta for its logits. A holder missing
  another's share updates nothing and sends nothing (`share_missing: abort`, the default: the
  paper's all-or-nothing rule, "able to calculate the gradients only if it receives all of the
  losses", applied to the output layer, whose loss needs every logit); `zero_fill` (the notes'
  proposal) trains on the view with the missing logits zero. The study runs both (an ablation:
  the choice moves Horizontal far more than Hybrid; docs/reproductions.md);
- BW_l (l < L): needs the partial products dL/da_l[:, S] of every holder of l + 1 (its own
  included, kept locally); if any is missing it updates nothing and sends nothing (backward
  all-or-nothing; the failure cascades toward the input);
- then the weight gradient at the stashed version, the partial products
  delta_l[:, S] W_l[S, S_a] for each holder a of l - 1 (zero where a's forward message was lost,
  `bwd_mode: masked`; `phantom` sends them anyway), and one SGD step on the latest weights.

Messages carry the minibatch id; one that arrives after its slot started is late and dropped.
With recovery (edgepipe.recovery) a message goes as r-TX's copies or with the link's ACK
retries. With a time budget (edgepipe.budget) one schedule runs over all its minibatches, across
data epochs. With `eval_every_min` the role keeps snapshots of its weights on the plan's slot
grid (edgepipe.curve) and hands them over with its state.

A role is built from its spec (`SuperNeuronSpec`: the partition, its place in it, the slot clock
and the knobs it reads) and the run's parts (framework.scheduler.SchedulerContext: the seeded
model its chunks are cut from, the training data, the optimizer settings).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from framework.scheduler import Role, SchedulerContext
from framework.specs import Data, RoleSpec
from plugins.schedulers.edgepipe import timing
from plugins.schedulers.edgepipe.budget import BudgetData
from plugins.schedulers.edgepipe.curve import Snapshots
from plugins.schedulers.edgepipe.dense import linear_of, op_works
from plugins.schedulers.edgepipe.partition import Partition


@dataclass(frozen=True)
class Recovery(Data):
    """What a sender does about a lost message (edgepipe.recovery)."""

    copies: int  # sends of every message: r-TX's copies, else 1
    retries: int  # the link's ARQ retransmissions at most: ACK's, else 0


@dataclass(frozen=True)
class SuperNeuronSpec(RoleSpec):
    """Super neuron `index`'s part of the plan. It carries the whole partition: the role talks
    to the holders of its neighbouring layers, and Eq. 2's schedule is the partition's."""

    index: int
    partition: Partition
    pipeline: bool  # Eq. 2's pipelined schedule, or one minibatch at a time
    slot_s: float
    weight_stashing: bool
    bwd_mode: str  # masked | phantom
    share_missing: str  # abort | zero_fill
    recovery: Recovery
    budget_minibatches: int | None  # a time budget's minibatches, one pipeline across data epochs; None: train.epochs
    snapshot_slots: tuple[int, ...] | None  # the curve's snapshot grid (edgepipe.curve); None: no curve


class SuperNeuronRole(Role):
    def __init__(self, spec: SuperNeuronSpec, parts: SchedulerContext):
        self.spec, self.parts = spec, parts
        s = self.s = spec.index
        self.name = spec.role
        self.device = spec.device
        p = self.p = spec.partition
        self.L = p.L
        self.chunks = {layer: (lo, hi) for layer, lo, hi in p.super_neurons[s].chunks}
        self.holders = {l: p.holders(l) for l in range(1, self.L + 1)}
        self.works = op_works(p.super_neurons[s].chunks, p.sizes, int(parts.cfg.train.batch_size))
        train = parts.cfg.train
        self.lr, self.momentum, self.wd = float(train.lr), float(train.momentum), float(train.weight_decay)
        self.stashing = spec.weight_stashing
        self.masked = spec.bwd_mode == "masked"
        self.share_abort = spec.share_missing == "abort"
        self.copies = spec.recovery.copies
        self.retries = spec.recovery.retries  # the link's ARQ
        # the owned parameters, cut from the seeded initial model; updates make new tensors, so a
        # stash keeps the version its forward used by reference
        self.W, self.b, self.buf = {}, {}, {}
        with torch.no_grad():
            for layer, (lo, hi) in self.chunks.items():
                if layer >= 2:
                    lin = linear_of(parts.model.units[layer - 2])
                    self.W[layer] = lin.weight[lo:hi].detach().clone()
                    self.b[layer] = lin.bias[lo:hi].detach().clone()
        self.version = {layer: 0 for layer in self.W}
        self.stash: dict = {}  # (layer, id) -> what BW needs
        self.acts: dict = {}  # (layer, id) -> own activation slice for a local consumer
        self.local_grad: dict = {}  # (layer, id) -> own partial dL/da_layer from own BW_{layer+1}
        self.early: dict = collections.defaultdict(dict)  # (src, tag) -> {id: tensor} that came ahead
        self.reporter = min(r for r, _, _ in self.holders[self.L]) == s
        self.sent: collections.Counter = collections.Counter()
        self.fw = {l: [0, 0] for l in range(1, self.L)}  # messages into FW_{l+1}: arrived, expected
        self.bw = {l: [0, 0] for l in range(2, self.L + 1)}  # BW_l: applied, attempted
        self.staleness: list[int] = []
        self.stale_log: list[tuple[int, int, int]] = []  # (layer, data id, updates between FW and BW)
        self.data_base = 0
        self.slot_base = 0  # global slots of the earlier epochs (the snapshot grid counts across them)
        self.snaps = Snapshots(spec.snapshot_slots) if spec.snapshot_slots is not None else None

    # ---- state -----------------------------------------------------------------------------

    def state(self) -> dict:
        out = {**{f"w{l}": w for l, w in self.W.items()}, **{f"b{l}": b for l, b in self.b.items()}}
        if self.snaps is not None and self.W:
            out.update(self.snaps.state())
        return out

    def stats(self) -> dict:
        return {"sent": dict(self.sent), "fw": self.fw, "bw": self.bw, "staleness": self.staleness, "stale_log": self.stale_log}

    # ---- messages ----------------------------------------------------------------------------

    def _send(self, ctx, dst: int, tag: str, x: torch.Tensor, gid: int) -> None:
        """One message, unreliable; r-TX sends its copies back to back, ACK has the link retransmit
        it until acknowledged (the receiver keeps one)."""
        payload = {"x": x, "id": torch.tensor([gid], dtype=torch.int64)}
        for _ in range(self.copies):
            ctx.send(f"sn{dst}", tag, payload, iteration=gid, reliable=False, retries=self.retries)
        self.sent[f"sn{dst}"] += 1

    async def _take(self, ctx, src: int, tag: str, gid: int):
        """Minibatch `gid`'s message from `src` under `tag` if it has arrived by now, else None.
        Earlier minibatches' stragglers are dropped; later ones are kept for their own slot."""
        key = (f"sn{src}", tag)
        box = self.early[key]
        while True:
            msg = await ctx.recv(key[0], tag, timeout=0.0)
            if msg is None:
                break
            mid = int(msg["id"][0])
            if mid >= gid:
                box[mid] = msg["x"]
        for mid in [m for m in box if m < gid]:
            del box[mid]
        return box.pop(gid, None)

    def _inbound(self) -> set[tuple[int, str]]:
        """Every (sender, tag) this super neuron receives from."""
        out = set()
        for l in self.chunks:
            if l >= 2:
                out |= {(r, f"fw{l - 1}") for r, _, _ in self.holders[l - 1] if r != self.s}
                if l < self.L:
                    out |= {(r, f"bw{l}") for r, _, _ in self.holders[l + 1] if r != self.s}
            if l == self.L:
                out |= {(r, "share") for r, _, _ in self.holders[l] if r != self.s}
        return out

    async def _drain(self, ctx) -> None:
        for r, tag in sorted(self._inbound()):
            while await ctx.recv(f"sn{r}", tag, timeout=0.0) is not None:
                pass
        self.early.clear()

    # ---- the program -------------------------------------------------------------------------

    async def run(self, ctx) -> None:
        parts, budget = self.parts, self.spec.budget_minibatches
        if budget is not None:  # the whole budget: one pipeline, one framework epoch
            await self._span(ctx, 0, BudgetData(parts, budget))
            return
        for epoch in range(self.first_epoch, int(parts.cfg.train.epochs)):
            await self._span(ctx, epoch, parts.train_batches(epoch))

    async def _span(self, ctx, epoch: int, data) -> None:
        """Eq. 2's schedule over the minibatches `data`, then the framework's epoch end."""
        T = self.spec.slot_s
        t0 = ctx.now()
        ops, last = timing.ops_of(self.p, self.spec.pipeline, self.s, len(data))
        for op in ops:
            if self.snaps is not None:
                self.snaps.before(self.slot_base + op.slot, self.W, self.b)
            await ctx.sleep_until(t0 + (op.slot - 1) * T)
            x, y = data[op.data - 1]
            gid = self.data_base + op.data
            if op.kind == "FW":
                await self.forward(ctx, op.layer, gid, x)
            else:
                await self.backward(ctx, op.layer, gid, y, epoch, op.data - 1)
        self.data_base += len(data)
        self.slot_base += last
        if self.snaps is not None:
            self.snaps.through(self.slot_base, self.W, self.b)
        # the epoch ends with its last slot: what is still on its way lands by then, and what
        # came too late is dropped, so nothing is left in flight at the epoch's end
        await ctx.sleep_until(t0 + last * T)
        await self._drain(ctx)
        await ctx.end_epoch(epoch)

    async def forward(self, ctx, l: int, gid: int, x: torch.Tensor) -> None:
        lo, hi = self.chunks[l]
        if l == 1:
            a = x.reshape(len(x), -1)[:, lo:hi]
        else:
            prev = torch.zeros((len(x), self.p.sizes[l - 2]), dtype=x.dtype, device=x.device)
            arrived = {}
            for r, plo, phi in self.holders[l - 1]:
                piece = self.acts.pop((l - 1, gid), None) if r == self.s else await self._take(ctx, r, f"fw{l - 1}", gid)
                arrived[r] = piece is not None
                if r != self.s:
                    self.fw[l - 1][0] += piece is not None
                    self.fw[l - 1][1] += 1
                if piece is not None:
                    prev[:, plo:phi] = piece
            W, b, last = self.W[l], self.b[l], l == self.L

            def fwd():
                z = prev @ W.T + b
                return z, (z if last else torch.relu(z))

            z, a = await ctx.compute(self.works[("FW", l)][0], fwd, iteration=gid)
            self.stash[(l, gid)] = {"prev": prev, "z": z, "W": W, "arrived": arrived, "version": self.version[l]}
        if l + 1 in self.chunks or l == self.L:
            self.acts[(l, gid)] = a
        targets = self.holders[l + 1] if l < self.L else self.holders[l]
        for r, _, _ in targets:
            if r != self.s:
                self._send(ctx, r, "share" if l == self.L else f"fw{l}", a, gid)

    async def _output_delta(self, ctx, gid: int, y: torch.Tensor) -> torch.Tensor | None:
        """Softmax cross-entropy on this holder's view of the logits (missing shares zero); None
        (no update) when a share is missing and `share_missing` is abort."""
        own = self.acts.pop((self.L, gid))
        logits = torch.zeros((len(y), self.p.sizes[-1]), dtype=own.dtype, device=own.device)
        complete = True
        for r, plo, phi in self.holders[self.L]:
            piece = own if r == self.s else await self._take(ctx, r, "share", gid)
            if piece is not None:
                logits[:, plo:phi] = piece
            complete &= piece is not None
        lo, hi = self.chunks[self.L]
        probs = torch.softmax(logits, dim=1)
        delta = (probs - F.one_hot(y, logits.shape[1]).to(probs.dtype))[:, lo:hi] / len(y)
        if self.reporter:
            loss = float(F.cross_entropy(logits, y, reduction="sum"))
            ctx.report_train(loss, int((logits.argmax(1) == y).sum()), len(y))
        return None if self.share_abort and not complete else delta

    async def backward(self, ctx, l: int, gid: int, y: torch.Tensor, epoch: int, index: int) -> None:
        st = self.stash.pop((l, gid))
        if l == self.L:
            delta = await self._output_delta(ctx, gid, y)
            ok = delta is not None
        else:
            grad, ok = torch.zeros_like(st["z"]), True
            for r, _, _ in self.holders[l + 1]:
                piece = self.local_grad.pop((l, gid), None) if r == self.s else await self._take(ctx, r, f"bw{l}", gid)
                if piece is None:
                    ok = False
                else:
                    grad += piece
            delta = grad * (st["z"] > 0).to(grad.dtype) if ok else None
        self.bw[l][1] += 1
        if ok:
            self.bw[l][0] += 1
            await self._apply(ctx, l, gid, st, delta)
        if l == self.L and self.reporter:
            ctx.iteration_done(epoch, index, len(y))

    async def _apply(self, ctx, l: int, gid: int, st: dict, delta: torch.Tensor) -> None:
        W_used = st["W"] if self.stashing else self.W[l]
        targets = self.holders[l - 1] if l - 1 >= 2 else []

        def bwd():
            gW, gb = delta.T @ st["prev"], delta.sum(0)
            parts = {}
            for r, plo, phi in targets:
                parts[r] = delta @ W_used[:, plo:phi] if (st["arrived"][r] or not self.masked) else torch.zeros((len(delta), phi - plo), dtype=delta.dtype, device=delta.device)
            self._sgd(l, gW, gb)
            return parts

        bwd_work, step_work = self.works[("BW", l)]
        parts = await ctx.compute(bwd_work, bwd, iteration=gid)  # the update is applied in there; its time follows
        await ctx.compute(step_work, None, iteration=gid)
        stale = self.version[l] - 1 - st["version"]  # updates between its forward and this one
        self.staleness.append(stale)
        self.stale_log.append((l, gid, stale))
        for r, piece in parts.items():
            if r == self.s:
                self.local_grad[(l - 1, gid)] = piece
            else:
                self._send(ctx, r, f"bw{l - 1}", piece, gid)

    def _sgd(self, l: int, gW: torch.Tensor, gb: torch.Tensor) -> None:
        """torch.optim.SGD's rule (momentum without dampening, L2 weight decay) on the latest
        weights, as new tensors."""
        for key, p, g in (("w", self.W, gW), ("b", self.b, gb)):
            if self.wd:
                g = g + self.wd * p[l]
            if self.momentum:
                buf = self.buf.get((key, l))
                g = self.buf[(key, l)] = g.clone() if buf is None else self.momentum * buf + g
            p[l] = p[l] - self.lr * g
        self.version[l] += 1
