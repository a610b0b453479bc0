"""The config schema of AdaLearner (dataclasses only: importing this imports no torch;
see framework.registry.declare)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from framework.config import SchedulerConfig


@dataclass
class AdaLearnerConfig(SchedulerConfig):
    """AdaLearner (Mao et al.): synchronous data parallelism over one shared WLAN (notes 2)."""

    name: str = "adalearner"
    partition: Any = "linear"  # linear (W_i = C_i (T - a_i), the notes' default) | lookup_table (Fig. 6)
    architecture: str = "auto"  # auto (Eq. 9 per n) | fp32 (gradients up, weights down) | onebit (the compressor's codec both ways)
    workers: Optional[int] = None  # n worker nodes; null: Algorithm 1 chooses (1 = local training on the group owner)
    max_workers: Optional[int] = None  # the candidates Algorithm 1 looks at; null: every dev<i>
    early_stop: bool = True  # Algorithm 1 stops at the first n whose estimate is worse (the paper's)
    local_when_n1: bool = True  # n = 1 is the group owner training alone, no communication
    planner: str = "fifo"  # fifo (the iteration as the FIFO star runs it) | paper (Eq. 4, 7-9) | paper_printed (Eq. 7-8 as printed)
    lookup_step_s: float = 0.1  # lookup_table: the table's time thresholds are multiples of this
    group_owner: str = "go"  # the device of the group owner (the user's phone, the hotspot)
