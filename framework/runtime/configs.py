"""The runtimes' config schemas (dataclasses only: importing this imports no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from framework.config.knobs import Range, knob
from framework.config.schemas import RuntimeConfig


@dataclass
class SimConfig(RuntimeConfig):
    """Runs role programs on the virtual clock."""

    name: str = "sim"
    torch_device: str = knob("cpu", "where tensor work runs: cpu | cuda | cuda:<n> (time still comes from the device models)")
    batch_replicas: Optional[bool] = knob(None, "run identical replicas' forwards/backwards as one vmapped call; null: on for cuda")
    replica_conv: Optional[str] = knob(None, "batched convolutions: matmul (faster on a GPU, more memory) | grouped; null: matmul on cuda, grouped on cpu", choices=("matmul", "grouped", None))
    tf32: bool = knob(False, "cuda only: float32 convolutions and matmuls on TF32 tensor cores (faster, 10 mantissa bits: drifts from the CPU run)")


@dataclass
class LocalConfig(RuntimeConfig):
    """One OS process per role on this machine, over a real transport (transport=mqtt)."""

    name: str = "local"
    progress: bool = True
    run_id: Optional[str] = knob(None, "topics are namespaced by it; null = a fresh id per run (runtime=remote prints it with the worker commands)")
    join_timeout_s: float = knob(120.0, "every role must say `ready` within this", range=Range(0, low_open=True, note="seconds"))
    emulate_compute: bool = knob(False, "true: stretch each computation to the device's time model")
    emulate_links: bool = knob(False, "true: price every message with the cluster's link model (bandwidth, latency, loss), in real time")
    max_pending_bytes: int = knob(256 << 20, "a role's unsent data before its next compute waits", range=Range(1, integer=True))
    python: Optional[str] = knob(None, "interpreter for role processes; null = this one")
    tune_malloc: bool = knob(True, "keep freed megabyte buffers mapped: no page faults per message (framework/runtime/allocator.py)")


@dataclass
class RemoteConfig(LocalConfig):
    """Roles join from other machines: `python -m framework.worker role=<name> ...`."""

    name: str = "remote"
