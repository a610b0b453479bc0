"""Shared fixtures: Hydra composition of the real config tree, and a pre-migrated MLflow store.

A fresh SQLite MLflow store takes seconds to migrate, so one is built per test session and
copied for each test that tracks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from framework import registry
from framework.cli import CONF_DIR

registry.load_plugins()

FAST = ["runtime.progress=false", "tracking=none"]


def compose_cfg(overrides=(), fast=True):
    """The composed config for these overrides (as `python -m framework <overrides>` sees it)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=(FAST if fast else []) + list(overrides))


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    from framework.tracking import client_and_experiment
    from omegaconf import OmegaConf

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
