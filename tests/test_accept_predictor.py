"""AccEPT's latency predictor pieces (plugins/predictors/accept_data.py, accept_mlp.py): the
sub-model encoding and representatives of notes 2.1, the synthetic devices, and that the
dual-stream MLP learns a device family from hardware vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plugins.predictors import accept_data as ad
from plugins.predictors.accept_mlp import LatencyPredictor
from tests.conftest import compose_cfg


@pytest.fixture(scope="module")
def mobilenet_facts():
    from framework import registry
    from framework.models import build_model

    registry.load_plugins()
    cfg = compose_cfg(["model=mobilenetv2", "dataset=synthetic_cifar10"])
    return ad.model_facts(build_model(cfg.model, (3, 32, 32), 10))


def test_submodels_and_masks():
    subs = ad.submodels(20)
    assert len(subs) == 210 and len(set(subs)) == 210
    assert ad.mask(10, 2, 7).tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0, 0]  # the paper's example, corrected (notes 2.1)


def test_representatives_of_the_20_unit_mobilenetv2(mobilenet_facts):
    """Sorted by FLOPs, indices floor(k * 209 / 9): 0, 23, 46, ..., 209: the smallest sub-model
    (the classifier alone) and the whole model among them."""
    facts = mobilenet_facts
    assert facts.L == 20
    flops = {ab: facts.flops(*ab) for ab in ad.submodels(20)}
    reps = ad.representatives(flops)
    order = sorted(flops, key=lambda ab: (flops[ab], ab))
    assert [order.index(r) for r in reps] == [0, 23, 46, 69, 92, 116, 139, 162, 185, 209]
    assert reps[0] == (19, 20) and reps[-1] == (0, 20)


def test_synthetic_devices_are_seeded_non_additive_transforms(mobilenet_facts):
    facts = mobilenet_facts
    host = {1: np.linspace(1e-3, 5e-2, 210), 2: np.linspace(8e-4, 3e-2, 210)}
    a, b, c = (ad.SyntheticDevice(s, facts, host) for s in (3, 3, 4))
    assert np.array_equal(a.times(), b.times()) and not np.array_equal(a.times(), c.times())
    assert (a.times() > 0).all()
    whole = a.time(0, 20)
    assert abs(whole - sum(a.time(j, j + 1) for j in range(20))) / whole > 0.01  # a per-unit table is not the truth


def test_the_predictor_learns_a_device_family_from_hardware_vectors():
    """Devices whose unit costs are one profile times a speed plus a per-unit launch cost: after
    pre-training on 30 of them, an unseen one is predicted from its 10 representatives alone."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    L = 8
    subs = ad.submodels(L)
    unit = rng.uniform(1, 5, L) * 1e-3
    flops = {ab: float(unit[ab[0]:ab[1]].sum()) for ab in subs}
    reps = ad.representatives(flops)
    masks = np.stack([ad.mask(L, a, b) for a, b in subs])

    def device(speed, launch):
        t = np.array([speed * unit[a:b].sum() + launch * (b - a) for a, b in subs])
        return np.repeat(np.array([t[subs.index(r)] for r in reps])[None], len(subs), 0), t

    pool = [device(rng.uniform(0.5, 4), rng.uniform(0, 2e-3)) for _ in range(30)]
    p = LatencyPredictor(L, seed=0, width=64).fit(np.concatenate([masks] * 30), np.concatenate([h for h, _ in pool]), np.concatenate([t for _, t in pool]), epochs=800)
    h, t = device(1.7, 1e-3)
    err = np.abs(p.predict(masks, h) - t) / t
    assert np.mean(err <= 0.10) >= 0.9, np.sort(err)[-5:]


# ---- the planner's predictors: lut and capacity (plugins/predictors/profiled.py) -----------------


def _job(tmp_path, overrides):
    from framework.job import Job

    return Job(compose_cfg(["tracking=none", "runtime.numerics=false", "model=mobilenetv2", "dataset=synthetic_cifar10",
                            "cluster=uniform", "cluster.num_devices=3", "train.batch_size=32", "train.iterations_per_epoch=2"] + overrides), tmp_path / "run")


def test_lut_sums_unit_times_and_is_exact_on_additive_devices(tmp_path):
    from framework.cluster import Work

    job = _job(tmp_path, ["predictor=lut", "cluster.device.call_overhead_s=1e-4"])
    dev = job.cluster.device("dev1")
    for a, b in [(0, 20), (3, 9), (19, 20)]:
        w = Work("fwd", a, b, 32)
        assert job.predictor.predict(dev, w) == pytest.approx(dev.time(w), rel=1e-12)
        assert job.predictor.predict(dev, w) == pytest.approx(sum(dev.time(Work("fwd", j, j + 1, 32)) for j in range(a, b)), rel=1e-12)


def test_capacity_scales_the_central_profile_by_one_ratio(tmp_path):
    """dev1 twice as slow as dev0 everywhere: the ratio is 2 and the prediction exact. dev2 slow
    only on depthwise convolutions: one ratio from its current sub-model spreads that over every
    unit, so some sub-models are predicted wrong, where the oracle is exact."""
    from framework.cluster import Work

    devices = {"dev1": {"slowdown": 2.0}, "dev2": {"kind_factors": {"depthwise": 6.0}}}
    job = _job(tmp_path, ["predictor=capacity", f"+cluster.devices={devices}".replace("'", "")])
    pred, d1, d2 = job.predictor, job.cluster.device("dev1"), job.cluster.device("dev2")
    assert pred.ratio(d1, 32) == pytest.approx(2.0)
    for a, b in [(0, 20), (4, 11)]:
        assert pred.predict(d1, Work("bwd", a, b, 32)) == pytest.approx(d1.time(Work("bwd", a, b, 32)), rel=1e-9)
    errors = [abs(pred.predict(d2, Work("fwd", a, b, 32)) / d2.time(Work("fwd", a, b, 32)) - 1) for a, b in [(0, 1), (1, 2), (19, 20), (0, 20)]]
    assert max(errors) > 0.2


def test_a_blind_predictor_plans_a_slower_pipeline(tmp_path):
    """The DP is only as good as its costs: on devices with per-kind speeds (fast links, so
    compute decides), the plans from capacity and FLOPs misplace a cut and their epochs (each
    simulated on the true device models) are slower than the oracle plan's."""
    devices = {"dev1": {"kind_factors": {"conv": 10.0, "depthwise": 4.0}}, "dev2": {"kind_factors": {"linear": 20.0, "pointwise": 0.5}}}
    over = [f"+cluster.devices={devices}".replace("'", ""), "scheduler=pipedream", "cluster.link.bandwidth_bps=1e12"]
    times = {}
    for p in ("oracle", "capacity", "flops"):
        job = _job(tmp_path / p, over + [f"predictor={p}"])
        job.run()
        times[p] = job.virtual_time
    assert times["oracle"] < times["capacity"] and times["oracle"] < times["flops"], times


def test_the_accept_predictor_plans_from_hardware_vectors_and_caches_its_training(tmp_path):
    """predictor=accept on LeNet: pre-trained on a small pool of simulated devices, it predicts
    the run's devices' sub-models from their measured representatives; a second job loads the
    cached weights and predicts the same."""
    from framework.cluster import Work

    over = ["predictor=accept", "predictor.pool=30", "predictor.epochs=400", f"predictor.cache_dir={tmp_path / 'cache'}", "model=lenet", "dataset=synthetic_mnist"]
    job = _job(tmp_path / "a", over)
    dev = job.cluster.device("dev1")
    works = [Work(k, a, b, 32) for a, b in ad.submodels(len(job.model)) for k in ("fwd", "bwd")]
    first = [job.predictor.predict(dev, w) for w in works]
    err = np.array([abs(p / dev.time(w) - 1) for p, w in zip(first, works)])
    assert np.median(err) < 0.25, np.sort(err)
    cached = sorted((tmp_path / "cache").glob("accept_*.safetensors"))
    assert len(cached) == 1  # one batch size trained (the planner's micro-batch); others are scaled
    again = _job(tmp_path / "b", over)
    assert [again.predictor.predict(again.cluster.device("dev1"), w) for w in works] == pytest.approx(first, rel=1e-6)
    assert sorted((tmp_path / "cache").glob("accept_*.safetensors")) == cached


def test_the_accept_predictor_prices_the_central_node_by_its_own_profile(tmp_path):
    """Eq. 9: the DP's first stage is the central node's profiled layers, summed; the MLP prices
    only the workers (Eq. 10). predictor.central=null gives the MLP the central node too."""
    from framework.cluster import Work

    over = ["predictor=accept", "predictor.pool=4", "predictor.epochs=10", f"predictor.cache_dir={tmp_path / 'cache'}", "model=lenet", "dataset=synthetic_mnist"]
    job = _job(tmp_path / "a", over)
    d0, d1 = job.cluster.device("dev0"), job.cluster.device("dev1")
    for a, b in [(0, 5), (1, 3)]:
        w = Work("bwd", a, b, 32)
        assert job.predictor.predict(d0, w) == pytest.approx(sum(d0.time(Work("bwd", j, j + 1, 32)) for j in range(a, b)), rel=1e-12)
    mlp_everywhere = _job(tmp_path / "b", over + ["predictor.central=null"])
    w = Work("fwd", 0, 5, 32)
    assert mlp_everywhere.predictor.predict(mlp_everywhere.cluster.device("dev0"), w) != pytest.approx(d0.time(w), rel=1e-6)
    assert mlp_everywhere.predictor.predict(mlp_everywhere.cluster.device("dev1"), w) == pytest.approx(job.predictor.predict(d1, w), rel=1e-9)


def test_a_measured_pool_pretrains_on_transforms_of_the_profile_table(tmp_path):
    """predictor.pool_table: the pool's devices are seeded transforms of the measured columns
    (accept_data.SyntheticDevice), every sub-model priced from the table; the cache key follows
    the table, and a table of another model is refused."""
    from framework.errors import ConfigError

    over = ["predictor=accept", "predictor.pool=3", "predictor.epochs=5", f"predictor.cache_dir={tmp_path / 'cache'}"]
    job = _job(tmp_path / "a", over + ["predictor.pool_table=accept_mobilenetv2_b128", "train.batch_size=128"])
    masks, hs, secs = job.predictor.pool_data(128)
    assert masks.shape == (3 * 210, 20) and hs.shape == (3 * 210, 10) and (secs > 0).all()
    from framework import profile_tables

    t = profile_tables.load("accept_mobilenetv2_b128")
    whole = [s for m, s in zip(masks, secs) if m.all()]
    assert min(whole) > 0.25 * min(t.iteration_seconds(c, 0, 20) for c in t.prefix)  # speeds 0.5-4x, kinds 0.6-1.7x of a measured column
    analytic = _job(tmp_path / "b", over + ["train.batch_size=128"])
    assert job.predictor._key(128) != analytic.predictor._key(128)
    with pytest.raises(ConfigError, match="prices 20 units, the model has 5"):  # the planner asks before anything runs
        _job(tmp_path / "c", over + ["predictor.pool_table=accept_mobilenetv2_b128", "model=lenet", "dataset=synthetic_mnist"])


def test_the_accept_preset_is_the_papers_run(tmp_path):
    """experiment=accept: MobileNetV2 at batch 128 on scenario 1, PipeDream's asynchronous 1F1B
    cut by the DP over the AccEPT predictor and MBQ sizes (2-bit forward, 8-bit backward first)."""
    from framework.job import Job

    cfg = compose_cfg(["experiment=accept", "tracking=none", "runtime.numerics=false", "train.iterations_per_epoch=3",
                       "predictor.pool=8", "predictor.epochs=30", f"predictor.cache_dir={tmp_path / 'cache'}"])
    assert (cfg.model.name, cfg.scheduler.name, cfg.scheduler.partition, cfg.predictor.name, cfg.compressor.name) == ("mobilenetv2", "pipedream", "dp", "accept", "mbq")
    assert cfg.cluster.name == "accept_s1" and cfg.train.batch_size == 128
    assert [list(x) for x in cfg.compressor.forward.schedule] == [[0, 2], [130, 3], [175, 4]]
    job = Job(cfg, tmp_path / "run")
    job.run()
    stages = job.scheduler.plan()["stages"]
    assert len(stages) == 3 and stages[0]["predicted_link_s"] > 0
    assert job.virtual_time > 0


def _fwd_bwd(predict, device, j):
    from framework.cluster import Work

    return sum(predict(device, Work(k, j, j + 1, 128)) for k in ("fwd", "bwd"))


def test_ftpipehds_ratio_misses_layers_whose_core_count_speed_up_differs(tmp_path):
    """Scenario 1's central node runs two cores and its workers one (Table 1); the profile measured
    here speeds a layer up on two cores by its own factor (a large early layer about 3x, the
    classifier 1.3x), so FTPipeHD's one ratio per worker, exact on the sub-model it measured, misses
    other layers, some by more than 20 % (the paper's Fig. 4: most, up to 187.51 %;
    experiments/accept_table5.py reports how many)."""
    from framework.job import Job

    job = Job(compose_cfg(["experiment=accept", "tracking=none", "runtime.numerics=false", "predictor=capacity"]), tmp_path / "run")
    pred, d0, d1 = job.predictor, job.cluster.device("dev0"), job.cluster.device("dev1")
    true = lambda d, w: d.time(w)  # noqa: E731
    a, b = pred._current(d1, 128)
    assert sum(_fwd_bwd(pred.predict, d1, j) for j in range(a, b)) == pytest.approx(sum(_fwd_bwd(true, d1, j) for j in range(a, b)), rel=1e-9)
    speed_up = np.array([_fwd_bwd(true, d1, j) / _fwd_bwd(true, d0, j) for j in range(len(job.model))])
    errors = np.array([abs(_fwd_bwd(pred.predict, d1, j) / _fwd_bwd(true, d1, j) - 1) for j in range(len(job.model))])
    assert speed_up.max() / speed_up.min() > 1.5, np.round(speed_up, 2)
    assert errors.max() > 0.2, np.round(errors, 2)
    # each layer's miss is its own d1/d0 ratio against the one FTPipeHD measured on the sub-model
    assert errors == pytest.approx(np.abs(pred.ratio(d1, 128) / speed_up - 1), rel=1e-9)


@pytest.mark.parametrize("scenario", ["accept_s1", "accept_s2"])
def test_ftpipehds_ratio_plans_the_exact_cuts_at_4_mbit(tmp_path, scenario):
    """At 4 Mbit/s compute decides the plan. Under the measured presets (per-unit profiles of one
    host, per-core CPU speeds) FTPipeHD's one ratio per worker misses single layers by up to
    45-61 %, but the DP on it (predictor=capacity) lands on the cuts of the DP on exact costs, so
    the two epochs are equal: the reason Table 5's LP column (1.05-1.48x) is not reproduced
    (docs/reproductions.md, AccEPT). A preset change that moves this moves that finding."""
    from framework.job import Job

    times, cuts = {}, {}
    for p in ("capacity", "oracle"):
        job = Job(compose_cfg(["experiment=accept", f"cluster={scenario}", "tracking=none", "runtime.numerics=false", "runtime.progress=false",
                               "compressor=none", "cluster.link.bandwidth_bps=4e6", f"predictor={p}"]), tmp_path / p)
        job.run()
        times[p], cuts[p] = job.virtual_time, [s["units"] for s in job.scheduler.plan()["stages"]]
    assert cuts["capacity"] == cuts["oracle"]
    assert times["capacity"] == pytest.approx(times["oracle"], rel=1e-9), times


@pytest.mark.slow  # pre-trains the AccEPT predictor once (minutes) and plays 8 epochs of 40 mini-batches
def test_the_table_5_study_prints_a_verdict_for_every_claim(tmp_path):
    """experiments/accept_table5.py --quick on scenario 1 at 0.25 and 4 Mbit/s: a two-sided
    verdict for every Table 5 number of those columns (4 times per mini-batch, 3 speed-ups each),
    the quoted speed-ups among them, the orderings, and the planning claims; the report holds the
    verdict table and the sensitivity plot. Hits or misses are the study's findings, not
    asserted here."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "experiments" / "accept_table5.py"), "--quick", "--scenario", "accept_s1", "--bandwidths", "0.25", "4",
                        "--out", str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    verdicts = json.loads((tmp_path / "results.json").read_text())["verdicts"]
    what = [v["what"] for v in verdicts]
    for bw in ("0.25", "4"):
        assert sum(w.startswith(f"S1 {bw} Mbit/s") and w.endswith("s per mini-batch") for w in what) == 4
        assert sum(w.startswith(f"S1 {bw} Mbit/s: FTPipeHD / ") and "quoted" not in w for w in what) == 3
    assert sum("(quoted)" in w for w in what) == 3  # AccEPT's 3.01 and BLC's 2.84 at 0.25, LP's 1.15 at 4
    assert any(w.startswith("S1: AccEPT the fastest") for w in what) and any("Table 4.2.2" == v["source"] for v in verdicts)
    assert all(isinstance(v["hit"], bool) and v["paper"] is not None for v in verdicts)
    report = (tmp_path / "report.md").read_text()
    assert "## Verdicts" in report and f"{sum(v['hit'] for v in verdicts)} of {len(verdicts)} claims hit" in report
    assert (tmp_path / "speedup_vs_bandwidth.png").stat().st_size > 0


@pytest.mark.slow  # three role processes over a real mosquitto (13 s)
def test_the_accept_run_on_real_processes_equals_the_simulator(tmp_path):
    """experiment=accept on runtime=local: the coordinator plans once (the predictor trains there),
    the three stages run as processes over MQTT with MBQ on every link, and the float64 weights are
    the simulator's, bit for bit."""
    import shutil

    from framework.job import Job

    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto not installed (bash setup.sh)")
    base = ["experiment=accept", "tracking=none", "runtime.progress=false", "train.iterations_per_epoch=3", "train.batch_size=16", "dataset.n_val=32",
            "dataset.n_test=32", "runtime.dtype=float64", "predictor.pool=8", "predictor.epochs=30", f"predictor.cache_dir={tmp_path / 'cache'}",
            "cluster.link.bandwidth_bps=4e6"]
    out = {}
    for rt, extra in (("sim", []), ("local", ["runtime=local", "transport=mqtt"])):
        job = Job(compose_cfg(base + extra), tmp_path / rt)
        job.run()
        out[rt] = ([s["units"] for s in job.scheduler.plan()["stages"]], job.final_model().state_dict())
    assert out["sim"][0] == out["local"][0]
    a, b = out["sim"][1], out["local"][1]
    assert all(torch.equal(a[k], b[k]) for k in a)
