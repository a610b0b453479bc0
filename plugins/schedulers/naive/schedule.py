"""The schedule of naive model parallelism, as the action list every stage runs per mini-batch."""

from __future__ import annotations

from framework.pipeline.scheduler import STEP, Action, B, F, PipelineScheduler


class Naive(PipelineScheduler):
    """Naive model parallelism: micro-batch m goes forward through stages 0..S-1 and backward
    through S-1..0 before micro-batch m+1 starts; one synchronous step per mini-batch.

    Every stage runs F(0) B(0) F(1) B(1) ... STEP. Stage 0 cannot start F(m+1) before its B(m),
    which waits for the gradient of m to come back from the last stage, so one stage computes at
    a time: the bubble is (S-1)/S with equal stages and free links, whatever M (GPipe's is
    (S-1)/(M+S-1)). The arithmetic is GPipe's: the same forwards and backwards, the gradients
    accumulated in the same order, so the two train to the same weights."""

    def actions(self, stage: int, num_stages: int, num_mb: int) -> list[Action]:
        acts: list[Action] = []
        for m in range(num_mb):
            acts += [F(m), B(m)]
        return acts + [STEP]
