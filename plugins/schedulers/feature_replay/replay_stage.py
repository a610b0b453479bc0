"""The upstream side's stage: a `framework.stage.Stage` with feature replay's history queue
(Huo et al. 2018; Yao et al. 2021, Eq. 3).

A batch's forward keeps no graph (its output is sent on at once); the stage keeps the input, the
weight version and, if the slice draws random numbers (dropout), the RNG state. When the batch's
gradient comes back, `replay(key)` redoes that forward through the *current* weights with the
graph kept, so that `backward(key, grad)` applies the old gradient to the weights as they are
now; the staleness is counted from the original forward (`Stage.restamp`).
"""

from __future__ import annotations

import torch

from framework.stage import Stage


class ReplayStage(Stage):
    """A stage that forwards without a graph and replays later (the history queue)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._history: dict = {}  # key -> (input, RNG state, weight version)
        self.peak_history = 0  # the most inputs kept at once

    def held_keys(self) -> list:
        return super().held_keys() + list(self._history)

    def forward_to_replay(self, x: torch.Tensor, key):
        """Forward without keeping a graph (the output is sent on); keep only the input, the
        weight version and, if the slice draws random numbers (dropout), the RNG state, so that
        `replay(key)` can redo this forward later through the weights of that time."""
        if key in self.held_keys():
            raise RuntimeError(f"stage [{self.start}:{self.stop}) already holds {key!r}")
        if not self.numerics:
            self._history[key] = (x, None, self.version)
            self.peak_history = max(self.peak_history, len(self._history))
            return torch.empty((x.shape[0], *self.out_shape), device="meta")
        rng = torch.get_rng_state() if self.draws_random else None
        with torch.no_grad():
            y = self.module(x)
        self._history[key] = (x, rng, self.version)
        self.peak_history = max(self.peak_history, len(self._history))
        return y

    def replay(self, key) -> None:
        """Run `key`'s stored input through the current weights, keeping the graph for
        `backward(key, grad)`: the gradient that comes back for an old output then updates the
        weights as they are now (the staleness is counted from the original forward)."""
        x, rng, version = self._history.pop(key)
        if rng is not None:
            now = torch.get_rng_state()
            torch.set_rng_state(rng)  # the same dropout masks as the forward that was sent
        try:
            self.forward(x, key)
        finally:
            if rng is not None:
                torch.set_rng_state(now)
        self.restamp(key, version)

    def forget(self, key) -> None:
        """Drop `key`'s stored input without training on it (a discarded stale gradient)."""
        self._history.pop(key)

    @property
    def history(self) -> int:
        """Inputs kept for replay."""
        return len(self._history)
