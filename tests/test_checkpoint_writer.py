"""Checkpoints written in the background (framework/checkpoints/writer.py): what is written is the
state when the checkpoint was taken, the files are whole and atomic, errors reach the run, and a
run resumed from a background-written checkpoint is the uninterrupted one."""

from __future__ import annotations

import threading

import pytest
import torch

from framework.checkpoints import state as ck
from framework.checkpoints import tensor_file as checkpoint_file
from framework.checkpoints.writer import CheckpointWriter
from tests.conftest import compose_cfg
from tests.test_resume import SMALL, _stop_and_resume


def _bag(value: float) -> ck.Bag:
    bag = ck.Bag()
    w = torch.full((3, 4), value)
    bag.meta["w"] = bag.put("w", {"weight": w, "steps": torch.tensor([int(value)])})
    return bag


def _written(run_dir) -> torch.Tensor:
    loaded = ck.load(run_dir)
    return loaded.take(loaded.meta["w"])["weight"]


def test_a_background_checkpoint_holds_the_state_when_it_was_taken(tmp_path):
    bag = _bag(1.0)
    seen = []
    writer = CheckpointWriter(background=True)
    writer.save(tmp_path, bag, then=lambda path: seen.append((path, threading.get_ident())))
    for t in bag.tensors.values():  # the next epoch's update, while the file may be being written
        t.add_(10)
    assert seen == []  # `then` waits for `wait` (or the next save)
    writer.wait()
    assert seen == [(tmp_path / ck.DIR, threading.get_ident())]  # once, in the run's thread
    assert torch.equal(_written(tmp_path), torch.full((3, 4), 1.0))
    writer.wait()  # nothing in flight: a no-op
    assert len(seen) == 1 and not writer.writing


def test_the_next_save_finishes_the_last_one_first(tmp_path):
    writer, seen = CheckpointWriter(background=True), []
    writer.save(tmp_path, _bag(1.0), then=seen.append)
    writer.save(tmp_path, _bag(2.0), then=seen.append)
    assert seen == [tmp_path / ck.DIR]
    writer.wait()
    assert seen == [tmp_path / ck.DIR] * 2
    assert torch.equal(_written(tmp_path), torch.full((3, 4), 2.0))


def test_cpu_state_is_written_before_the_run_goes_on(tmp_path):
    """By default only state whose bytes were copied off a device is written in the background:
    a CPU run's tensors are written from their own memory, before the next epoch changes them."""
    writer, seen = CheckpointWriter(), []
    bag = _bag(1.0)
    writer.save(tmp_path, bag, then=seen.append)
    assert not writer.writing and seen == [tmp_path / ck.DIR]
    assert torch.equal(_written(tmp_path), torch.full((3, 4), 1.0))


def test_a_failed_write_raises_at_wait_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    writer, seen = CheckpointWriter(background=True), []
    writer.save(tmp_path, _bag(1.0), then=seen.append)
    writer.wait()

    def full_disk(self, path):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_file.PreparedFile, "write", full_disk)
    writer.save(tmp_path, _bag(2.0), then=seen.append)
    with pytest.raises(ck.CheckpointError, match="writing the checkpoint failed: OSError.*No space left"):
        writer.wait()
    assert len(seen) == 1 and not writer.writing  # no `then` for a checkpoint that is not there
    monkeypatch.undo()
    assert torch.equal(_written(tmp_path), torch.full((3, 4), 1.0))  # the last good one, whole
    writer.save(tmp_path, _bag(3.0))  # the writer goes on working
    writer.wait()
    assert torch.equal(_written(tmp_path), torch.full((3, 4), 3.0))


@pytest.fixture
def background_checkpoints(monkeypatch):
    """Jobs write every checkpoint in the background, as a GPU run does, on the CPU."""
    monkeypatch.setattr("framework.job.CheckpointWriter", lambda: CheckpointWriter(background=True))


def test_a_run_stopped_with_its_checkpoint_in_flight_resumes_bit_identical(tmp_path, background_checkpoints):
    """Ctrl-C right after epoch 0's checkpoint was taken (its file still being written): the run
    finishes the file before it stops, and resuming from it gives the uninterrupted run."""
    _stop_and_resume(tmp_path, ["scheduler=fl", "cluster=pipar_wifi", "cluster.num_devices=3", "model=mlp", "dataset=synthetic_mnist", "runtime.batch_replicas=true"])


def test_background_checkpoints_reach_mlflow(tmp_path, mlflow_store, background_checkpoints):
    from framework.job import Job

    tracking, client = mlflow_store
    cfg = compose_cfg(SMALL + tracking + ["model=mlp", "train.epochs=2", "runtime.progress=false"])
    summary = Job(cfg, tmp_path / "run").run()
    assert summary["status"] == "FINISHED"
    arts = {a.path for a in client.list_artifacts(summary["mlflow_run_id"], ck.DIR)}
    assert arts == {f"{ck.DIR}/meta.json", f"{ck.DIR}/state.safetensors"}
    assert ck.load(tmp_path / "run").meta["epoch"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_run_writes_its_checkpoints_in_the_background(tmp_path, monkeypatch):
    from framework.job import Job

    threads = []
    write = CheckpointWriter._write
    monkeypatch.setattr(CheckpointWriter, "_write", lambda self, prepared: (threads.append(threading.current_thread()), write(self, prepared)))
    cfg = compose_cfg(SMALL + ["scheduler=fl", "cluster=pipar_wifi", "cluster.num_devices=3", "model=mlp", "dataset=synthetic_mnist", "runtime.torch_device=cuda"])
    Job(cfg, tmp_path / "run").run()
    assert len(threads) == 3 and all(t is not threading.main_thread() for t in threads)
    assert ck.load(tmp_path / "run").meta["epoch"] == 2


def _all_on_a_device(monkeypatch):
    """Every tensor's bytes fetched as if it were on a device: on the CPU they go through the
    same block."""
    monkeypatch.setattr(checkpoint_file, "_fetched", lambda t: True)


def test_a_device_block_is_laid_out_whole_and_reads_back(tmp_path, monkeypatch):
    """A device's tensors go into the file in their block's order (grouped by dtype), so the
    block is one write; the header's byte ranges follow, and safetensors reads every tensor back."""
    from safetensors.torch import load_file

    tensors = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "n": torch.tensor([7, 8], dtype=torch.int64),
               "h": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "b": torch.full((5,), -1.25), "z": torch.zeros(0)}
    _all_on_a_device(monkeypatch)
    prepared = checkpoint_file.prepare(tensors)
    assert len(prepared.parts) == 1 and prepared.detached  # one block, one write, a copy
    prepared.write(tmp_path / "s.safetensors")
    back = load_file(tmp_path / "s.safetensors")
    assert back.keys() == tensors.keys()
    assert all(back[k].dtype == t.dtype and torch.equal(back[k], t) for k, t in tensors.items())
    tensors["a"].add_(1)  # the block is a copy: the file written later holds the old values
    prepared.write(tmp_path / "t.safetensors")
    assert torch.equal(load_file(tmp_path / "t.safetensors")["a"], torch.arange(6, dtype=torch.float32).view(2, 3))


def test_cpu_tensors_detached_for_the_background_are_one_copy(tmp_path):
    from safetensors.torch import load_file

    tensors = {"w": torch.randn(4, 4), "s": torch.tensor([3], dtype=torch.int64)}
    prepared = checkpoint_file.prepare(tensors, detach_from_run=True)
    assert len(prepared.parts) == 1 and prepared.detached
    assert not checkpoint_file.prepare(tensors).detached  # views of the live tensors
    prepared.write(tmp_path / "s.safetensors")
    back = load_file(tmp_path / "s.safetensors")
    assert all(torch.equal(back[k], t) for k, t in tensors.items())


def test_a_second_ctrl_c_while_the_last_file_is_written_still_ends_the_run_failed(tmp_path, mlflow_store, monkeypatch):
    """Ctrl-C during an epoch, and again while the run waits for its last checkpoint's file: the
    run still writes its outputs and leaves its MLflow run FAILED."""
    import json

    from framework.job import Job
    from tests.test_resume import _stop_after

    tracking, client = mlflow_store

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(CheckpointWriter, "wait", interrupted)
    cfg = compose_cfg(SMALL + tracking + ["model=mlp", "runtime.progress=false"])
    job = Job(cfg, tmp_path / "run")
    _stop_after(job, 0)
    with pytest.raises(KeyboardInterrupt):
        job.run()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "FAILED"
    assert client.get_run(summary["mlflow_run_id"]).info.status == "FAILED"


def test_a_device_block_holds_each_tensors_bytes(tmp_path, monkeypatch):
    """What a GPU checkpoint copies back (one block, cut up by the header's byte ranges) holds
    each tensor's bytes as the CPU writer takes them, whatever the dtype, shape or layout."""
    import json
    import struct

    from framework.checkpoints.tensor_file import _host_bytes

    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(5, 3, generator=g), torch.randn(3, 5, generator=g).t(), torch.tensor(7), torch.randn(9, generator=g) > 0,
               torch.randn(4, generator=g).half(), torch.zeros(0, 2), torch.randn(6, generator=g, dtype=torch.float64),
               torch.randn(3, generator=g).bfloat16(), torch.randn(2, 3, generator=g)]
    _all_on_a_device(monkeypatch)
    checkpoint_file.prepare({f"t{i}": t for i, t in enumerate(tensors)}).write(tmp_path / "s.safetensors")
    raw = (tmp_path / "s.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    for i, t in enumerate(tensors):
        start, stop = header[f"t{i}"]["data_offsets"]
        assert body[start:stop] == _host_bytes(t).tobytes(), t
