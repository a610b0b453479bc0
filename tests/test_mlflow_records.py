"""What pipelab records in MLflow beyond params and metrics: the experiment's kind (model training,
not a GenAI app) and each run's data as dataset inputs (one per split, with digest, source,
schema and profile)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from omegaconf import OmegaConf

from framework import registry
from framework.job import Job
from framework.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, client_and_experiment
from framework.tracking.tracker import MlflowTracker
from tests.conftest import compose_cfg
from tests.test_cli_and_tracking import TINY

CONTEXT = "mlflow.data.context"


@pytest.fixture
def store(mlflow_template, tmp_path):
    """(tracking config maker, MlflowClient) on a private copy of the migrated store."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template, db)
    uri = f"sqlite:///{db}"

    def cfg(experiment: str):
        return OmegaConf.create({"uri": uri, "artifact_root": str(tmp_path / "art"), "experiment": experiment, "flush_every": 100})

    return cfg, MlflowClient(tracking_uri=uri)


# ---------------------------------------------------------------------------------------------
# the experiment's kind


def test_a_new_experiment_is_a_model_training_experiment(store):
    cfg, client = store
    _, exp_id = client_and_experiment(cfg("fresh"))
    assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"


def test_an_existing_experiment_without_a_kind_gets_one_and_a_chosen_kind_is_kept(store):
    cfg, client = store
    old = client.create_experiment("made_before_kinds")  # as an older pipelab made them
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    _, exp_id = client_and_experiment(cfg("made_before_kinds"))
    assert exp_id == old and client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND

    chosen = client.create_experiment("someone_chose", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    client_and_experiment(cfg("someone_chose"))
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


# ---------------------------------------------------------------------------------------------
# dataset inputs


def inputs_by_context(client, run_id) -> dict:
    run = client.get_run(run_id)
    out = {}
    for di in run.inputs.dataset_inputs:
        (ctx,) = [t.value for t in di.tags if t.key == CONTEXT]
        assert ctx not in out, f"split {ctx} recorded twice"
        out[ctx] = di.dataset
    return out


def test_a_run_records_its_splits_as_dataset_inputs(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    cfg = compose_cfg(tracking + TINY + ["scheduler=local"], fast=False)
    summary = Job(cfg, tmp_path / "run").run()
    run = client.get_run(summary["mlflow_run_id"])  # in experiment `tests`, made by the run's tracker
    assert client.get_experiment(run.info.experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    got = inputs_by_context(client, summary["mlflow_run_id"])
    assert sorted(got) == ["test", "train", "val"]

    # the digests are those of the data the run trained and evaluated on: the same config builds
    # the same tensors, and every split has its own
    data = registry.build("dataset", cfg.dataset)
    for split, n in (("train", 256), ("val", 64), ("test", 64)):
        ds = got[split]
        assert ds.name == "synthetic_mnist"
        assert ds.digest == data.digest(split) and len(ds.digest) == 16
        assert ds.source_type == "code" and json.loads(ds.source) == {"uri": "synthetic:seed=0"}
        profile = json.loads(ds.profile)
        assert profile["split"] == split and profile["num_samples"] == n
        assert profile["input_shape"] == [1, 28, 28] and profile["input_dtype"] == "float32" and profile["num_classes"] == 10
        assert sum(profile["class_counts"]) == n and len(profile["class_counts"]) == 10
        spec = json.loads(ds.schema)["mlflow_tensorspec"]
        assert json.loads(spec["features"]) == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 1, 28, 28]}}]
        assert json.loads(spec["targets"]) == [{"type": "tensor", "tensor-spec": {"dtype": "int64", "shape": [-1]}}]
    assert len({d.digest for d in got.values()}) == 3

    # a second run on other data (another seed, float64 inputs) records other digests; a run on
    # the same data shares the experiment's dataset entries
    other = Job(compose_cfg(tracking + TINY + ["scheduler=local", "dataset.seed=1"], fast=False), tmp_path / "other").run()
    wide = Job(compose_cfg(tracking + TINY + ["scheduler=local", "runtime.dtype=float64"], fast=False), tmp_path / "wide").run()
    same = Job(cfg, tmp_path / "same").run()
    got_other = inputs_by_context(client, other["mlflow_run_id"])
    got_wide = inputs_by_context(client, wide["mlflow_run_id"])
    got_same = inputs_by_context(client, same["mlflow_run_id"])
    for split in got:
        assert got_other[split].digest != got[split].digest
        assert json.loads(got_other[split].source) == {"uri": "synthetic:seed=1"}
        assert got_wide[split].digest != got[split].digest
        assert json.loads(got_wide[split].profile)["input_dtype"] == "float64"
        assert got_same[split].digest == got[split].digest


def test_a_timing_only_run_records_labels_and_shapes_but_no_input_values(tmp_path, mlflow_store):
    # runtime.numerics=false makes no input values: the record says so, and its digest is that
    # of the labels and shapes, never equal to the digest of the full data
    tracking, client = mlflow_store
    cfg = compose_cfg(tracking + TINY + ["scheduler=local", "runtime.numerics=false"], fast=False)
    summary = Job(cfg, tmp_path / "run").run()
    got = inputs_by_context(client, summary["mlflow_run_id"])
    full = registry.build("dataset", cfg.dataset)
    for split, ds in got.items():
        profile = json.loads(ds.profile)
        assert profile["input_values"] is False and profile["input_shape"] == [1, 28, 28]
        assert ds.digest == full.without_inputs().digest(split) != full.digest(split)
        spec = json.loads(ds.schema)["mlflow_tensorspec"]
        assert json.loads(spec["features"]) == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 1, 28, 28]}}]


def test_the_digest_follows_the_bytes(tmp_path):
    data = registry.build("dataset", compose_cfg(TINY).dataset)
    before = data.digest("train")
    assert before == data.digest("train")  # no state: hashing twice gives the same
    data.x_train[17, 0, 3, 4] += 1e-3  # one value of one sample
    assert data.digest("train") != before
    data.x_train[17, 0, 3, 4] -= 1e-3
    data.y_train[5] = (data.y_train[5] + 1) % 10  # one label
    assert data.digest("train") != before
    with pytest.raises(ValueError, match="unknown split"):
        data.digest("training")


def test_fashion_mnist_inputs_name_their_idx_files(tmp_path, store):
    from tests.test_datasets import tiny_fashion

    (tmp_path / "fmnist").mkdir()
    files = tiny_fashion(tmp_path / "fmnist", n_train=40, n_test=12)
    data = registry.build("dataset", compose_cfg(["dataset=fashion_mnist", f"dataset.root={tmp_path / 'fmnist'}", "dataset.n_val=8"]).dataset)
    cfg, client = store
    tracker = MlflowTracker(cfg("fmnist"), run_name="fmnist")
    tracker.log_dataset(data)
    tracker.log_dataset(data)  # a resumed run logs its data again: still one input per split
    tracker.end()
    got = inputs_by_context(client, tracker.run_id)
    assert sorted(got) == ["test", "train", "val"]
    assert {split: json.loads(d.source)["uri"] for split, d in got.items()} == {
        "train": str(files["train_images"]),
        "val": str(files["train_images"]),  # the tail of the training file
        "test": str(files["test_images"]),
    }
    assert all(d.source_type == "local" and d.name == "fashion_mnist" for d in got.values())
    assert [json.loads(got[s].profile)["num_samples"] for s in ("train", "val", "test")] == [32, 8, 12]
    assert got["val"].digest == data.digest("val") != got["train"].digest


def test_an_empty_split_is_no_input(store):
    data = registry.build("dataset", compose_cfg(TINY + ["dataset.n_val=0", "dataset.n_test=0"]).dataset)
    cfg, client = store
    tracker = MlflowTracker(cfg("empty"), run_name="empty")
    tracker.log_dataset(data)
    tracker.end()
    assert list(inputs_by_context(client, tracker.run_id)) == ["train"]


def test_tracking_none_records_nothing_and_still_runs(tmp_path):
    summary = Job(compose_cfg(TINY + ["scheduler=local"]), tmp_path / "run").run()  # tracking=none
    assert summary["mlflow_run_id"] is None and summary["iterations"] == 3


def test_digest_is_cheap_on_a_full_size_set():
    """One pass over the bytes: hashing 60k MNIST-sized float32 images (188 MB) takes well
    under a second (a Python loop or a copy per sample would take many)."""
    import time

    from framework.data import Dataset

    x = torch.zeros(60000, 1, 28, 28)
    y = torch.zeros(60000, dtype=torch.long)
    data = Dataset("big", x, y, x[:0], y[:0], x[:0], y[:0], 10)
    t0 = time.perf_counter()
    data.digest("train")
    assert time.perf_counter() - t0 < 2.0
