"""Which `pipelab.plugins` entry points load: this repo's own (the built-in `plugins` package,
from the installed pipelab's metadata, or from this source tree's pyproject.toml when it was not
pip-installed) and every other installed package's, unless `PIPELAB_PLUGINS` says otherwise.

`PIPELAB_PLUGINS`, when set, names the only outside distributions whose entry points load
(comma- or space-separated, as pip spells them; empty: none); this repo's own load whatever it
says. The test suite sets it empty (tests/conftest.py), so what else a machine has installed, a
plugin that imports torch at its top, say, changes no test; a test that installs a plugin of its
own names that plugin's distribution there.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from framework.errors import PipelabError

ENTRY_POINT_GROUP = "pipelab.plugins"
DISTRIBUTION = "pipelab"  # the package whose installed entry points name the built-in plugins
ONLY_PLUGINS_ENV = "PIPELAB_PLUGINS"  # the outside distributions whose plugins load (unset: all)


def entry_points_to_load() -> list[EntryPoint]:
    installed = list(entry_points(group=ENTRY_POINT_GROUP))
    if not any(ep.dist is not None and ep.dist.name == DISTRIBUTION for ep in installed):  # a source tree not pip-installed
        installed += _source_tree_entry_points()
    return [ep for ep in installed if _wanted(ep)]


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # a distribution's name as pip compares it


def _wanted(ep: EntryPoint) -> bool:
    """This repo's own always (installed, or read from its pyproject.toml: no distribution);
    another package's unless `PIPELAB_PLUGINS` is set and leaves it out."""
    only = os.environ.get(ONLY_PLUGINS_ENV)
    if only is None or ep.dist is None or ep.dist.name == DISTRIBUTION:
        return True
    return _dist_key(ep.dist.name) in {_dist_key(n) for n in re.split(r"[,\s]+", only) if n}


def _source_tree_entry_points() -> list[EntryPoint]:
    """The `pipelab.plugins` entry points that this source tree's pyproject.toml declares (the
    built-in `plugins`): what an install would have made, for a tree that was not pip-installed."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if not pyproject.is_file():
        return []
    try:
        import tomllib  # optional: Python 3.11+ (and only a tree that was not installed reads it)
    except ModuleNotFoundError:
        raise PipelabError(f"this pipelab was not pip-installed, and Python {sys.version_info.major}.{sys.version_info.minor} cannot read its plugins from {pyproject}: run `pip install -e .` in it") from None
    declared = tomllib.loads(pyproject.read_text()).get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in declared.items()]
