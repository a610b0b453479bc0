"""framework.specs: a role's spec and a plan cross processes as JSON and come back equal."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from framework.specs import Data, RoleSpec, absent_when_none


@dataclass(frozen=True)
class Slot(Data):
    start: float
    units: tuple[int, ...]


@dataclass(frozen=True)
class ExampleSpec(RoleSpec):
    peers: tuple[str, ...]
    bounds: tuple[tuple[int, int], ...]
    by_epoch: dict[int, tuple[int, int]]
    slots: list[Slot]
    lr: float
    cap: int | None = None
    first: Slot | None = None


def test_a_spec_survives_json_exactly():
    spec = ExampleSpec("stage1", "dev1", ("stage0", "stage2"), ((0, 3), (3, 7)), {2: (1, 5)}, [Slot(0.1 + 0.2, (1, 2))], 1e-3, None, Slot(1 / 3, ()))
    wire = json.dumps(spec.to_json())  # what a role process receives
    back = ExampleSpec.from_json(json.loads(wire))
    assert back == spec and type(back.slots[0]) is Slot and back.first.start == 1 / 3 and back.by_epoch == {2: (1, 5)}
    with pytest.raises(Exception):  # frozen: a role cannot change what the coordinator decided
        back.lr = 0.1


def test_unknown_fields_and_foreign_values_are_refused():
    with pytest.raises(ValueError, match="unknown fields"):
        RoleSpec.from_json({"role": "a", "device": "b", "plan": {}})
    with pytest.raises(TypeError, match="not JSON data"):
        ExampleSpec("r", "d", (), (), {}, [], object()).to_json()


@dataclass(frozen=True)
class PlanWithAnOptionalPart(Data):
    n: int
    budget: Slot | None = absent_when_none()


def test_an_absent_when_none_field_is_left_out_while_none_and_comes_back():
    bare, full = PlanWithAnOptionalPart(3), PlanWithAnOptionalPart(3, Slot(0.5, (1,)))
    assert bare.to_json() == {"n": 3} and PlanWithAnOptionalPart.from_json({"n": 3}) == bare
    assert full.to_json() == {"n": 3, "budget": {"start": 0.5, "units": [1]}}
    assert PlanWithAnOptionalPart.from_json(json.loads(json.dumps(full.to_json()))) == full
