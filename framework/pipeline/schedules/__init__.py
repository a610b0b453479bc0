"""Every built-in pipeline schedule as a generator of per-device programs (framework.pipeline.actions),
one function per schedule, named as the literature names it:

| name | paper | torch class | stages per device |
|---|---|---|---|
| `gpipe` | Huang et al. 2019 | ScheduleGPipe | 1 |
| `1f1b` | Narayanan et al. 2021 (PipeDream-flush), Fan et al. 2021 (DAPPLE) | Schedule1F1B | 1 |
| `pipedream` | Narayanan et al. 2019 | (none: asynchronous) | 1 |
| `looped_bfs` | Lamy-Poirier 2023 | ScheduleLoopedBFS | V (default 2), looped |
| `interleaved_1f1b` | Narayanan et al. 2021 (Megatron-LM) | ScheduleInterleaved1F1B | V (default 2), looped |
| `zero_bubble` | Qi et al. 2024 (ZB-H1; interleaved with V > 1) | ScheduleInterleavedZeroBubble | V (default 1), looped |
| `zbv` | Qi et al. 2024, Sec. 6 | ScheduleZBVZeroBubble | 2, V-shaped |
| `dualpipev` | DeepSeek-AI 2024 | ScheduleDualPipeV | 2, V-shaped |

`build(name, stages, microbatches, stages_per_device)` makes one: S stages on S / V devices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from framework.errors import ScheduleError
from framework.pipeline.actions import PipelineOrder
from framework.pipeline.schedules.flush import gpipe, one_f_one_b, pipedream
from framework.pipeline.schedules.interleaved import interleaved_1f1b, looped_bfs, zero_bubble
from framework.pipeline.schedules.v_shape import dualpipev, zbv


@dataclass(frozen=True)
class Builtin:
    make: Callable[..., PipelineOrder]  # (devices, microbatches[, stages_per_device]) -> the order
    default_per_device: int  # stages per device when not given
    fixed_per_device: bool  # whether the schedule's shape fixes it (one per device, or a V's two)
    doc: str


BUILTIN: dict[str, Builtin] = {
    "gpipe": Builtin(gpipe, 1, True, "every forward, then every backward"),
    "1f1b": Builtin(one_f_one_b, 1, True, "1F1B with a flush (PipeDream-flush, DAPPLE)"),
    "pipedream": Builtin(pipedream, 1, True, "asynchronous 1F1B with a step after each backward"),
    "looped_bfs": Builtin(looped_bfs, 2, False, "breadth first over looped virtual stages"),
    "interleaved_1f1b": Builtin(interleaved_1f1b, 2, False, "1F1B over looped virtual stages, depth first (Megatron-LM)"),
    "zero_bubble": Builtin(zero_bubble, 1, False, "backward split into I and W, W filling the bubble (ZB-H1; interleaved with V > 1)"),
    "zbv": Builtin(zbv, 2, True, "zero bubble on a V of two stages per device"),
    "dualpipev": Builtin(dualpipev, 2, True, "DeepSeek's DualPipe folded onto a V"),
}


def build(name: str, stages: int, microbatches: int, stages_per_device: int | None = None, in_flight: int | None = None) -> PipelineOrder:
    """Schedule `name` for `stages` stages (S / V devices) and `microbatches` micro-batches;
    `in_flight`: PipeDream's items admitted before the first backward (default: one per stage)."""
    if name not in BUILTIN:
        raise ScheduleError(f"no built-in schedule {name!r}; choose one of {', '.join(BUILTIN)}")
    b = BUILTIN[name]
    V = b.default_per_device if stages_per_device is None else stages_per_device
    if b.fixed_per_device and V != b.default_per_device:
        raise ScheduleError(f"{name} runs {b.default_per_device} stage(s) per device, got {V}")
    if V < 1 or stages < V or stages % V:
        raise ScheduleError(f"{stages} stages do not spread over devices at {V} per device: S must be a positive multiple of V")
    if in_flight is not None and name != "pipedream":
        raise ScheduleError(f"in_flight is PipeDream's knob; {name} fixes its own warm-up")
    devices = stages // V
    if name == "pipedream":
        return pipedream(devices, microbatches, in_flight)
    return b.make(devices, microbatches) if b.fixed_per_device else b.make(devices, microbatches, V)
