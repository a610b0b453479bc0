"""The validator: whether a lowered schedule runs, and if not, its first problem in one line.

`validate(order)` takes every device's program with its sends and receives
(framework.pipeline.lowering) and raises `ScheduleError` naming the first problem it finds, in
this order of checks:

1. every action's stage exists and lives on the device that runs it (an unknown stage);
2. each stage's own sequence: a micro-batch forwarded twice, a backward (B or I) before its
   forward, a W before its I, an input consumed before it was computed on the same device or
   received from another, a send before the action that computes it, more micro-batches in flight
   on a stage than `max_in_flight` allows, and, at the end, a forward or backward never run;
3. every receive has its send and every send its receive;
4. the programs played together, sends never blocking and receives blocking until their message
   is sent: if every unfinished device waits, the order deadlocks, and the cycle of waits is named.

`check(order)` lowers a compute-only order first. A micro-batch is in flight on a stage from its
forward until its last backward piece (B, or W when split: the weight gradient still reads the
stage's saved inputs).
"""

from __future__ import annotations

from framework.errors import ScheduleError
from framework.pipeline.actions import RECEIVES, SENDS, Op, PipelineOrder, StageAction
from framework.pipeline.lowering import is_lowered, lower, matching, message_in, peer


def check(order: PipelineOrder, max_in_flight: int | dict[int, int] | None = None) -> PipelineOrder:
    """Lower `order` when it is compute-only, validate it, and return the lowered order."""
    _check_stages(order)
    lowered = order if is_lowered(order) else lower(order)
    validate(lowered, max_in_flight)
    return lowered


def validate(order: PipelineOrder, max_in_flight: int | dict[int, int] | None = None) -> None:
    """Raise ScheduleError with the first problem of the lowered `order` (see the module doc).
    `max_in_flight`: the most micro-batches one stage may hold (an int for every stage, or per stage)."""
    _check_stages(order)
    _check_sequences(order, max_in_flight)
    _check_messages(order)
    _check_deadlock(order)


def _check_stages(order: PipelineOrder) -> None:
    S, M, place = order.num_stages, order.microbatches, order.placement
    if place.num_devices != order.num_devices:
        raise ScheduleError(f"the placement spreads stages over {place.num_devices} devices but the schedule has programs for {order.num_devices}")
    for d, prog in enumerate(order.programs):
        for a in prog:
            if not 0 <= a.stage < S:
                raise ScheduleError(f"device {d} runs {a}: unknown stage {a.stage}, the pipeline has stages 0..{S - 1}")
            if place.device_of[a.stage] != d:
                raise ScheduleError(f"device {d} runs {a}: unknown stage {a.stage} on device {d}, it lives on device {place.device_of[a.stage]}")
            if a.mb is not None and not 0 <= a.mb < M:
                raise ScheduleError(f"device {d} runs {a}: micro-batch {a.mb} of {M} (0..{M - 1})")


def _bound(max_in_flight, stage: int) -> int | None:
    return max_in_flight.get(stage) if isinstance(max_in_flight, dict) else max_in_flight


def _check_sequences(order: PipelineOrder, max_in_flight) -> None:
    for d in range(order.num_devices):
        _check_device(order, d, max_in_flight)


def _check_device(order: PipelineOrder, d: int, max_in_flight) -> None:
    """Device d's program on its own: each of its stages' sequence, and its inputs' origins."""
    S, M, place, prog = order.num_stages, order.microbatches, order.placement, order.programs[d]
    done: set[StageAction] = set()  # what this device has run so far
    live: dict[int, int] = {}  # micro-batches in flight per stage
    later = set(prog)

    def before(a: StageAction, need: StageAction, what: str) -> None:
        if need not in done:
            when = "comes later" if need in later else "never runs"
            raise ScheduleError(f"device {d} runs {a} {what} {need}, which {when}")

    for a in prog:
        s, m = a.stage, a.mb
        if a.op is Op.F:
            if a in done:
                raise ScheduleError(f"device {d} runs {a} twice: micro-batch {m} forwarded twice on stage {s}")
            live[s] = live.get(s, 0) + 1
            bound = _bound(max_in_flight, s)
            if bound is not None and live[s] > bound:
                raise ScheduleError(f"device {d} runs {a} with {live[s]} micro-batches in flight on stage {s}, more than the bound of {bound}")
        elif a.op in (Op.B, Op.I):
            if StageAction(s, Op.B, m) in done or StageAction(s, Op.I, m) in done:
                raise ScheduleError(f"device {d} runs {a} twice: micro-batch {m} backpropagated twice on stage {s}")
            before(a, StageAction(s, Op.F, m), "(a backward) before its forward")
            if a.op is Op.B:
                live[s] -= 1
        elif a.op is Op.W:
            if a in done:
                raise ScheduleError(f"device {d} runs {a} twice: weight gradient of micro-batch {m} taken twice on stage {s}")
            if StageAction(s, Op.B, m) in done:
                raise ScheduleError(f"device {d} runs {a} after {s}B{m}, whose full backward took the weight gradient already")
            before(a, StageAction(s, Op.I, m), "(a weight gradient) before its input gradient")
            live[s] -= 1
        elif a.op in SENDS:
            producers = [StageAction(s, Op.F, m)] if a.op is Op.SEND_F else [StageAction(s, Op.B, m), StageAction(s, Op.I, m)]
            if not any(p in done for p in producers):
                raise ScheduleError(f"device {d} runs {a} before {' or '.join(map(str, producers))}, which computes what it sends")
        elif a.op in RECEIVES and a in done:
            raise ScheduleError(f"device {d} runs {a} twice: the second receive waits for a message never sent")
        if a.op in (Op.F, Op.B, Op.I) and (recv := message_in(a, S)) is not None:
            src = peer(recv)
            if place.device_of[src] != d:
                before(a, recv, "before receiving its input,")
            else:  # the upstream (forward) or downstream (backward) stage is on this device: in memory
                producers = [StageAction(src, Op.F, m)] if a.op is Op.F else [StageAction(src, Op.B, m), StageAction(src, Op.I, m)]
                if not any(p in done for p in producers):
                    when = "comes later" if any(p in later for p in producers) else "never runs"
                    name = " or ".join(map(str, producers))
                    raise ScheduleError(f"device {d} runs {a} before {name}, which computes its input on the same device and {when}")
        done.add(a)
    for s in place.stages_on(d):
        for m in range(M):
            if StageAction(s, Op.F, m) not in done:
                raise ScheduleError(f"stage {s} (device {d}) never runs {s}F{m}: every stage forwards micro-batches 0..{M - 1}")
            if StageAction(s, Op.B, m) not in done and StageAction(s, Op.W, m) not in done:
                missing = f"{s}W{m}" if StageAction(s, Op.I, m) in done else f"{s}B{m} (or {s}I{m} and {s}W{m})"
                raise ScheduleError(f"stage {s} (device {d}) never runs {missing}: every micro-batch's backward completes")


def _check_messages(order: PipelineOrder) -> None:
    runs = {a: d for d, prog in enumerate(order.programs) for a in prog if a.op in SENDS or a.op in RECEIVES}
    for d, prog in enumerate(order.programs):
        for a in prog:
            if a.op in RECEIVES and matching(a) not in runs:
                raise ScheduleError(f"device {d} runs {a}, a receive with no matching send: no device runs {matching(a)}")
            if a.op in SENDS and matching(a) not in runs:
                raise ScheduleError(f"device {d} runs {a}, a send nobody receives: no device runs {matching(a)}")


def _check_deadlock(order: PipelineOrder) -> None:
    """Play the programs: a device runs its next action unless it is a receive whose send has not
    run; stop when nothing moves. Unfinished devices then all wait on receives; following each
    wait to the device whose send it needs closes a cycle, which is reported."""
    place, progs = order.placement, order.programs
    pos = [0] * len(progs)
    sent: set[StageAction] = set()
    moved = True
    while moved:
        moved = False
        for d, prog in enumerate(progs):
            while pos[d] < len(prog):
                a = prog[pos[d]]
                if a.op in RECEIVES and matching(a) not in sent:
                    break
                if a.op in SENDS:
                    sent.add(a)
                pos[d] += 1
                moved = True
    waiting = [d for d in range(len(progs)) if pos[d] < len(progs[d])]
    if not waiting:
        return
    cycle, d = [], waiting[0]
    while d not in cycle:
        cycle.append(d)
        d = place.device_of[peer(progs[d][pos[d]])]
    cycle = cycle[cycle.index(d):]
    waits = [f"device {c} waits in {progs[c][pos[c]]} for device {place.device_of[peer(progs[c][pos[c]])]}'s {matching(progs[c][pos[c]])}" for c in cycle]
    raise ScheduleError("deadlock: " + "; ".join(waits))
