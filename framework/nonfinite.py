"""Non-finite numbers end a run (`train.on_nonfinite`), instead of passing as a finished one.

A diverged run (`train.lr=1e9`) or a poisoned peer used to train on NaN, report `val/loss nan`
and end FINISHED with exit status 0. `train.on_nonfinite` decides what the first non-finite
number does:

- `fail` (default): the run ends FAILED with one line naming what was not finite (the loss, a
  parameter after the update, a tensor received from which role under which tag), the role and
  the iteration; summary.json's `failure` and the MLflow tag `pipelab.failure` record it.
- `warn`: one warning per (role, what), then the run goes on; summary.json counts them.
- `ignore`: no checks at all (nothing is computed).

Where the checks run, so that every scheduler gets them without code of its own: the loss a role
reports (the job's hook, which sees every loss on either runtime), each Stage's parameters after
its optimizer step (a non-finite gradient makes a non-finite parameter, so one check covers the
gradient and the update; which of the two it was is told apart only when the check fails), and,
on real runtimes, every tensor a role receives (`ctx.recv`: a broken or malicious peer must not
pass as a finished run). The simulator does not check what roles pass each other in its one
process: a message there is what a role computed, and a NaN in it reaches a checked loss or update
within the same iteration. Checking them too cost 2.3-2.7% of a run (GPipe S=4 M=8 VGG-5, PiPar
K=16 LeNet; one thread, 1,800 and 1,232 checks a run), over the 2% this may cost.

Where: the role is the one whose computation or receive met the number; the iteration is the
global (0-based) iteration that computation belonged to, or, where the role does not say, the
run's iterations done by then. With `runtime.batch_replicas` a parameter's check runs in a batched
flush that any role may set off, so the line names the stage (its units) but no role.

Cost: a tensor is summed (a NaN or an infinity anywhere makes the sum non-finite) and only a
non-finite sum is looked at element by element, since a sum of large finite values can
overflow. Summing is ~15x cheaper than `torch.isfinite(x).all()`, which writes a mask first.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager

import torch

from framework.config.knobs import choices
from framework.config.schemas import TrainConfig
from framework.errors import PipelabError

POLICIES = choices(TrainConfig, "on_nonfinite")


class NonFiniteError(PipelabError):
    """A NaN or an infinity in training, under `train.on_nonfinite=fail`. `role` and `iteration`
    are filled in where they are known (the role context that ran the computation)."""

    exit_status = 3  # not bad input (2): the run started and failed

    def __init__(self, what: str, *, role: str | None = None, iteration: int | None = None):
        self.what, self.role, self.iteration = what, role, iteration
        super().__init__(self._message())

    def locate(self, role: str | None = None, iteration: int | None = None) -> "NonFiniteError":
        """Add where it happened, unless already known; returns self (to re-raise)."""
        if self.role is None and role is not None:
            self.role = role
        if self.iteration is None and iteration is not None and iteration >= 0:
            self.iteration = iteration
        self.args = (self._message(),)
        return self

    def where(self) -> dict:
        return {"kind": "nonfinite", "what": self.what, "role": self.role, "iteration": self.iteration}

    @property
    def headline(self) -> str:
        """What and where, without the advice."""
        at = [f"role {self.role}"] if self.role is not None else []
        if self.iteration is not None:
            at.append(f"iteration {self.iteration}")
        return f"non-finite {self.what}" + (f" ({', '.join(at)})" if at else "")

    def _message(self) -> str:
        why = "a peer sent NaN or inf;" if " received from " in self.what else "training diverged; lower train.lr, or"
        return f"{self.headline}: {why} set train.on_nonfinite=warn to go on"

    def __str__(self) -> str:
        return self.args[0]


def finite_tensor(t: torch.Tensor) -> bool:
    """Whether every element of `t` is finite (floating point; other dtypes always are)."""
    if not t.is_floating_point() or t.device.type == "meta" or t.numel() == 0:
        return True
    if math.isfinite(float(t.sum())):
        return True
    return bool(torch.isfinite(t).all())  # the sum may have overflowed: look element by element


class Guard:
    """The checks of one role (or one stage) under a policy; `enabled` is False for `ignore`."""

    def __init__(self, policy: str = "fail"):
        if policy not in POLICIES:
            raise ValueError(f"train.on_nonfinite={policy!r}; choices: {', '.join(POLICIES)}")
        self.policy = policy
        self.enabled = policy != "ignore"
        self.warned: dict[tuple, int] = {}  # (role, what) -> occurrences, under `warn`

    def found(self, what: str, role: str | None = None, iteration: int | None = None) -> None:
        err = NonFiniteError(what, role=role, iteration=iteration)
        if self.policy == "fail":
            raise err
        key = (role, what)
        self.warned[key] = self.warned.get(key, 0) + 1
        if self.warned[key] == 1:
            print(f"warning: {err.headline}; train.on_nonfinite=warn: training goes on (each kind is said once; summary.json counts them)", file=sys.stderr)

    def number(self, value, what: str, role: str | None = None, iteration: int | None = None) -> None:
        if self.enabled and isinstance(value, (int, float)) and not math.isfinite(value):
            self.found(what, role, iteration)

    def received(self, message, what: str, role: str | None = None, iteration: int | None = None) -> None:
        """Every floating tensor of a message (a tensor or a dict of them; placeholders of
        deferred work are checked where their values are used)."""
        if not self.enabled:
            return
        if isinstance(message, torch.Tensor):
            if not finite_tensor(message):
                self.found(what, role, iteration)
        elif isinstance(message, dict):
            for k, t in message.items():
                if isinstance(t, torch.Tensor) and not finite_tensor(t):
                    self.found(what if k == "x" else f"{what} ({k})", role, iteration)
                    return

    def parameters(self, named, where: str) -> None:
        """After an optimizer step: every parameter finite. `named`: (name, parameter) pairs.
        Inside `held()` (a batched flush) the sums are kept and read after it."""
        if not self.enabled:
            return
        named = list(named)
        if _held is not None:
            if named:
                _held.append((self, torch.stack([p.detach().sum() for _, p in named]).sum(), named, where))
            return
        total = 0.0
        for _, p in named:
            total += float(p.detach().sum())
        if not math.isfinite(total):
            self._find_parameter(named, where)

    def _find_parameter(self, named, where: str) -> None:
        for name, p in named:
            if not bool(torch.isfinite(p.detach()).all()):
                g = p.grad
                what = "gradient" if g is not None and not bool(torch.isfinite(g).all()) else "update"
                self.found(f"{what} of parameter {name} in {where}")
                return

    def summary(self) -> dict:
        """Under `warn`: how often each non-finite number was met, by role where it is known."""
        return {(f"{role}: " if role else "") + what: n for (role, what), n in self.warned.items()}


_held: list | None = None  # checks made inside `held()`, not read yet


@contextmanager
def held():
    """A block whose parameter checks read nothing back (a batched flush of deferred work: on a
    GPU each read would make the host wait for every kernel queued before it); they are read in
    one go when it ends, as the losses of the same work are."""
    global _held
    if _held is not None:  # nested: the outer block reads them
        yield
        return
    _held = []
    try:
        yield
    except BaseException:
        _held = None
        raise
    checks, _held = _held, None
    if not checks:
        return
    totals = torch.stack([t.to(torch.float64) for _, t, _, _ in checks]).tolist()
    for (guard, _, named, where), total in zip(checks, totals):
        if not math.isfinite(total):
            guard._find_parameter(named, where)
