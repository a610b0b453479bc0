"""A device whose cores its computations share (framework/runtime/shared_processor.py)."""

import asyncio

import pytest

from framework.errors import ConfigError
from framework.job import Job
from framework.runtime.clock import run_virtual
from framework.runtime.shared_processor import SharedProcessor
from tests.conftest import compose_cfg


def ends(cores: int, jobs: list[tuple[str, float, float]]) -> dict[str, float]:
    """When each (name, arrival, seconds alone) computation ends on `cores` shared cores."""
    sp, out = SharedProcessor(cores), {}

    async def one(name, at, seconds):
        loop = asyncio.get_running_loop()
        await loop.sleep_until(at)
        out[name] = await sp.hold(loop, seconds)

    async def main():
        await asyncio.gather(*(one(*j) for j in jobs))
        assert sp.idle

    run_virtual(main())
    return out


def test_up_to_cores_computations_run_at_full_speed():
    assert ends(4, [(str(i), 0.0, 1.0 + i) for i in range(4)]) == {str(i): 1.0 + i for i in range(4)}


def test_more_computations_than_cores_share_them_equally():
    # 10 equal computations on 4 cores: each at 4/10 of its speed, all end at 10/4
    got = ends(4, [(str(i), 0.0, 1.0) for i in range(10)])
    assert set(got.values()) == {2.5}


def test_arrivals_and_departures_change_the_share():
    # 0-0.5 s: a, b, c on 2 cores (2/3 each: 1/3 s done); d arrives needing 0.25 s: 4 share 2
    # cores (1/2 each) until d ends at 1.0; then a, b, c have 5/12 s left at 2/3: end at 1.625
    got = ends(2, [("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 0.0, 1.0), ("d", 0.5, 0.25)])
    assert got["d"] == pytest.approx(1.0, abs=1e-12)
    assert got["a"] == got["b"] == got["c"] == pytest.approx(1.625, abs=1e-12)


def fluid(cores: int, jobs, dt: float = 1e-4) -> dict[str, float]:
    """The same by brute force: advance every running computation by dt x its share."""
    left = {name: w for name, _, w in jobs}
    out, t = {}, 0.0
    while left:
        running = [n for n, at, _ in jobs if n in left and at <= t + 1e-12]
        share = min(1.0, cores / len(running)) if running else 0.0
        for n in running:
            left[n] -= dt * share
            if left[n] <= 1e-12:
                out[n] = t + dt
                del left[n]
        t += dt
    return out


def test_staggered_arrivals_match_a_brute_force_fluid_model():
    jobs = [(str(i), 0.05 * i, 0.1 + 0.03 * (i % 5)) for i in range(12)]
    got, ref = ends(3, jobs), fluid(3, jobs)
    assert got == pytest.approx(ref, abs=3e-4)


def _pipar(extra):
    return compose_cfg(["scheduler=pipar", "cluster=pipar_4g", "model=vgg5", "dataset=synthetic_cifar10", "train.batch_size=100", "runtime.numerics=false",
                        "train.epochs=1", "scheduler.P=1", "scheduler.N=4", *extra])


def test_replicas_on_a_shared_server_take_longer_than_alone_and_runs_repeat(tmp_path):
    alone = Job(_pipar(["cluster.num_devices=1", "dataset.n_train=200", "cluster.devices.server.cores=8"]), tmp_path / "a").run()
    many = [Job(_pipar(["cluster.num_devices=40", "dataset.n_train=8000", "cluster.devices.server.cores=8"]), tmp_path / f"m{i}").run() for i in range(2)]
    # identical devices stay in step, so 40 replicas always share 8 cores: every server-side
    # computation takes 40 / 8 = 5 times as long as alone
    srv = [r for r in many[0]["roles"] if r.startswith("srv")]
    assert len(srv) == 40
    assert many[0]["roles"]["srv7"]["busy_s"] == pytest.approx(5 * alone["roles"]["srv0"]["busy_s"], rel=1e-9)
    assert many[0]["virtual_time_s"] > alone["virtual_time_s"]
    assert many[0]["virtual_time_s"] == many[1]["virtual_time_s"]  # deterministic
    assert many[0]["roles"] == many[1]["roles"]


def test_cores_and_slots_are_two_disciplines(tmp_path):
    with pytest.raises(ConfigError, match="cores"):
        Job(_pipar(["cluster.devices.server.cores=8", "+cluster.devices.server.slots=2"]), tmp_path)


def test_an_idle_processor_is_as_good_as_new():
    """Its service clock starts again when nothing runs, so what follows an idle moment ends at
    the same floats as on a fresh processor (a resumed run continues bit for bit)."""
    later = [(str(i), 1234600.1 + 0.013 * i, 0.1 + 0.37 * i) for i in range(5)]
    after_work = ends(3, [("x", 0.0, 1234567.891), ("y", 0.2, 17.7)] + later)
    fresh = ends(3, later)
    assert {n: after_work[n] for n, _, _ in later} == fresh
