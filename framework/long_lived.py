"""The cyclic garbage collector during a run: what lives for the whole run is not traversed again
and again.

`long_lived()` is a nestable context: everything alive on entry (imports, data, configs; nested:
the roles built since) lives for the whole run, so it is moved out of the collector's reach
(`gc.freeze`), and a collection scans only what the run itself allocates. Cyclic garbage the run
makes is still collected, with young collections after 10,000 new objects instead of Python's
700: a run makes many short-lived objects (placeholders, deferred calls, messages) that reference
counting frees anyway. Once the roles are built, the young threshold grows to 50 new objects per
role where that is more: what a simulation keeps in flight (coroutines, futures, messages, the
timeline) grows with its roles, and a fixed threshold made the collections' share of the run
grow with K. The outermost exit restores both, so a process that runs many jobs (a sweep, the
tests) collects what each one left.

Measured:
- collections over the models' objects had cost 0.15-0.2 s of a 0.8 s PiPar run of 64 devices
  (`gc.callbacks`); the young threshold cut a batched PiPar epoch's host instructions by 2.7%
  (64 devices, callgrind);
- a timing-only PiPar run of 10,000 devices (20,001 roles; 1.2 million tracked objects alive in
  the simulation) spent 9.5 s of its 44 s in collections, 1.1 s with both changes below;
  `bench_scale.py` at K = 10,000, the tree before and after in turn: PiPar 41.9 s to 32.0 s, FL
  10.0 s to 8.3 s, SFL 19.4 s to 14.7 s, peak memory unchanged;
  - the job keeps the run frozen while it writes its outputs (`Job.run`): when the roles and the
    timeline went back to the collector after the simulation, writing the outputs set off full
    collections over them;
  - the young threshold per role (1,000,050 there): with 10,000, 576 young collections took 3 s
    and 51 middle ones 3.2 s.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

YOUNG_THRESHOLD = 10_000
YOUNG_PER_ROLE = 50  # young objects per role between collections, where that is more
_depth = 0  # nesting depth of long_lived


@contextmanager
def long_lived(roles: int = 0):
    """Nestable; `roles`: how many roles the run has (known once they are built), which raises the
    young threshold to `YOUNG_PER_ROLE` objects per role until the outermost exit."""
    global _depth
    gc.freeze()
    _depth += 1
    thresholds = gc.get_threshold()
    young = max(YOUNG_THRESHOLD, YOUNG_PER_ROLE * roles)
    if _depth == 1 or young > thresholds[0]:
        gc.set_threshold(young, *thresholds[1:])
    try:
        yield
    finally:
        _depth -= 1
        if not _depth:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
