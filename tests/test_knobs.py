"""One home per knob: a schema field holds its default, its meaning, its range and its choices
(framework.config.knobs); validation, a plugin's build, `--help` and the one-line errors read them
there, and a YAML preset sets only what it changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from framework import registry
from framework.config import knobs
from framework.config.dirs import CONF_DIR
from framework.config.knobs import Knob, Range, knob
from framework.config.schemas import BASE_SCHEMAS, ClusterConfig, Config, DeviceConfig, TrainConfig
from framework.errors import ConfigError


def built_in(e: registry.Entry) -> bool:
    """A plugin of this repo (not one a test registers, such as test_nonfinite's poisoned model)."""
    return (e.target or f"{e.factory.__module__}:").startswith(("plugins.", "framework."))


def every_schema() -> set[type]:
    """The core's schemas, every built-in plugin's, and the schemas nested in them."""
    registry.load_plugins()
    entries = [registry.declared(g, n) for g in registry.GROUPS for n in registry.names(g)]
    todo = [Config, TrainConfig, *BASE_SCHEMAS.values(), *(e.schema for e in entries if e.schema and built_in(e))]
    seen: set[type] = set()
    while todo:
        schema = todo.pop()
        if schema in seen:
            continue
        seen.add(schema)
        for name, (k, sub) in knobs.schema_fields(schema).items():
            todo += [s for s in (sub, k.entries if k else None) if s is not None]
    return seen


def test_every_field_says_what_it_means():
    """Every field but a group's `name` and Config's group slots has a Knob with a doc; a default
    is among its choices and in its range."""
    groups = set(registry.GROUPS) | {"train"}
    for schema in every_schema():
        for f in dataclasses.fields(schema):
            if f.name == "name" or (schema is Config and f.name in groups):
                continue
            k = knobs.knob_of(schema, f.name)
            assert isinstance(k, Knob) and k.doc.strip(), f"{schema.__name__}.{f.name} has no doc"
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            if k.choices is not None:
                assert default in k.choices, (schema.__name__, f.name, default, k.choices)
            if k.range is not None and not isinstance(default, dict):
                assert k.range.problem(default) is None, (schema.__name__, f.name, default)


def test_a_subclass_that_changes_a_default_keeps_the_knob():
    @dataclasses.dataclass
    class Base:
        x: int = knob(1, "an x", range=Range(1, integer=True))

    @dataclasses.dataclass
    class Child(Base):
        x: int = 4

    assert knobs.knob_of(Child, "x") is knobs.knob_of(Base, "x")
    assert Child().x == 4 and Base().x == 1
    with pytest.raises(ConfigError, match=r"^where.x: must be an integer >= 1, got 0$"):
        knobs.check({"x": 0}, Child, "where")


def test_mutable_defaults_are_fresh_per_instance():
    @dataclasses.dataclass
    class Holder:
        xs: list = knob([1, 2], "some numbers")

    a, b = Holder(), Holder()
    a.xs.append(3)
    assert b.xs == [1, 2]


def test_leaves_read_nested_schemas_entries_and_maps_of_numbers():
    """cluster.devices.<name>.<key> is read against DeviceConfig, kind_factors.<kind> against the
    kind_factors knob's range: the ranges hand-kept tables with wildcard keys held before."""
    node = {"device": {"slots": 2, "kind_factors": {"conv": 0.5}}, "devices": {"server": {"cores": 0}}, "links": {"a->b": {"loss": 1.0}}}
    found = {key: k for key, _, k in knobs.leaves(node, ClusterConfig, "cluster")}
    assert found["cluster.device.slots"] is knobs.knob_of(DeviceConfig, "slots")
    assert found["cluster.device.kind_factors.conv"] is knobs.knob_of(DeviceConfig, "kind_factors")
    assert found["cluster.devices.server.cores"] is knobs.knob_of(DeviceConfig, "cores")
    with pytest.raises(ConfigError, match=r"^cluster.devices.server.cores: must be an integer >= 1 or null"):
        knobs.check(node, ClusterConfig, "cluster")


def test_choices_are_checked_when_a_plugin_is_built():
    """registry.build checks a plugin's node against its schema, whoever builds it (the Python
    API too): the plugin's code checks only what its fields cannot say."""
    with pytest.raises(ConfigError, match=r"^scheduler.select: 'fast' is not a choice; choices: auto, paper, exhaustive, refine$"):
        registry.build("scheduler", {"name": "pipar", "select": "fast"}, None)
    with pytest.raises(ConfigError, match=r"^predictor.flops_per_s: must be a number > 0"):
        registry.build("predictor", {"name": "flops", "flops_per_s": 0.0}, None)


def test_code_reads_choices_from_the_field():
    from plugins.schedulers.edgepipe import partition
    from plugins.schedulers.edgepipe.schema import SuperNeuronConfig

    assert partition.CLASSES == knobs.choices(SuperNeuronConfig, "partition_class") == ("vertical", "hybrid", "horizontal")
    with pytest.raises(KeyError):
        knobs.choices(TrainConfig, "lr")


def test_help_shows_the_chosen_plugins_knobs_with_their_doc():
    from hydra import compose, initialize_config_dir

    from framework.config.knob_help import annotated_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["scheduler=pipar", "cluster=pipar_4g"])
    text = annotated_config(cfg)
    assert "  select: auto  # how (P, N) is chosen: auto" in text and "; one of auto, paper, exhaustive, refine" in text
    assert "  lr: 0.05  # the learning rate; a number > 0" in text
    assert "    server:\n      slowdown: 1.0  # every time model" in text  # an entry of cluster.devices, read as a device


def _base(group: str, first: str, compose) -> dict:
    """What a preset extends: its schema's defaults, or the parent preset as composed."""
    if first.startswith("/schema/"):
        g, name = first.split("/")[2], first.split("/")[3].split("@")[0]
        schema = BASE_SCHEMAS[g] if name == "base" else registry.declared(g, name).schema
        return OmegaConf.to_container(OmegaConf.structured(schema))
    return OmegaConf.to_container(compose(config_name="config", overrides=[f"{group}={first}"])[group])


def _leaves(node, path=()):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    else:
        yield path, node


def test_presets_set_only_what_they_change():
    """No value of a group's YAML preset equals what the preset extends (its schema's default or
    its parent preset's): a default lives in its field, once. The one exception is a paper's
    measured or stated number that docs/calibration.md gives a source for (a link's zero latency
    where the paper has none): the preset says it, with its source, rather than lean on a default."""
    from hydra import compose, initialize_config_dir

    from tests.test_calibration import doc_tables

    sourced = doc_tables()
    registry.load_plugins()
    same = []
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for group in registry.GROUPS:
            for path in sorted(Path(CONF_DIR, group).glob("*.yaml")):
                data = OmegaConf.to_container(OmegaConf.load(path))  # YAML 1.2 numbers, as Hydra reads them (1.0e9)
                base = _base(group, data["defaults"][0], compose)
                for keys, value in _leaves({k: v for k, v in data.items() if k not in ("defaults", "name")}):
                    have = base
                    for key in keys:
                        have = have.get(key, KeyError) if isinstance(have, dict) else KeyError
                    if ".".join(keys) in sourced.get(f"conf/{path.relative_to(CONF_DIR).as_posix()}", {}):
                        continue
                    if have is not KeyError and have == value and isinstance(value, bool) == isinstance(have, bool):
                        same.append(f"{path.relative_to(CONF_DIR)}: {'.'.join(keys)}")
    assert not same, same
