"""The schedule validator (framework.pipeline.validate): every problem it names, in one line, and
every built-in schedule passing it; the lowering it validates; the built-ins against today's orders."""

from __future__ import annotations

import pytest

from framework.errors import LINE_MAX, ScheduleError
from framework.pipeline.actions import Op, PipelineOrder, Placement, StageAction, legacy_program
from framework.pipeline.lowering import lower
from framework.pipeline.schedule import one_f_one_b
from framework.pipeline.schedules import BUILTIN, build
from framework.pipeline.validate import check, validate


def order(*rows: str, placement: Placement | None = None) -> PipelineOrder:
    """Device d's program from row d, actions separated by spaces."""
    return PipelineOrder.of([[StageAction.parse(t) for t in row.split()] for row in rows], placement)


def problem(o: PipelineOrder, **kw) -> str:
    with pytest.raises(ScheduleError) as e:
        check(o, **kw)
    msg = e.value.message
    assert "\n" not in msg and len("error: " + msg) <= LINE_MAX, msg
    return msg


def test_a_backward_before_its_forward():
    assert problem(order("0F0 0B1 0F1 0B0", "1F0 1B0 1F1 1B1")) == "device 0 runs 0B1 (a backward) before its forward 0F1, which comes later"
    assert problem(order("0F0 0B0 0I1", "1F0 1B0 1F1 1I1 1W1")) == "device 0 runs 0I1 (a backward) before its forward 0F1, which never runs"


def test_a_weight_gradient_before_its_input_gradient():
    assert problem(order("0F0 0W0 0I0", "1F0 1I0 1W0")) == "device 0 runs 0W0 (a weight gradient) before its input gradient 0I0, which comes later"
    assert problem(order("0F0 0B0 0W0", "1F0 1B0")) == "device 0 runs 0W0 after 0B0, whose full backward took the weight gradient already"


def test_a_receive_without_a_send():
    lowered = lower(build("1f1b", 2, 2))
    assert StageAction(1, Op.SEND_B, 0) in lowered.programs[1]
    cut = PipelineOrder(tuple(tuple(a for a in p if a != StageAction(1, Op.SEND_B, 0)) for p in lowered.programs), lowered.placement, 2)
    with pytest.raises(ScheduleError, match=r"^device 0 runs 0RECV_B0, a receive with no matching send: no device runs 1SEND_B0$"):
        validate(cut)
    no_recv = PipelineOrder(tuple(tuple(a for a in p if a != StageAction(0, Op.RECV_B, 1)) for p in lowered.programs), lowered.placement, 2)
    with pytest.raises(ScheduleError, match=r"^device 0 runs 0B1 before receiving its input, 0RECV_B1, which never runs$"):
        validate(no_recv)


def test_an_unknown_stage():
    two = Placement.one_per_device(2)
    assert problem(order("0F0 0B0", "1F0 1B0 2F0", placement=two)) == "device 1 runs 2F0: unknown stage 2, the pipeline has stages 0..1"
    assert problem(order("0F0 0B0 1F0", "1F0 1B0", placement=two)) == "device 0 runs 1F0: unknown stage 1 on device 0, it lives on device 1"
    with pytest.raises(ScheduleError, match=r"^stage\(s\) \[1\] run nowhere, but stages up to 2 do"):
        order("0F0 0B0", "2F0 2B0")  # placement read off the programs (as from a CSV): stage 1 is on no device
    with pytest.raises(ScheduleError, match=r"^stage 0 runs on device 0 and on device 1 \(0F1\)"):
        order("0F0 0B0", "0F1 0B1")


def test_a_deadlocking_order_names_its_cycle():
    """Device 0 waits for micro-batch 0's gradient before sending micro-batch 1's activation,
    which device 1 wants before it computes that gradient."""
    assert problem(order("0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0")) == (
        "deadlock: device 0 waits in 0RECV_B0 for device 1's 1SEND_B0; device 1 waits in 1RECV_F1 for device 0's 0SEND_F1")
    # device 0 waits on device 1 too, but only devices 1 and 2 wait on each other: the cycle names them
    assert problem(order("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1", "2F1 2B1 2F0 2B0")) == (
        "deadlock: device 1 waits in 1RECV_B0 for device 2's 2SEND_B0; device 2 waits in 2RECV_F1 for device 1's 1SEND_F1")


def test_a_micro_batch_forwarded_twice():
    assert problem(order("0F0 0F0 0B0", "1F0 1B0")) == "device 0 runs 0F0 twice: micro-batch 0 forwarded twice on stage 0"


def test_more_micro_batches_in_flight_than_the_memory_allows():
    assert problem(build("gpipe", 2, 4), max_in_flight=2) == "device 0 runs 0F2 with 3 micro-batches in flight on stage 0, more than the bound of 2"
    check(build("1f1b", 2, 4), max_in_flight=2)  # 1F1B holds D - d micro-batches on device d
    assert problem(build("zero_bubble", 4, 8), max_in_flight={3: 3}).endswith("with 4 micro-batches in flight on stage 3, more than the bound of 3")  # ZB-H1's W holds D


def test_an_input_on_the_same_device_before_it_is_computed():
    both = Placement((0, 0, 1), 2)  # stages 0 and 1 on device 0: 1F0 takes 0F0's output in memory
    assert problem(order("1F0 0F0 1B0 0B0", "2F0 2B0", placement=both)) == "device 0 runs 1F0 before 0F0, which computes its input on the same device and comes later"


def test_work_left_undone():
    assert problem(order("0F0 0F1 0B0", "1F0 1B0 1F1 1B1")) == "stage 0 (device 0) never runs 0B1 (or 0I1 and 0W1): every micro-batch's backward completes"
    assert problem(order("0F0 0I0", "1F0 1I0 1W0")) == "stage 0 (device 0) never runs 0W0: every micro-batch's backward completes"


def test_sends_out_of_place():
    lowered = lower(build("gpipe", 2, 1))
    assert lowered.text() == [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    with pytest.raises(ScheduleError, match=r"^device 0 runs 0SEND_F0 before 0F0, which computes what it sends$"):
        validate(order("0SEND_F0 0F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"))
    with pytest.raises(ScheduleError, match=r"^device 1 runs 1F0 before receiving its input, 1RECV_F0, which never runs$"):
        validate(order("0F0 0SEND_F0 0RECV_B0 0B0", "1F0 1B0 1SEND_B0"))
    one = Placement((0, 0), 1)  # both stages on one device: the activation passes in memory
    with pytest.raises(ScheduleError, match=r"^device 0 runs 0SEND_F0, a send nobody receives: no device runs 1RECV_F0$"):
        validate(order("0F0 0SEND_F0 1F0 1B0 0B0", placement=one))
    with pytest.raises(ScheduleError, match=r"^device 1 runs 1RECV_F0 twice"):
        validate(order("0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1RECV_F0 1F0 1B0 1SEND_B0"))


def test_lowering_an_order_twice_is_refused():
    with pytest.raises(ScheduleError, match="has its sends and receives already"):
        lower(lower(build("gpipe", 2, 2)))


def _every_builtin():
    for name, b in BUILTIN.items():
        for D in (1, 2, 3, 4, 5):
            for M in (1, 2, 3, 4, 5, 6, 8, 10, 12):
                for V in ((b.default_per_device,) if b.fixed_per_device else (1, 2, 3)):
                    yield name, D, M, V


def test_every_builtin_schedule_passes():
    passed = rejected = 0
    for name, D, M, V in _every_builtin():
        try:
            o = build(name, D * V, M, V)
        except ScheduleError as e:  # a shape the schedule cannot take (torch's constraints): said so up front
            assert "rounds of equal size" in e.message or "at least as many micro-batches" in e.message, (name, D, M, V, e.message)
            rejected += 1
            continue
        lowered = check(o)
        assert o.num_devices == D and o.num_stages == D * V and o.microbatches == M
        sends = sum(a.op in (Op.SEND_F, Op.SEND_B) for p in lowered.programs for a in p)
        crossings = sum(o.placement.crosses(s, s + 1) for s in range(D * V - 1))
        assert sends == 2 * M * crossings, (name, D, M, V)
        passed += 1
    assert passed > 500 and rejected < passed / 4, (passed, rejected)


@pytest.mark.parametrize("D,M", [(2, 4), (4, 8), (3, 5), (4, 2)])
def test_one_stage_schedules_are_todays_orders(D, M):
    """gpipe, 1f1b and pipedream as data are what today's stages run (framework.pipeline.schedule)."""
    for d in range(D):
        assert legacy_program(build("gpipe", D, M), d) == [f"F{m}" for m in range(M)] + [f"B{m}" for m in range(M)]
        assert legacy_program(build("1f1b", D, M), d) == [str(a) for a in one_f_one_b(d, D, M)]
        assert legacy_program(build("pipedream", D, M), d) == [str(a) for a in one_f_one_b(d, D, M, step_after_backward=True)]
    from framework.pipeline.schedules.flush import pipedream

    deeper = pipedream(D, M, in_flight=2 * D - 1)
    assert [legacy_program(deeper, d) for d in range(D)] == [[str(a) for a in one_f_one_b(d, D, M, step_after_backward=True, in_flight=2 * D - 1)] for d in range(D)]
