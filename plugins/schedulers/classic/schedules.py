"""The classic schedules: local, GPipe, 1F1B (PipeDream-flush) and PipeDream (async 1F1B).

Each is only its per-stage action list; `framework.pipeline.scheduler.PipelineScheduler` runs it.
"""

from __future__ import annotations

from framework.errors import ConfigError
from framework.pipeline.scheduler import STEP, B, F, PipelineScheduler, one_f_one_b


class Local(PipelineScheduler):
    """One device, the reference loop: gradient accumulation over micro-batches, one step."""

    min_stages = 1

    def num_stages_override(self, num_stages: int) -> int:
        return 1

    def actions(self, stage, num_stages, num_mb):
        acts = []
        for m in range(num_mb):
            acts += [F(m), B(m)]
        return acts + [STEP]


class GPipe(PipelineScheduler):
    """GPipe: every forward, then every backward, then one synchronous step (Huang et al. 2019)."""

    def actions(self, stage, num_stages, num_mb):
        return [F(m) for m in range(num_mb)] + [B(m) for m in range(num_mb)] + [STEP]


class OneFOneB(PipelineScheduler):
    """1F1B with a flush (PipeDream-flush / DAPPLE): GPipe's bubble, at most S micro-batches alive."""

    def actions(self, stage, num_stages, num_mb):
        return one_f_one_b(stage, num_stages, num_mb) + [STEP]


class PipeDream(PipelineScheduler):
    """PipeDream: asynchronous 1F1B over whole mini-batches with weight stashing (Narayanan et al. 2019).

    As FTPipeHD and AccEPT use it: stage s updates after each backward, and backpropagates
    through the weights its forward used (stashed), as many updates old as its warm-up has
    forwards: S-1-s with `in_flight` S (the default; FTPipeHD's semaphore of N), more with a
    deeper pipeline (framework.pipeline.scheduler.one_f_one_b). The pipeline drains at each epoch end so
    that evaluation sees one consistent model."""

    flush_per = "epoch"
    stash = True

    def num_microbatches(self) -> int:
        if int(self.cfg.microbatches) != 1:
            raise ConfigError("scheduler.microbatches", f"pipedream pipelines whole mini-batches, one per stage; got {self.cfg.microbatches}, use 1")
        if self.cfg.in_flight is not None and int(self.cfg.in_flight) < 1:
            raise ConfigError("scheduler.in_flight", f"mini-batches in flight must be at least 1 (null: one per stage), got {self.cfg.in_flight}")
        return 1

    def actions(self, stage, num_stages, num_mb):
        return one_f_one_b(stage, num_stages, num_mb, step_after_backward=True, in_flight=self.cfg.in_flight)
