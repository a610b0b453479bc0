"""Runtimes run role programs: `sim` on a virtual clock, `local`/`remote` as real processes.
Declared in framework.core_plugins: a runtime's code (and torch) is imported when it is built."""


class InprocTransport:
    """In-process delivery: the simulator's link models price every message."""

    def __init__(self, cfg):
        self.cfg = cfg
