"""PiPar and its baselines: exact updates, the Table I estimator against the simulator, selection,
disconnects, DP, re-selection and the headline command."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch

from framework.errors import ConfigError
from framework.job import Job
from plugins.schedulers.pipar import plan as pp
from plugins.schedulers.pipar.search import exhaustive, trial_iteration
from tests.conftest import compose_cfg

# exact comparisons of weights; the epoch-end evaluations are no part of them (small val/test sets:
# the default 1,000 samples each cost VGG-5 in float64 1.3 s per evaluation)
F64 = ["runtime.dtype=float64", "model=vgg5", "model.batchnorm=false", "dataset=synthetic_mnist", "cluster=pipar_wifi", "dataset.n_val=16", "dataset.n_test=16"]


def make_job(tmp_path, overrides):
    return Job(compose_cfg(overrides), tmp_path)


# ---- the DAG ---------------------------------------------------------------------------------


def forward_recursion(t: pp.StageTimes, n: int) -> float:
    """The notes' O(N) recursion (section 2.5), an independent statement of Table I."""
    fc, u, fs, bs, d = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for i in range(n):
        fc[i] = (fc[i - 1] if i else 0) + t.fc
        u[i] = max(fc[i], u[i - 1] if i else 0) + t.u
        fs[i] = max(u[i], bs[i - 1] if i else 0) + t.fs
        bs[i] = fs[i] + t.bs
        d[i] = max(bs[i], d[i - 1] if i else 0) + t.d
    bc = fc[n - 1]
    for i in range(n):
        bc = max(bc, d[i]) + t.bc
    return bc


def test_table1_dag_matches_the_recursion_and_collapses_to_the_stage_sum_at_n1():
    rng = random.Random(0)
    for _ in range(200):
        t = pp.StageTimes(*(rng.uniform(0.01, 2.0) for _ in range(6)))
        n = rng.randint(1, 25)
        assert pp.dag_makespan(t, n) == pytest.approx(forward_recursion(t, n), rel=1e-12)
        assert pp.dag_makespan(t, 1) == pytest.approx(t.fc + t.u + t.fs + t.bs + t.d + t.bc, rel=1e-12)
    # the authors' code's DAG lets d_n overtake d_{n-1}: never longer, and shorter when downloads queue
    t = pp.StageTimes(fc=0.1, bc=0.1, fs=0.05, bs=0.05, u=0.1, d=1.0)
    assert pp.dag_makespan(t, 8, "code_legacy") < pp.dag_makespan(t, 8)


def test_closed_form_n_fills_the_device_gap_and_the_clamps_snap():
    t = pp.StageTimes(fc=1.0, bc=2.0, fs=0.5, bs=0.5, u=3.0, d=1.0)
    assert pp.closed_form_n(t) == 1 + math.ceil(5.0 / 1.0)
    assert pp.clamp_n(12, 100, True) == 12 and 100 // 12 == 8  # B' = 8, 12 x 8 = 96 samples
    assert pp.clamp_n(30, 100, True) == 33  # 100 // (100 // 30) = 100 // 3
    assert pp.clamp_n(80, 100, True) == 50  # at most B/2
    assert pp.clamp_n(80, 100, False) == 80


@pytest.mark.parametrize("latency", [0.0, 0.003])
def test_table1_estimate_equals_the_simulated_iteration(tmp_path, latency):
    """Stage times priced as the run prices them (select=auto's model: each micro-batch at its
    own size, real packet sizes): the critical path of Table I is the simulator's iteration time,
    N = 1..20."""
    ov = ["scheduler=pipar", "scheduler.P=2", "scheduler.N=1", "runtime.numerics=false", "train.batch_size=100", "model=vgg5", "dataset=synthetic_mnist", "cluster=pipar_4g", f"cluster.link.latency_s={latency}", "cluster.num_devices=1"]
    job = make_job(tmp_path, ov)
    sched = job.scheduler
    pair = sched.planner.pair_model(0, model="auto")
    assert pair.lat_up == latency
    for P in (1, 3):
        for n in range(1, 21):
            b = 100 // n
            est = pp.dag_makespan(pair.stage_times(P, b), n)
            sim = trial_iteration(sched.planner, 0, P, n)
            assert sim == pytest.approx(est, rel=1e-9), (P, n)


# ---- exactness -------------------------------------------------------------------------------


def reference_sgd(model, batches, train):
    """Plain mini-batch SGD (momentum) of the unsplit model, loss = mean cross-entropy."""
    opt = torch.optim.SGD(model.parameters(), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def max_diff(a, b) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("P", [1] + [pytest.param(p, marks=pytest.mark.slow) for p in (2, 3, 4)])
def test_pipar_iterations_equal_full_batch_sgd(tmp_path, P):
    """Two PiPar iterations (so momentum matters) equal two full-batch SGD-momentum steps of
    the unsplit model, for every N that divides B = 100."""
    for N in (1, 2, 4, 5, 10):
        ov = F64 + ["scheduler=pipar", f"scheduler.P={P}", f"scheduler.N={N}", "cluster.num_devices=1", "train.batch_size=100", "dataset.n_train=200", "train.epochs=1", "train.lr=0.05"]
        job = make_job(tmp_path, ov)
        init = copy.deepcopy(job.model)
        its = job.scheduler.iteration_batches(0, 0)
        assert len(its) == 2 and all(len(xs) == N and sum(len(x) for x in xs) == 100 for xs, _ in its)
        job.train()
        ref = reference_sgd(init, [(torch.cat(xs), torch.cat(ys)) for xs, ys in its], job.cfg.train)
        assert max_diff(job.final_model(), ref) <= 1e-10, (P, N)


def fedavg_reference(job, ks, epoch=0):
    """Each device in `ks` trains its own copy from the initial model; average weighted by samples."""
    init = copy.deepcopy(job.model)
    models, weights = [], []
    for k in ks:
        its = job.scheduler.iteration_batches(k, epoch)
        models.append(reference_sgd(copy.deepcopy(init), [(torch.cat(xs), torch.cat(ys)) for xs, ys in its], job.cfg.train))
        weights.append(sum(len(y) for _, ys in its for y in ys))
    avg = copy.deepcopy(init)
    with torch.no_grad():
        for i, p in enumerate(avg.parameters()):
            p.copy_(sum(w * list(m.parameters())[i] for w, m in zip(weights, models)) / sum(weights))
    return avg


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int64])
def test_fedavg_is_the_weighted_sum_term_by_term(dtype):
    """FedAvg's K models as one stacked float64 tensor and one multi-tensor multiply (a few
    kernel launches on a GPU, not 2K) gives, bit for bit, the float64 sum of n_k / n x w_k taken
    term by term in the models' order (signed zeros included); mixed dtypes too."""
    from plugins.schedulers.pipar.fedavg import fedavg

    g = torch.Generator().manual_seed(0)
    for k in (1, 3, 64):
        models = [{"p": (torch.randn(257, generator=g) * 1e3).to(dtype), "b": torch.tensor([-0.0, 1e-30, 3.0]).to(dtype)} for _ in range(k)]
        if k == 3:
            models[1]["p"] = models[1]["p"].to(torch.float64 if dtype != torch.float64 else torch.float32)
        counts = [int(c) for c in torch.randint(1, 300, (k,), generator=g)]
        got = fedavg(models, counts)
        for key in ("p", "b"):
            want = torch.zeros(models[0][key].shape, dtype=torch.float64)
            for m, n in zip(models, counts):
                want += (float(n) / sum(counts)) * m[key].to(torch.float64)
            want = want.to(models[0][key].dtype)
            assert got[key].dtype == want.dtype and torch.equal(got[key], want), (k, key)
            if want.is_floating_point():
                assert torch.equal(torch.signbit(got[key]), torch.signbit(want))


def test_fl_equals_fedavg_of_locally_trained_models(tmp_path):
    ov = F64 + ["scheduler=fl", "cluster.num_devices=4", "train.batch_size=50", "dataset.n_train=430", "train.epochs=1"]
    job = make_job(tmp_path, ov)
    assert [len(s) for s in job.scheduler.shards] == [108, 108, 107, 107]
    ref = fedavg_reference(job, range(4))
    job.train()
    assert max_diff(job.final_model(), ref) <= 1e-10


def test_sfl_n1_equals_fl_and_pipar_matches_fl_per_round(tmp_path):
    """Splitting changes nothing (Eq. 24): SFL at any P and PiPar with N micro-batches of B/N
    give the same FedAvg round as FL."""
    base = F64 + ["cluster.num_devices=3", "train.batch_size=20", "dataset.n_train=120", "train.epochs=1"]
    fl = make_job(tmp_path, base + ["scheduler=fl"])
    ref = fedavg_reference(fl, range(3))
    for extra in (["scheduler=sfl", "scheduler.P=3"], ["scheduler=pipar", "scheduler.P=2", "scheduler.N=4"], ["scheduler=pipar", "scheduler.P=1", "scheduler.N=5", "scheduler.server_mode=sequential"]):
        job = make_job(tmp_path, base + extra)
        job.train()
        assert max_diff(job.final_model(), ref) <= 1e-10, extra


def test_a_device_that_drops_out_is_left_out_and_rejoins_with_the_global_model(tmp_path):
    ov = F64 + ["scheduler=pipar", "scheduler.P=2", "scheduler.N=2", "cluster.num_devices=3", "train.batch_size=20", "dataset.n_train=120", "train.epochs=1", "scheduler.failures=[[1,0]]"]
    job = make_job(tmp_path, ov)
    ref = fedavg_reference(job, [0, 2])
    job.train()
    assert max_diff(job.final_model(), ref) <= 1e-10
    assert max_diff(job.runtime.roles["dev1"].model.units[:2], job.final_model().units[:2]) == 0.0  # its part, P = 2  # rejoined with the latest global model
    links = job.runtime.timeline.link_stats()
    assert "dev1->server" not in links or links["dev1->server"]["bytes"] == 0
    assert links["server->dev1"]["bytes"] > 0


def test_a_mid_epoch_dropout_trains_then_is_excluded(tmp_path):
    ov = ["scheduler=pipar", "scheduler.P=1", "scheduler.N=2", "cluster.num_devices=2", "train.batch_size=20", "dataset.n_train=200", "train.epochs=2", "scheduler.failures=[[0,0,2]]", "model=vgg5", "cluster=pipar_wifi"]
    job = make_job(tmp_path, ov)
    job.train()
    # dev0 ran 2 of its 5 iterations in epoch 0 and all 5 in epoch 1; dev1 ran 5 + 5
    assert job.iterations == 2 + 5 + 5 + 5
    assert math.isfinite(job._final["val/acc"])


def test_dp_noise_perturbs_only_uploaded_device_models_and_costs_device_time(tmp_path):
    base = F64 + ["cluster.num_devices=2", "train.batch_size=20", "dataset.n_train=80", "train.epochs=1", "scheduler.P=1", "scheduler.N=2", "scheduler=pipar"]
    clean = make_job(tmp_path, base)
    clean.train()
    noisy = make_job(tmp_path, base + ["scheduler.dp_sigma=0.01"])
    noisy.train()
    a, b = clean.final_model(), noisy.final_model()
    dev_diff = max(float((p - q).abs().max()) for p, q in zip(a.units[0].parameters(), b.units[0].parameters()))
    srv_diff = max(float((p - q).abs().max()) for p, q in zip(a.units[1:].parameters(), b.units[1:].parameters()))
    assert 1e-4 < dev_diff < 0.1 and srv_diff == 0.0
    kinds = {iv.kind for iv in noisy.runtime.timeline.intervals}
    assert "dp_noise" in kinds and noisy.virtual_time > clean.virtual_time


# ---- selection -------------------------------------------------------------------------------


def selected(tmp_path, cluster, extra=()):
    job = make_job(tmp_path, ["scheduler=pipar", "runtime.numerics=false", "model=vgg5", "dataset=synthetic_cifar10", "train.batch_size=100", f"cluster={cluster}", *extra])
    return job, job.scheduler.plans[0]


def test_auto_selection_picks_n_that_falls_as_bandwidth_rises(tmp_path):
    ns = [selected(tmp_path, c)[1] for c in ("pipar_4g", "pipar_4gplus", "pipar_wifi")]
    assert [p.P for p in ns] == [1, 1, 1]
    assert ns[0].N > ns[1].N > ns[2].N


def test_auto_selection_finds_the_exhaustive_split_point_cheaply(tmp_path):
    """The default selection picks the exhaustive search's split point at the cost of one
    profiling iteration, and its estimate is the trial's time (both price the run as it runs;
    select=paper's score is measured and reported by experiments/pipar_study.py)."""
    job, auto = selected(tmp_path, "pipar_4g", ["dataset=synthetic_mnist"])
    sched = job.scheduler
    best, trials = exhaustive(sched.planner, 0, sched.p_range())
    assert len(trials) == len(sched.p_range()) * 100
    by = {(t["P"], t["N"]): t for t in trials}
    t_auto = by[(auto.P, auto.N)]["epoch_s"]
    assert auto.P == best["P"]
    assert by[(auto.P, auto.N)]["iter_s"] == pytest.approx(auto.predicted_iter_s, rel=1e-9)  # the estimate is exact here
    assert sched.search_virtual_s < 0.6 * t_auto  # profiling costs well under one epoch
    assert sum(t["iter_s"] for t in trials) > 100 * sched.search_virtual_s


def test_call_overhead_makes_small_batches_dearer_per_sample(tmp_path):
    from framework.cluster import Work

    job = make_job(tmp_path, ["model=vgg5", "cluster=pipar_4g", "cluster.device.call_overhead_s=0.001"])
    dev = job.cluster.device("dev0")
    s = dev.cfg.slowdown
    t1, t64 = dev.time(Work("fwd", 0, 2, 1)), dev.time(Work("fwd", 0, 2, 64))
    assert t64 - 64 * (t1 - s * 0.002) == pytest.approx(s * 0.002, rel=1e-9)  # slowdown x 2 units x 1 ms


def test_exhaustive_selection_and_the_plan_in_summary(tmp_path):
    job = make_job(tmp_path, ["scheduler=pipar", "scheduler.select=exhaustive", "scheduler.P=1", "runtime.numerics=false", "model=vgg5", "train.batch_size=40", "cluster=pipar_4g", "train.epochs=1", "cluster.num_devices=2"])
    job.out_dir.mkdir(parents=True, exist_ok=True)
    summary = job.run()
    plan = summary["plan"]
    assert plan["P"] == 1 and 1 <= plan["N"] <= 40 and plan["select"] == "exhaustive"
    assert plan["search_s"] > 10 * plan["predicted_iter_s"]  # 40 trial iterations
    assert set(summary["idle"]) >= {"server_s", "device_mean_s"}
    assert summary["idle"]["server_s"] > 0 and summary["metrics"]["plan/N"] == plan["N"]
    on_disk = json.loads((tmp_path / "plan.json").read_text())
    assert len(on_disk["shortlist_dev0"]) == 40


def test_heterogeneous_devices_get_their_own_plans(tmp_path):
    job = make_job(tmp_path, ["scheduler=pipar", "runtime.numerics=false", "model=vgg5", "dataset=synthetic_cifar10", "train.batch_size=100", "cluster=pipar_4g_hetero"])
    plans = job.scheduler.plans
    devs = job.cluster.devices
    assert devs["dev1"].cfg.slowdown == 2 * devs["dev0"].cfg.slowdown
    assert (plans[0].P, plans[0].N) == (plans[2].P, plans[2].N)
    assert (plans[1].P, plans[1].N) != (plans[0].P, plans[0].N)
    assert plans[1].predicted_iter_s > plans[0].predicted_iter_s


def test_bandwidth_change_triggers_reselection_at_the_next_epoch(tmp_path):
    from omegaconf import open_dict

    ov = ["scheduler=pipar", "runtime.numerics=false", "model=vgg5", "dataset=synthetic_cifar10", "train.batch_size=100", "cluster=pipar_wifi", "cluster.num_devices=2", "dataset.n_train=1000", "train.epochs=3"]
    cfg = compose_cfg(ov)
    with open_dict(cfg):  # dev0's uplink drops from WiFi to 10 Mbit/s after 1 virtual second
        cfg.cluster.links["dev0->server"] = {"trace": [[0.0, 50e6], [1.0, 10e6]]}
    job = Job(cfg, tmp_path)
    n0 = job.scheduler.plans[0].N
    job.train()
    roles = job.runtime.roles  # each role keeps its own plan; the server role re-planned dev0
    re = roles["srv0"].reselections + roles["srv1"].reselections
    assert [r["device"] for r in re] == [0]
    assert re[0]["new"][1] > n0 and roles["dev0"].plan.N > roles["dev1"].plan.N == n0
    assert "profile" in {iv.kind for iv in job.runtime.timeline.intervals}


# ---- errors and the headline command ----------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["scheduler=pipar", "cluster=uniform"], "cluster"),
        (["scheduler=pipar", "scheduler.N=500"], "scheduler.N"),
        (["scheduler=pipar", "scheduler.P=9"], "scheduler.P"),
        (["scheduler=pipar", "scheduler.server_mode=fast"], "scheduler.server_mode"),
        (["scheduler=fl", "scheduler.P=2"], "scheduler.P"),
        (["scheduler=sfl", "scheduler.N=4"], "scheduler.N"),
        (["scheduler=pipar", "scheduler.failures=[[7,0]]"], "scheduler.failures[0]"),
        (["scheduler=pipar", "scheduler.microbatches=4"], "scheduler.microbatches"),
    ],
)
def test_bad_collaborative_configs_name_the_key(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as e:
        make_job(tmp_path, overrides)
    assert e.value.key == key


@pytest.mark.slow  # two VGG-5 runs with numerics (about 13 s)
def test_mbq_uploads_fewer_bytes_and_shortens_the_epoch_on_4g(tmp_path):
    out = {}
    for c in ("none", "mbq"):
        job = make_job(tmp_path / c, ["scheduler=pipar", f"compressor={c}", "cluster=pipar_4g", "train.epochs=1"])
        job.train()
        up = sum(st["bytes"] for name, st in job.runtime.timeline.link_stats().items() if name.endswith("->server"))
        out[c] = (up, job.history["time/epoch_virtual_s"][0])
    assert out["mbq"][0] < 0.8 * out["none"][0]
    assert out["mbq"][1] < out["none"][1]


def test_sl_trains_devices_in_turn_and_equals_sequential_sgd(tmp_path):
    """Vanilla SL is plain SGD over dev0's batches, then dev1's (without momentum, which each
    device keeps for its own part)."""
    job = make_job(tmp_path, F64 + ["scheduler=sl", "scheduler.P=2", "cluster.num_devices=2", "dataset.n_train=80", "train.batch_size=20", "train.epochs=1", "train.momentum=0"])
    init = copy.deepcopy(job.model)
    seq = [(torch.cat(xs), torch.cat(ys)) for k in (0, 1) for xs, ys in job.scheduler.iteration_batches(k, 0)]
    job.train()
    assert max_diff(job.final_model(), reference_sgd(init, seq, job.cfg.train)) <= 1e-10
    tl = job.runtime.timeline
    fwd = {r: [iv.start for iv in tl.intervals if iv.resource == r and iv.kind == "fwd"] for r in ("dev0", "dev1")}
    assert max(fwd["dev0"]) < min(fwd["dev1"]) and len(fwd["dev0"]) == len(fwd["dev1"]) == 2


def test_sl_server_labels_each_reply_with_the_devices_own_iteration(tmp_path):
    """The server answers device k with k's iteration numbers, as k labels what it sends: an
    error-feedback compressor pairs each gradient with its activation by that label. Labelled
    with one count over all devices, device 1's and 2's gradients paired with nothing, their
    corrections were lost, and the checkpoint refused the compressor's unmatched state."""
    job = make_job(tmp_path, ["scheduler=sl", "compressor=minmax_ef", "model=mlp", "dataset=synthetic_mnist", "cluster=pipar_wifi",
                              "cluster.num_devices=3", "dataset.n_train=180", "train.batch_size=20", "train.epochs=2", "dataset.n_val=16", "dataset.n_test=16"])
    job.train()  # checkpoints after each epoch
    fwd = {}
    for iv in sorted(job.runtime.timeline.intervals, key=lambda iv: iv.start):
        if iv.kind == "fwd":
            fwd.setdefault(iv.resource, []).append(iv.iteration)
    devices = [fwd[f"dev{k}"] for k in range(3)]
    assert all(d == list(range(6)) for d in devices)  # three iterations a device, two epochs
    turns = [its[e * 3 : e * 3 + 3] for e in range(2) for its in devices]  # the server serves them in turn
    assert fwd["server"] == [i for turn in turns for i in turn]


def test_model_vectors_are_copies_laid_end_to_end_and_load_back():
    """A split model's flat vectors (what FedAvg averages and links carry): the units' float
    parameters and buffers end to end, copies of them (a later update does not show, also for a
    range of one tensor), loaded back exactly; a vector of the wrong length is refused."""
    from framework.models import UnitModel, build_model, clone_module
    from plugins.schedulers.pipar.model_vectors import UnitLayout

    cfg = compose_cfg(["model=vgg5", "dataset=synthetic_cifar10"])
    model = build_model(cfg.model, (3, 32, 32), 10)
    layout = UnitLayout(model)
    L = len(model)
    whole = layout.flat(model, 0, L, torch.float32, True)
    parts = [layout.flat(model, a, b, torch.float32, True) for a, b in ((0, 2), (2, L))]
    for what in ("p", "b"):
        assert torch.equal(whole[what], torch.cat([p[what] for p in parts]))
        want = [t for u in model.units for t in (u.parameters() if what == "p" else u.buffers()) if t.is_floating_point()]
        assert torch.equal(whole[what], torch.cat([t.reshape(-1) for t in want]))
    tiny = UnitModel("tiny", [("fc", torch.nn.Linear(4, 3, bias=False)), ("bn", torch.nn.BatchNorm1d(3))], (4,), 3)
    single = UnitLayout(tiny).flat(tiny, 0, 1, torch.float32, True)  # one tensor: flattening alone would alias it
    assert single["p"].numel() == 12 and single["b"].numel() == 0
    before = single["p"].clone()
    with torch.no_grad():
        tiny.units[0].weight.add_(1.0)
    assert torch.equal(single["p"], before)
    other = clone_module(model)
    with torch.no_grad():
        for t in [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]:
            t.add_(1.0)
    assert not any(torch.equal(layout.flat(model, 0, L, torch.float32, True)[k], whole[k]) for k in whole)
    layout.load(other, 0, L, layout.flat(model, 0, L, torch.float32, True))
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), model.state_dict().values()))
    with pytest.raises(ValueError, match="units"):
        layout.load(other, 0, L, {"p": whole["p"][:-1], "b": whole["b"]})


# ---- roles from their specs ----------------------------------------------------------------------


def _no_scheduler_in(obj, sched, depth: int = 2, path: str = "role") -> None:
    """Nothing `obj` holds, `depth` attribute levels down (containers looked into on the way), is
    the scheduler, a Scheduler or a method bound to one."""
    from framework.scheduler import Scheduler

    seen: set[int] = set()

    def walk(v, level: int, where: str) -> None:
        if id(v) in seen or isinstance(v, (str, bytes, int, float, bool, torch.Tensor)) or v is None:
            return
        seen.add(id(v))
        assert v is not sched and not isinstance(v, Scheduler), where
        assert getattr(v, "__self__", None) is not sched, f"{where} is bound to the scheduler"
        if isinstance(v, dict):
            for key, x in v.items():
                walk(x, level, f"{where}[{key!r}]")
        elif isinstance(v, (list, tuple, set, frozenset)):
            for i, x in enumerate(v):
                walk(x, level, f"{where}[{i}]")
        elif level < depth and hasattr(v, "__dict__"):
            for name, x in vars(v).items():
                walk(x, level + 1, f"{where}.{name}")

    walk(obj, 0, path)


@pytest.mark.parametrize("overrides", [
    ["scheduler=pipar", "scheduler.shard=dirichlet", "scheduler.failures=[[1,0,1]]", "scheduler.dp_sigma=0.1", "scheduler.dp_clip=2.0"],
    ["scheduler=pipar", "scheduler.server_mode=sequential", "scheduler.P=1", "scheduler.N=2"],
    ["scheduler=fl"],
    ["scheduler=sfl", "scheduler.server_model=shared", "scheduler.P=1"],
    ["scheduler=sl", "scheduler.P=1"],
], ids=["pipar", "pipar_sequential", "fl", "sfl_shared", "sl"])
def test_every_role_is_built_from_its_spec_as_shipped_and_holds_no_scheduler(tmp_path, overrides):
    """What a role process does: the spec's JSON in, the role out; the role keeps its spec and the
    run's parts, nothing of the scheduler; the spec survives JSON unchanged."""
    from plugins.schedulers.pipar import specs

    job = make_job(tmp_path, ["model=mlp", "dataset=synthetic_mnist", "cluster=pipar_wifi", "cluster.num_devices=3", "dataset.n_train=120", "train.batch_size=20", *overrides])
    sched = job.scheduler
    roles = sched.role_devices()
    for r in roles:
        spec = sched.role_spec(r)
        assert isinstance(spec, specs.CollabRoleSpec) and (spec.role, spec.device) == (r, roles[r])
        assert type(spec).from_json(spec.to_json()) == spec
        role = sched.role_from_spec(r, json.loads(json.dumps(spec.to_json())))
        assert role.spec == spec and role.device == roles[r]
        _no_scheduler_in(role, sched, path=r)
        if isinstance(spec, specs.DeviceSpec):  # its shard, as data, is the scheduler's
            assert torch.equal(spec.shard.tensor(), sched.shards[spec.k]) and spec.plan == sched.plans[spec.k].lean()
    plan = sched.plan()
    assert specs.CollabPlan.from_json(json.loads(json.dumps(plan))).to_json() == plan  # plan.json, typed and back
    with pytest.raises(KeyError):
        sched.role_spec("dev9")
