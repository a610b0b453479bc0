"""EdgePipe's time budget (Table III; notes 2.12, 2.13, 3): train for a fixed simulated time, not
for a number of epochs. `scheduler.budget_min: 194` trains the most minibatches whose Eq. 2
schedule fits in 194 minutes of the run's own slot clock (Theorem 1 inverted:
edgepipe.timing.minibatches_in_budget with the plan's slot_s), drawn from consecutive epochs of
the shuffled training data, "epoch e, step s" as the paper counts them.

Decisions:
- One continuous pipeline for the whole budget: Theorem 1 counts one fill and one drain, and the
  paper's slot counts (Table III) match it, so the schedule does not drain at data-epoch ends.
  The framework sees the budget as one epoch of that many iterations (its epoch-end barrier and
  validation come once, at the end); train.epochs must then be 1.
- The slot is the run's own (from the cluster's models, or scheduler.slot_s), not Table II's:
  on the calibrated preset it is within 1-3 % of the paper's, so the counts are close to Table
  III's (Hybrid 9252 vs 9356) without being copied from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from framework.errors import ConfigError
from framework.specs import Data
from plugins.schedulers.edgepipe import timing


def check(cfg, run_cfg) -> None:
    """With scheduler.budget_min (its range is the schema's), the run's train.epochs is 1."""
    if cfg.budget_min is None:
        return
    if int(run_cfg.train.epochs) != 1:
        raise ConfigError("train.epochs", f"scheduler.budget_min={cfg.budget_min} sets the minibatches trained (across data epochs); set train.epochs=1, got {run_cfg.train.epochs}")


@dataclass(frozen=True)
class Budget(Data):
    """What the budget buys on the run's slot clock (plan.json `budget`)."""

    budget_min: float
    minibatches: int
    slots: int
    predicted_s: float
    data_epochs: int
    paper_epoch_step: tuple[int, int]  # the last minibatch as the paper counts: epoch e, step s
    minibatches_per_data_epoch: int


def budget_plan(p, budget_min: float, pipeline: bool, slot_s: float, per_epoch: int) -> Budget:
    """What the budget buys on this slot clock."""
    n = timing.minibatches_in_budget(p, budget_min * 60.0, pipeline, slot_s)
    if n < 1:
        raise ValueError(f"{budget_min} min holds {int(budget_min * 60 / slot_s)} slots of {slot_s:.6g} s; the first minibatch alone needs {timing.slots_for(p, 1, pipeline)}")
    slots = timing.slots_for(p, n, pipeline)
    epoch = (n - 1) // per_epoch + 1
    return Budget(float(budget_min), n, slots, slots * slot_s, math.ceil(n / per_epoch), (epoch, n - (epoch - 1) * per_epoch), per_epoch)


class BudgetData:
    """Minibatch i (0-based) of a budget run: data epoch i // per_epoch, its index i % per_epoch.
    The roles of one process share it; it keeps the two most recent data epochs (a pipeline spans
    a data-epoch end for a few slots: group 1 already forwards the next epoch's first minibatches
    while the output group still needs the last ones' labels)."""

    def __init__(self, ctx, n: int):
        self.ctx = ctx
        self.n = n
        self.per_epoch = ctx.iterations_per_epoch()
        self.cache: dict[int, list] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        epoch, k = divmod(i, self.per_epoch)
        if epoch not in self.cache:
            self.cache = {e: b for e, b in self.cache.items() if e == epoch - 1}
            self.cache[epoch] = self.ctx.train_batches(epoch)  # the same seeded shuffle as an epoch run
        return self.cache[epoch][k]
