"""Shared fixtures: Hydra composition of the real config tree, and a pre-migrated MLflow store.

A fresh SQLite MLflow store takes seconds to migrate, so one is built per test session and
copied for each test that tracks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from framework import plugin_discovery, registry
from framework.cli import CONF_DIR
from tests import emulated_gpu

# the suite sees this repo's plugins alone, whatever else the machine has installed (a plugin
# that imports torch at its top would make `--help` import torch, a plugin of a taken name fail
# start-up, listings differ), in this process and in every subprocess a test starts; a test that
# installs a plugin of its own names its distribution (tests/test_external_plugin.py)
os.environ[plugin_discovery.ONLY_PLUGINS_ENV] = ""
registry.load_plugins()
# without CUDA, a GPU emulated on the CPU (tests/emulated_gpu.py), set up before any backward runs:
# autograd's engine counts each backend's devices once, at its first backward. Not beside CUDA:
# torch takes a registered PrivateUse1 backend as the accelerator before CUDA, and the real GPU
# tests run there instead
if emulated_gpu.wanted():
    emulated_gpu.device()

FAST = ["runtime.progress=false", "tracking=none"]


def _hydra_compose(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


_BASES: dict[tuple, object] = {}  # the config of each tuple of group choices, composed once
_CHOICE_KEYS = set(registry.GROUPS) | {"experiment"}


def _is_choice(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+~")
    return key in _CHOICE_KEYS or "/" in key or "@" in key


def cached_compose(overrides: list[str]):
    """Hydra's compose of `overrides`, in milliseconds instead of 0.4 s. Hydra's result is the
    config of the defaults list that the group choices (`scheduler=pipar`) select, with the
    other overrides then applied in order by `ConfigLoaderImpl._apply_overrides_to_config`, its
    loader's last step: so the first part is composed once per tuple of choices and deep-copied,
    and the rest applied by that same step, which raises Hydra's own exceptions for a bad one."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = tuple(o for o in overrides if _is_choice(o))
    if choices not in _BASES:
        _BASES[choices] = _hydra_compose(list(choices))
    cfg = copy.deepcopy(_BASES[choices])
    values = [o for o in overrides if o not in choices]
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(values), cfg)
    return cfg


def compose_cfg(overrides=(), fast=True):
    """The composed config for these overrides (as `python -m framework <overrides>` sees it),
    by `cached_compose`: the suite composes hundreds of times. Overrides of `hydra.*`, and any
    that fail there, take Hydra's whole compose (which raises what a user would see).
    PIPELAB_TEST_COMPOSE=hydra composes every config in full; =check does both and compares."""
    overrides = (FAST if fast else []) + list(overrides)
    mode = os.environ.get("PIPELAB_TEST_COMPOSE", "cached")
    if mode == "hydra" or any(o.lstrip("+~").startswith("hydra") for o in overrides):
        return _hydra_compose(overrides)
    try:
        cfg = cached_compose(overrides)
    except Exception:
        return _hydra_compose(overrides)
    if mode == "check":
        from omegaconf import OmegaConf

        full = _hydra_compose(overrides)
        assert OmegaConf.to_yaml(cfg) == OmegaConf.to_yaml(full), f"cached compose differs for {overrides}"
        assert (OmegaConf.is_struct(cfg), OmegaConf.is_readonly(cfg)) == (OmegaConf.is_struct(full), OmegaConf.is_readonly(full)), overrides
    return cfg


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    from omegaconf import OmegaConf

    from framework.tracking.store import client_and_experiment

    root = tmp_path_factory.mktemp("mlflow_template")
    cfg = OmegaConf.create({"uri": f"sqlite:///{root}/mlflow.db", "artifact_root": str(root / "art"), "experiment": "pipelab"})
    client_and_experiment(cfg)  # migrates the schema once
    return root / "mlflow.db"


@pytest.fixture
def mlflow_store(mlflow_template, tmp_path):
    """(tracking overrides, MlflowClient) on a private copy of the migrated store."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template, db)
    uri = f"sqlite:///{db}"
    overrides = ["tracking=mlflow", f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path / 'mlartifacts'}", "tracking.experiment=tests"]
    return overrides, MlflowClient(tracking_uri=uri)


@pytest.fixture(autouse=True)
def _isolate_torch_state():
    """Each test starts from the same global RNG state (its random data must not depend on which
    tests ran before it) and leaves torch's thread count as it found it."""
    n = torch.get_num_threads()
    torch.manual_seed(0)
    yield
    torch.set_num_threads(n)
