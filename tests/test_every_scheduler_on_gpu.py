"""`runtime.torch_device=cuda` runs every scheduler's tensor work on the accelerator: each
registered scheduler (and every compressor, through PiPar) trains one small epoch there and
matches its CPU run.

Two backends run the same cases:
- **emulated** (every machine): a GPU emulated on the CPU (tests/emulated_gpu.py). Tensors a run
  puts on the device and tensors it keeps on the CPU must never meet in one operation, and no
  device tensor may be read as a numpy array, as on CUDA; the math itself runs on the CPU, so in
  float64 the run equals the CPU run to rounding (its replicas batched, as on a GPU, against one
  at a time). This found AdaLearner's 1-bit path, the min-max and LSQ compressors' error
  feedback and the differential-privacy noise mixing CPU tensors with device tensors. Stopped after an epoch, each run
  resumes there bit for bit (slow).
- **cuda** (skips without CUDA): the real device. The same virtual time and bytes, finite
  weights and the same accuracy within 5 points; tests/test_replica_batching.py holds the
  tighter float64 and float32 comparisons of the schedulers it covers.
"""

from __future__ import annotations

import pytest
import torch

from framework import registry
from framework.job import Job
from tests import emulated_gpu
from tests.conftest import compose_cfg

SPLIT = ["dataset=synthetic_cifar10", "dataset.n_train=384", "dataset.n_val=64", "dataset.n_test=64", "cluster=pipar_wifi", "cluster.num_devices=3",
         "train.epochs=1", "train.batch_size=32", "train.momentum=0.9", "train.weight_decay=1e-4", "model=vgg5"]
ADALEARNER = ["experiment=adalearner", "train.epochs=1", "train.iterations_per_epoch=6", "dataset.n_train=768", "model=mlp", "model.widths=[128,64]",
              "scheduler.workers=3"]
REPLAY = ["model=vgg5", "dataset=synthetic_cifar10", "cluster=pi4_wifi", "train.epochs=1", "dataset.n_train=320", "dataset.n_val=64",
          "dataset.n_test=64", "train.batch_size=32"]
EDGEPIPE = ["scheduler=super_neuron", "model=mlp", "model.depth=5", "model.hidden=16", "dataset=synthetic_mnist", "dataset.n_train=300",
            "dataset.n_val=100", "dataset.n_test=100", "cluster=edgepipe_rpi2", "train.batch_size=50", "train.epochs=1", "scheduler.generations=50"]

# scheduler -> its cases (id -> overrides); every registered scheduler has at least one
CASES = {
    "fl": {"fl": SPLIT + ["scheduler=fl"],
           "fl-dp": SPLIT + ["scheduler=fl", "scheduler.dp_sigma=0.01", "scheduler.dp_clip=1.0", "scheduler.failures=[[1,0]]"]},  # CPU noise, GPU model
    "pipar": {"pipar": SPLIT + ["scheduler=pipar"]},
    # LSQ's scale learned from the returned gradients; uncompressed, they stay on the device
    "sfl": {"sfl": SPLIT + ["scheduler=sfl", "compressor=uniform", "compressor.backward.codec=none"]},
    "sl": {"sl": SPLIT + ["scheduler=sl"]},
    "gpipe": {"gpipe": SPLIT + ["scheduler=gpipe"]},
    "1f1b": {"1f1b": SPLIT + ["scheduler=1f1b"]},
    "pipedream": {"pipedream": SPLIT + ["scheduler=pipedream"]},
    "local": {"local": SPLIT + ["scheduler=local", "scheduler.microbatches=2"]},
    "adalearner": {"adalearner-onebit": ADALEARNER + ["scheduler.architecture=onebit"],
                   "adalearner-fp32": ADALEARNER + ["scheduler.architecture=fp32"]},
    "feature_replay": {"feature_replay": REPLAY + ["scheduler=feature_replay", "compressor=minmax_ef"]},
    "edge_only": {"edge_only": REPLAY + ["scheduler=edge_only"]},
    "jointdnn": {"jointdnn": REPLAY + ["scheduler=jointdnn", "compressor=minmax_ef"]},
    "super_neuron": {"super_neuron": EDGEPIPE},
}
# a scheduler added without a case of its own (the "Add a system" tutorial's) runs the default split
# setting; registry names are read after the built-in plugins are declared
for _name in registry.names("scheduler"):
    CASES.setdefault(_name, {_name: SPLIT + [f"scheduler={_name}"]})
COMPRESSORS = ["mbq", "uniform", "uniform_stochastic", "fp16", "onebit_ef", "minmax_ef"]
# the fast suite runs one case per family (the classic pipeline, the collaborative schedulers,
# AdaLearner, feature replay, EdgePipe); `-m slow` every case
FAST = {"fl", "gpipe", "adalearner-onebit", "feature_replay", "super_neuron"}
RUNS = [pytest.param(overrides, id=case, marks=() if case in FAST else pytest.mark.slow) for cases in CASES.values() for case, overrides in cases.items()]
RUNS += [pytest.param(SPLIT + ["scheduler=pipar", f"compressor={c}"], id=f"pipar-{c}", marks=pytest.mark.slow) for c in COMPRESSORS]

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
emulated = pytest.mark.skipif(not emulated_gpu.wanted(), reason="a real GPU here: the cuda cases run instead")


def run(tmp_path, overrides: list[str]):
    job = Job(compose_cfg(overrides + ["runtime.dtype=float64"]), tmp_path)
    res = job.run()
    return job, res, {k: v.detach().cpu().clone() for k, v in job.final_model().state_dict().items()}


def same_time_and_bytes(a: dict, b: dict) -> None:
    assert a["virtual_time_s"] == b["virtual_time_s"]
    net = {k: v for k, v in a["metrics"].items() if k.startswith(("net/", "compression/bytes"))}
    assert net == {k: b["metrics"][k] for k in net}


def test_every_scheduler_has_a_case():
    assert set(CASES) == set(registry.names("scheduler"))  # an explicit one, or the default split setting


@emulated
@pytest.mark.parametrize("overrides", RUNS)
def test_on_the_emulated_gpu(tmp_path, overrides):
    on_cpu = run(tmp_path / "cpu", overrides)
    with emulated_gpu.emulated_gpu() as device:
        job, res, weights = run(tmp_path / "gpu", overrides + ["runtime.torch_device=cuda", "runtime.batch_replicas=true", "runtime.replica_conv=matmul"])
        assert next(job.model.parameters()).device == device  # the run did go there
    same_time_and_bytes(on_cpu[1], res)
    learned = {k: v for k, v in on_cpu[1]["metrics"].items() if k.startswith(("val/", "train/", "test/"))}
    assert learned and learned == pytest.approx({k: res["metrics"][k] for k in learned}, rel=1e-8, abs=1e-8)
    for k, w in on_cpu[2].items():
        torch.testing.assert_close(weights[k], w, rtol=1e-8, atol=1e-8)


RESUMABLE = [pytest.param(ov, id=case) for name, cases in CASES.items() if name != "super_neuron"  # EdgePipe keeps no checkpoints
             for case, ov in cases.items()]


@emulated
@pytest.mark.slow
@pytest.mark.parametrize("overrides", RESUMABLE)
def test_resumes_on_the_emulated_gpu(tmp_path, overrides):
    """Stopped after its first epoch, a run on the device resumes bit for bit: the checkpoint's
    tensors, fetched from the device, load back there, optimizer and codec state included."""
    from tests.test_resume import _stop_and_resume

    sized = [o for o in overrides if not o.startswith(("train.epochs=", "dataset.n_train=", "train.iterations_per_epoch="))]
    with emulated_gpu.emulated_gpu():
        _stop_and_resume(tmp_path, sized + ["runtime.torch_device=cuda", "runtime.batch_replicas=true", "runtime.replica_conv=matmul"])


@cuda
@pytest.mark.parametrize("overrides", RUNS)
def test_on_cuda(tmp_path, overrides):
    (_, rc, _), (job, rg, wg) = run(tmp_path / "cpu", overrides), run(tmp_path / "gpu", overrides + ["runtime.torch_device=cuda"])
    assert next(job.model.parameters()).is_cuda
    same_time_and_bytes(rc, rg)
    assert all(torch.isfinite(w).all() for w in wg.values() if w.is_floating_point())
    assert rg["metrics"]["val/acc"] == pytest.approx(rc["metrics"]["val/acc"], abs=0.05)


# ---- the emulation itself: what it must refuse, and what it must let through -------------------


@emulated
def test_the_emulated_gpu_refuses_what_cuda_refuses():
    with emulated_gpu.emulated_gpu() as device:
        w = torch.randn(4, 3, device=device)
        assert isinstance(w, emulated_gpu.OnDevice) and w.device == device
        with pytest.raises(emulated_gpu.DeviceMix):
            w @ torch.randn(3, 2)
        with pytest.raises(emulated_gpu.DeviceMix):
            torch.nn.functional.linear(torch.randn(2, 3), w)
        with pytest.raises(TypeError, match="numpy"):
            w.numpy()


@emulated
def test_the_emulated_gpu_lets_through_what_cuda_takes():
    with emulated_gpu.emulated_gpu() as device:
        x = torch.arange(12.0).reshape(4, 3).to(device)
        assert torch.equal((x * torch.tensor(2.0)).cpu(), torch.arange(12.0).reshape(4, 3) * 2)  # a CPU scalar
        assert torch.equal(x[torch.tensor([0, 2])].cpu(), torch.tensor([[0.0, 1, 2], [6, 7, 8]]))  # a CPU index
        y = x.add_(1)
        assert y is x  # in place: the same tensor
        x.copy_(torch.zeros(4, 3))  # a copy across
        assert x.tolist() == [[0.0] * 3] * 4 and type(x.cpu()) is torch.Tensor
        p = torch.nn.Parameter(torch.zeros(3, device=device))
        block = torch.arange(6.0, device=device)
        p.data = block[3:]  # a parameter pointed at a block's row (the replica bank, block copies)
        assert p.data_ptr() == block[3:].data_ptr()
        block.mul_(2)
        assert p.tolist() == [6.0, 8.0, 10.0]
        m = torch.nn.Linear(3, 2).to(device)
        m(torch.randn(5, 3, device=device)).sum().backward()
        assert m.weight.grad.device == device
