"""Lowering: a compute-only schedule plus its placement gives every device's sends and receives.

A message crosses between devices where a micro-batch moves between adjacent stages on two
devices: F(s, m) sends its activation to stage s+1 (SEND_F on s's device, RECV_F of stage s+1 on
the other), and the backward that yields stage s's input gradient (B, or I when split) sends it
to stage s-1 (SEND_B, RECV_B). Adjacent stages on one device pass it in memory: no action. W
sends nothing.

A send goes right after the action that produced its message and never blocks (the message waits
at the receiver); a receive goes right before the action that consumes it and blocks until the
message is there (framework.pipeline.validate simulates exactly this). torch's `_add_send_recv`
inserts the same sends in the same places and the same receives, placed as early as its lock-step
simulation allows instead (its `_defer_recv_ops` moves them to where they are here).
"""

from __future__ import annotations

from framework.errors import ScheduleError
from framework.pipeline.actions import COMPUTE, Op, PipelineOrder, StageAction


def message_in(a: StageAction, num_stages: int) -> StageAction | None:
    """The receive compute action `a` needs before it runs, whether or not it crosses devices:
    RECV_F(s, m) for a forward after the first stage, RECV_B(s, m) for a backward before the last."""
    if a.op is Op.F and a.stage > 0:
        return StageAction(a.stage, Op.RECV_F, a.mb)
    if a.op in (Op.B, Op.I) and a.stage < num_stages - 1:
        return StageAction(a.stage, Op.RECV_B, a.mb)
    return None


def message_out(a: StageAction, num_stages: int) -> StageAction | None:
    """The send that follows compute action `a`, whether or not it crosses devices."""
    if a.op is Op.F and a.stage < num_stages - 1:
        return StageAction(a.stage, Op.SEND_F, a.mb)
    if a.op in (Op.B, Op.I) and a.stage > 0:
        return StageAction(a.stage, Op.SEND_B, a.mb)
    return None


def peer(a: StageAction) -> int:
    """The stage on the other end of a send or receive."""
    return a.stage + (1 if a.op in (Op.SEND_F, Op.RECV_B) else -1)


def matching(a: StageAction) -> StageAction:
    """The send a receive waits for, or the receive a send feeds."""
    pair = {Op.SEND_F: Op.RECV_F, Op.RECV_F: Op.SEND_F, Op.SEND_B: Op.RECV_B, Op.RECV_B: Op.SEND_B}
    return StageAction(peer(a), pair[a.op], a.mb)


def lower(order: PipelineOrder) -> PipelineOrder:
    """`order` with a SEND after every action whose message crosses to another device and a RECV
    before every action whose input comes from another device; compute actions and steps keep
    their order. An order that has sends or receives already is lowered: that is an error.
    """
    S, placement = order.num_stages, order.placement

    def crosses(msg: StageAction | None) -> bool:
        return msg is not None and 0 <= msg.stage < S and 0 <= peer(msg) < S and placement.crosses(msg.stage, peer(msg))

    programs = []
    for prog in order.programs:
        out: list[StageAction] = []
        for a in prog:
            if a.op in COMPUTE:
                if crosses(recv := message_in(a, S)):
                    out.append(recv)
                out.append(a)
                if crosses(send := message_out(a, S)):
                    out.append(send)
            elif a.op is Op.STEP:
                out.append(a)
            else:
                raise ScheduleError(f"device {len(programs)}: {a}: this schedule has its sends and receives already (validate it as it is)")
        programs.append(tuple(out))
    return PipelineOrder(tuple(programs), placement, order.microbatches)


def is_lowered(order: PipelineOrder) -> bool:
    """Whether `order` already has its sends and receives (a compute_comms schedule)."""
    return any(a.op not in COMPUTE and a.op is not Op.STEP for p in order.programs for a in p)
