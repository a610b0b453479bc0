"""Runtimes run role programs: `sim` on a virtual clock, `local`/`remote` as real processes."""

from dataclasses import dataclass

from framework.config import RuntimeConfig, TransportConfig
from framework.registry import register
from framework.runtime.local import LocalConfig, LocalRuntime, RemoteConfig, RemoteRuntime
from framework.runtime.sim import SimRuntime


@dataclass
class SimConfig(RuntimeConfig):
    name: str = "sim"


register("runtime", "sim", schema=SimConfig)(SimRuntime)
register("runtime", "local", schema=LocalConfig)(LocalRuntime)
register("runtime", "remote", schema=RemoteConfig)(RemoteRuntime)


@register("transport", "inproc", schema=TransportConfig)
class InprocTransport:
    """In-process delivery: the simulator's link models price every message."""

    def __init__(self, cfg):
        self.cfg = cfg
