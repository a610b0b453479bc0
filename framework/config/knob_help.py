"""`--help`'s config: the composed config as YAML, each knob followed by what it means and what
it takes, read from its schema field (framework.config.knobs), e.g.

    train:
      lr: 0.05  # the learning rate; a number > 0

The groups are read against the schemas of the options chosen (`scheduler=pipar --help` shows
PiPar's knobs). Imports no torch (start-up), like the rest of `--help`.
"""

from __future__ import annotations

import dataclasses

import yaml
from omegaconf import OmegaConf

from framework import registry
from framework.config import knobs
from framework.config.schemas import Config
from framework.config.validate_knobs import group_schema


def annotated_config(root, resolve: bool = False) -> str:
    """The config `root` (an OmegaConf node, its `hydra` node left out) as commented YAML."""
    plain = OmegaConf.to_container(root, resolve=resolve)
    plain.pop("hydra", None)
    lines: list[str] = []
    for key, value in plain.items():
        if key in registry.GROUPS and isinstance(value, dict):
            lines.append(f"{key}:")
            _node(value, group_schema(key, value.get("name")), "  ", lines)
        else:
            _node({key: value}, Config, "", lines)
    return "\n".join(lines)


def _node(node: dict, schema, indent: str, lines: list[str]) -> None:
    """`node`'s keys under `indent`: a nested schema or a map of entries as a block, any other
    value (a map of numbers such as kind_factors, a list) on its key's line."""
    fields = knobs.schema_fields(schema) if dataclasses.is_dataclass(schema) else {}
    for key, value in node.items():
        k, sub = fields.get(key, (None, None))
        entries = k.entries if k is not None else None
        if not isinstance(value, dict) or not value or (sub is None and entries is None and k is not None and k.range is not None):
            lines.append(_line(f"{indent}{key}: {_value(value)}", k))
            continue
        lines.append(_line(f"{indent}{key}:", k))
        if sub is not None or entries is None:
            _node(value, sub, indent + "  ", lines)
            continue
        for name, entry in value.items():  # each entry read against the entries' schema
            if isinstance(entry, dict) and entry:
                lines.append(f"{indent}  {name}:")
                _node(entry, entries, indent + "    ", lines)
            else:
                lines.append(f"{indent}  {name}: {_value(entry)}")


def _line(text: str, k) -> str:
    if k is None:
        return text
    said = "; ".join(x for x in (k.doc, k.takes(beside=k.doc)) if x)
    return f"{text}  # {said}" if said else text


def _value(value) -> str:
    if isinstance(value, str) and "${" in value:  # an interpolation, shown as written
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf"), sort_keys=False).removesuffix("\n...\n").strip()
