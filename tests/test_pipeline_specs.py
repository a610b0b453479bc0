"""A pipeline stage is built from its spec and its process's parts, never from the scheduler
(framework.pipeline.stage); the plan and the schedule are data that survive JSON; what stages
do at an epoch's end is a policy a plugin declares (framework.pipeline.epoch_end)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.job import Job
from framework.pipeline import epoch_end as pipeline_epoch_end
from framework.pipeline.epoch_end import EpochEndPolicy, EpochEndSpec
from framework.pipeline.plan import PipelinePlan
from framework.pipeline.schedule import STEP, Action, B, F, Schedule, one_f_one_b
from framework.pipeline.stage import StageRole, StageSpec
from framework.scheduler import Scheduler, SchedulerContext
from tests.conftest import compose_cfg

SMALL = ["model=mlp", "dataset=synthetic_mnist", "dataset.n_train=96", "dataset.n_val=32", "dataset.n_test=32", "cluster=uniform", "cluster.num_devices=3",
         "train.batch_size=16", "train.epochs=3", "train.iterations_per_epoch=3", "predictor=oracle", "tracking=none", "runtime.progress=false"]
SCHEDULES = [["scheduler=gpipe"], ["scheduler=1f1b"], ["scheduler=pipedream"], ["scheduler=local"], ["scheduler=pipedream", "scheduler.replan_epsilon=0.15"],
             ["scheduler=1f1b", "scheduler.repartition=[[1,[1,3]]]", "scheduler.partition=[1,2]"]]


def _held(obj, depth: int):
    """What `obj` holds, `depth` levels down: its attributes, and the items of the containers
    among them."""
    out, todo = [], [(obj, 0)]
    while todo:
        x, d = todo.pop()
        if d == depth:
            continue
        attrs = vars(x) if hasattr(x, "__dict__") and not isinstance(x, type) else {}
        items = list(x.values()) if isinstance(x, dict) else list(x) if isinstance(x, (list, tuple, set)) else []
        for v in list(attrs.values()) + items:
            out.append(v)
            todo.append((v, d + 1))
    return out


@pytest.mark.parametrize("over", SCHEDULES, ids=lambda o: " ".join(o))
def test_every_stage_is_built_from_its_shipped_spec_alone(tmp_path, over):
    job = Job(compose_cfg(SMALL + over), tmp_path)
    sched = job.scheduler
    for role in sched.role_devices():
        spec = sched.role_spec(role)
        assert isinstance(spec, StageSpec) and StageSpec.from_json(spec.to_json()) == spec
        built = sched.role_from_spec(role, json.loads(json.dumps(spec.to_json())))  # as a role process receives it
        assert isinstance(built, StageRole) and built.spec == spec
        built.planner  # the planner it builds for itself is held too
        for v in _held(built, 3):
            assert v is not sched and not isinstance(v, Scheduler), (role, type(v))
            assert getattr(v, "__self__", None) is not sched, (role, v)  # no bound method of the scheduler


@pytest.mark.parametrize("over", SCHEDULES[:3], ids=lambda o: " ".join(o))
def test_a_role_process_gets_the_same_plan_and_specs_from_the_shipped_plan(tmp_path, over):
    """A role process builds its scheduler from the coordinator's plan as JSON (no search): the
    typed plan comes back equal and so does every stage's spec."""
    job = Job(compose_cfg(SMALL + over), tmp_path)
    sched = job.scheduler
    shipped = json.loads(json.dumps(sched.plan()))
    assert PipelinePlan.from_json(shipped) == sched.pipeline_plan and sched.pipeline_plan.to_json() == shipped
    ctx = job.scheduler.ctx
    there = type(sched)(sched.cfg, SchedulerContext(ctx.cfg, ctx.model, ctx.dataset, ctx.cluster, ctx.compressor, ctx.predictor, role="stage1", plan=shipped))
    assert there.plan() == sched.plan()
    assert all(there.role_spec(r) == sched.role_spec(r) for r in sched.role_devices())


def test_the_schedule_as_data_is_the_action_lists():
    schedule = Schedule.of(lambda s, S, n: one_f_one_b(s, S, n) + [STEP], 3, [4, 1, 2, 3, 4])
    assert sorted(schedule.programs[0]) == [1, 2, 3, 4] and schedule.num_stages == 3
    assert schedule.programs[2][2] == ("F0", "B0", "F1", "B1", "STEP")
    for s in range(3):
        for n in range(1, 5):
            assert schedule.program(s, n) == one_f_one_b(s, 3, n) + [STEP]
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    assert [Action.parse(str(a)) for a in (F(0), B(12), STEP)] == [F(0), B(12), STEP]
    with pytest.raises(ValueError, match="no program for a flush of 5"):
        schedule.program(0, 5)
    with pytest.raises(ValueError, match="not a pipeline action"):
        Action.parse("W3")


def test_a_short_last_batch_runs_the_program_of_fewer_microbatches(tmp_path):
    """100 samples in batches of 16: the last has 4, split into 4 micro-batches of one where the
    others have 8 of two: the spec holds the program of every count from 1 to 8."""
    over = SMALL + ["scheduler=1f1b", "scheduler.microbatches=8", "dataset.n_train=100", "train.iterations_per_epoch=null", "train.epochs=1", "runtime.numerics=false"]
    job = Job(compose_cfg(over), tmp_path)
    assert sorted(job.scheduler.role_spec("stage0").schedule.programs[0]) == list(range(1, 9))
    job.run()
    assert job.runtime.role_stats["stage0"]["peak_inflight"] >= 1


class CountingPolicy(EpochEndPolicy):
    """A policy of the test's own: each stage counts its epoch ends and says which it saw."""

    def __init__(self, spec: EpochEndSpec):
        super().__init__(spec)
        self.seen: list[int] = []

    async def at_epoch_end(self, stage, ctx, epoch: int) -> None:
        assert stage.batches == 3 and stage.bounds and stage.roles[stage.index] == f"stage{stage.index}"
        self.seen.append(epoch)

    def stats(self) -> dict:
        return {"seen": self.seen}

    @classmethod
    def report(cls, role_stats):
        return {"summary": {"seen": {r: st["seen"] for r, st in role_stats.items()}}, "metrics": {"pipe/epoch_ends": sum(len(st["seen"]) for st in role_stats.values())}}


def test_a_declared_policy_runs_at_every_epoch_end_but_the_last(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline_epoch_end, "_DECLARED", {})  # the built-in accept_replan would claim the same key
    pipeline_epoch_end.declare("counting", f"{__name__}:CountingPolicy", knobs=("replan_epsilon",))
    job = Job(compose_cfg(SMALL + ["scheduler=gpipe", "scheduler.replan_epsilon=0.5", "runtime.numerics=false"]), tmp_path)
    assert job.scheduler.role_spec("stage0").epoch_end == EpochEndSpec("counting", {"replan_epsilon": 0.5})
    job.run()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seen"] == {"stage0": [0, 1], "stage1": [0, 1], "stage2": [0, 1]}
    assert summary["metrics"]["pipe/epoch_ends"] == 6


def test_policies_are_chosen_by_their_key_and_two_at_once_are_refused(monkeypatch):
    assert pipeline_epoch_end.chosen(OmegaConf.create({"replan_epsilon": None})) is None
    assert pipeline_epoch_end.chosen(OmegaConf.create({"name": "gpipe"})) is None  # a schema without the key
    assert pipeline_epoch_end.chosen(OmegaConf.create({"replan_epsilon": 0.2})) == EpochEndSpec("accept_replan", {"replan_epsilon": 0.2})
    monkeypatch.setattr(pipeline_epoch_end, "_DECLARED", dict(pipeline_epoch_end._DECLARED))
    pipeline_epoch_end.declare("counting", f"{__name__}:CountingPolicy", knobs=("count_every",))
    with pytest.raises(ConfigError, match="replan_epsilon and scheduler.count_every each switch on"):
        pipeline_epoch_end.chosen(OmegaConf.create({"replan_epsilon": 0.2, "count_every": 1}))

