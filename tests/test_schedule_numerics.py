"""Every synchronous schedule (framework.pipeline.schedules) computes what `scheduler=local` does:
float64, its per-device programs executed over stage modules in one process (tests/inprocess_pipeline.py:
F, B, I and W as the stage interpreter runs them, I and W through
framework.pipeline.split_backward), two mini-batches with SGD and momentum, end with every weight
and BatchNorm statistic equal to the reference loop's to 1e-12 (issue 48's acceptance, without the
runtime). What differs between schedules is only the order of the same operations: per stage,
forwards run in micro-batch order, so BatchNorm's running statistics are updated in the same
order, and a gradient is summed over micro-batches in the order the backwards finish. Where that
is micro-batch order (every schedule but looped BFS, whose backwards run newest first), the
weights are bit-equal; looped BFS's differ by at most 2.3e-16 here.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from framework.pipeline.actions import Op, PipelineOrder, StageAction
from framework.pipeline.schedules import build
from framework.stage import make_optimizer
from tests.inprocess_pipeline import SGD, reference_minibatch, run_minibatch, stage_modules
from tests.test_split_backward import CLASSES, SHAPE, even_cut, zoo_model

# (schedule, stages, stages per device, micro-batches): 2 and 4 devices
RUNS = [
    ("gpipe", 2, 1, 4), ("gpipe", 4, 1, 8),
    ("1f1b", 2, 1, 4), ("1f1b", 4, 1, 8),
    ("zero_bubble", 2, 1, 4), ("zero_bubble", 4, 1, 8), ("zero_bubble", 4, 2, 4),
    ("interleaved_1f1b", 4, 2, 4), ("interleaved_1f1b", 8, 2, 8),
    ("looped_bfs", 4, 2, 4), ("looped_bfs", 8, 2, 8),
    ("zbv", 4, 2, 4), ("zbv", 8, 2, 8),
    ("dualpipev", 4, 2, 4), ("dualpipev", 8, 2, 8),
]
UNITS = {"mlp": 8, "vgg5": 5, "lenet": 5}  # the MLP is built 8 units deep (model_of)
CASES = [(model, *run) for model in UNITS for run in RUNS if run[1] <= UNITS[model]]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def model_of(name: str):
    """The zoo's model; the MLP with a unit for each of up to 8 stages."""
    return zoo_model(name, depth=8, hidden=16) if name == "mlp" else zoo_model(name)


def sums_in_order(order) -> bool:
    """Whether every stage finishes its micro-batches' weight gradients (B, or W) in micro-batch
    order, as the reference loop does: then each `.grad` is the same sum in the same order."""
    done = defaultdict(list)
    for prog in order.programs:
        for a in prog:
            if a.op in (Op.B, Op.W):
                done[a.stage].append(a.mb)
    return all(mbs == sorted(mbs) for mbs in done.values())


def minibatches(n: int, size: int, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, *SHAPE, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (size,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("model_name,name,stages,per_device,M", CASES, ids=[f"{m}-{n}-S{s}-V{v}-M{mb}" for m, n, s, v, mb in CASES])
def test_every_synchronous_schedule_ends_with_the_reference_weights(model_name, name, stages, per_device, M):
    model = model_of(model_name)
    assert len(model) == UNITS[model_name]
    bounds = even_cut(model, stages)
    order = build(name, stages, M, per_device)
    pipeline = stage_modules(model, bounds)
    ref = model_of(model_name)
    ref_opt = make_optimizer(ref.parameters(), SGD)
    for x, y in minibatches(2, 2 * M):
        run_minibatch(order, pipeline, x, y, M)
        reference_minibatch(ref, ref_opt, x, y, M)
    got = {f"units.{a + int(k.split('.', 1)[0])}.{k.split('.', 1)[1]}": v for st, (a, _) in zip(pipeline, bounds) for k, v in st.module.state_dict().items()}
    want, start = ref.state_dict(), model.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-12, msg=lambda m, k=k: f"{k}: {m}")
    assert all(not torch.equal(want[k], start[k]) for k in want if "weight" in k), "a weight never changed: nothing was compared"
    if sums_in_order(order):  # all but looped BFS, whose backwards run newest first: bit-equal
        assert all(torch.equal(got[k], want[k]) for k in want), "the same operations in the same order, yet not bit-equal"


def test_the_driver_finds_a_deadlock():
    """An order whose devices wait on each other is an error, not a hang (the driver's own check)."""
    model = model_of("mlp")
    order = PipelineOrder.of([[StageAction(0, Op.B, 0), StageAction(0, Op.F, 0)], [StageAction(1, Op.F, 0), StageAction(1, Op.B, 0)]])
    x, y = minibatches(1, 2)[0]
    with pytest.raises(AssertionError, match="deadlock"):
        run_minibatch(order, stage_modules(model, even_cut(model, 2)), x, y, 1)
