"""Typed data that crosses processes: a role's spec and a scheduler's plan.

A scheduler decides once, on the coordinator, what each role needs to know: its slice of the
plan and the knobs it reads. That is the role's **spec**, a frozen dataclass deriving from
`RoleSpec`. It travels to a role process as JSON (`to_json` / `from_json`, never pickle) and the
role is built from it and from the process's own parts (`framework.scheduler.SchedulerContext`:
model, dataset, cluster, compressor); a role never holds the scheduler. On the simulator the
same JSON round trip builds every role (`Scheduler.build_role`), so both runtimes build roles
from the same bytes.

Plans are typed the same way (`Data` subclasses); `Scheduler.plan()` returns their JSON, which
is written to plan.json and shipped.

A field made with `absent_when_none()` is left out of the JSON while it is None (a plan's
optional part: plan.json has no such key then, and `from_json` gives the default back).

Field types `from_json` rebuilds: JSON scalars, `Data` subclasses, `tuple[X, ...]`,
`tuple[X, Y]`, `list[X]`, `dict[str | int, X]` and `X | None` of those. Floats survive the round
trip exactly (`json` writes their shortest repr); dict keys come back as the annotated key type.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T", bound="Data")
_ABSENT_WHEN_NONE = "absent_when_none"


def absent_when_none() -> Any:
    """A field defaulting to None that `to_json` leaves out while it is None."""
    return dataclasses.field(default=None, metadata={_ABSENT_WHEN_NONE: True})


@dataclasses.dataclass(frozen=True)
class Data:
    """A frozen dataclass that converts to and from JSON by its field types."""

    def to_json(self) -> dict:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not (f.metadata.get(_ABSENT_WHEN_NONE) and getattr(self, f.name) is None)}

    @classmethod
    def from_json(cls: type[T], data: dict) -> T:
        hints, names = _fields(cls)
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        return cls(**{k: _decode(hints[k], v) for k, v in data.items()})


@functools.cache
def _fields(cls: type) -> tuple[dict, frozenset]:
    """A Data class's field types and init field names, resolved once: `get_type_hints` evaluates
    every annotation's string anew (1 ms for a spec with nested types, once per role built)."""
    return typing.get_type_hints(cls), frozenset(f.name for f in dataclasses.fields(cls) if f.init)


@dataclasses.dataclass(frozen=True)
class RoleSpec(Data):
    """What one role needs: its name and device; a scheduler's roles extend it with their slice
    of the plan and their knobs."""

    role: str
    device: str


def _encode(value: Any) -> Any:
    if isinstance(value, Data):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{type(value).__name__} is not JSON data (a spec or plan field holds {value!r})")


def _decode(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return _decode(options[0], value)
        return value  # a union of scalars (int | float, ...): JSON kept the value's own type
    if isinstance(tp, type) and issubclass(tp, Data):
        return tp.from_json(value)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value))
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return [_decode(arg, v) for v in value]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp) or (str, Any)
        return {_decode_key(key_tp, k): _decode(val_tp, v) for k, v in value.items()}
    return value  # a scalar keeps the type JSON gave it (an int in a float field stays an int: same numbers)


def _decode_key(tp: Any, key: str) -> Any:
    return int(key) if tp is int else key
