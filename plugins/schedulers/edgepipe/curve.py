"""EdgePipe's test accuracy over training time on the slot clock (the paper's Fig. 5 and 7: test
accuracy against simulated time; Fig. 7's "2.47x faster than Model Parallelism to > 80 %").

`scheduler.eval_every_min: m` takes a snapshot of every super neuron's weights each m simulated
minutes of the slot clock, and once more at the run's end; after the run each snapshot is
tested with `eval_passes` lossy test passes (edgepipe.lossy_eval, as the final test) and once
losslessly. The curve goes to summary.json (`edgepipe.curve`).

Decisions:
- A snapshot is taken on a slot boundary, the one nearest to k x m minutes: it holds every op of
  the slots before it, on every super neuron alike, so the model it assembles is the one the
  devices hold at that instant of the slot clock (ops run at the start of their slot and finish
  within it). Slots count across epochs (`slots_per_epoch` each), so the grid is the slot
  clock's whatever the epochs.
- A fixed time grid, the same for every configuration, not the paper's "every 0.1 epoch" (which
  is 1.25 min for Hybrid and 3.4 min for Model): times to an accuracy then compare at the same
  resolution.
- Each role keeps its own snapshots and hands them over with its final state (`state()`, keys
  `snap_w<l>`/`snap_b<l>`, stacked): a role owns its state, and the runtime already carries
  states to the coordinator on every runtime. An update makes new tensors, so a snapshot holds
  references, not copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from framework.specs import Data
from plugins.schedulers.edgepipe.lossy_eval import lossy_test

SNAP_SLOTS = "snap_slots"


def grid(every_min: float, slot_s: float, total_slots: int) -> list[int]:
    """Slot boundaries of the snapshots: the one nearest to each multiple of every_min minutes
    (the first at least one slot in), up to the run's end, and the end itself."""
    out = []
    k = 1
    while True:
        b = max(1, round(k * every_min * 60.0 / slot_s))
        if b >= total_slots:
            break
        if not out or b > out[-1]:
            out.append(b)
        k += 1
    return out + [total_slots]


@dataclass(frozen=True)
class EvalGrid(Data):
    """When the curve's snapshots are taken and how each is tested (plan.json `eval`)."""

    every_min: float
    passes: int  # lossy test passes per snapshot
    at_slots: tuple[int, ...]  # the slot boundaries of the snapshots, the run's end last
    at_s: tuple[float, ...]


def plan(cfg, slot_s: float, slots_per_epoch: int, epochs: int) -> EvalGrid | None:
    """The plan's `eval` entry (None without a curve)."""
    if cfg.eval_every_min is None:
        return None
    at = grid(float(cfg.eval_every_min), slot_s, slots_per_epoch * epochs)
    return EvalGrid(float(cfg.eval_every_min), int(cfg.eval_passes), tuple(at), tuple(b * slot_s for b in at))


class Snapshots:
    """One role's snapshots at the plan's slot boundaries."""

    def __init__(self, at_slots: tuple[int, ...]):
        self.at = list(at_slots)
        self.taken: list[tuple[dict, dict]] = []

    def before(self, slot: int, W: dict, b: dict) -> None:
        """Called before the op of global slot `slot`: take every snapshot due before it."""
        while len(self.taken) < len(self.at) and self.at[len(self.taken)] < slot:
            self.taken.append((dict(W), dict(b)))

    def through(self, slot: int, W: dict, b: dict) -> None:
        """After the ops of global slots up to `slot` (an epoch's end): take those due by then."""
        self.before(slot + 1, W, b)

    def state(self) -> dict:
        if not self.taken:
            return {}
        out = {SNAP_SLOTS: torch.tensor(self.at[: len(self.taken)], dtype=torch.int64)}
        for l in self.taken[0][0]:
            out[f"snap_w{l}"] = torch.stack([W[l] for W, _ in self.taken])
            out[f"snap_b{l}"] = torch.stack([b[l] for _, b in self.taken])
        return out


def layers_at(partition, states: dict[str, dict], k: int, like: list[tuple[torch.Tensor, torch.Tensor]]):
    """The whole model's (W_l, b_l) at snapshot k, assembled from the roles' chunks."""
    layers = [(torch.empty_like(W), torch.empty_like(b)) for W, b in like]
    for role, st in states.items():
        for layer, lo, hi in partition.super_neurons[int(role[2:])].chunks:
            if layer >= 2:
                layers[layer - 2][0][lo:hi] = st[f"snap_w{layer}"][k]
                layers[layer - 2][1][lo:hi] = st[f"snap_b{layer}"][k]
    return layers


@torch.no_grad()
def lossless_acc(layers, x: torch.Tensor, y: torch.Tensor) -> float:
    a = x.reshape(len(x), -1)
    for i, (W, b) in enumerate(layers):
        a = a @ W.T + b
        if i < len(layers) - 1:
            a = torch.relu(a)
    return float((a.argmax(1) == y).double().mean())


def curve(partition, states: dict[str, dict], like, eval_plan: EvalGrid, slot_s: float, x, y, sn_prr: np.ndarray, seed: int) -> dict:
    """Every snapshot's lossy test (its own seed: [seed, k]) and lossless accuracy."""

    n = min(len(st[SNAP_SLOTS]) for st in states.values())
    at = list(eval_plan.at_slots[:n])
    for role, st in states.items():
        if st[SNAP_SLOTS].tolist()[:n] != at:
            raise ValueError(f"{role}'s snapshots are at slots {st[SNAP_SLOTS].tolist()[:n]}, not the plan's {at}")
    out = {"passes": eval_plan.passes, "slots": at, "t_min": [b * slot_s / 60.0 for b in at], "lossy_mean": [], "lossy_std": [], "acc": []}
    for k in range(n):
        layers = layers_at(partition, states, k, like)
        res = lossy_test(partition, layers, x, y, sn_prr, eval_plan.passes, [seed, k])
        out["lossy_mean"].append(res["mean"])
        out["lossy_std"].append(res["std"])
        out["acc"].append(lossless_acc(layers, x, y))
    return out


def time_to(curve_: dict, target: float, key: str = "lossy_mean") -> float | None:
    """Minutes until the curve first reaches `target` (None if it never does)."""
    for t, a in zip(curve_["t_min"], curve_[key]):
        if a >= target:
            return t
    return None
