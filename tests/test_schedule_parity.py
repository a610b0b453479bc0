"""pipelab's schedules against torch.distributed.pipelining's (issue 48): the same per-device
action order, the same sends, and CSV files that each side reads from the other.

torch's schedule classes compute every rank's order (`pipeline_order`) in their constructors, so
mock stages (no module, no process group) are enough to read them on a CPU. Idle slots (None) are
dropped before comparing: they say when an action may start, which the runtime decides.

Two things are normalised the same documented way on both sides:
- DualPipeV's `OVERLAP_F_B` pairs become their forward and backward, in that order, which is how
  torch's runtime runs them (`_PipelineScheduleRuntime._step_microbatches`) and how pipelab's
  generator and CSV reader write them;
- `REDUCE_GRAD` (torch's data-parallel gradient reduction, which its single-stage classes append)
  is not a pipeline action and is dropped.

torch's bug: `Schedule1F1B._get_pipeline_order` numbers the last rank's forwards from 1 (F1..FM):
with no warm-up forwards its counter starts at 0 and is incremented before the first forward. Its
`step()` runs F0..F(M-1) there, so the IR, not the schedule, is off by one. Every other rank is
compared exactly; the last rank against its forwards renumbered from 0, after checking that torch
still writes F1..FM (if a torch release fixes it, the check says so).
"""

from __future__ import annotations

import pytest
import torch.distributed.pipelining.schedules as ts
from torch.distributed.pipelining.stage import _PipelineStageBase

from framework.errors import ScheduleError
from framework.pipeline.actions import COMPUTE, RECEIVES, Op, PipelineOrder, StageAction
from framework.pipeline.lowering import lower
from framework.pipeline.schedule_csv import dump_csv, load_csv, loads
from framework.pipeline.schedules import BUILTIN, build


class MockStage(_PipelineStageBase):
    """What a schedule class reads of a stage: its index, the stage count, the group's size and rank."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int, group_rank: int):
        self.stage_index, self.num_stages = stage_index, num_stages
        self.group_size, self.group_rank = group_size, group_rank
        self.submod, self.has_backward, self.stage_index_to_group_rank, self.dw_builder = None, True, {}, None

    def _prepare_forward_infra(self, *args, **kwargs):
        pass

    def _create_grad_recv_info(self, *args, **kwargs):
        pass

    def _prepare_backward_infra(self, *args, **kwargs):
        pass


# (pipelab name, torch class, stages per device)
CLASSES = [
    ("gpipe", ts.ScheduleGPipe, 1),
    ("1f1b", ts.Schedule1F1B, 1),
    ("interleaved_1f1b", ts.ScheduleInterleaved1F1B, 2),
    ("looped_bfs", ts.ScheduleLoopedBFS, 2),
    ("zero_bubble", ts.ScheduleInterleavedZeroBubble, 2),
    ("zero_bubble", ts.ScheduleInterleavedZeroBubble, 1),  # ZB-H1: the same class with one stage per rank
    ("zbv", ts.ScheduleZBVZeroBubble, 2),
    ("dualpipev", ts.ScheduleDualPipeV, 2),
]
CASES = [(name, cls, V, D, M) for name, cls, V in CLASSES for D in (2, 4) for M in (4, 8)]
# the one combination torch rejects: DualPipeV needs as many micro-batches as stages (8 on 4 devices)
REJECTED = {("dualpipev", 4, 4)}


def torch_schedule(cls, D: int, M: int, V: int):
    """torch's schedule object for D ranks, V stages each, seen from rank 0."""
    S = D * V
    if V == 1 and cls in (ts.ScheduleGPipe, ts.Schedule1F1B):
        stages = MockStage(0, S, D, 0)  # PipelineScheduleSingle: one stage, not a list
    elif cls in (ts.ScheduleZBVZeroBubble, ts.ScheduleDualPipeV):
        stages = [MockStage(s, S, D, 0) for s in (0, S - 1)]  # the V: rank 0 holds the first and last stage
    else:
        stages = [MockStage(k * D, S, D, 0) for k in range(V)]  # looped: rank 0 holds 0, D, 2D, ...
    return cls(stages, M, loss_fn=lambda output, target: 0)


def expanded(actions) -> list[str]:
    """torch's actions as text, OVERLAP_F_B pairs expanded, idle slots and REDUCE_GRAD dropped."""
    out = []
    for a in actions:
        if a is None or a.computation_type == ts.REDUCE_GRAD:
            continue
        out += [str(sub) for sub in a.sub_actions] if a.sub_actions is not None else [str(a)]
    return out


def corrected_1f1b_last_rank(row: list[str], M: int) -> list[str]:
    forwards = [int(t.split("F")[1]) for t in row if "F" in t]
    assert forwards == list(range(1, M + 1)), f"torch's Schedule1F1B numbers its last rank's forwards {forwards}: it fixed its off-by-one, compare the last rank exactly"
    return [t.replace(f"F{int(t.split('F')[1])}", f"F{int(t.split('F')[1]) - 1}") if "F" in t else t for t in row]


@pytest.mark.parametrize("name,cls,V,D,M", CASES, ids=[f"{n}-V{V}-D{D}-M{M}" for n, _, V, D, M in CASES])
def test_every_device_runs_torchs_order(name, cls, V, D, M):
    if (name, D, M) in REJECTED:
        with pytest.raises(ValueError, match="at least as many microbatches as stages"):
            torch_schedule(cls, D, M, V)
        with pytest.raises(ScheduleError, match="at least as many micro-batches as stages"):
            build(name, D * V, M, V)
        return
    theirs = {r: expanded(acts) for r, acts in torch_schedule(cls, D, M, V).pipeline_order.items()}
    ours = build(name, D * V, M, V)
    assert ours.num_devices == D and sorted(theirs) == list(range(D))
    for d in range(D):
        expected = corrected_1f1b_last_rank(theirs[d], M) if cls is ts.Schedule1F1B and d == D - 1 else theirs[d]
        assert [str(a) for a in ours.programs[d]] == expected, f"device {d}"


RUNTIME_CASES = [c for c in CASES if issubclass(c[1], ts._PipelineScheduleRuntime) and (c[0], c[3], c[4]) not in REJECTED]


@pytest.mark.parametrize("name,cls,V,D,M", RUNTIME_CASES, ids=[f"{n}-V{V}-D{D}-M{M}" for n, _, V, D, M in RUNTIME_CASES])
def test_lowering_sends_what_torch_sends(name, cls, V, D, M):
    """torch lowers its multi-stage schedules itself (`_add_send_recv`): a send right after the
    action that computes it, as pipelab's lowering, and the same receives, which torch places as
    early as its lock-step simulation lets it and pipelab right before their consumer. Its FSDP
    actions (UNSHARD, RESHARD) and REDUCE_GRAD are dropped. A DualPipeV pair's two sends follow
    the pair in torch (it runs as one action there) and each half here: the same sends, in order."""
    theirs = torch_schedule(cls, D, M, V).pipeline_order_with_comms
    ours = lower(build(name, D * V, M, V))
    for d in range(D):
        t = [a for a in expanded(theirs[d]) if "SHARD" not in a]
        o = [str(a) for a in ours.programs[d]]
        assert [a for a in o if "SEND" in a] == [a for a in t if "SEND" in a], f"device {d}: sends"
        assert sorted(a for a in o if "RECV" in a) == sorted(a for a in t if "RECV" in a), f"device {d}: receives"
        if cls is not ts.ScheduleDualPipeV:  # which torch sends after both actions of an OVERLAP_F_B pair
            assert [a for a in o if "RECV" not in a] == [a for a in t if "RECV" not in a], f"device {d}: sends right after their actions"


def test_adjacent_stages_on_one_device_send_nothing():
    """DualPipeV's middle device holds stages D-1 and D: activations pass in memory there."""
    D, M = 4, 8
    order = lower(build("dualpipev", 2 * D, M))
    sends = [a for p in order.programs for a in p if a.op in (Op.SEND_F, Op.SEND_B)]
    # 2D - 1 boundaries, one of them inside device D-1; each carries M activations and M gradients
    assert len(sends) == (2 * D - 2) * 2 * M
    assert StageAction(D - 1, Op.SEND_F, 0) not in order.programs[D - 1] and StageAction(D, Op.SEND_B, 0) not in order.programs[D - 1]


BUILTIN_CASES = [(name, D, M) for name in BUILTIN for D in (2, 4) for M in (4, 8) if (name, D, M) not in REJECTED]


@pytest.mark.parametrize("name,D,M", BUILTIN_CASES, ids=[f"{n}-D{D}-M{M}" for n, D, M in BUILTIN_CASES])
def test_torch_reads_the_csv_pipelab_writes(tmp_path, name, D, M):
    """`_PipelineScheduleRuntime._load_csv` (torch's compute_only reader, which also validates the
    schedule, infers each stage's rank and lowers it) gives the actions pipelab wrote.
    PipeDream's optimizer steps are pipelab's and the CSV format has none: its export drops them."""
    V = BUILTIN[name].default_per_device
    order = build(name, D * V, M)
    path = tmp_path / f"{name}.csv"
    dump_csv(order, path)
    sched = ts._PipelineScheduleRuntime([MockStage(s, D * V, D, 0) for s in order.placement.stages_on(0)], M)
    sched._load_csv(str(path))
    assert {r: [str(a) for a in acts] for r, acts in sched.pipeline_order.items()} == dict(enumerate(order.compute_only().text()))
    assert sched.stage_index_to_group_rank == dict(enumerate(order.placement.device_of))


@pytest.mark.parametrize("name,cls,V,D,M", CASES, ids=[f"{n}-V{V}-D{D}-M{M}" for n, _, V, D, M in CASES])
def test_pipelab_reads_the_csv_torch_writes(tmp_path, name, cls, V, D, M):
    """torch's `_dump_csv(format="compute_only")`: idle slots as empty cells, DualPipeV's pairs as
    `(0F3;3B1)OVERLAP_F_B`, the single-stage classes' REDUCE_GRAD (written through a runtime
    schedule holding their order, as those classes have no writer of their own)."""
    if (name, D, M) in REJECTED:
        pytest.skip("torch rejects DualPipeV with fewer micro-batches than stages (tested above)")
    sched = torch_schedule(cls, D, M, V)
    path = tmp_path / "torch.csv"
    if isinstance(sched, ts._PipelineScheduleRuntime):
        sched._dump_csv(str(path), format="compute_only")
    else:
        writer = ts._PipelineScheduleRuntime([MockStage(0, D, D, 0)], M)
        writer.pipeline_order = sched.pipeline_order
        writer._dump_csv(str(path), format="compute_only")
    if cls in (ts.ScheduleGPipe, ts.Schedule1F1B):
        assert "REDUCE_GRAD" in path.read_text()  # what the reader drops
    order = load_csv(path)
    assert order.text() == [expanded(sched.pipeline_order[r]) for r in range(D)]
    if cls is not ts.Schedule1F1B:  # torch's 1F1B IR has M + 1 forwards' indices on its last rank (see above)
        assert order.microbatches == M and order.placement.device_of == build(name, D * V, M, V).placement.device_of


def test_a_cell_torch_cannot_write_is_refused_with_its_place():
    with pytest.raises(ScheduleError, match=r"^row 2 \(device 1\), column 3: '1X0' is not an action"):
        loads("0F0,0B0\n1F0,1B0,1X0\n")


def test_compute_only_drops_what_torch_has_no_cell_for():
    order = build("pipedream", 3, 4)
    assert any(a.op is Op.STEP for p in order.programs for a in p)
    assert all(a.op in COMPUTE for p in order.compute_only().programs for a in p)
    assert not any(a.op in RECEIVES for p in lower(order).compute_only().programs for a in p)
    assert isinstance(loads("0F0,,0B0\n1F0,1B0\n"), PipelineOrder)
