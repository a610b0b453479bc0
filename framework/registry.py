"""The one place that turns a config node into an object.

Plugins register a factory under (group, name); `build(group, cfg, ...)` looks up `cfg.name`
and calls it. A plugin may also register the dataclass schema that its YAML files extend: it is
stored in Hydra's ConfigStore as `schema/<group>/<name>`, so that a wrong type or an unknown
key fails while Hydra composes the config, before anything runs. A schema with no YAML preset of
its name in conf/<group>/ (a plugin from outside this repo) is also stored as the group option
`<group>/<name>` itself, so `<group>=<name>` selects it with the schema's defaults; a YAML preset
keeps precedence (Hydra would merge a same-named ConfigStore entry into it, with a warning).

The core's own plugins (runtimes, trackers) are declared in framework.core_plugins. Built-in
plugins live in the `plugins` package and third parties add theirs, both through the
`pipelab.plugins` entry-point group (each entry point names a module to import; a source tree
that was not pip-installed reads its own from pyproject.toml): the registry names no plugin
module itself, so a plugin may import it.

Declared, not imported: a plugin package lists its plugins with `declare(group, name,
"module:attr", schema=..., doc=...)`, the schema coming from a light module (dataclasses only).
The code behind `module:attr` (torch, models, runtimes) is imported the first time the plugin
is built, so `--help`, `--plugins`, composing a config and rejecting a bad override import no
torch (start-up in well under 2 s instead of 10 or more). `@register` on the factory itself
still works, for plugins that do not mind being imported eagerly.

Declared from metadata: an entry point named `<group>.<name>` (`scheduler.my_sched =
"my_pkg.sched:MySched"`) declares that one plugin from the installed package's metadata, without
importing anything of the package: its module, which may import torch at its top, is imported
(and registers the plugin's schema and doc with `@register` or `declare`) only when a config
selects the plugin, a run builds it, a check needs its schema or `--plugins` lists it. Until
then its option `<group>=<name>` exists (a placeholder in Hydra's ConfigStore that Hydra's
loading of it fills in), so `--help` lists it and stays free of the package's imports.

Which packages' entry points load: framework.plugin_discovery (`PIPELAB_PLUGINS` limits them).
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, is_dataclass
from importlib.metadata import EntryPoint
from typing import Any, Callable

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from framework import plugin_discovery
from framework.config import knobs
from framework.config.dirs import yaml_presets
from framework.core_plugins import CORE_PLUGINS
from framework.errors import ConfigError, PipelabError

GROUPS = (
    "model",
    "dataset",
    "cluster",
    "scheduler",
    "compressor",
    "predictor",
    "transport",
    "runtime",
    "tracking",
)


@dataclass(frozen=True)
class Entry:
    group: str
    name: str
    factory: Callable[..., Any] | None  # None until `target` is imported (a declared plugin)
    schema: type | None
    doc: str
    target: str | None = None  # "module:attr" of a declared plugin
    # optional keyword arguments the factory understands beyond its group's call, e.g. a
    # dataset's `inputs=False` (framework.data.build_dataset): said at registration, not guessed
    keywords: frozenset[str] = frozenset()


_REGISTRY: dict[str, dict[str, Entry]] = {g: {} for g in GROUPS}
_SCHEMA_OPTIONS: dict[str, set[str]] = {g: set() for g in GROUPS}  # stored as group options (no YAML)
_loaded = False
_DEFERRED: list[str] = []  # modules imported when first needed (defer_import)
_deferred_done = 0
# plugins declared from an entry point's name and value alone, their module not imported yet
_FROM_METADATA: dict[tuple[str, str], EntryPoint] = {}
_PLACEHOLDERS: dict[str, tuple[str, str]] = {}  # their ConfigStore path ("scheduler/x.yaml") -> (group, name)


def register(group: str, name: str, *, schema: type | None = None, doc: str | None = None, keywords: tuple[str, ...] = ()):
    """Decorator: register `factory` (a class or function) as `name` in `group`.

    `doc` (one line for `--plugins`) defaults to the schema's docstring, else the factory's;
    `keywords`: the optional keyword arguments it takes (`Entry.keywords`)."""
    if group not in _REGISTRY:
        raise ValueError(f"unknown registry group {group!r}; groups: {', '.join(GROUPS)}")

    def deco(factory):
        previous = _REGISTRY[group].get(name)
        if previous is not None and previous.factory is None:  # declared: only its own target may register it
            if previous.target != f"{factory.__module__}:{factory.__qualname__}":
                raise ValueError(f"{group} {name!r} is registered twice ({previous.target} and {factory.__module__}:{factory.__qualname__})")
        elif previous is not None and previous.factory is not factory:
            raise ValueError(f"{group} {name!r} is registered twice ({previous.factory} and {factory})")
        text = doc
        if text is None and schema is not None and schema.__doc__ and not schema.__doc__.startswith(schema.__name__ + "("):
            text = schema.__doc__  # a written docstring, not the dataclass signature
        if text is None:
            text = factory.__doc__ or ""
        line = text.strip().splitlines()[0] if text.strip() else ""
        declared = previous.keywords if previous is not None else frozenset()
        _REGISTRY[group][name] = Entry(group, name, factory, schema, line, keywords=frozenset(keywords) | declared)
        if schema is not None:
            _store_schema(group, name, schema)
        return factory

    return deco


def declare(group: str, name: str, target: str, *, schema: type | None = None, doc: str, keywords: tuple[str, ...] = ()) -> None:
    """Register `name` in `group` without importing its code: `target` ("package.module:attr")
    is imported when the plugin is first built. `schema` must come from a module that imports no
    heavy code (it goes to Hydra's ConfigStore now); `doc` is its line in `--plugins`;
    `keywords`: the optional keyword arguments the factory takes (`Entry.keywords`)."""
    if group not in _REGISTRY:
        raise ValueError(f"unknown registry group {group!r}; groups: {', '.join(GROUPS)}")
    if ":" not in target:
        raise ValueError(f"{group} {name!r}: target {target!r} must be 'module:attr'")
    previous = _REGISTRY[group].get(name)
    if previous is not None and previous.target != target:
        raise ValueError(f"{group} {name!r} is registered twice ({previous.target or previous.factory} and {target})")
    if previous is None or (group, name) in _FROM_METADATA:  # new, or its module describing it now
        _REGISTRY[group][name] = Entry(group, name, None, schema, doc.strip().splitlines()[0] if doc.strip() else "", target, frozenset(keywords))
        if schema is not None:
            _store_schema(group, name, schema)


def defer_import(module: str) -> None:
    """Import `module` when plugin code is first needed rather than now: for modules that
    register things other than plugins (the codecs of `framework.codec`), which look for them
    with `import_deferred()` when a name is missing."""
    if module not in _DEFERRED:
        _DEFERRED.append(module)


def import_deferred() -> None:
    global _deferred_done
    load_plugins()
    while _deferred_done < len(_DEFERRED):
        module = _DEFERRED[_deferred_done]
        _deferred_done += 1
        importlib.import_module(module)


def _resolve(e: Entry) -> Entry:
    """Import a declared plugin's code (once)."""
    if e.factory is not None:
        return e
    module, _, attr = e.target.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise PipelabError(f"{e.group} {e.name!r}: cannot import {e.target}: {type(err).__name__}: {err}") from err
    e = Entry(e.group, e.name, obj, e.schema, e.doc, e.target, e.keywords)
    _REGISTRY[e.group][e.name] = e
    return e


def _store_schema(group: str, name: str, schema: type) -> None:
    cs = ConfigStore.instance()
    cs.store(group=f"schema/{group}", name=name, node=schema)
    if name in yaml_presets(group):
        return  # the YAML preset is the option; it extends the schema through its defaults list
    node = OmegaConf.structured(schema)  # typed and closed: a wrong type or unknown key fails
    if "name" in node.keys():  # (`in` is False for a MISSING value)
        node.name = name  # `group=name` builds what `name` registered, whatever the schema's default
    cs.store(group=group, name=name, node=node)
    _SCHEMA_OPTIONS[group].add(name)


def schema_options(group: str) -> list[str]:
    """Options of `group` that come from a registered schema alone (no YAML preset in conf/)."""
    load_plugins()
    return sorted(_SCHEMA_OPTIONS.get(group, ()))


def load_plugins() -> None:
    """Declare the core's own plugins, then import every `pipelab.plugins` entry point (the
    built-in `plugins` package among them), once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for group, name, target, schema, doc in CORE_PLUGINS:
        declare(group, name, target, schema=schema, doc=doc)
    for ep in plugin_discovery.entry_points_to_load():
        group, _, name = ep.name.partition(".")
        try:
            if name and group in GROUPS:
                _declare_from_metadata(group, name, ep)  # `<group>.<name> = module:attr`: imported when used
            else:
                ep.load()  # a module whose import registers its plugins
        except Exception as e:
            raise PipelabError(f"plugin {ep.name} = {ep.value} ('{plugin_discovery.ENTRY_POINT_GROUP}' entry point) failed to load: {type(e).__name__}: {e}") from e


def _declare_from_metadata(group: str, name: str, ep: EntryPoint) -> None:
    """Declare `name` in `group` from its entry point alone: the target `module:attr` is its value,
    its schema and doc come when its module is imported (`_describe`). Its option `group=name` is
    a placeholder in Hydra's ConfigStore until then (unless a YAML preset of conf/ is the option)."""
    where = f"from {ep.dist.name}" if ep.dist is not None else "an outside plugin"
    declare(group, name, ep.value, doc=f"({where}: described when first used)")
    _FROM_METADATA[(group, name)] = ep
    if name not in yaml_presets(group):
        ConfigStore.instance().store(group=group, name=name, node={"name": name})
        _SCHEMA_OPTIONS[group].add(name)
        _PLACEHOLDERS[f"{group}/{name}.yaml"] = (group, name)
        _load_placeholders_described()


def _describe(group: str, name: str) -> None:
    """Import the module of a plugin declared from metadata (once): it registers the plugin's
    schema and doc (`@register` or `declare` under the same target), which replace the
    placeholders; a module that registers nothing leaves its target as the factory, with no schema."""
    ep = _FROM_METADATA.get((group, name))
    if ep is None:
        return
    try:
        importlib.import_module(ep.value.partition(":")[0])
    except Exception as e:
        raise PipelabError(f"plugin {ep.name} = {ep.value} ('{plugin_discovery.ENTRY_POINT_GROUP}' entry point) failed to load: {type(e).__name__}: {e}") from e
    finally:
        del _FROM_METADATA[(group, name)]
    if _REGISTRY[group][name].schema is None:
        e = _resolve(_REGISTRY[group][name])
        text = (e.factory.__doc__ or "").strip()
        _REGISTRY[group][name] = Entry(group, name, e.factory, None, text.splitlines()[0] if text else "", e.target, e.keywords)


def _load_placeholders_described() -> None:
    """Hydra loads a config option through `ConfigStore.load`; a placeholder's plugin is described
    first, so what Hydra composes is its schema (typed, closed, with its defaults). Installed once."""
    load = ConfigStore.load
    if getattr(load, "describes_placeholders", False):
        return

    def load_described(self, config_path: str):
        if config_path in _PLACEHOLDERS:
            _describe(*_PLACEHOLDERS[config_path])  # once
            self = ConfigStore.instance()  # Hydra composes from a deep copy of it, taken before the plugin was described
        return load(self, config_path)

    load_described.describes_placeholders = True
    ConfigStore.load = load_described


def names(group: str) -> list[str]:
    load_plugins()
    return sorted(_REGISTRY[group])


def entry(group: str, name: str) -> Entry:
    """`name`'s entry in `group` with its code imported (`factory` set)."""
    return _resolve(declared(group, name))


def declared(group: str, name: str) -> Entry:
    """`name`'s entry in `group` as registered: its schema, doc and keywords, without importing
    a declared plugin's code (what error messages and key checks need: no torch)."""
    load_plugins()
    if (group, name) in _FROM_METADATA:
        _describe(group, name)
    try:
        return _REGISTRY[group][name]
    except KeyError:
        choices = ", ".join(sorted(_REGISTRY[group])) or "(none registered)"
        close = difflib.get_close_matches(str(name).lower(), sorted(_REGISTRY[group]), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{group}.name", f"unknown {group} {name!r}{hint}; registered {group}s: {choices}") from None


def build(group: str, cfg: Any, *args, **kwargs) -> Any:
    """Instantiate the plugin that `cfg.name` names in `group`. The plugin receives its config in
    one shape whoever calls (the CLI's composed config, the Python API's dataclass or dict):
    `typed_config`, every knob in its schema's range and among its choices (framework.config.knobs), so
    a plugin checks only what its fields cannot say."""
    cfg = as_config(cfg)
    name = cfg.get("name")
    if not name:
        raise ConfigError(f"{group}.name", f"missing; registered {group}s: {', '.join(names(group))}")
    found = declared(group, name)
    typed = typed_config(found, cfg)
    if found.schema is not None:
        knobs.check(typed, found.schema, group)
    return entry(group, name).factory(typed, *args, **kwargs)


def as_config(cfg: Any) -> DictConfig:
    """A config node as OmegaConf's DictConfig (a dataclass instance or a dict becomes one)."""
    if isinstance(cfg, DictConfig):
        return cfg
    if cfg is None or not (isinstance(cfg, dict) or is_dataclass(cfg)):
        raise ConfigError("name", f"a plugin's config is a mapping with a `name`; got {type(cfg).__name__}")
    return OmegaConf.structured(cfg) if is_dataclass(cfg) else OmegaConf.create(cfg)


def typed_config(found: Entry, cfg: DictConfig) -> DictConfig:
    """`cfg` typed by the plugin's schema: every field there, with its default where the caller
    gave none, so plugins read `cfg.field` and never probe. A node the CLI composed already is."""
    schema = found.schema
    if schema is None:
        return cfg
    have = OmegaConf.get_type(cfg)
    if isinstance(have, type) and issubclass(have, schema):
        return cfg
    return OmegaConf.merge(OmegaConf.structured(schema), cfg)


def describe() -> str:
    """Human-readable listing of every registered name per group (for `--plugins`)."""
    load_plugins()
    for group, name in list(_FROM_METADATA):  # the listing shows every plugin's doc: import them
        _describe(group, name)
    lines = []
    for g in GROUPS:
        lines.append(f"{g}:")
        if not _REGISTRY[g]:
            lines.append("  (no code plugins: presets are data, listed below)")
        for n in sorted(_REGISTRY[g]):
            e = _REGISTRY[g][n]
            lines.append(f"  {n:<20} {e.doc}")
    return "\n".join(lines)
