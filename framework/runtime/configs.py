"""The runtimes' config schemas (dataclasses only: importing this imports no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from framework.config import RuntimeConfig


@dataclass
class SimConfig(RuntimeConfig):
    """Runs role programs on the virtual clock."""

    name: str = "sim"
    torch_device: str = "cpu"  # where tensor work runs: cpu | cuda | cuda:<n> (time still comes from the device models)
    batch_replicas: Optional[bool] = None  # run identical replicas' forwards/backwards as one vmapped call; null: on for cuda
    replica_conv: Optional[str] = None  # batched convolutions: matmul (faster on a GPU, more memory) | grouped; null: matmul on cuda
    tf32: bool = False  # cuda only: float32 convolutions and matmuls on TF32 tensor cores (faster, 10 mantissa bits: drifts from the CPU run)


@dataclass
class LocalConfig(RuntimeConfig):
    """One OS process per role on this machine, over a real transport (transport=mqtt)."""

    name: str = "local"
    progress: bool = True
    run_id: Optional[str] = None  # topics are namespaced by it; null = a fresh id per run
    join_timeout_s: float = 120.0  # every role must say `ready` within this
    emulate_compute: bool = False  # stretch each computation to the device's time model
    emulate_links: bool = False  # price every message with the cluster's link model, in real time
    max_pending_bytes: int = 256 << 20  # a role's unsent data before its next compute waits
    python: Optional[str] = None  # interpreter for role processes; null = this one
    tune_malloc: bool = True  # keep freed megabyte buffers mapped (framework/runtime/allocator.py)


@dataclass
class RemoteConfig(LocalConfig):
    """Roles join from other machines: `python -m framework.worker role=<name> ...`."""

    name: str = "remote"
