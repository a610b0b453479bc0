"""A run's plan in a few report columns, so a reader sees why two runs differ (fp16 slower than
no compression at 10 Mbit/s: the partitioner cut the model elsewhere).

Read from the run's plan.json by the keys schedulers share there, none of them plugin code:
- `stages` (pipeline schedulers: each stage's `units` [first, end)) or `cut` (edge/cloud split
  schedulers): `plan/cuts`, the unit indexes where a new stage starts (`4` = units 0-3 on the first
  device, the rest after; `2,4,6` = four stages);
- `microbatches` and `flush_per`: `plan/schedule` (`M=8, flush per iteration`);
- `P` and `N` (PiPar's chosen split point and micro-batches per device): `plan/P`, `plan/N`;
- `n` (AdaLearner's chosen number of workers): `plan/n`.
A key a plan lacks leaves its column empty; a column no run has is left out.
"""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ("plan/cuts", "plan/schedule", "plan/P", "plan/N", "plan/n")


def _cuts(plan: dict) -> str | None:
    stages = plan.get("stages")
    if isinstance(stages, list) and stages and all(isinstance(s, dict) and isinstance(s.get("units"), list) and len(s["units"]) == 2 for s in stages):
        return ",".join(str(s["units"][0]) for s in stages[1:]) or "none (one stage)"
    cut = plan.get("cut")
    if isinstance(cut, int) and not isinstance(cut, bool):
        return str(cut)
    return None


def _schedule(plan: dict) -> str | None:
    parts = []
    if isinstance(plan.get("microbatches"), int):
        parts.append(f"M={plan['microbatches']}")
    if isinstance(plan.get("flush_per"), str):
        parts.append(f"flush per {plan['flush_per']}")
    if plan.get("weight_stashing") is True:
        parts.append("weight stashing")
    return ", ".join(parts) or None


def _integer(plan: dict, key: str) -> str | None:
    v = plan.get(key)
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else None


def plan_columns(plan: dict) -> dict[str, str]:
    """The plan's report columns that it has (see the module's docstring)."""
    if not isinstance(plan, dict):
        return {}
    values = {"plan/cuts": _cuts(plan), "plan/schedule": _schedule(plan), "plan/P": _integer(plan, "P"), "plan/N": _integer(plan, "N"), "plan/n": _integer(plan, "n")}
    return {k: v for k, v in values.items() if v is not None}


def read_plan(path: Path) -> dict[str, str]:
    """The columns of the plan.json at `path`; none when it is absent or unreadable (a run that
    failed before planning)."""
    try:
        return plan_columns(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return {}
