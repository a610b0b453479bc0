"""One stage per device: GPipe, 1F1B and PipeDream, as every device's program of actions.

Device d holds stage d (Placement.one_per_device). Each function returns the compute actions
only; the lowering pass adds the sends and receives (framework.pipeline.lowering).
"""

from __future__ import annotations

from framework.errors import ScheduleError
from framework.pipeline.actions import Op, PipelineOrder, Placement, StageAction
from framework.pipeline.schedule import one_f_one_b as pipedream_order


def _check(num_devices: int, microbatches: int) -> None:
    if num_devices < 1 or microbatches < 1:
        raise ScheduleError(f"a schedule needs at least one device and one micro-batch, got {num_devices} device(s) and {microbatches} micro-batch(es)")


def gpipe(num_devices: int, microbatches: int) -> PipelineOrder:
    """GPipe (Huang et al., NeurIPS 2019): every forward, then every backward, in micro-batch
    order. Each device holds all M micro-batches' activations at its peak."""
    _check(num_devices, microbatches)
    M = microbatches
    programs = [[StageAction(d, Op.F, m) for m in range(M)] + [StageAction(d, Op.B, m) for m in range(M)] for d in range(num_devices)]
    return PipelineOrder.of(programs, Placement.one_per_device(num_devices), M)


def one_f_one_b(num_devices: int, microbatches: int) -> PipelineOrder:
    """1F1B with a flush (PipeDream-flush, Narayanan et al., ICML 2021; DAPPLE, Fan et al., PPoPP
    2021): device d warms up with D-1-d forwards (as many as the micro-batch's round trip to the
    last stage and back keeps busy), then runs one forward and one backward in turn, then drains
    the backwards. Device d holds at most D-d micro-batches' activations."""
    _check(num_devices, microbatches)
    D, M = num_devices, microbatches
    programs = []
    for d in range(D):
        warmup = min(D - 1 - d, M)
        prog = [StageAction(d, Op.F, m) for m in range(warmup)]
        for b in range(M - warmup):  # steady state: the next forward, then the oldest backward
            prog += [StageAction(d, Op.F, warmup + b), StageAction(d, Op.B, b)]
        prog += [StageAction(d, Op.B, b) for b in range(M - warmup, M)]  # cool-down
        programs.append(prog)
    return PipelineOrder.of(programs, Placement.one_per_device(D), M)


def pipedream(num_devices: int, microbatches: int, in_flight: int | None = None) -> PipelineOrder:
    """PipeDream (Narayanan et al., SOSP 2019): asynchronous 1F1B over whole mini-batches,
    each stage stepping its optimizer after every backward (weight stashing keeps the forward's
    weights for its backward). The order is pipelab's `one_f_one_b` with its `in_flight` knob
    (framework.pipeline.schedule): stage 0 admits `in_flight` items (default D) before its
    first backward. The STEPs are pipelab's; torch's CSV format has none, so an export drops them."""
    _check(num_devices, microbatches)
    if in_flight is not None and in_flight < 1:
        raise ScheduleError(f"in_flight must be at least 1 (null: one per stage), got {in_flight}")
    programs = []
    for d in range(num_devices):
        prog = []
        for a in pipedream_order(d, num_devices, microbatches, step_after_backward=True, in_flight=in_flight):
            prog.append(StageAction(d, Op.STEP) if a.op == "STEP" else StageAction(d, Op(a.op), a.mb))
        programs.append(prog)
    return PipelineOrder.of(programs, Placement.one_per_device(num_devices), microbatches)
