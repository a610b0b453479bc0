"""Checkpoints and `train.resume`: a run stopped after an epoch and resumed ends bit for bit where
an uninterrupted run ends (weights, metrics, virtual time), and loading runs no pickle."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import open_dict
from safetensors.torch import load_file

from framework.checkpoints import state as ck
from framework.job import Job
from tests.conftest import compose_cfg
from tests.test_cli_and_tracking import cli

SMALL = ["train.epochs=3", "train.iterations_per_epoch=4", "dataset.n_train=512", "dataset.n_val=64", "dataset.n_test=64"]


def _job(overrides, out, links=None, resume=None):
    cfg = compose_cfg(SMALL + overrides + ([f"train.resume={resume}"] if resume else []))
    if links:
        with open_dict(cfg):
            cfg.cluster.links.update(links)
    return Job(cfg, out)


def _stop_after(job, epoch):
    """Ctrl-C right after `epoch`'s end (and its checkpoint)."""
    hook = job.on_epoch_end

    def on_epoch_end(e, now, states):
        hook(e, now, states)
        if e == epoch:
            raise KeyboardInterrupt

    job.on_epoch_end = on_epoch_end


def _same_run(full_dir, full, resumed_dir, resumed):
    assert resumed["virtual_time_s"] == full["virtual_time_s"]
    assert resumed["history"] == full["history"]
    wall = {k for k in full["metrics"] if "wall" in k}
    assert {k: v for k, v in resumed["metrics"].items() if k not in wall} == {k: v for k, v in full["metrics"].items() if k not in wall}
    for key in ("roles", "links", "compression", "staleness", "peak_inflight", "iterations", "samples", "messages_lost", "plan", "rounds", "replans"):
        assert resumed.get(key) == full.get(key), key
    a, b = load_file(full_dir / "model.safetensors"), load_file(resumed_dir / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _stop_and_resume(tmp_path, overrides, links=None):
    full = _job(overrides, tmp_path / "full", links).run()
    job = _job(overrides, tmp_path / "cut", links)
    _stop_after(job, 0)
    with pytest.raises(KeyboardInterrupt):
        job.run()
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["status"] == "FAILED"
    assert ck.exists(tmp_path / "cut")
    resumed_job = _job(overrides, tmp_path / "elsewhere", links, resume=tmp_path / "cut")
    assert resumed_job.resumed_epoch == 0 and resumed_job.out_dir == tmp_path / "cut"  # it goes on in its own folder
    resumed = resumed_job.run()
    _same_run(tmp_path / "full", full, tmp_path / "cut", resumed)
    return full, resumed


def test_gpipe_resumed_after_epoch_1_of_3_is_bit_identical(tmp_path):
    _stop_and_resume(tmp_path, [])


def test_pipar_resumed_after_epoch_1_of_3_is_bit_identical_with_a_moved_cut(tmp_path):
    # dev0's uplink drops during epoch 0: the server re-plans dev0 at that epoch's end, so the
    # checkpoint holds a plan (and stages) that differ from the initial ones
    ov = ["scheduler=pipar", "cluster=pipar_wifi", "cluster.num_devices=2", "model=vgg5", "dataset=synthetic_cifar10", "train.batch_size=32", "compressor=mbq"]
    full, resumed = _stop_and_resume(tmp_path, ov, links={"dev0->server": {"trace": [[0.0, 50e6], [0.01, 2e6]]}})
    assert [r["device"] for r in full["plan"]["reselections"]] == [0]
    assert resumed["plan"] == full["plan"] and resumed["rounds"] == full["rounds"]


def test_fl_devices_identical_models_are_stored_once_and_resume_bit_identical(tmp_path):
    """After the round every device holds the aggregate: the checkpoint stores those weights once
    (the others are aliases), keeps each device's own momentum, and the resumed run is the
    uninterrupted one."""
    ov = ["scheduler=fl", "cluster=pipar_wifi", "cluster.num_devices=3", "model=mlp", "dataset=synthetic_mnist"]
    _stop_and_resume(tmp_path, ov)
    meta = json.loads((tmp_path / "cut" / ck.DIR / "meta.json").read_text())
    stored = load_file(tmp_path / "cut" / ck.DIR / "state.safetensors")
    aliases = meta["aliases"]
    assert aliases and not set(aliases) & set(stored) and set(aliases.values()) <= set(stored)
    roles = ("dev0", "dev1", "dev2", "fed")
    names = {k.split(".model.", 1)[1] for k in [*stored, *aliases] if ".model." in k}
    assert names and not any("momentum_buffer" in k for k in aliases)  # each device's momentum is its own
    for name in names:  # each weight once, whichever role the roles' order put first
        keys = {f"runtime.role.{r}.model.{name}" for r in roles}
        kept = keys & set(stored)
        assert len(kept) == 1 and {k: aliases[k] for k in keys - kept} == dict.fromkeys(keys - kept, kept.pop()), name


def test_batched_fl_resumes_bit_identical(tmp_path):
    """Replicas batched, their steps over a bank of their parameters (framework/replicas/bank.py):
    the resumed roles' first group step builds a bank that takes in the restored momentum
    buffers, and the resumed run is the uninterrupted one."""
    _stop_and_resume(tmp_path, ["scheduler=fl", "cluster=pipar_wifi", "cluster.num_devices=3", "model=mlp", "dataset=synthetic_mnist", "runtime.batch_replicas=true"])


def test_identical_bits_under_one_name_are_stored_once_and_load_as_copies(tmp_path):
    bag = ck.Bag()
    w = torch.randn(4, 3)
    zero, negzero = torch.zeros(5), torch.full((5,), -0.0)
    bag.meta["a"] = bag.put("a", {"w": w, "b": zero, "n": torch.tensor([float("nan")])})
    bag.meta["b"] = bag.put("b", {"w": w.clone(), "b": negzero, "n": torch.tensor([float("nan")])})  # -0.0 == 0.0, but not in bits
    bag.meta["c"] = bag.put("c", {"other": w.clone(), "w": w + 1})  # same bits, another name; same name, other bits
    assert ck.duplicates(bag) == {"b.w": "a.w", "b.n": "a.n"}
    ck.save(tmp_path, bag)
    assert set(load_file(tmp_path / ck.DIR / "state.safetensors")) == set(bag.tensors) - {"b.w", "b.n"}
    back = ck.load(tmp_path)
    for key in ("a", "b", "c"):
        got, want = back.take(back.meta[key]), bag.take(bag.meta[key])
        assert got.keys() == want.keys() and all(torch.equal(got[k].view(torch.int32), want[k].view(torch.int32)) for k in want), key
    a, b = back.take(back.meta["a"])["w"], back.take(back.meta["b"])["w"]
    a.add_(1)  # an optimizer may keep a loaded buffer and update it in place
    assert torch.equal(b, w)


@pytest.mark.parametrize("stack_bytes", [256 * 2**20, 100])
def test_the_device_side_comparison_agrees_with_torch_equal(monkeypatch, stack_bytes):
    """What a GPU checkpoint compares on the device (stacked by shape and dtype, in chunks, one
    read-back): the same answers as torch.equal, here on the CPU, for equal, different, empty,
    scalar, boolean and bit-viewed tensors, whatever the chunk size."""
    from framework.checkpoints import tensor_file as checkpoint_file
    from framework.checkpoints.tensor_file import _bits, _equal_on_device

    monkeypatch.setattr(checkpoint_file, "_STACK_BYTES", stack_bytes)  # 100 bytes: two 3x4 float pairs a chunk
    w = torch.randn(3, 4)
    pairs = [(w, w.clone()), (w, w + 1), (torch.zeros(0, 2), torch.zeros(0, 2)), (torch.tensor([True, False]), torch.tensor([True, True])),
             (_bits(torch.zeros(2)), _bits(torch.full((2,), -0.0))), (_bits(torch.tensor([float("nan")])), _bits(torch.tensor([float("nan")]))),
             (torch.tensor(2.0), torch.tensor(2.0)), (torch.tensor(2.0), torch.tensor(3.0))]
    pairs += [(w, w.clone() if i % 3 else w - 1) for i in range(7)]  # one kind in several chunks, mixed answers
    want = [torch.equal(a, b) for a, b in pairs]
    assert want[:8] == [True, False, True, False, False, True, True, False] and want[8:].count(False) == 3
    assert _equal_on_device(pairs) == want
    # floats as they are stored: compared in bits (-0.0 is not 0.0; a NaN equals its own bits)
    raw = [(torch.zeros(2), torch.full((2,), -0.0)), (torch.tensor([float("nan")]), torch.tensor([float("nan")])), (w, w.clone())]
    assert _equal_on_device(raw) == [torch.equal(_bits(a), _bits(b)) for a, b in raw] == [False, True, True]


def _saved_with_meta(tmp_path, w, **meta_changes):
    """A one-tensor checkpoint whose meta.json is then changed (None: the key removed); returns
    the tensor's JSON description."""
    bag = ck.Bag()
    desc = bag.put("a", {"w": w})
    ck.save(tmp_path, bag)
    path = tmp_path / ck.DIR / "meta.json"
    meta = json.loads(path.read_text())
    meta.update(meta_changes)
    path.write_text(json.dumps({k: v for k, v in meta.items() if v is not None}))
    return desc


def test_a_format_1_checkpoint_still_loads(tmp_path):
    """Checkpoints written before identical tensors were stored once (no `aliases`) resume as before."""
    desc = _saved_with_meta(tmp_path, torch.arange(3.0), format=1, aliases=None)
    assert torch.equal(ck.load(tmp_path).take(desc)["w"], torch.arange(3.0))
    _saved_with_meta(tmp_path, torch.arange(3.0), format=3)
    with pytest.raises(ck.CheckpointError, match="format 3; this pipelab reads formats 1, 2"):
        ck.load(tmp_path)


def test_a_checkpoint_naming_a_missing_original_is_refused(tmp_path):
    _saved_with_meta(tmp_path, torch.ones(2), aliases={"b.w": "nope.w"})
    with pytest.raises(ck.CheckpointError, match="b.w is stored as nope.w"):
        ck.load(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["scheduler=pipedream", "cluster=uniform", "cluster.num_devices=3", "model=mlp", "compressor=uniform_stochastic"],
        ["scheduler=1f1b", "model=mlp", "cluster.link.loss=0.2", "scheduler.partition=[2]", "scheduler.repartition=[[2,[1]]]"],
        ["scheduler=sl", "cluster=pipar_4g", "model=mlp", "runtime.numerics=false"],
        # dev1 slows 4x: stage 0 re-plans at epoch 0's end, so the checkpoint holds moved units and the decision
        ["scheduler=pipedream", "cluster=uniform", "cluster.num_devices=3", "model=mlp", "predictor=oracle", "scheduler.replan_epsilon=0.15",
         "+cluster.devices.dev1.trace=[[0.0,4.0]]"],
    ],
    ids=["pipedream-stochastic-codec", "1f1b-lossy-repartition", "sl-timing-only", "pipedream-replanned"],
)
def test_other_schedules_resume_bit_identical(tmp_path, overrides):
    if "runtime.numerics=false" in overrides:  # no weights to compare: times and counts only
        full = _job(overrides, tmp_path / "full").run()
        job = _job(overrides, tmp_path / "cut")
        _stop_after(job, 0)
        with pytest.raises(KeyboardInterrupt):
            job.run()
        resumed = _job(overrides, tmp_path / "x", resume=tmp_path / "cut").run()
        assert resumed["virtual_time_s"] == full["virtual_time_s"] and resumed["links"] == full["links"] and resumed["roles"] == full["roles"]
    else:
        _stop_and_resume(tmp_path, overrides)


SL_EF = ["scheduler=sl", "cluster=pipar_4g", "cluster.num_devices=3", "model=mlp", "compressor=minmax_ef"]


def test_sl_with_error_feedback_resumes_bit_identical(tmp_path):
    """The SL server's per-device counts (its replies' labels, which the compressor's kept error
    pairs with) come back from the checkpoint."""
    _stop_and_resume(tmp_path, SL_EF)


def test_sl_resumes_from_a_checkpoint_with_one_served_count(tmp_path):
    """Checkpoints written before the SL server counted per device hold one count over all
    devices; taken at an epoch's end, it says how many whole epochs each device was served."""
    full = _job(SL_EF, tmp_path / "full").run()
    job = _job(SL_EF, tmp_path / "cut")
    _stop_after(job, 0)
    with pytest.raises(KeyboardInterrupt):
        job.run()
    path = tmp_path / "cut" / ck.DIR / "meta.json"
    meta = json.loads(path.read_text())
    s = job.scheduler
    served = meta["runtime"]["roles"]["server"]["served"]
    assert served == {str(k): s.num_iterations(k, s.plans[k]) for k in range(3)}  # epoch 0's
    meta["runtime"]["roles"]["server"]["served"] = sum(served.values())
    path.write_text(json.dumps(meta))
    resumed = _job(SL_EF, tmp_path / "x", resume=tmp_path / "cut").run()
    _same_run(tmp_path / "full", full, tmp_path / "cut", resumed)


def test_adalearner_onebit_resumed_is_bit_identical(tmp_path):
    """The group owner's second-quantization residuals, the workers' replicas and the uplinks'
    codec streams are all in the checkpoint: the resumed 1-bit run is the uninterrupted one."""
    ov = ["experiment=adalearner", "model=mlp", "model.widths=[32,16]", "dataset=synthetic_mnist", "train.batch_size=128", "train.iterations_per_epoch=3",
          "dataset.n_train=1024", "scheduler.workers=3", "scheduler.architecture=onebit"]
    full, resumed = _stop_and_resume(tmp_path, ov)
    assert full["plan"]["scheme"] == "onebit"


def test_checkpoint_files_are_safetensors_and_json(tmp_path):
    _job(["train.epochs=1"], tmp_path).run()
    files = sorted(p.name for p in (tmp_path / ck.DIR).iterdir())
    assert files == ["meta.json", "state.safetensors"]
    bag = ck.load(tmp_path)
    assert bag.meta["epoch"] == 0 and any(k.startswith("runtime.role.stage1.stage.optimizer") for k in bag.tensors)  # momentum buffers


def test_resume_errors_name_the_key(tmp_path):
    from framework.errors import ConfigError

    _job(["train.epochs=1", "train.checkpoint=false"], tmp_path / "nock").run()
    with pytest.raises(ConfigError, match="train.resume.*no checkpoint"):
        _job(["train.epochs=1"], tmp_path / "x", resume=tmp_path / "nock")
    _job(["train.epochs=1"], tmp_path / "done").run()
    with pytest.raises(ConfigError, match="finished all 1 epochs.*raise train.epochs"):
        _job(["train.epochs=1"], tmp_path / "x", resume=tmp_path / "done")
    with pytest.raises(ConfigError, match="another config"):
        _job(["train.epochs=2", "train.lr=0.01"], tmp_path / "x", resume=tmp_path / "done")


@pytest.mark.slow  # two CLI processes against one store (about 18 s); the in-process resume tests stay fast
def test_cli_resume_continues_the_same_mlflow_run(tmp_path, mlflow_store):
    tracking, client = mlflow_store
    tiny = ["model=mlp", "train.iterations_per_epoch=3", "dataset.n_train=256", "dataset.n_val=64", "dataset.n_test=64", "runtime.progress=false"]
    first = cli(tracking + tiny + ["train.epochs=1", "hydra.run.dir=run"], tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "run"
    bad = cli(tracking + [f"train.resume={run_dir}", "train.lr=0.5"], tmp_path)
    assert bad.returncode == 2 and "drop train.lr" in bad.stderr and "Traceback" not in bad.stderr
    res = cli(tracking + [f"train.resume={run_dir}", "train.epochs=2"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"resuming {run_dir} after epoch 0 of 2" in res.stderr and str(run_dir) in res.stdout
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1  # the same MLflow run went on
    run = runs[0]
    assert run.info.status == "FINISHED" and "after epoch 0" in run.data.tags["pipelab.resumed"]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")]
    assert steps == [3, 6]  # one value per epoch, on the iterations axis
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and len(summary["history"]["val/acc"]) == 2
    arts = {a.path for a in client.list_artifacts(run.info.run_id, ck.DIR)}
    assert arts == {f"{ck.DIR}/meta.json", f"{ck.DIR}/state.safetensors"}


def test_checkpoint_files_are_safetensors_that_its_loader_reads_back(tmp_path):
    """framework.checkpoints.state writes the format itself (one pass, no per-tensor Python of the
    library's writer); safetensors' own loader must read every dtype and shape back exactly."""
    from framework.checkpoints.state import CheckpointError, save_file

    tensors = {
        "f32": torch.randn(3, 4), "f64": torch.tensor(3.5, dtype=torch.float64), "empty": torch.zeros(0, 5),
        "bool": torch.tensor([True, False, True]), "bf16": torch.randn(2, 3).to(torch.bfloat16),
        "rng": torch.Generator().manual_seed(1).get_state(), "view": torch.arange(9)[2:7:2], "transposed": torch.randn(4, 3).t(),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
    }
    path = tmp_path / "state.safetensors"
    save_file(tensors, path)
    back = load_file(str(path))
    assert list(back) == list(tensors)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape and torch.equal(back[k], t), k
    with pytest.raises(CheckpointError, match="complex64"):
        save_file({"c": torch.zeros(2, dtype=torch.complex64)}, path)
