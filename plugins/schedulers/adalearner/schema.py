"""The config schema of AdaLearner (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from framework.config.knobs import Range, knob
from framework.config.schemas import SchedulerConfig


@dataclass
class AdaLearnerConfig(SchedulerConfig):
    """AdaLearner (Mao et al.): synchronous data parallelism over one shared WLAN (notes 2)."""

    name: str = "adalearner"
    partition: Any = knob("linear", "linear (W_i = C_i (T - a_i), the notes' default) | lookup_table (the paper's Fig. 6)", choices=("linear", "lookup_table"))
    architecture: str = knob("auto", "auto (Eq. 9 per n) | fp32 (gradients up, weights down) | onebit (the compressor's codec both ways)", choices=("auto", "fp32", "onebit"))
    workers: Optional[int] = knob(None, "n worker nodes; null: Algorithm 1 chooses (1 = local training on the group owner)")
    max_workers: Optional[int] = knob(None, "the candidates Algorithm 1 looks at (dev0..); null: every dev<i>")
    early_stop: bool = knob(True, "Algorithm 1 stops at the first n whose estimate is worse (the paper's greedy loop)")
    local_when_n1: bool = knob(True, "n = 1 is the group owner training alone, no communication")
    planner: str = knob(
        "fifo",
        "fifo (the iteration as the FIFO star runs it: what the simulator measures) | paper (Eq. 4, 7-9: compute + 2n serial transfers) | paper_printed (Eq. 7-8 as printed)",
        choices=("fifo", "paper", "paper_printed"),
    )
    lookup_step_s: float = knob(0.1, "lookup_table: the table's time thresholds are multiples of this", range=Range(0, low_open=True, note="seconds"))
    group_owner: str = knob("go", "the device that aggregates: the group owner (the user's phone, the hotspot)")
