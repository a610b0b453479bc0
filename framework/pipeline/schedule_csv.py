"""Schedules in torch's CSV format: one row per device (torch's rank), one action per cell.

This is the format of `torch.distributed.pipelining`'s `PipelineScheduleMulti._dump_csv` and
`_load_csv` ("compute_only"): cells such as `0F0`, `1B3`, `2I0`, `3W1`; an empty cell is an idle
slot. pipelab writes the compute actions (F, B, I, W) alone, without idle slots, so torch reads
what pipelab writes and pipelab reads what torch writes (tests/test_schedule_parity.py):

- a cell torch writes as `(0F3;3B1)OVERLAP_F_B` (DualPipeV's forward/backward pair) becomes its
  two actions in that order, which is how torch's runtime runs it;
- `UNSHARD`, `RESHARD` and `REDUCE_GRAD` (FSDP and data-parallel bookkeeping, no pipeline order)
  are dropped;
- sends and receives (torch's "compute_comms" format) and pipelab's `STEP` are read as they are;
  the writer leaves them out (the reader of a compute-only file lowers it again).

The placement is read off the rows (each stage on the device whose row runs it), as torch infers
its stage-to-rank mapping; the micro-batch count is the largest index plus one unless given.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from framework.errors import ScheduleError
from framework.pipeline.actions import COMPUTE, PipelineOrder, StageAction

DROPPED = ("UNSHARD", "RESHARD", "REDUCE_GRAD")


def dumps(order: PipelineOrder) -> str:
    """The compute actions of every device's program, one CSV row per device."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for prog in order.programs:
        writer.writerow([str(a) for a in prog if a.op in COMPUTE])
    return buf.getvalue()


def dump_csv(order: PipelineOrder, path: str | Path) -> None:
    Path(path).write_text(dumps(order))


def _cell(text: str) -> list[StageAction]:
    text = text.strip()
    if not text:
        return []  # an idle slot
    if text.startswith("(") and text.endswith(")OVERLAP_F_B"):
        return [a for part in text[1 : -len(")OVERLAP_F_B")].split(";") for a in _cell(part)]
    if text.lstrip("0123456789") in DROPPED:
        return []
    return [StageAction.parse(text)]


def loads(text: str, microbatches: int | None = None) -> PipelineOrder:
    """Every device's program from CSV text (row d: device d)."""
    programs = []
    for row_no, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        prog = []
        for col_no, cell in enumerate(row, start=1):
            try:
                prog += _cell(cell)
            except ScheduleError as e:
                raise ScheduleError(f"row {row_no} (device {row_no - 1}), column {col_no}: {e.message}") from None
        programs.append(prog)
    if not programs:
        raise ScheduleError("the schedule has no rows: one row of actions per device")
    return PipelineOrder.of(programs, microbatches=microbatches)


def load_csv(path: str | Path, microbatches: int | None = None) -> PipelineOrder:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ScheduleError(f"cannot read {path}: {e.strerror or e}") from None
    return loads(text, microbatches)
