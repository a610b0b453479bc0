"""The feature-replay study's runs (experiments/feature_replay_study.py): each part returns JSON.

Timing parts run ResNet-50 on the paper's measured profile tables (Pi 4B / TX2 + RTX 2080 Ti),
timing only, with the replay's forward charged (the presets' setting); accuracy parts train
VGG-5 with BN on real Fashion-MNIST. Everything is on the virtual clock, so deterministic.
"""

from __future__ import annotations

import gc
import statistics
from pathlib import Path

from experiments.study_runs import run_job
from framework.config.knobs import choices
from plugins.schedulers.feature_replay.schema import FeatureReplayConfig

MB = 1 << 20
FAST = ["tracking=none", "runtime.progress=false"]
FIXED_CUT = ["scheduler.cut=1", "scheduler.adaptive=false"]
PI = ["experiment=feature_replay_pi"]
TX2 = ["experiment=feature_replay_tx2"]
DEVICES = {"pi4b": PI, "tx2": TX2}
POLICIES = choices(FeatureReplayConfig, "staleness_policy")

# (label, overrides, link MiB/s up/down or None for the preset's, the notes' section 4.3 numbers:
# serial s, K = 5 s, speed-up, edge-only s, saving; computed with the replay not charged)
LATENCY_CASES = [
    ("Pi 4B, cut 1, 8-bit, 5/10 MB/s", PI, None, (210.7, 81.3, 2.59, 4847, 0.983)),
    ("Pi 4B, cut 1, fp32, 5/10 MB/s", PI + ["compressor=none"], None, (306.0, 161.5, 1.90, 4847, 0.967)),
    ("TX2, cut 1, 8-bit, 12.5/25 MB/s", TX2, None, (81.4, 32.5, 2.51, 123.9, 0.738)),
]
LINK_BOUND = ("TX2, cut 1, fp32, 5/10 MB/s", TX2 + ["compressor=none"], (5.0, 10.0))  # the notes' AC-2 staleness case (Fig. 21)
# the planner grid: the Pi preset (P1 the bottleneck) and a link-bound TX2 with a 20 ms latency
PLANNER_CASES = [("Pi 4B, 8-bit, 5/10 MB/s", PI, None), ("TX2, fp32, 5/10 MB/s, 20 ms", TX2 + ["compressor=none", "cluster.link.latency_s=0.02"], (5.0, 10.0))]


def run(overrides: list[str], out: Path, rates: tuple[float, float] | None = None) -> dict:
    """One run as `python -m framework <overrides>` would make it, with the edge's links at
    `rates` (MiB/s up, down) when given (the downlink's key, `links.cloud->dev0`, cannot be
    written on a command line); its summary with the plan. A finished Job is left in reference
    cycles that hold its model (ResNet-50: ~100 MB), which Python's collector reaches only now
    and then, so hundreds of runs in one process collect after each."""
    try:
        return _run(overrides, out, rates)
    finally:
        gc.collect()


def _run(overrides: list[str], out: Path, rates: tuple[float, float] | None) -> dict:
    if rates is None:
        return run_job(FAST + overrides, out)
    from hydra import compose, initialize_config_dir

    from framework import registry
    from framework.cli import CONF_DIR
    from framework.job import Job

    registry.load_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=FAST + overrides)
    cfg.cluster.link.bandwidth_bps = rates[0] * 8 * MB
    cfg.cluster.links["cloud->dev0"].bandwidth_bps = rates[1] * 8 * MB
    job = Job(cfg, out)
    summary = job.run()
    summary["plan"] = job.scheduler.plan()
    return summary


def timing(s: dict) -> dict:
    """What the timing parts keep of a run."""
    p, fr = s["plan"], s["feature_replay"]
    hist = s["staleness"].get("histogram", {})
    return {"virtual_s": s["virtual_time_s"], "planned_s": p["predicted_epoch_s"]["planned"], "eq12_s": p["predicted_epoch_s"]["grouped_eq12"],
            "serial_eq10_s": p["predicted_epoch_s"]["serial_eq10"], "over_planned": s["prediction"]["epoch_over_predicted"],
            "staleness_mean": s["staleness"]["mean"], "staleness_mode": int(max(hist, key=lambda k: (hist[k], -int(k)))) if hist else None,
            "discarded": fr["discarded_gradients"], "cut": p["cut"], "cut_by_cost_model": p.get("cut_by_cost_model", {}), "module_times_s": p["module_times_s"]}


def part_latency(out: Path) -> dict:
    """Serial (K = 0), K = 5, no bound and edge-only per case, the replay charged; for the Pi
    8-bit case also the official cost model's accounting (`price_replay=false`), which at K = 0
    is a serial edge that keeps its graph and has nothing to replay."""
    res = {}
    for n, (label, over, rates, ref) in enumerate(LATENCY_CASES):
        row = {"ref": dict(zip(("serial_s", "k5_s", "speedup", "edge_only_s", "saving"), ref))}
        runs = {"serial": ["scheduler.K=0"], "k5": ["scheduler.K=5"], "unbounded": ["scheduler.K=null"], "edge_only": ["scheduler=edge_only", "scheduler.cut=null"]}
        if n == 0:
            runs |= {"serial_uncharged": ["scheduler.K=0", "scheduler.price_replay=false"], "k5_uncharged": ["scheduler.K=5", "scheduler.price_replay=false"]}
        for name, extra in runs.items():
            row[name] = timing(run(over + FIXED_CUT + extra, out / "runs" / f"latency{n}_{name}", rates))
        row["speedup"] = row["serial"]["virtual_s"] / row["k5"]["virtual_s"]
        row["full_speedup"] = row["serial"]["virtual_s"] / row["unbounded"]["virtual_s"]
        row["saving"] = 1 - row["k5"]["virtual_s"] / row["edge_only"]["virtual_s"]
        if n == 0:
            row["speedup_uncharged"] = row["serial_uncharged"]["virtual_s"] / row["k5_uncharged"]["virtual_s"]
            row["speedup_vs_graph_keeping_serial"] = row["serial_uncharged"]["virtual_s"] / row["k5"]["virtual_s"]
        res[label] = row
        print(f"latency {label}: serial {row['serial']['virtual_s']:.1f} s, K=5 {row['k5']['virtual_s']:.1f} s ({row['speedup']:.2f}x), "
              f"edge-only {row['edge_only']['virtual_s']:.0f} s", flush=True)
    label, over, rates = LINK_BOUND
    res["link_bound"] = {"label": label, "k5": timing(run(over + FIXED_CUT + ["scheduler.K=5"], out / "runs" / "latency_linkbound", rates))}
    return res


def part_planner(out: Path, ks: list) -> dict:
    """The plan's predicted epoch against the simulated one, for every staleness policy, K and
    pricing of the replay; Eq. 12's prediction beside it. The Pi case's `block` rows are the
    staleness sensitivity of the headline."""
    rows = []
    for c, (label, over, rates) in enumerate(PLANNER_CASES):
        for price in (True, False):
            for policy in POLICIES:
                for K in ks:
                    extra = [f"scheduler.K={'null' if K is None else K}", f"scheduler.staleness_policy={policy}", f"scheduler.price_replay={str(price).lower()}"]
                    t = timing(run(over + FIXED_CUT + extra, out / "runs" / f"planner{c}_{policy}_{K}_{price}", rates))
                    rows.append({"case": label, "policy": policy, "K": K, "replay_charged": price, **t})
        worst = max(abs(r["over_planned"] - 1) for r in rows if r["case"] == label)
        print(f"planner {label}: worst |simulated / planned - 1| = {worst:.4f}", flush=True)
    return {"rows": rows, "ks": ks}


def part_bandwidth(out: Path, rates: list[float]) -> dict:
    """The headline against the link: per uplink rate r (downlink 2r), the engine's cut and its
    K = 5 epoch, JointDNN's (the serial argmin) and edge-only's, for the Pi and the TX2."""
    res = {}
    for dev, over in DEVICES.items():
        edge_only = timing(run(over + ["scheduler=edge_only"], out / "runs" / f"bw_{dev}_edge_only"))["virtual_s"]
        pts = []
        for r in rates:
            fr = timing(run(over + ["scheduler.adaptive=false", "scheduler.K=5"], out / "runs" / f"bw_{dev}_{r}_fr", (r, 2 * r)))
            jd = timing(run(over + ["scheduler=jointdnn"], out / "runs" / f"bw_{dev}_{r}_jointdnn", (r, 2 * r)))
            pts.append({"up_MiBps": r, "fr": fr, "jointdnn": jd, "speedup_vs_jointdnn": jd["virtual_s"] / fr["virtual_s"], "saving": 1 - fr["virtual_s"] / edge_only})
        res[dev] = {"edge_only_s": edge_only, "points": pts}
        print(f"bandwidth {dev}: cuts {[p['fr']['cut'] for p in pts]}, speed-up vs JointDNN {[round(p['speedup_vs_jointdnn'], 2) for p in pts]}", flush=True)
    return res


def part_forward_share(out: Path, shares: list[float]) -> dict:
    """The headline against the forward's share of a measured iteration (the tables measure
    forward and backward together; the replay costs one forward): Pi 8-bit, serial and K = 5."""
    pts = []
    for f in shares:
        over = PI + FIXED_CUT + [f"cluster.device.forward_fraction={f}"]
        serial = timing(run(over + ["scheduler.K=0"], out / "runs" / f"share_{f}_serial"))["virtual_s"]
        k5 = timing(run(over + ["scheduler.K=5"], out / "runs" / f"share_{f}_k5"))["virtual_s"]
        pts.append({"forward_fraction": f, "serial_s": serial, "k5_s": k5, "speedup": serial / k5})
    return {"points": pts}


def part_tables() -> dict:
    """The paper's claims on models the framework does not have (BI-LSTM, MobileNetV3-large):
    the policy-aware cost model on their profile tables, the replay charged (forward 1/3 of a
    measured iteration), compression from the tables' 8-bit column. Not simulated."""
    from framework import profile_tables
    from plugins.schedulers.feature_replay.cost import table_profile
    from plugins.schedulers.feature_replay.pipeline import epoch_seconds

    def best(prof, K, up, down, tau=100):
        """The engine's best deployment (every cut, 8 or 32 bits, edge-only) without migration."""
        L = prof.units
        found = [(prof.edge_s[L - 1] * tau, L, 32)]
        for cut in range(1, L):
            for bits in (8, 32):
                found.append((epoch_seconds(prof.stages(cut, bits, up * MB, down * MB), K, "block", tau, exact=True), cut, bits))
        return min(found)

    out = {}
    bilstm = table_profile(profile_tables.load("feature_replay_bilstm_imdb"), "tx2", "rtx2080ti", forward_fraction=1 / 3, price_replay=True)
    out["bilstm_tx2"] = {f"{u}/{2 * u}": dict(zip(("per_100_s", "cut", "bits"), best(bilstm, 4, u, 2 * u))) for u in (1.0, 2.5, 5.0, 12.5, 50.0)}
    mob = table_profile(profile_tables.load("feature_replay_mobilenetv3_large_cifar10"), "tx2", "rtx2080ti", forward_fraction=1 / 3, price_replay=True)
    st = mob.stages(2, 8, 5 * MB, 10 * MB)
    serial, k5 = epoch_seconds(st, 0, "block", 100, exact=True), epoch_seconds(st, 5, "block", 100, exact=True)
    edge = mob.edge_s[-1] * 100
    out["mobilenetv3_tx2"] = {"serial_s": serial, "k5_s": k5, "speedup": serial / k5, "edge_only_s": edge, "saving": 1 - k5 / edge,
                              "ref": {"serial_s": 44.6, "k5_s": 20.2, "speedup": 2.20, "edge_only_s": 45.9, "saving": 0.559}}
    return out


def accuracy_data() -> list[str]:
    """Real Fashion-MNIST (Debian's dataset-fashion-mnist) when installed, 12,000 training images;
    else the CIFAR-10-shaped synthetic set with twice its noise (the clean one is too easy to
    show differences)."""
    if Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists():
        return ["dataset=fashion_mnist", "dataset.n_train=12000", "dataset.n_val=2000"]
    return ["dataset=synthetic_cifar10", "dataset.noise=12.0"]


def _acc_runs(out: Path, tag: str, base: list[str], variants: dict, seeds, epochs: int) -> dict:
    res = {"data": accuracy_data()}
    base = base + res["data"]
    for name, extra in variants.items():
        accs, bytes_up, raw_up = [], [], []
        for seed in seeds:
            s = run(base + extra + ["runtime.threads=1", f"seed={seed}", f"train.epochs={epochs}"], out / "runs" / f"{tag}_{name}_s{seed}")
            accs.append(s["metrics"]["test/acc"])
            if s["feature_replay"]["drift_std"] and "drift" not in res:
                res["drift"] = s["feature_replay"]["drift_std"]
            link = s["links"].get("dev0->server", {})
            bytes_up.append(link.get("bytes", 0))
            raw_up.append(link.get("raw_bytes", 0))
        res[name] = {"test_acc": accs, "mean": statistics.mean(accs), "std": statistics.pstdev(accs), "uplink_bytes": bytes_up, "uplink_raw_bytes": raw_up}
        print(f"{tag} {name}: {100 * res[name]['mean']:.2f} % over {len(accs)} seeds", flush=True)
    return res


def part_accuracy(out: Path, seeds, epochs: int) -> dict:
    """K = 0 / 5 / unbounded (the staleness fixed at K); the K = 5 runs record the drift (Fig. 4)."""
    return _acc_runs(out, "acc", ["experiment=feature_replay_accuracy"],
                     {"K0": ["scheduler.K=0", "scheduler.drift_lags=[]"], "K5": ["scheduler.K=5"], "unbounded": ["scheduler.K=null", "scheduler.drift_lags=[]"]}, seeds, epochs)


def part_compression(out: Path, seeds, epochs: int) -> dict:
    """The cut after the last conv block: normal backprop (K = 0, fp32), and K = 5 with fp32, 8-bit
    min-max with error feedback, and without it."""
    base = ["experiment=feature_replay_accuracy", "scheduler.cut=3", "scheduler.drift_lags=[]"]
    res = _acc_runs(out, "ef", base, {"K0_fp32": ["compressor=none", "scheduler.K=0"], "fp32": ["compressor=none"], "8bit_ef": ["compressor=minmax_ef"],
                                      "8bit_no_ef": ["compressor=minmax_ef", "compressor.error_feedback=false"]}, seeds, epochs)
    res["bytes_ratio"] = sum(res["fp32"]["uplink_bytes"]) / max(1, sum(res["8bit_ef"]["uplink_bytes"]))
    return res


def part_drift(out: Path, epochs: int, accuracy: dict | None) -> dict:
    """From the accuracy part's first K = 5 run, or a run of its own."""
    if accuracy and "drift" in accuracy:
        d = accuracy["drift"]
    else:
        d = run(["experiment=feature_replay_accuracy", "runtime.threads=1", f"train.epochs={epochs}", *accuracy_data()], out / "runs" / "drift")["feature_replay"]["drift_std"]
    return {"std": d, "ratio_6_4": [b / a for a, b in zip(d["4"], d["6"])], "ratio_5_4": [b / a for a, b in zip(d["4"], d["5"])],
            "last_over_first_k5": d["5"][-1] / d["5"][0]}


def part_adaptivity(out: Path) -> dict:
    """The TX2 under a 30-iteration drop to 0.5/1 MB/s and under a one-iteration dip (AC-6)."""
    from hydra import compose, initialize_config_dir

    from framework import registry
    from framework.cli import CONF_DIR
    from framework.job import Job

    registry.load_plugins()
    res = {}
    for name, (a, b) in {"step": (10, 250), "dip": (10, 10.3)}.items():
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="config", overrides=FAST + ["experiment=feature_replay_adaptive"])
        cfg.cluster.link.trace = [[0, 12.5 * 8 * MB], [a, 0.5 * 8 * MB], [b, 12.5 * 8 * MB]]
        cfg.cluster.links["cloud->dev0"].trace = [[0, 25 * 8 * MB], [a, 8 * MB], [b, 25 * 8 * MB]]
        job = Job(cfg, out / "runs" / f"adapt_{name}")
        s = job.run()
        fr = s["feature_replay"]
        res[name] = {"drop_s": [a, b], "virtual_s": s["virtual_time_s"], "migrations": fr["migrations"], "final_cut": fr["final_cut"],
                     "over_planned": s["prediction"]["epoch_over_predicted"], "edge_only_iter_s": job.scheduler.plan()["profile"]["edge_s"][-1]}
        print(f"adaptivity {name}: migrations {[(round(m['time_s'], 1), m['from'], m['to']) for m in fr['migrations']]}", flush=True)
    return res
