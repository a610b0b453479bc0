"""docs/calibration.md lists every number of every cluster and experiment preset (and of the
Optuna sampler options an experiment picks), with its source.

A preset that gains a number the table does not list, a number whose value differs from the
table's, a row the preset no longer has, or a row without a source fails here: a constant has a
source (the paper's table or figure, a datasheet, a profile measured here with its command, or
"fitted" with what it was fitted to), never a target.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_yaml_loader

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "calibration.md"
PRESETS = sorted(p.relative_to(ROOT).as_posix() for d in ("conf/cluster", "conf/experiment", "conf/hydra/sweeper/sampler") for p in (ROOT / d).glob("*.yaml"))
HEADING = re.compile(r"^#{2,4}\s+`?(conf/[\w/]+\.yaml)`?\s*$")
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|(.*)\|\s*$")


def numbers(node, prefix: str = ""):
    """(dotted key, value) of every number in a raw preset (lists holding numbers as a whole);
    the defaults list and interpolations (strings) are not numbers."""
    if isinstance(node, dict):
        for k, v in node.items():
            if not prefix and k == "defaults":
                continue
            yield from numbers(v, f"{prefix}{k}.")
    elif _is_number(node):
        yield prefix[:-1], node


def _is_number(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, list) and any(_is_number(x) for x in v)


def same(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    return a == b or math.isclose(a, b, rel_tol=1e-12)


def doc_tables() -> dict[str, dict[str, tuple[object, str]]]:
    """preset path -> {key: (value, source)} from the doc's tables."""
    out: dict[str, dict] = {}
    current = None
    for line in DOC.read_text().splitlines():
        m = HEADING.match(line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if line.startswith("#"):
            current = None
            continue
        m = ROW.match(line)
        if m and current is not None:
            key, value, source = m.group(1), m.group(2).strip().strip("`"), m.group(3).strip()
            current[key] = (yaml.load(value, Loader=get_yaml_loader()), source)
    return out


@pytest.fixture(scope="module")
def tables():
    return doc_tables()


@pytest.mark.parametrize("preset", PRESETS, ids=[p[5:-5] for p in PRESETS])
def test_every_number_of_the_preset_is_listed_with_its_source(preset, tables):
    raw = OmegaConf.to_container(OmegaConf.load(ROOT / preset), resolve=False)
    have = dict(numbers(raw))
    assert preset in tables, f"docs/calibration.md has no section for {preset}"
    listed = tables[preset]
    problems = []
    for key, value in have.items():
        if key not in listed:
            problems.append(f"{key} = {value!r} is not listed")
        elif not same(listed[key][0], value):
            problems.append(f"{key}: the preset says {value!r}, the table {listed[key][0]!r}")
        elif not listed[key][1] or listed[key][1].upper().startswith("TODO"):
            problems.append(f"{key}: no source")
    problems += [f"{key} is listed but the preset has no such number" for key in listed if key not in have]
    assert not problems, f"{preset}:\n  " + "\n  ".join(problems)


def test_the_doc_has_no_section_for_a_preset_that_is_gone(tables):
    assert sorted(set(tables) - set(PRESETS)) == []
