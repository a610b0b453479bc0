"""A pipeline schedule's vocabulary, and the schedule as data a stage receives.

A schedule says, for stage s of S and n items in one flush (micro-batches of a mini-batch, or
an epoch's mini-batches for an asynchronous pipeline), the ordered actions that stage performs:
`F(m)` forward of item m, `B(m)` backward of it, `STEP` the optimizer. A schedule plugin writes
that as a function (`PipelineScheduler.actions`, framework.pipeline.scheduler); the scheduler evaluates it
once, on the coordinator, for every flush size a run can meet, and ships the result to the
stages as a `Schedule`: plain data (actions as text, `"F0"`, `"B3"`, `"STEP"`), so a stage runs a
program it received, not a function of the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from framework.specs import Data


@dataclass(frozen=True)
class Action:
    op: str  # "F", "B" or "STEP"
    mb: int = -1

    def __repr__(self) -> str:
        return self.op if self.op == "STEP" else f"{self.op}{self.mb}"

    __str__ = __repr__

    @classmethod
    def parse(cls, text: str) -> Action:
        """The action `str(action)` wrote: "STEP", or an op and an item index ("F0", "B12")."""
        if text == "STEP":
            return STEP
        op, mb = text[:1], text[1:]
        if op not in ("F", "B") or not mb.isdigit():
            raise ValueError(f"{text!r} is not a pipeline action (F<m>, B<m> or STEP)")
        return cls(op, int(mb))


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


@dataclass(frozen=True)
class Schedule(Data):
    """Every stage's program for every flush size a run can meet: `programs[s][n]` is what
    stage s does in a flush of n items, as action text. Every stage receives all of them, as it
    receives every stage's role name: a stage that re-plans prices every stage's program
    (framework.pipeline.cost)."""

    programs: tuple[dict[int, tuple[str, ...]], ...]

    @classmethod
    def of(cls, actions: Callable[[int, int, int], list[Action]], num_stages: int, flush_sizes: Iterable[int]) -> Schedule:
        """`actions(stage, num_stages, n)` evaluated for every stage and flush size."""
        sizes = sorted(set(flush_sizes))
        return cls(tuple({n: tuple(str(a) for a in actions(s, num_stages, n)) for n in sizes} for s in range(num_stages)))

    @property
    def num_stages(self) -> int:
        return len(self.programs)

    def program(self, stage: int, n: int) -> list[Action]:
        """Stage `stage`'s actions in a flush of `n` items."""
        try:
            texts = self.programs[stage][n]
        except KeyError:
            raise ValueError(f"stage{stage} has no program for a flush of {n} items (the scheduler computed it for {sorted(self.programs[stage])})") from None
        return [Action.parse(t) for t in texts]
