"""Two stages per device in a V: ZBV and DualPipeV.

Device d of D holds stage d (on a micro-batch's way down) and stage 2D-1-d (on its way back),
so device 0 runs both the first and the last stage (Placement.v_shape): the loss's gradient
starts where the input entered, and the middle device's two stages (D-1 and D) pass activations
in memory. The orders equal torch.distributed.pipelining's ScheduleZBVZeroBubble and
ScheduleDualPipeV (tests/test_schedule_parity.py).
"""

from __future__ import annotations

from collections import defaultdict, deque

from framework.errors import ScheduleError
from framework.pipeline.actions import Op, PipelineOrder, Placement, StageAction


class _Program:
    """One device's program being written: each call appends an action on the next micro-batch of
    that (stage, op): forwards, backwards and weight gradients each go in micro-batch order."""

    def __init__(self):
        self.actions: list[StageAction] = []
        self.count: dict[tuple[int, str], int] = defaultdict(int)

    def run(self, stage: int, op: Op, counter: str | None = None) -> int:
        key = (stage, counter or op.value)
        mb = self.count[key]
        self.count[key] += 1
        self.actions.append(StageAction(stage, op, mb))
        return mb


def zbv(num_devices: int, microbatches: int) -> PipelineOrder:
    """ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 6): with T_F = T_I =
    T_W = t per stage, the V placement and split backwards leave each device idle only (D-1)·t,
    the time the first forward takes to reach the last device, at 1F1B's peak memory (2D stages of
    half a layer-stack each in flight per device; framework.pipeline.bubble). Each device:
    a warm-up of forwards down the V (2(D-d)-1 on its first stage, then d pairs of both), then
    (D-d) rounds of F, I, W on its second stage, a steady state of F, I, W on each stage in turn,
    and a cool-down of the remaining input gradients and then weight gradients.

    The shape needs 2D-1 micro-batches to fill; with fewer (torch does the same), it is built for
    2D-1 and the actions on micro-batches beyond M are dropped."""
    D, M = num_devices, microbatches
    if D < 1 or M < 1:
        raise ScheduleError(f"zbv needs at least one device and one micro-batch, got {D} and {M}")
    n = max(2 * D - 1, M)
    programs = []
    for d in range(D):
        down, up = d, 2 * D - 1 - d
        p = _Program()
        # warm-up
        for _ in range(2 * (D - d) - 1):
            p.run(down, Op.F)
        for _ in range(d):
            p.run(up, Op.F)
            p.run(down, Op.F)
        for _ in range(D - d):
            p.run(up, Op.F)
            p.run(up, Op.I)
            p.run(up, Op.W)
        # steady state: F, I, W on the way down, then on the way back
        while p.count[up, "F"] < p.count[down, "F"] or p.count[down, "F"] < n:
            if p.count[down, "F"] < n:
                p.run(down, Op.F)
            p.run(down, Op.I)
            p.run(down, Op.W)
            p.run(up, Op.F)
            p.run(up, Op.I)
            p.run(up, Op.W)
        # cool-down: the input gradients first (others wait on them), the weight gradients after
        for _ in range(d):
            p.run(down, Op.I)
            p.run(up, Op.I)
        for _ in range(D - d):
            p.run(down, Op.I)
            p.run(down, Op.W)
        for stage in (up, down):
            while p.count[stage, "W"] < p.count[stage, "I"]:
                p.run(stage, Op.W)
        programs.append([a for a in p.actions if a.mb < M])
    return PipelineOrder.of(programs, Placement.v_shape(D), M)


def dualpipev(num_devices: int, microbatches: int) -> PipelineOrder:
    """DualPipeV: DualPipe's schedule (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, Sec.
    3.2.1; github.com/deepseek-ai/DualPipe) folded onto a V: in its main phase each device runs
    a forward on one of its stages and a full backward on the other in pairs (whose compute and
    communication DualPipe overlaps), and it splits the last backwards into I and W to fill the
    cool-down.

    torch writes each pair as one OVERLAP_F_B action; its runtime runs the pair's forward, then
    its backward, which is how it is written here (and how the CSV reader expands it).
    Needs M >= 2D micro-batches (torch's constraint: as many as stages)."""
    D, M = num_devices, microbatches
    if D < 1 or M < 2 * D:
        raise ScheduleError(f"dualpipev needs at least as many micro-batches as stages (2D = {2 * D}), got M = {M}")
    return PipelineOrder.of([_dualpipev_device(d, D, M) for d in range(D)], Placement.v_shape(D), M)


def _dualpipev_device(d: int, D: int, M: int) -> list[StageAction]:
    """Device d's DualPipeV program, in DualPipe's eight steps."""
    down, up = d, 2 * D - 1 - d
    p = _Program()
    deferred: deque[tuple[int, int]] = deque()  # (stage, micro-batch) of input gradients whose W waits

    def forward(stage):
        p.run(stage, Op.F)

    def backward(stage, split=False):  # I and B share one counter: each is the stage's next backward
        mb = p.run(stage, Op.I if split else Op.B, counter="backward")
        if split:
            deferred.append((stage, mb))

    def weight():
        if deferred:
            stage, mb = deferred.popleft()
            p.actions.append(StageAction(stage, Op.W, mb))

    def forward_and_backward(f_stage, b_stage):  # torch's OVERLAP_F_B, as its runtime runs it
        forward(f_stage)
        backward(b_stage)

    for _ in range(2 * (D - d - 1)):  # 1: forwards down the V
        forward(down)
    for _ in range(d + 1):  # 2: forwards on both stages
        forward(down)
        forward(up)
    for _ in range(D - d - 1):  # 3: zero-bubble steps on the way back
        backward(up, split=True)
        weight()
        forward(up)
    for _ in range(M - 2 * D + d + 1):  # 4: the main phase, forward/backward pairs
        forward_and_backward(down, up)  # (torch does not overlap the last device's first pair: the same order)
        forward_and_backward(up, down)
    for _ in range(D - d - 1):  # 5: backward on the way back, then a pair
        backward(up)
        forward_and_backward(up, down)
    split = False  # 6: the last backwards, the second half split (W deferred)
    for i in range(d + 1):
        if i == (d + 1) // 2 and d % 2 == 1:
            split = True
        backward(up, split)
        if i == (d + 1) // 2 and d % 2 == 0:
            split = True
        backward(down, split)
    for _ in range(D - d - 1):  # 7: a deferred W, then a backward
        weight()
        backward(down, split)
    for _ in range(d + 1):  # 8: the deferred weight gradients
        weight()
    return p.actions
