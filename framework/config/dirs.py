"""Where configs come from: conf/ and the folders a command line adds (`--config-dir`,
`hydra.searchpath`), and the YAML presets of a group in them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

# the config tree (an absolute path: Hydra resolves relative ones against the module, which fails under `-m`)
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def yaml_presets(group: str, dirs=None) -> list[str]:
    """The YAML presets of a config group: <dir>/<group>/**/*.yaml of each config folder (conf/
    and, for a command line, the user's: `search_dirs`), as `group=option` names them."""
    out = set()
    for d in dirs if dirs is not None else [Path(CONF_DIR)]:
        root = Path(d) / group
        out.update(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    return sorted(out)


def search_dirs(argv=()) -> list[Path]:
    """The config folders Hydra composes from for command-line arguments `argv`: conf/, the
    folder of `--config-dir <dir>` (or -cd) and each folder of `hydra.searchpath=[...]`
    (file://<dir>, or pkg://<package>); a pkg:// package that cannot be found is left out (Hydra
    says so when it composes)."""
    dirs = [Path(CONF_DIR)]
    for d in extra_config_dirs(argv):
        if d not in dirs:
            dirs.append(d)
    return dirs


def extra_config_dirs(argv=(), *, sources: bool = False) -> list:
    """The folders `argv` adds to Hydra's search path (see `search_dirs`), in its order;
    `sources`: as (what added it: "--config-dir" or the hydra.searchpath entry, folder)."""
    argv = list(argv)
    out: list[tuple[str, Path]] = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            out.append((arg, Path(argv[i + 1]).expanduser().absolute()))
        elif arg.startswith("--config-dir="):
            out.append(("--config-dir", Path(arg.split("=", 1)[1]).expanduser().absolute()))
    for entry in searchpath_override(argv) or []:
        d = _search_dir(entry)
        if d is not None:
            out.append((f"hydra.searchpath entry {entry}", d))
    return out if sources else [d for _, d in out]


def searchpath_override(argv) -> list[str] | None:
    """The entries of a `hydra.searchpath=[...]` override among `argv` (None: there is none)."""
    for arg in argv:
        if arg.lstrip("+~").split("=", 1)[0].strip() != "hydra.searchpath" or "=" not in arg:
            continue
        try:
            value = OverridesParser.create().parse_override(arg).value()
        except HydraException:
            return None  # the override check says what is wrong with it
        return [str(v) for v in value] if isinstance(value, list) else None
    return None


def _search_dir(entry: str) -> Path | None:
    scheme, _, rest = entry.partition("://") if "://" in entry else ("file", "", entry)
    if scheme == "file":
        return Path(rest).expanduser().absolute()
    if scheme == "pkg":
        try:
            spec = importlib.util.find_spec(rest.replace("/", "."))
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    return None
