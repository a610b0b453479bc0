"""Several stages per device, placed in a loop: looped BFS, interleaved 1F1B and (interleaved)
zero bubble, whose one-stage-per-device case is ZB-H1.

Device d of D holds the V stages d, d + D, ..., d + (V-1)D (Placement.looped): a micro-batch
visits every device V times on its way down, and V times on its way back. The orders equal
torch.distributed.pipelining's classes of the same names (tests/test_schedule_parity.py).
"""

from __future__ import annotations

from framework.errors import ScheduleError
from framework.pipeline.actions import Op, PipelineOrder, Placement, StageAction


def _check(num_devices: int, microbatches: int, stages_per_device: int) -> None:
    if num_devices < 1 or microbatches < 1 or stages_per_device < 1:
        raise ScheduleError(f"a schedule needs at least one device, micro-batch and stage per device, got {num_devices}, {microbatches} and {stages_per_device}")


def looped_bfs(num_devices: int, microbatches: int, stages_per_device: int = 2) -> PipelineOrder:
    """Breadth-first pipeline parallelism (Lamy-Poirier, "Breadth-First Pipeline Parallelism",
    MLSys 2023): a device runs its first stage on every micro-batch, then its next stage, ...
    (GPipe per stage, breadth first), then the backwards from its last stage back, each stage's
    micro-batches newest first (the last forward's activation is the freshest to free)."""
    _check(num_devices, microbatches, stages_per_device)
    D, M, V = num_devices, microbatches, stages_per_device
    programs = []
    for d in range(D):
        mine = [d + k * D for k in range(V)]
        prog = [StageAction(s, Op.F, m) for s in mine for m in range(M)]
        prog += [StageAction(s, Op.B, m) for s in reversed(mine) for m in reversed(range(M))]
        programs.append(prog)
    return PipelineOrder.of(programs, Placement.looped(D, V), M)


def _per_round(num_devices: int, microbatches: int, name: str) -> int:
    """Micro-batches a device pushes through one local stage before moving to its next: D, as in
    Megatron-LM's interleaved schedule, relaxed as torch relaxes it (its "flex PP"): rounds =
    max(1, M // D) of M / rounds micro-batches each, so M must divide into whole rounds."""
    rounds = max(1, microbatches // num_devices)
    if microbatches % rounds:
        raise ScheduleError(f"{name} splits the micro-batches into max(1, M // D) = {rounds} rounds of equal size (as torch does), so M = {microbatches} must be a multiple of {rounds}; use M <= {num_devices} or a multiple of {num_devices}")
    return microbatches // rounds


def _depth_first(d: int, D: int, V: int, M: int, per_round: int, backward: bool) -> list[tuple[int, int]]:
    """The (stage, micro-batch) sequence of device d's forwards (or backwards): `per_round`
    micro-batches through its first local stage, the same ones through its second, ..., then the
    next round (depth first: a round reaches the last stage before the next round starts).
    Backwards visit the local stages last first."""
    seq = []
    for k in range(M * V):
        chunk = (k // per_round) % V
        local = V - 1 - chunk if backward else chunk
        mb = (k // (per_round * V)) * per_round + k % per_round
        seq.append((local * D + d, mb))
    return seq


def _one_forward_one_backward(fwd, bwd, warmup: int, backward: Op, weight_lag: int | None = None) -> list[StageAction]:
    """`warmup` forwards, then one forward and one backward in turn, then the remaining backwards.
    With `weight_lag` L (zero bubble), the backward is the input gradient (I) alone and the weight
    gradient (W) of backward i runs right after backward i + L; the last L weight gradients drain
    at the end."""
    prog = [StageAction(s, Op.F, m) for s, m in fwd[:warmup]]
    for i, (s, m) in enumerate(bwd):
        if warmup + i < len(fwd):
            fs, fm = fwd[warmup + i]
            prog.append(StageAction(fs, Op.F, fm))
        prog.append(StageAction(s, backward, m))
        if weight_lag is not None and i >= weight_lag:
            prog.append(StageAction(bwd[i - weight_lag][0], Op.W, bwd[i - weight_lag][1]))
    if weight_lag is not None:
        prog += [StageAction(s, Op.W, m) for s, m in bwd[max(0, len(bwd) - weight_lag):]]
    return prog


def interleaved_1f1b(num_devices: int, microbatches: int, stages_per_device: int = 2) -> PipelineOrder:
    """Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
    Clusters Using Megatron-LM", SC 2021, Sec. 2.2): 1F1B over V local stages, depth first. Device d
    warms up with (V-1)·per_round forwards (the other local stages' share of a round) plus 2 per
    device downstream of it (the round trip of a micro-batch's forward and backward), which cuts
    1F1B's bubble by V at V times the messages."""
    _check(num_devices, microbatches, stages_per_device)
    D, M, V = num_devices, microbatches, stages_per_device
    per_round = _per_round(D, M, "interleaved_1f1b")
    programs = []
    for d in range(D):
        warmup = min((V - 1) * per_round + 2 * (D - 1 - d), M * V)
        programs.append(_one_forward_one_backward(_depth_first(d, D, V, M, per_round, False), _depth_first(d, D, V, M, per_round, True), warmup, Op.B))
    return PipelineOrder.of(programs, Placement.looped(D, V), M)


def zero_bubble(num_devices: int, microbatches: int, stages_per_device: int = 1) -> PipelineOrder:
    """Zero bubble (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward split
    into its input gradient (I), which the upstream device waits on, and its weight gradient (W),
    which nobody waits on and so fills what would be a bubble.

    With one stage per device this is ZB-H1 (the paper's Sec. 3.1, Fig. 3): 1F1B's warm-up of
    D-1-d forwards and its memory (device d delays its W by d backwards, so it holds at most D
    micro-batches, as 1F1B's first device does), and 1F1B's bubble of (D-1)(T_F+T_B) shrinks to
    about (D-1)(T_F+T_I-T_W) (framework.pipeline.bubble). With V stages per device it is torch's
    ScheduleInterleavedZeroBubble (the paper's ZB1P, interleaved): interleaved 1F1B's depth-first
    order with one forward per device downstream in the warm-up instead of two."""
    _check(num_devices, microbatches, stages_per_device)
    D, M, V = num_devices, microbatches, stages_per_device
    # rounds only order the local stages: with one per device every M works (torch asks for whole rounds anyway)
    per_round = _per_round(D, M, "zero_bubble") if V > 1 else min(M, D)
    programs = []
    for d in range(D):
        warmup = min((V - 1) * per_round + (D - 1 - d), M * V)
        programs.append(_one_forward_one_backward(_depth_first(d, D, V, M, per_round, False), _depth_first(d, D, V, M, per_round, True), warmup, Op.I, weight_lag=d))
    return PipelineOrder.of(programs, Placement.looped(D, V), M)
