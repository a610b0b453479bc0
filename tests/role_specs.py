"""Checks that a scheduler's roles are built from their specs alone (issue 45: no role holds the
scheduler): each role is built from its spec's JSON as a role process receives it, and nothing
it holds, nor what those hold in turn, is the scheduler, a scheduler or one's bound method."""

from __future__ import annotations

import inspect
import json

from framework.scheduler import Role, Scheduler


def roles_from_shipped_specs(sched: Scheduler) -> dict[str, Role]:
    """Every role of `sched`, built from its spec after a trip through JSON text; each spec
    round-trips equal."""
    roles = {}
    for r in sched.role_devices():
        spec = sched.role_spec(r)
        assert type(spec).from_json(spec.to_json()) == spec, r
        roles[r] = sched.role_from_spec(r, json.loads(json.dumps(spec.to_json())))
    return roles


def _held(value) -> list:
    """What `value` holds: its attributes, or a container's items."""
    if isinstance(value, dict):
        return list(value.keys()) + list(value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    try:
        return list(vars(value).values())
    except TypeError:  # no __dict__: a scalar, a slotted object
        return []


def assert_holds_no_scheduler(role: Role, sched: Scheduler, levels: int = 2) -> None:
    """Nothing `role` holds, down `levels` objects (containers count as none), is `sched`, any
    Scheduler, or a method bound to one."""
    todo, seen = [(v, 1, type(role).__name__) for v in _held(role)], set()
    while todo:
        value, level, where = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        bound = value.__self__ if inspect.ismethod(value) else None
        assert value is not sched and not isinstance(value, Scheduler), f"{where} holds the scheduler"
        assert not isinstance(bound, Scheduler), f"{where} holds a method of the scheduler"
        container = isinstance(value, (dict, list, tuple, set, frozenset))
        if container or level < levels:
            todo += [(v, level if container else level + 1, f"{where}.{type(value).__name__}") for v in _held(value)]
