"""What `group=option` may name on the command line, and the one-line error for an option that
does not exist: the CLI lists the options (`--plugins`, `--help`), the bad-input checks name them
(framework.config.input_errors)."""

from __future__ import annotations

import difflib
from pathlib import Path

from framework import registry
from framework.config.dirs import CONF_DIR, extra_config_dirs, search_dirs, yaml_presets
from framework.errors import CHOICES_MOST, listing


def group_choices(group: str, argv=()) -> list[str]:
    """What `group=option` may name: the YAML presets in <dir>/<group>/ of every config folder
    Hydra searches for the command line `argv` (conf/, --config-dir, hydra.searchpath), and the
    plugins that registered a schema but ship no YAML (installed from outside this repo)."""
    choices = set(yaml_presets(group, search_dirs(argv)))
    if group in registry.GROUPS:
        choices.update(registry.schema_options(group))
    return sorted(choices)


def check_group_overrides(args: list[str]) -> str | None:
    """A one-line error for `group=option` overrides naming an option that does not exist.

    Hydra would say the same over a dozen lines with its search path; this names the choices."""
    for source, d in extra_config_dirs(args, sources=True):
        if not d.is_dir():
            return f"{source}: {d} is not a folder; a config folder holds <group>/<option>.yaml files, e.g. cluster/mine.yaml (then cluster=mine)"
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        group = key.lstrip("+~")
        if not group or "." in group or group.split("/")[0] == "hydra" or not ((Path(CONF_DIR) / group).is_dir() or group in registry.GROUPS):
            # hydra/...: Hydra's own groups and its plugins' (hydra/sweeper/sampler=grid) live in its
            # ConfigStore too, which this listing does not see; Hydra checks them
            continue
        choices = group_choices(group, args)
        for option in value.split(","):  # multirun sweeps: a,b,c
            option = option.strip()
            if option and option != "null" and option not in choices:
                close = difflib.get_close_matches(option.lower().removesuffix(".yaml"), choices, n=1)
                hint = f" (did you mean {group}={close[0]}?)" if close else ""
                return f"{group}={option}: no such {group}{hint}; choices: {listing(choices, CHOICES_MOST)}"
    return None
