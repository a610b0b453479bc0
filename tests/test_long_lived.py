"""The collector's policy during a run (framework/long_lived.py): what lives for the whole run is
frozen until the job's outputs are written, the young threshold grows with the number of roles,
and everything is as it was afterwards (a sweep's next job, the tests, collect what a run left)."""

from __future__ import annotations

import gc

from framework import long_lived as ll
from framework.job import Job
from tests.conftest import compose_cfg


def test_nested_contexts_freeze_raise_the_threshold_and_restore_at_the_outermost_exit():
    before_threshold, before_frozen = gc.get_threshold(), gc.get_freeze_count()
    with ll.long_lived():
        assert gc.get_threshold()[0] == ll.YOUNG_THRESHOLD and gc.get_freeze_count() > before_frozen
        with ll.long_lived(roles=4_000):
            assert gc.get_threshold()[0] == ll.YOUNG_PER_ROLE * 4_000
        assert gc.get_threshold()[0] == ll.YOUNG_PER_ROLE * 4_000  # until the outermost exit
        with ll.long_lived(roles=10):  # fewer roles never lower it
            assert gc.get_threshold()[0] == ll.YOUNG_PER_ROLE * 4_000
        assert gc.get_freeze_count() > before_frozen
    assert gc.get_threshold() == before_threshold and gc.get_freeze_count() == before_frozen


def test_an_exception_restores_the_collector():
    before = gc.get_threshold(), gc.get_freeze_count()
    try:
        with ll.long_lived(roles=1_000):
            raise KeyError("stop")
    except KeyError:
        pass
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_a_job_writes_its_outputs_with_the_run_still_frozen(tmp_path):
    """After the simulation the roles and the timeline stay out of the collector's reach while
    the outputs are written (full collections over them had cost 2 s of a 10,000-device run)."""
    job = Job(compose_cfg(["train.epochs=1", "train.iterations_per_epoch=2", "dataset.n_train=256", "dataset.n_val=32", "dataset.n_test=32",
                           "runtime.numerics=false", "tracking=none"]), tmp_path)
    before = gc.get_threshold(), gc.get_freeze_count()
    seen = {}
    write = job._write_outputs

    def watched(status):
        seen["frozen"], seen["threshold"] = gc.get_freeze_count(), gc.get_threshold()[0]
        return write(status)

    job._write_outputs = watched
    job.run()
    assert seen["frozen"] > before[1] and seen["threshold"] >= ll.YOUNG_THRESHOLD
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_the_simulation_raises_the_young_threshold_with_its_roles(tmp_path, monkeypatch):
    monkeypatch.setattr(ll, "YOUNG_PER_ROLE", 100_000)  # so that a small run's roles decide it
    job = Job(compose_cfg(["scheduler=fl", "cluster.num_devices=3", "train.epochs=1", "dataset.n_train=96", "runtime.numerics=false", "tracking=none"]), tmp_path)
    seen = []
    hook = job.on_epoch_end

    def on_epoch_end(*a, **kw):
        seen.append(gc.get_threshold()[0])
        return hook(*a, **kw)

    job.on_epoch_end = on_epoch_end
    job.run()
    assert seen == [100_000 * len(job.runtime.roles)]  # three devices and the aggregator
