"""PiPar's aggregator role (`fed`, on the server): the global model. It averages the device and
server parts of each round that arrive (FedAvg), decides re-selections from the links'
bandwidths and sends every device and server replica its slice back. The round's messages are
in `pipar.roles`' docstring."""

from __future__ import annotations

import torch

from framework.checkpoints import state as ck
from framework.cluster import Work
from framework.runtime.base import PeerLost
from framework.scheduler import Role, SchedulerContext
from plugins.schedulers.pipar.fedavg import fedavg
from plugins.schedulers.pipar.iteration import SERVER
from plugins.schedulers.pipar.model_vectors import layout_of
from plugins.schedulers.pipar.specs import FedSpec
from plugins.schedulers.pipar.training import bandwidths, own_copy

_NO_FAILURES: dict[int, int] = {}


class FedRole(Role):
    """The aggregator: owns the global model; FedAvg over the parts that arrive (Eq. 3)."""

    def __init__(self, spec: FedSpec, parts: SchedulerContext):
        self.spec, self.cluster = spec, parts.cluster
        self.device = spec.device
        self.K, self.Q = len(spec.cuts), len(parts.model)
        self.numerics, self.dtype = parts.numerics, parts.dtype  # read once: a config lookup costs 20 us
        self.layout = layout_of(parts.model)
        self.model = own_copy(parts, self.numerics)
        self.P = list(spec.cuts)
        self.server_of = spec.server_of()
        self.bw_at_plan = [bandwidths(self.cluster, f"dev{k}", 0.0) for k in range(self.K)]
        self.lost: set[int] = set()
        self.rounds: list[dict] = []

    def state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()} if self.numerics else {}

    def stats(self) -> dict:
        return {"rounds": self.rounds, "lost_devices": sorted(self.lost)}

    def checkpoint(self, bag, prefix: str) -> dict:
        out = {"P": self.P, "bw_at_plan": [list(b) for b in self.bw_at_plan], "lost": sorted(self.lost), "rounds": self.rounds}
        if self.numerics:
            out["model"] = ck.module_state(bag, f"{prefix}.model", self.model)
        return out

    def restore(self, bag, desc: dict) -> None:
        if self.numerics:
            ck.load_module_state(bag, desc["model"], self.model)
        self.P = [int(p) for p in desc["P"]]
        self.bw_at_plan = [tuple(b) for b in desc["bw_at_plan"]]
        self.lost, self.rounds = set(desc["lost"]), list(desc["rounds"])

    async def run(self, ctx) -> None:
        for epoch in range(self.first_epoch, self.spec.epochs):
            if self.spec.aggregates(epoch):
                await self.aggregate(ctx, epoch)
            await ctx.end_epoch(epoch)

    async def aggregate(self, ctx, epoch: int) -> None:
        with ctx.deferred_results():  # the parts may be placeholders: `average` waits for them
            parts, counts, present = await self._collect(ctx, epoch)
            seconds = len(present) * self.cluster.device(SERVER).time(Work("step", 0, self.Q))  # one weighted add per model
            await ctx.compute(Work("aggregate", seconds=seconds), self.average, parts, counts)
        self.rounds.append({"epoch": epoch, "devices": present})
        await self._send_round(ctx, epoch)

    async def _collect(self, ctx, epoch: int) -> tuple[list, list[float], list[int]]:
        """The round's parts: (device part, server part or None) per device present, their
        sample counts, and who they are."""
        parts, counts, present = [], [], []
        for k in range(self.K):
            if epoch in self.spec.failures.get(k, _NO_FAILURES):
                continue  # disconnected at the round's end (config `failures`)
            dev = None
            if k not in self.lost:
                try:
                    dev = await ctx.recv(f"dev{k}", "model")
                except PeerLost:
                    self.lost.add(k)
                    dev = None
            srv = None
            if self.P[k] < self.Q:
                served = await ctx.recv(self.server_of[k], "served")
                if int(served[0]):
                    srv = await ctx.recv(self.server_of[k], "model")
                elif dev is not None:
                    dev = None  # the server side of its model is incomplete: leave it out
            if dev is None:
                continue
            present.append(k)
            counts.append(float(dev["n"][0]) if self.numerics else 1.0)  # timing-only packets carry no values
            parts.append((dev, srv))
        return parts, counts, present

    async def _send_round(self, ctx, epoch: int) -> None:
        lay, Q = self.layout, self.Q
        reselect = self.check_bandwidth(ctx.now())
        for k in range(self.K):
            flag = torch.tensor([1 if k in reselect else 0], dtype=torch.int64)
            if k not in self.lost:
                ctx.send(f"dev{k}", "round", flag)
            if self.P[k] < Q:
                ctx.send(self.server_of[k], "round", flag)
        parts: dict = {}  # P -> the global model's units [0, P), flattened once for all the devices

        def part(P: int) -> dict:  # that take it: a message to a device crosses a link, so each
            if P not in parts:  # receives its own copy (a server role on the same processor gets
                parts[P] = lay.flat(self.model, 0, P, self.dtype, self.numerics)  # the object sent)
            return parts[P]

        for k in sorted(range(self.K), key=lambda k: k in reselect):  # re-planned devices last
            if k in reselect:
                self.P[k] = int((await ctx.recv(self.server_of[k], "plan"))[0])
            P = self.P[k]
            if k not in self.lost:
                ctx.send(f"dev{k}", "global", part(P))
            if P < Q:
                ctx.send(self.server_of[k], "global", lay.flat(self.model, P, Q, self.dtype, self.numerics))

    def average(self, parts: list[tuple], counts: list[float]) -> None:
        """FedAvg of the (device part, server part or None) pairs into the global model."""
        if not self.numerics or not parts or sum(counts) <= 0:
            return  # nobody trained: the global model stays
        whole = [{w: _joined(dev[w], srv[w]) if srv is not None else dev[w] for w in ("p", "b")} for dev, srv in parts]
        self.layout.load(self.model, 0, self.Q, fedavg(whole, counts))

    def check_bandwidth(self, now: float) -> set[int]:
        """Devices whose links changed bandwidth since their plan was made (the emulator tells
        the framework, the notes' decision 16): they re-select at this epoch boundary."""
        if not self.spec.reselect:
            return set()
        out = set()
        for k in range(self.K):
            bw = bandwidths(self.cluster, f"dev{k}", now)
            if bw != self.bw_at_plan[k] and k not in self.lost:
                out.add(k)
                self.bw_at_plan[k] = bw
        return out


def _joined(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A device's and its server's halves of one model vector. Timing-only packets are meta
    tensors, and torch.cat on meta tensors goes through torch's reference kernels, which import
    torch._dynamo (2 s once per process): their shape is all there is to join."""
    if a.is_meta or b.is_meta:
        return torch.empty(a.shape[0] + b.shape[0], dtype=a.dtype, device="meta")
    return torch.cat([a, b])
