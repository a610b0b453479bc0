"""Where a run's tensor work happens: `runtime.torch_device` (the simulator's option) as a torch
device, checked against what this machine has. The job (which puts the dataset and the models
there) and the simulator (which moves received messages there) both ask here, so they agree;
tests that emulate an accelerator on the CPU (tests/emulated_gpu.py) replace `named`."""

from __future__ import annotations

import torch

from framework.errors import ConfigError


def named(name: str) -> torch.device:
    """The torch device `runtime.torch_device=<name>` stands for."""
    return torch.device(name)


def of(runtime_cfg) -> torch.device:
    """`runtime_cfg`'s device, without checks (None: the CPU, as a bare runtime has)."""
    return named(str(runtime_cfg.get("torch_device", "cpu")) if runtime_cfg is not None else "cpu")


def resolve(runtime_cfg) -> torch.device:
    """`runtime_cfg`'s device, checked against this machine; sets TF32 for a CUDA run."""
    name = str(runtime_cfg.get("torch_device", "cpu"))
    device = named(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ConfigError("runtime.torch_device", f"{name}: {why} (torch {torch.__version__}); choices on this machine: cpu")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ConfigError("runtime.torch_device", f"{name}: this machine has {torch.cuda.device_count()} CUDA device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        # By default float32 means float32: cuDNN's default TF32 convolutions keep 10 mantissa bits,
        # and over one epoch of VGG-5 moved BatchNorm statistics 20 % away from the CPU run (H200,
        # measured). `runtime.tf32=true` trades that for the tensor cores' speed.
        tf32 = bool(runtime_cfg.get("tf32", False))
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return device
