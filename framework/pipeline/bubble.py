"""What a schedule costs on given durations: its makespan, bubble fraction and peak in-flight
activations, from a small event simulation of the lowered programs.

Each device runs its program in order, one action at a time: F, B, I and W take their stage's
duration, a send takes none on the device and its message arrives `link(stage, peer)` seconds
later (0: communication free), a receive waits for its message. The bubble fraction is the
pipeline timeline's (framework.timeline): the idle share of the devices' time between the first
forward's start and the last backward's end, optimizer steps outside it.

Closed forms on D identical devices with free communication, each device busy M·P with
P = T_F + T_I + T_W (T_B = T_I + T_W for a full backward), makespan T, bubble (T - M·P) / T:

- GPipe and 1F1B: T = (M + D - 1)(T_F + T_B), so the bubble is (D-1)/(M+D-1) (GPipe's).
- Interleaved 1F1B and looped BFS with V stages per device (durations per virtual stage), M >= D:
  (D-1)/(V·M + D-1), Megatron-LM's (p-1)/(v·m) of the ideal time (Narayanan et al., SC 2021).
- ZBV and DualPipeV with T_F = T_I = T_W = t per stage (2 per device): T = 6M·t + (D-1)·t, each
  device idle only while the first forward reaches the last device.
- ZB-H1 (`zero_bubble`, one stage per device), M >= D:
      T = M·P + (D-1)·max(T_F + T_I - T_W, T_I, T_F),
  the longest of three dependency paths, each a lower bound on T, which the schedule meets:
  (1) the last device starts once the first forward has crossed D-1 devices, then has M·P to do;
  (2) device 0's first I waits for its D warm-up forwards and the first input gradient's way back
      over D-1 devices, (D-1)·T_I, and M·P - D·T_F of its work follows;
  (3) the last device reaches its last I after the forward wave (D-1)·T_F and its M forwards, M-1
      input gradients and M-D weight gradients (ZB-H1 defers device d's W by d backwards); that
      input gradient then crosses D-1 devices (T_I each) and device 0 ends with its W:
      T >= M·P + (D-1)(T_F + T_I - T_W).
  When T_W <= min(T_F, T_I), path 3 is the longest: the bubble is (D-1)(T_F+T_I-T_W) / T, the
  zero-bubble paper's ZB-H1 bubble (Qi et al., ICLR 2024, Sec. 3.1: "(p-1)(T_F+T_B-T_W)", their
  T_B being our T_I), a third of 1F1B's (D-1)(T_F+T_I+T_W) when the three are equal.
  tests/test_schedule_bubble.py checks these to 1e-9.

A micro-batch is in flight on a stage from its forward until its last backward piece (B, or W
when the backward is split); a device's count is the sum over its stages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from framework.errors import ScheduleError
from framework.pipeline.actions import COMPUTE, RECEIVES, SENDS, Op, PipelineOrder, StageAction
from framework.pipeline.lowering import matching, peer
from framework.pipeline.validate import check

PerStage = float | Sequence[float]


@dataclass(frozen=True)
class Durations:
    """Seconds of each action per stage (a number for every stage, or one per stage). A full
    backward costs `backward` when given, else I + W."""

    forward: PerStage
    backward_input: PerStage
    backward_weight: PerStage
    backward: PerStage | None = None
    step: PerStage = 0.0
    link: float | Callable[[int, int], float] = 0.0  # seconds from a send to its arrival, by (sender's stage, receiver's stage)

    def of(self, stage: int, op: Op) -> float:
        def at(v: PerStage) -> float:
            return float(v if isinstance(v, (int, float)) else v[stage])

        if op is Op.F:
            return at(self.forward)
        if op is Op.I:
            return at(self.backward_input)
        if op is Op.W:
            return at(self.backward_weight)
        if op is Op.B:
            return at(self.backward) if self.backward is not None else at(self.backward_input) + at(self.backward_weight)
        if op is Op.STEP:
            return at(self.step)
        return 0.0

    def transfer(self, src: int, dst: int) -> float:
        return float(self.link(src, dst) if callable(self.link) else self.link)


@dataclass(frozen=True)
class Simulation:
    makespan: float  # when the last action ends
    busy: tuple[float, ...]  # each device's compute seconds (F, B, I, W)
    bubble_frac: float
    peak_in_flight_stage: tuple[int, ...]
    peak_in_flight_device: tuple[int, ...]
    intervals: tuple[tuple[tuple[str, float, float], ...], ...] = field(repr=False)  # per device: (action, start, end)


def simulate(order: PipelineOrder, durations: Durations, max_in_flight: int | dict[int, int] | None = None) -> Simulation:
    """Play `order` (validated, and lowered first when compute-only) on `durations`."""
    lowered = check(order, max_in_flight)
    progs = lowered.programs
    clock = [0.0] * len(progs)
    pos = [0] * len(progs)
    arrival: dict = {}  # receive action -> when its message is there
    spans: list[list[tuple[StageAction, float, float]]] = [[] for _ in progs]
    moved = True
    while moved:  # each action's time depends only on its device's previous action and its message: any sweep order gives the same times
        moved = False
        for d, prog in enumerate(progs):
            while pos[d] < len(prog):
                a = prog[pos[d]]
                if a.op in RECEIVES:
                    if a not in arrival:
                        break
                    clock[d] = max(clock[d], arrival[a])
                elif a.op in SENDS:
                    arrival[matching(a)] = clock[d] + durations.transfer(a.stage, peer(a))
                else:
                    start = clock[d]
                    clock[d] = start + durations.of(a.stage, a.op)
                    spans[d].append((a, start, clock[d]))
                pos[d] += 1
                moved = True
    if any(p < len(prog) for p, prog in zip(pos, progs)):  # validate() rules this out
        raise ScheduleError("the programs wait on each other")
    compute = [[span for span in dev if span[0].op in COMPUTE] for dev in spans]  # optimizer steps are outside the window
    busy = tuple(sum(e - s for _, s, e in dev) for dev in compute)
    starts = [s for dev in compute for _, s, _ in dev]
    ends = [e for dev in compute for _, _, e in dev]
    window = (max(ends) - min(starts)) if starts else 0.0
    capacity = window * sum(1 for dev in compute if dev)
    bubble = (capacity - sum(busy)) / capacity if capacity > 0 else 0.0
    stage_peak, device_peak = peak_in_flight(lowered)
    intervals = tuple(tuple((str(a), s, e) for a, s, e in dev) for dev in spans)
    return Simulation(max(clock) if clock else 0.0, busy, bubble, stage_peak, device_peak, intervals)


def peak_in_flight(order: PipelineOrder) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The most micro-batches each stage, and each device, holds at once (read off the programs:
    a device's count changes only with its own actions)."""
    stage_peak = [0] * order.num_stages
    device_peak = []
    for prog in order.programs:
        live: dict[int, int] = {}
        peak = 0
        for a in prog:
            if a.op is Op.F:
                live[a.stage] = live.get(a.stage, 0) + 1
                stage_peak[a.stage] = max(stage_peak[a.stage], live[a.stage])
                peak = max(peak, sum(live.values()))
            elif a.op in (Op.B, Op.W):
                live[a.stage] -= 1
        device_peak.append(peak)
    return tuple(stage_peak), tuple(device_peak)
