"""A knob is one field of a config schema, and everything about it lives in that field: its
default, what it means (`doc`), the numbers it may take (`range`) and the words it may take
(`choices`).

    lr: float = knob(0.05, "the optimizer's step size", range=Range(0, low_open=True))

`knob(...)` returns a dataclass `field` whose `metadata` holds a `Knob`; a list or dict default
gets a fresh copy per instance (`default_factory`), and `knob_factory` takes any factory (a
nested schema). Everything that says or checks what a knob takes reads it from there:
validation before a run (framework.config.validate_knobs walks the composed config against the
schemas), the check of a plugin's node when it is built (framework.registry.build: `check`),
`--help` (every key with its doc) and the one-line errors (framework.config.input_errors: `takes`).

This module imports nothing heavy: schemas import it, and `--help` must not import torch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

from omegaconf import OmegaConf

from framework.errors import ConfigError

METADATA_KEY = "pipelab_knob"


@dataclass(frozen=True)
class Range:
    """What a number may be: [low, high] (an end `open` is excluded), an integer or not, `null`
    or `.inf` allowed or not. `note` says what the number counts, after the range."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    null: bool = False
    inf: bool = False
    note: str = ""

    def describe(self, note: bool = True) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            text = f"{kind} in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
            if self.integer and not self.low_open and not self.high_open:
                text = f"{kind} in {_num(self.low)}..{_num(self.high)}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            text = f"a finite {'integer' if self.integer else 'number'}"
        extras = [x for x, on in ((".inf", self.inf), ("null", self.null)) if on]
        if extras:
            text += " or " + " or ".join(extras)
        return text + (f" ({self.note})" if self.note and note else "")

    def problem(self, value) -> str | None:
        """Why `value` is out of range (None when it is fine)."""
        if value is None:
            return None if self.null else "must be set (null is not allowed here)"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number"
        if math.isnan(value) or (math.isinf(value) and not (self.inf and value > 0)):
            return f"must be {self.describe()}; {value} is not a finite number"
        fraction = self.integer and not float(value).is_integer()
        low_bad = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        high_bad = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        return f"must be {self.describe()}, got {value}" if fraction or low_bad or high_bad else None


def _num(x: float) -> str:
    if isinstance(x, int) and abs(x) >= 2**30:
        return f"2**{x.bit_length()}-1" if x == 2 ** x.bit_length() - 1 else str(x)
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Knob:
    """What a field means and takes. `range` bounds a number (each value, for a map of numbers
    such as `kind_factors`); `choices` lists the values a word may take (None among them: null
    is one); `entries`: the field is a map whose every entry is a partial node of this schema
    (`cluster.devices`: each entry overrides some of a DeviceConfig's keys)."""

    doc: str
    range: Range | None = None
    choices: tuple | None = None
    entries: type | None = None

    def takes(self, beside: str = "") -> str | None:
        """What the knob takes, in words (None: its type says it all); the range's note is left
        out where `beside` (the doc it is printed with) says it already."""
        if self.range is not None:
            return self.range.describe(note=self.range.note not in beside)
        if self.choices is not None:
            return "one of " + ", ".join(_word(c) for c in self.choices)
        return None

    def problem(self, value) -> str | None:
        """Why `value` is not a value this knob takes (None when it is fine)."""
        if self.range is not None:
            return self.range.problem(value)
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not a choice; choices: {', '.join(_word(c) for c in self.choices)}"
        return None


def _word(choice) -> str:
    return "null" if choice is None else str(choice)


def knob(default, doc: str, *, range: Range | None = None, choices=None, entries: type | None = None):
    """A schema field with its default and its `Knob` (see the module's docstring)."""
    meta = {METADATA_KEY: Knob(doc, range, tuple(choices) if choices is not None else None, entries)}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def knob_factory(factory, doc: str, *, range: Range | None = None, choices=None, entries: type | None = None):
    """A schema field whose default `factory()` makes (a nested schema, say), with its `Knob`."""
    meta = {METADATA_KEY: Knob(doc, range, tuple(choices) if choices is not None else None, entries)}
    return dataclasses.field(default_factory=factory, metadata=meta)


@lru_cache(maxsize=None)
def schema_fields(schema: type) -> dict[str, tuple[Knob | None, type | None]]:
    """name -> (its Knob, the schema of a nested node: a field typed by a dataclass), for every
    field of dataclass `schema`. A subclass
    that only changes a default (`microbatches: int = 4`) keeps the Knob of the class it extends."""
    hints = typing.get_type_hints(schema)
    out = {}
    for f in dataclasses.fields(schema):
        hint = hints.get(f.name)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is typing.Union and len(args) == 1:
            hint = args[0]  # Optional[X]
        out[f.name] = (_inherited_knob(schema, f.name), hint if dataclasses.is_dataclass(hint) else None)
    return out


def _inherited_knob(schema: type, name: str) -> Knob | None:
    for cls in schema.__mro__:
        own = cls.__dict__.get("__dataclass_fields__", {}).get(name)
        if own is not None and METADATA_KEY in own.metadata:
            return own.metadata[METADATA_KEY]
    return None


def knob_of(schema: type, name: str) -> Knob | None:
    """The Knob of field `name` of dataclass `schema` (None: no such field, or a plain one)."""
    found = schema_fields(schema).get(name) if dataclasses.is_dataclass(schema) else None
    return found[0] if found else None


def choices(schema: type, name: str) -> tuple:
    """The choices of field `name` of `schema`: code that dispatches on a knob's value reads them
    here, so they are written once."""
    k = knob_of(schema, name)
    if k is None or k.choices is None:
        raise KeyError(f"{schema.__name__}.{name} declares no choices")
    return k.choices


def takes(schema: type, name: str) -> str | None:
    """What field `name` of `schema` takes, in words (its range or choices), if it says."""
    k = knob_of(schema, name)
    return k.takes() if k else None


def doc(schema: type, name: str) -> str:
    k = knob_of(schema, name)
    return k.doc if k else ""


def leaves(node, schema: type | None, prefix: str) -> Iterator[tuple[str, Any, Knob | None]]:
    """(dotted key, value, its Knob or None) of every leaf of the plain container `node`, read
    against dataclass `schema`: a dict-typed knob with a range gives each of its values that
    knob (`kind_factors.<kind>`), a knob with `entries` reads each entry against that schema,
    list items are `key[i]`; a key the schema lacks has no knob (the key checks report it)."""
    if not isinstance(node, dict):
        yield from _items(node, None, prefix)
        return
    known = schema_fields(schema) if dataclasses.is_dataclass(schema) else {}
    for key, value in node.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        k, sub = known.get(key, (None, None))
        if sub is not None and isinstance(value, dict):
            yield from leaves(value, sub, where)
        elif k is not None and k.entries is not None and isinstance(value, dict):
            for name, entry in value.items():
                yield from leaves(entry, k.entries, f"{where}.{name}")
        elif k is not None and k.range is not None and isinstance(value, dict):
            for name, v in value.items():
                yield f"{where}.{name}", v, k
        else:
            yield from _items(value, k, where)


def _items(value, k: Knob | None, where: str):
    if isinstance(value, dict):
        for name, v in value.items():
            yield from _items(v, None, f"{where}.{name}")
    elif isinstance(value, list) and not (k is not None and k.choices is not None):  # a list is no choice: said whole
        for i, v in enumerate(value):
            yield from _items(v, None, f"{where}[{i}]")
    else:
        yield where, value, k


def check(node, schema: type, where: str) -> None:
    """Every knob of `node` (a plain container, or an OmegaConf node) in its range and among its
    choices, read against `schema`; the first that is not is a ConfigError naming its key."""
    if dataclasses.is_dataclass(node):
        node = dataclasses.asdict(node)
    elif not isinstance(node, (dict, list)):
        node = OmegaConf.to_container(node, resolve=True)
    for key, value, k in leaves(node, schema, where):
        why = k.problem(value) if k is not None else None
        if why:
            raise ConfigError(key, why)
