"""A pipeline schedule as data: every device's program of `(stage, op, micro-batch)` actions.

This is the vocabulary of `torch.distributed.pipelining.schedules` (its `_Action` and
`_ComputationType`), with the same text form, so a schedule moves between pipelab and torch
unchanged (framework.pipeline.schedule_csv):

    0F0        stage 0 runs the forward of micro-batch 0
    1B3        stage 1 runs the full backward of micro-batch 3
    2I0, 3W1   the backward split in two (zero-bubble schedules): the input gradient (I), which
               the upstream stage waits on, and the weight gradient (W), which nothing waits on
    1SEND_F0   stage 1 sends micro-batch 0's activation to stage 2 (RECV_F: stage 2 receives it)
    2SEND_B0   stage 2 sends micro-batch 0's input gradient to stage 1 (RECV_B: stage 1 receives it)
    0STEP      stage 0's optimizer step (pipelab's: torch keeps the step outside its schedule)

A stage lives on one device (`Placement`); a device may hold several stages (virtual stages:
interleaved and V-shaped schedules). `PipelineOrder` is every device's program: what a
generator writes (framework.pipeline.schedules), the lowering pass extends with sends and
receives (framework.pipeline.lowering) and the validator checks (framework.pipeline.validate).

Today's pipeline stages run `framework.pipeline.schedule.Action`, the stage-implicit form
(`F0`, `B3`, `STEP`) of a schedule with one stage per device; `legacy_program` converts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from framework.errors import ScheduleError


class Op(str, Enum):
    F = "F"  # forward
    B = "B"  # full backward: input and weight gradients at once
    I = "I"  # backward-input: the gradient the previous stage waits on
    W = "W"  # backward-weight: the parameters' gradient, after this micro-batch's I
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    STEP = "STEP"  # the optimizer step (no micro-batch)


COMPUTE = frozenset({Op.F, Op.B, Op.I, Op.W})
SENDS = frozenset({Op.SEND_F, Op.SEND_B})
RECEIVES = frozenset({Op.RECV_F, Op.RECV_B})

# torch's _action_regex, anchored, with pipelab's STEP and without torch's FSDP/data-parallel
# bookkeeping (UNSHARD, RESHARD, REDUCE_GRAD: the CSV reader drops those)
_ACTION = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|STEP|F|B|I|W)(\d*)")


class StageAction(NamedTuple):
    """One action of one stage: `StageAction(1, Op.F, 0)` is `1F0`."""

    stage: int
    op: Op
    mb: int | None = None  # the micro-batch; None for STEP

    def __str__(self) -> str:
        return f"{self.stage}{self.op.value}{'' if self.mb is None else self.mb}"

    __repr__ = __str__

    @classmethod
    def parse(cls, text: str) -> StageAction:
        """The action `str(action)` wrote (`0F0`, `1SEND_B3`, `0STEP`)."""
        m = _ACTION.fullmatch(text.strip())
        if m is None:
            raise ScheduleError(f"{text.strip()!r} is not an action: <stage><op><micro-batch>, op one of F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B (e.g. 0F0, 1B3, 2I0, 1SEND_F0) or <stage>STEP")
        stage, op, mb = int(m.group(1)), Op(m.group(2)), m.group(3)
        if (op is Op.STEP) != (mb == ""):
            raise ScheduleError(f"{text.strip()!r}: STEP takes no micro-batch, every other op one (e.g. 0F0, 0STEP)")
        return cls(stage, op, int(mb) if mb else None)


@dataclass(frozen=True)
class Placement:
    """Which device holds each stage: `device_of[s]`. Stage s talks only to s-1 and s+1; two
    adjacent stages on one device pass activations in memory, without a send."""

    device_of: tuple[int, ...]
    num_devices: int

    def __post_init__(self):
        missing = sorted(set(range(self.num_devices)) - set(self.device_of))
        if missing or any(not 0 <= d < self.num_devices for d in self.device_of):
            raise ScheduleError(f"placement {list(self.device_of)} of {len(self.device_of)} stages leaves device(s) {missing} of {self.num_devices} empty or names one outside 0..{self.num_devices - 1}")

    @classmethod
    def one_per_device(cls, num_devices: int) -> Placement:
        """Stage d on device d (GPipe, 1F1B, ZB-H1, PipeDream)."""
        return cls(tuple(range(num_devices)), num_devices)

    @classmethod
    def looped(cls, num_devices: int, stages_per_device: int) -> Placement:
        """Stage s on device s mod D: device d holds d, d + D, d + 2D, ... (interleaved 1F1B,
        looped BFS, interleaved zero bubble; torch's default "loop" style)."""
        return cls(tuple(s % num_devices for s in range(num_devices * stages_per_device)), num_devices)

    @classmethod
    def v_shape(cls, num_devices: int) -> Placement:
        """Device d holds stages d and 2D-1-d (ZBV, DualPipeV; torch's "v" style): the first and
        the last stage share device 0, so the loss's gradient starts where the input entered."""
        D = num_devices
        return cls(tuple(s if s < D else 2 * D - 1 - s for s in range(2 * D)), D)

    @classmethod
    def inferred(cls, programs: Sequence[Sequence[StageAction]]) -> Placement:
        """The placement a set of programs implies, as torch infers it from a CSV: each stage on
        the device whose program runs it."""
        where: dict[int, int] = {}
        for d, prog in enumerate(programs):
            for a in prog:
                if where.setdefault(a.stage, d) != d:
                    raise ScheduleError(f"stage {a.stage} runs on device {where[a.stage]} and on device {d} ({a}): a stage lives on one device")
        if not where:
            raise ScheduleError("the schedule has no actions")
        gaps = sorted(set(range(max(where) + 1)) - set(where))
        if gaps:
            raise ScheduleError(f"stage(s) {gaps} run nowhere, but stages up to {max(where)} do: stages are numbered 0..S-1 in pipeline order")
        return cls(tuple(where[s] for s in range(len(where))), len(programs))

    @property
    def num_stages(self) -> int:
        return len(self.device_of)

    def stages_on(self, device: int) -> tuple[int, ...]:
        return tuple(s for s, d in enumerate(self.device_of) if d == device)

    def crosses(self, a: int, b: int) -> bool:
        """Whether stages a and b are on different devices (a message between them is sent)."""
        return self.device_of[a] != self.device_of[b]


@dataclass(frozen=True)
class PipelineOrder:
    """Every device's program: `programs[d]` the actions device d runs, in order."""

    programs: tuple[tuple[StageAction, ...], ...]
    placement: Placement
    microbatches: int

    @classmethod
    def of(cls, programs: Iterable[Iterable[StageAction | None]], placement: Placement | None = None, microbatches: int | None = None) -> PipelineOrder:
        """From per-device lists; None (torch's idle slot) is dropped: an idle slot is when an
        action may start, which the runtime decides, not which action comes next."""
        progs = tuple(tuple(a for a in p if a is not None) for p in programs)
        placement = placement or Placement.inferred(progs)
        if microbatches is None:
            mbs = [a.mb for p in progs for a in p if a.mb is not None]
            microbatches = max(mbs) + 1 if mbs else 0
        return cls(progs, placement, microbatches)

    @property
    def num_devices(self) -> int:
        return len(self.programs)

    @property
    def num_stages(self) -> int:
        return self.placement.num_stages

    def compute_only(self) -> PipelineOrder:
        """The forwards and backwards alone (torch's compute_only format): no sends, receives or steps."""
        return PipelineOrder(tuple(tuple(a for a in p if a.op in COMPUTE) for p in self.programs), self.placement, self.microbatches)

    def text(self) -> list[list[str]]:
        return [[str(a) for a in p] for p in self.programs]

    def __str__(self) -> str:
        return "\n".join(f"device {d}: {' '.join(row)}" for d, row in enumerate(self.text()))


def legacy_program(order: PipelineOrder, device: int) -> list[str]:
    """Device `device`'s program in today's stage-implicit form (`F0`, `B3`, `STEP`:
    framework.pipeline.schedule.Action), for a schedule of one stage per device and full backwards."""
    out = []
    for a in order.programs[device]:
        if len(order.placement.stages_on(device)) != 1 or a.op not in (Op.F, Op.B, Op.STEP):
            raise ScheduleError(f"{a} on device {device}: today's stages run one stage per device with F, B and STEP only")
        out.append("STEP" if a.op is Op.STEP else f"{a.op.value}{a.mb}")
    return out
