"""Every mistake on the command line is one line: `error: <key>...: <what it takes>`, exit 2.

Hydra reports a malformed override, a value of the wrong type or a key no schema has over
several lines (or a stack trace) and exits 1. Here:

- `override_problem` reads each override with Hydra's own parser before anything runs, so
  `=3`, `scheduler=[` or `model=lenet,mlp` without `-m` get one line naming the override;
- `hydra_problem` turns the exception Hydra or OmegaConf raised while composing the config into
  one line naming the key, what it takes (its field's range or choices, framework.config.knobs, or its type)
  and, for a key that does not exist, the keys there are, a "did you mean" and the options of the
  group that have it (`model.depth`: model=mlp has it);
- `run_app` runs the Hydra app so that those exceptions reach `hydra_problem`. An exception the
  run itself raises is a bug, not bad input: it keeps its stack trace. `HYDRA_FULL_ERROR=1`
  turns the translation off, for debugging.

`check_args(argv)` gives the line `python -m framework argv` would print for bad input before
anything runs (or None), in this process: the tests call it for every bad input they know.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import traceback
import typing
from collections.abc import Mapping
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, OmegaConfBaseException, ValidationError

from framework import registry
from framework.config import knobs, preflight
from framework.config.dirs import CONF_DIR, extra_config_dirs
from framework.config.group_options import check_group_overrides, group_choices
from framework.errors import CHOICES_MOST, LINE_MAX, PipelabError, listing, one_line

# Hydra's flags that take a value (`--cfg job`): that value is not an override
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}
INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def overrides_of(argv: list[str]) -> list[str]:
    """The overrides among command-line arguments (Hydra's flags and their values left out)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in FLAGS_WITH_VALUE:
            skip = True
        elif arg == "--info":
            skip = i + 1 < len(argv) and argv[i + 1] in INFO_VALUES
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def _multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") or a.replace(" ", "") == "hydra.mode=MULTIRUN" for a in argv)


def _group_choices(group: str, argv=()) -> list[str] | None:
    return group_choices(group, argv) if group in registry.GROUPS or group == "experiment" else None


def override_problem(argv: list[str]) -> str | None:
    """One line for the first override Hydra cannot read, or that sweeps without -m."""
    if any(a in ("-sc", "--shell-completion") for a in argv):
        return None
    parser = OverridesParser.create()
    for arg in overrides_of(argv):
        key = arg.split("=", 1)[0].strip()
        if "=" not in arg and not arg.startswith("~"):  # `~key` deletes a key
            return f"{arg!r} is not an override: write key=value with no spaces around '=', e.g. train.lr=0.1 (python -m framework --help lists the groups)"
        if not key.lstrip("+~"):
            return f"{arg}: an override needs a key before '=', e.g. train.lr=0.1"
        try:
            override = parser.parse_override(arg)
        except HydraException as e:  # OverrideParseException, or Hydra's own for a bad token
            return _parse_problem(arg, key, str(e), argv)
        if override.is_sweep_override() and not _multirun(argv):
            return _sweep_problem(arg, argv)
    return None


def _sweep_problem(arg: str, argv=()) -> str:
    key, value = arg.split("=", 1)
    as_list = "" if _group_choices(key.lstrip("+~"), argv) else f", or write a list as {key}=[{value}]"
    return f"{arg}: several values are a sweep; add -m to run one job each (python -m framework -m {arg}){as_list}"


def _parse_problem(arg: str, key: str, message: str, argv=()) -> str:
    reason = message.splitlines()[0]
    if "->" in arg:
        return f"{arg}: a link key 'src->dst' cannot be written on the command line (Hydra's override grammar has no '>'); set cluster.links in a cluster preset (conf/cluster/*.yaml), or change every link with cluster.link.<key>=..."
    choices = _group_choices(key.lstrip("+~"), argv)
    takes = f"; choices: {listing(choices)}" if choices else ""  # the default few: the grammar's help comes first
    return f"{arg}: Hydra cannot read this override ({reason}); write key=value or key=[a,b], quoting a value with spaces or , [ ] {{ }} = as key='...'{takes}"


# ---- exceptions raised while Hydra composes the config -------------------------------------------


def hydra_problem(exc: BaseException, argv: list[str]) -> str | None:
    """One line for an exception Hydra or OmegaConf raised composing the config; None for any other."""
    ours = _pipelab_problem(exc)
    if ours:
        return ours
    bad_yaml = _yaml_problem(exc, argv)
    if bad_yaml:
        return bad_yaml
    if isinstance(exc, OverrideParseException):
        arg = _arg_in(str(exc), argv) or "override"
        return _parse_problem(arg, arg.split("=", 1)[0], str(exc), argv)
    cause = exc.__cause__
    if isinstance(exc, ConfigCompositionException) and isinstance(cause, OmegaConfBaseException):
        return _omegaconf_problem(cause, argv)
    if isinstance(exc, OmegaConfBaseException):
        return _omegaconf_problem(exc, argv)
    if not isinstance(exc, HydraException):
        return None
    text = str(exc)
    m = re.search(r"Ambiguous value for argument '(.*?)'", text)
    if m:
        return _sweep_problem(m.group(1), argv)
    m = re.search(r"An item is already at '(.*?)'", text)
    if m:
        arg = _arg_for(m.group(1), argv) or f"+{m.group(1)}=..."
        return f"{m.group(1)}: already set in this config, so '+' cannot add it; set it without the '+': {arg.lstrip('+')}"
    m = re.search(r"Multiple values for (\S+?)\. To override", text)
    if m:
        group = m.group(1)
        arg = _arg_for(group, argv) or f"+{group}=..."
        return f"{arg}: {group} is a config group with a default, so '+' cannot add it; choose the option without the '+': {arg.lstrip('+')}"
    m = re.search(r"Could not delete from config. '(.*?)' does not exist", text)
    if m:
        return f"{m.group(1)}: no such key to delete (~{m.group(1)})"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _pipelab_problem(exc: BaseException) -> str | None:
    """The line of our own error raised while Hydra composed (a plugin declared from metadata whose
    module fails to import when Hydra loads its option: framework.registry), however Hydra wrapped it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PipelabError):
            return str(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _yaml_problem(exc: BaseException, argv: list[str]) -> str | None:
    """One line for a YAML file Hydra could not read (a preset in conf/ or in the user's config
    folder): its file, line and column, and which override chose it."""
    seen = set()
    while exc is not None and id(exc) not in seen and not isinstance(exc, yaml.YAMLError):
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    if exc is None or not isinstance(exc, yaml.YAMLError):
        return None
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    if mark is None:
        return f"a config file is not valid YAML: {problem}"
    path = Path(str(mark.name))
    chosen = f"{path.parent.name}={path.stem}"
    by = next((a for a in overrides_of(argv) if a.lstrip("+").replace(" ", "") == chosen), None)
    context = getattr(exc, "context", None)
    start = getattr(exc, "context_mark", None)
    where = f" ({context} that starts at line {start.line + 1})" if context and start is not None and start.line != mark.line else ""
    return f"{by + ': ' if by else ''}{path}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}{where}"


def _arg_in(text: str, argv: list[str]) -> str | None:
    return next((a for a in overrides_of(argv) if a in text), None)


def _arg_for(key: str, argv: list[str], value=None) -> str | None:
    """The override that sets `key` (or a key under it), as written: the last one, or the last
    whose value reads as `value` (the one Hydra refused)."""
    found, under = [], []
    for arg in overrides_of(argv):
        k = arg.split("=", 1)[0].lstrip("+~")
        if k == key or key.startswith(k + ".") or key.startswith(k + "["):
            found.append(arg)
        elif k.startswith(key + "."):  # a key under it: what the user wrote (not a group choice above it)
            under.append(arg)
    same = [a for a in found if value is not None and "=" in a and a.split("=", 1)[1].strip() in (str(value), repr(value))]
    return (same or under or found or [None])[-1]


def _yaml(value) -> str:
    """`value` as YAML writes it (true, false, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _omegaconf_problem(e, argv: list[str]) -> str:
    key = str(e.full_key or e.key or "config")
    msg = str(e.msg or e).splitlines()[0]
    if isinstance(e, (ConfigAttributeError, ConfigKeyError)) and ("not in" in msg or "is not in struct" in msg):
        return _unknown_key(key, e.parent_node, argv)
    if isinstance(e, ValidationError):
        return _wrong_type(key, e, argv)
    if isinstance(e, ConfigTypeError) and "deletion" in msg:
        return f"{key}: cannot be deleted (~{key}): every run needs it; set it instead, {key}=<value>"
    return f"{key}: {msg}"


def _words(hint) -> str:
    """What a type hint accepts, in words."""
    if hint is None or hint is typing.Any:
        return "any value"
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) < len(typing.get_args(hint)):
        return _words(args[0]) + " or null"
    origin = typing.get_origin(hint)
    if origin in (list, typing.List):
        return "a list, e.g. [1, 2]"
    if origin in (dict, typing.Dict):
        return "a map, e.g. {a: 1}"
    if dataclasses.is_dataclass(hint):
        return f"a group of keys ({', '.join(f.name for f in dataclasses.fields(hint))})"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def _wrong_type(key: str, e, argv: list[str]) -> str:
    schema, leaf = e.object_type, str(e.key)
    hint = typing.get_type_hints(schema).get(leaf) if dataclasses.is_dataclass(schema) else None
    if hint is None:  # an item of a typed list: OmegaConf's own words
        return f"{key}: {str(e.msg).splitlines()[0]}"
    takes = knobs.takes(schema, leaf) or _words(hint)  # the field's range or choices
    arg = _arg_for(key, argv, e.value)
    raw = arg.split("=", 1)[1] if arg and arg.split("=", 1)[0].lstrip("+~") == key else repr(e.value)
    default = ""
    try:
        current = e.parent_node.get(leaf) if e.parent_node is not None else None
        if current is not None and not isinstance(current, Mapping):  # a value, not a group of keys
            default = f" (default {_yaml(current)})"
    except Exception:  # a node that cannot say its value: no default shown
        pass
    if dataclasses.is_dataclass(hint):
        first = dataclasses.fields(hint)[0].name
        return f"{key}: {raw} is not {_words(hint)}; set its keys one at a time, e.g. {key}.{first}=..."
    if raw == "":
        line = f"{key}: no value given ({key}=); {key} takes {takes}{default}"
    else:
        line = f"{key}: {raw!r} is not {_words(hint)}; {key} takes {takes}{default}"
    meaning = knobs.doc(schema, leaf)  # what the key is for, where the line has room
    return f"{line}: {meaning}" if meaning and len(f"error: {line}: {meaning}") <= LINE_MAX else line


def _unknown_key(key: str, parent, argv: list[str]) -> str:
    leaf = key.rsplit(".", 1)[-1]
    where = key.rsplit(".", 1)[0] if "." in key else ""
    if parent is None:
        return f"{key}: no such key"
    schema = OmegaConf.get_type(parent)
    keys = [str(k) for k in parent.keys()]
    if not dataclasses.is_dataclass(schema):  # a map: its entries are what the preset holds
        if where == "cluster.devices":
            return _unknown_device(key, leaf, parent, argv)
        arg = _arg_for(key, argv) or f"{key}=..."
        return f"{key}: {where} has no entry {leaf!r} (entries: {listing(keys) or 'none'}); '+' adds one: +{arg.lstrip('+')}"
    names = [f.name for f in dataclasses.fields(schema)]
    top = key.split(".")[0]
    if not where and top not in names and _group_choices(top, argv):  # `experiment.x`: a group that only sets other groups' keys
        written = next((a.split("=", 1)[0].lstrip("+~") for a in overrides_of(argv) if a.lstrip("+~").split(".")[0] == top), key)
        return f"{written}: {top} is a config group of presets, not a key; choose one with {top}=<name>: {listing(_group_choices(top, argv), CHOICES_MOST)}"
    close = difflib.get_close_matches(leaf, names, n=1)
    group = where if where in registry.GROUPS else None
    option = parent.get("name") if group and "name" in names else None
    head = f"{key}: {group}={option} has no key {leaf}" if option else f"{key}: no such key"
    hint = f"; did you mean {where + '.' if where else ''}{close[0]}?" if close else ""
    others = []
    if group:
        others = [n for n in registry.names(group) if n != option and (s := registry.declared(group, n).schema) and leaf in {f.name for f in dataclasses.fields(s)}]
    have = f"; {group}={', '.join(others)} {'has' if len(others) == 1 else 'have'} it" if others else ""
    return f"{head}{hint}{have} (keys of {where or 'the config'}: {', '.join(names)})"


def _unknown_device(key: str, leaf: str, devices, argv: list[str]) -> str:
    cluster = devices._get_parent()  # OmegaConf has no public way up
    n = int(cluster.num_devices)
    names = listing([f"dev{i}" for i in range(n)] + [str(k) for k in devices.keys() if not re.fullmatch(r"dev\d+", str(k)) and not any(c in str(k) for c in "*?[")])
    arg = (_arg_for(key, argv) or f"{key}.slowdown=2").lstrip("+")
    m = re.fullmatch(r"dev(\d+)", leaf)
    if m and int(m.group(1)) < n:
        return f"{key}: this cluster preset sets nothing for {leaf} yet; '+' adds its entry: +{arg}"
    more = f"; a cluster of {int(m.group(1)) + 1} devices is cluster.num_devices={int(m.group(1)) + 1}" if m else ""
    return f"{key}: no such device; cluster {cluster.get('name')} has {names} (cluster.num_devices={n}){more}; '+' adds a device's entry: +{arg}"


# ---- running the app ----------------------------------------------------------------------------


def run_app(app, argv: list[str]) -> None:
    """Run the Hydra app; an exception from composing the config is one line and exit status 2."""
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its own report
    try:
        app()
    except Exception as e:
        if full:
            raise
        task = getattr(app, "__wrapped__", None)
        line = None if _raised_in(e, task) else hydra_problem(e, argv)
        if line is None:  # the run's own exception (a bug): its trace, as Hydra shows it
            traceback.print_exc()
            print("\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
            sys.exit(1)
        print(f"error: {one_line(line)}", file=sys.stderr)
        sys.exit(2)
    finally:
        if not full:
            os.environ.pop("HYDRA_FULL_ERROR", None)


def _raised_in(exc: BaseException, fn) -> bool:
    """Whether `exc` passed through a call of function `fn` (the task, not Hydra's composition)."""
    code = getattr(fn, "__code__", None)
    tb = exc.__traceback__
    while tb is not None and code is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def check_args(argv: list[str], compose_fn=None) -> str | None:
    """The one line `python -m framework argv` prints for bad input before anything runs (without
    `error: `), or None when the run would start: one run's arguments (no -m). Composes the config
    (`compose_fn(overrides)`, by default Hydra's compose API as the CLI composes) and builds the
    job as the CLI does, but starts no tracking run and trains nothing."""
    line = _check_args(argv, compose_fn)
    return None if line is None else one_line(line)


def _check_args(argv: list[str], compose_fn=None) -> str | None:
    registry.load_plugins()
    problem = override_problem(argv) or check_group_overrides(argv)
    if problem:
        return problem
    overrides = overrides_of(argv)
    composing = overrides
    dirs = extra_config_dirs(argv)
    if dirs:  # the user's config folders, searched as the CLI searches them (--config-dir, then hydra.searchpath)
        quoted = ",".join("'file://" + str(d).replace("\\", "\\\\").replace("'", "\\'") + "'" for d in dirs)
        composing = [o for o in overrides if o.lstrip("+~").split("=", 1)[0].strip() != "hydra.searchpath"] + [f"hydra.searchpath=[{quoted}]"]
        compose_fn = None  # Hydra's own compose: a faster one knows conf/ alone
    try:
        if compose_fn is not None:
            cfg = compose_fn(composing)
        elif GlobalHydra.instance().is_initialized():
            cfg = compose(config_name="config", overrides=composing)
        else:
            with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
                cfg = compose(config_name="config", overrides=composing)
    except Exception as e:
        line = hydra_problem(e, argv)
        if line is None:
            raise
        return line
    try:
        preflight.check(cfg, overrides)  # what a run checks before it starts (bad input before torch, where it can)
    except PipelabError as e:
        return str(e)
    return None
