"""Runtimes run role programs: `sim` on a virtual clock, `local`/`remote` as real processes.
Declared (framework.registry.declare): a runtime's code (and torch) is imported when it is built."""

from framework.config import TransportConfig
from framework.registry import declare, register
from framework.runtime.configs import LocalConfig, RemoteConfig, SimConfig

declare("runtime", "sim", "framework.runtime.sim:SimRuntime", schema=SimConfig, doc="Runs role programs on the virtual clock.")
declare("runtime", "local", "framework.runtime.local:LocalRuntime", schema=LocalConfig,
        doc="One OS process per role on this machine, over a real transport (transport=mqtt).")
declare("runtime", "remote", "framework.runtime.local:RemoteRuntime", schema=RemoteConfig,
        doc="Roles join from other machines: `python -m framework.worker role=<name> ...`.")


@register("transport", "inproc", schema=TransportConfig)
class InprocTransport:
    """In-process delivery: the simulator's link models price every message."""

    def __init__(self, cfg):
        self.cfg = cfg
