"""What feature replay's two roles share: the messages between them and a side's units and stage
(plugins.schedulers.feature_replay.scheduler explains the schedule).

The upstream role (plugins.schedulers.feature_replay.upstream) owns units [0, cut), the raw data,
the history queue (its `ReplayStage`) and the online decision engine; the downstream role
(plugins.schedulers.feature_replay.downstream) owns units [cut, L). Everything between them is a
message on the edge->cloud / cloud->edge links:

- `act`: a batch's feature and labels; or a control message alone: `change` (the new cut,
  sent once the history queue is empty) or `end` (the epoch's last batch was flushed);
- `grad`: the gradient of a batch's feature; `stamps`: when the cloud received that batch and
  sent its gradient back (the official code's timestamps), from which the edge measures both
  links' rates;
- `units`: the weights of the blocks that change sides in a migration (Eq. 13's cost is then
  simply their bytes on the link).
"""

from __future__ import annotations

import torch

from framework.models import clone_module
from framework.pipeline import repartition as rp
from framework.runtime import wire
from framework.scheduler import Role, SchedulerContext
from framework.stage import Stage
from plugins.schedulers.feature_replay.role_specs import SideSpec


def int_tensor(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


GRADIENT, PROBE_REPLY, STOP = 0, 1, 2  # what a `stamps` message answers


def stamps(kind: int, received: float, sent: float) -> torch.Tensor:
    """[kind, when the cloud received the message, when it sent the reply]."""
    return torch.tensor([kind, received, sent], dtype=torch.float64)


PROBE_BYTES = wire.encoded_size({"probe": int_tensor(0)})
STAMPS_BYTES = wire.encoded_size({"x": stamps(0, 0.0, 0.0)})


def own_model(parts):
    """A role's private copy of the initial model: the blocks a migration moves must arrive as
    messages even on the simulator (timing-only runs share the untouched one)."""
    return clone_module(parts.model) if parts.numerics else parts.model


class Side(Role):
    """One party's units of the cut and its stage over them."""

    upstream = True  # holds units [0, cut) and the inputs, replays; the downstream side [cut, L) and the loss
    stage_class = Stage

    def __init__(self, spec: SideSpec, parts: SchedulerContext):
        self.parts = parts
        self.name = spec.role
        self.peer = "cloud" if spec.role == "edge" else "edge"
        self.device = spec.device
        self.reversed = spec.reversed
        self.cut = spec.cut
        self.L = len(parts.model)
        self.numerics = parts.numerics
        self.epochs = int(parts.train.epochs)
        self.model = own_model(parts)
        self.stage = self._new_stage()
        self.it = 0  # batches this role has handled, over all epochs (the messages' iteration ids)

    def _bounds(self) -> tuple[int, int]:
        return (0, self.cut) if self.upstream else (self.cut, self.L)

    def _new_stage(self) -> Stage | None:
        a, b = self._bounds()
        return self.stage_class(self.model, a, b, self.parts.optimizer, numerics=self.numerics) if b > a else None

    def move_cut(self, new_cut: int) -> None:
        """Rebuild the stage for `new_cut`, keeping the optimizer state of the blocks that stay."""
        old = self.stage
        self.cut = new_cut
        self.stage = self._new_stage()
        if old is None or self.stage is None:
            return
        self.carry_over(old, self.stage)
        if old.optimizer is not None:
            for p in self.stage.module.parameters():
                if p in old.optimizer.state:
                    self.stage.optimizer.state[p] = old.optimizer.state[p]

    def carry_over(self, old: Stage, new: Stage) -> None:
        """The counters a rebuilt stage continues from."""
        new.version = old.version
        new.staleness = old.staleness

    def send_units(self, ctx, units: range, **kw) -> None:
        """The weights of `units` to the other side (a migration moves them)."""
        ctx.send(self.peer, "units", rp.pack_units(self.model, None, list(units), self.numerics), **kw)

    async def take_units(self, ctx) -> None:
        """The weights the other side sent into this side's model."""
        rp.unpack_units(self.model, await ctx.recv(self.peer, "units"), self.numerics)

    def state(self) -> dict:
        st = self.stage
        return rp.pack_units(self.model, None, list(range(st.start, st.stop)), True) if st is not None and self.numerics else {}

    def checkpoint(self, bag, prefix: str) -> dict:
        return {"it": self.it, "cut": self.cut, "stage": self.stage.checkpoint(bag, f"{prefix}.stage") if self.stage is not None else None}

    def restore(self, bag, desc: dict) -> None:
        self.it = int(desc["it"])
        if int(desc["cut"]) != self.cut:
            self.move_cut(int(desc["cut"]))
        if self.stage is not None:
            self.stage.restore(bag, desc["stage"])
