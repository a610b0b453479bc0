"""Where the PiPar clusters' device and server constants come from (docs/calibration.md).

    python experiments/calibrate_pipar.py            # fit from the shipped profiles, print the constants and their errors
    python experiments/calibrate_pipar.py --measure  # measure the profiles on this host again first (about 2 minutes, run it alone)

Two steps, each from a measurement, none from a result the PiPar study reproduces:

1. **A core, measured here.** Per-unit forward and backward seconds of VGG-5 (CIFAR-10- and
   MNIST-shaped) and MobileNetV3-Small (CIFAR-10-shaped) at batch sizes 1..100, on one core of the
   development machine (torch, one thread; `framework.cluster.host_profile`), shipped in
   experiments/data/pipar_host_profiles.json. The analytic time model's constants (a convolution's
   FLOP rate, per-kind factors, the per-call overhead, the backward/forward ratio, the optimizer's
   FLOPs per parameter) are fitted to them by least squares on relative error; LeNet and
   MobileNetV3-Small on MNIST-shaped data are held out. The paper's server is an 8-core Intel
   i7-11850H (Sec. V-A); one of its cores is taken as one core of this machine (an AMD EPYC of the
   Zen 3 family): both retire 32 single-precision FLOPs per cycle at peak (two 256-bit FMAs on
   Zen 3; one 512-bit FMA, or two 256-bit, on Willow Cove), at base clocks of 2.45 GHz here and
   2.5 GHz there (datasheets). So the server is `slowdown: 1` with `cores: 8`.
2. **A Raspberry Pi 3B, from the paper.** The paper's search cost S of its selection (Table VII)
   is one profiling iteration of the whole model at batch 100 on the device (and, at the same
   time, on the much faster server) plus a profile of a few hundred bytes each way: a component
   measurement of one device's iteration. The devices' `slowdown` (Pi 3B / one core here) is S
   of VGG-5 on CIFAR-10 over WiFi (4.2 s, the network's smallest share) over the fitted model's
   iteration; S of VGG-5 on MNIST and of MobileNetV3-Small on both sets are held out.

3. **A Raspberry Pi 4B (`pi4_wifi`, the default cluster), from the feature-replay paper.** Its
   profile table (conf/profile_tables/feature_replay_resnet50_cifar10.yaml) has the Pi 4B's
   measured iteration of ResNet-50's first l units at batch 32, l = 1..19: the slowdown is the
   median over the 19 cuts of table / the fitted core's model.

Nothing here reads the study's epoch times, speed-ups or idle times.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "experiments" / "data" / "pipar_host_profiles.json"
BATCH = 100
FIT = [("vgg5", "synthetic_cifar10"), ("vgg5", "synthetic_mnist"), ("mobilenetv3_small", "synthetic_cifar10")]
HELD_OUT = [("lenet", "synthetic_mnist"), ("mobilenetv3_small", "synthetic_mnist")]
# layer kinds priced alike: memory-bound elementwise work (BatchNorm, activations, pooling)
ELEMENTWISE = ("norm", "act", "pool", "other")
KINDS = ("conv", "depthwise", "pointwise", "linear", "elementwise")
# Table VII's search cost S (seconds) over WiFi: the Pi 3B's profiling iteration
PAPER_S_WIFI = {("vgg5", "synthetic_cifar10"): 4.2, ("vgg5", "synthetic_mnist"): 1.3, ("mobilenetv3_small", "synthetic_cifar10"): 3.1, ("mobilenetv3_small", "synthetic_mnist"): 1.1}
S_FIT = ("vgg5", "synthetic_cifar10")


def model_infos(model: str, dataset: str):
    from experiments.study_runs import build_job

    job = build_job(["scheduler=local", f"model={model}", f"dataset={dataset}", f"train.batch_size={BATCH}", "runtime.numerics=false", "tracking=none", "runtime.progress=false", "cluster=uniform", "cluster.num_devices=1"], Path("/tmp/calibrate_pipar"))
    return job.model


def measure() -> dict:
    import torch

    from framework.cluster import host_profile

    torch.set_num_threads(1)
    out = {"host": platform.processor() or platform.machine(), "cpu": _cpu_name(), "torch": torch.__version__, "threads": 1, "batch": BATCH,
           "measured": time.strftime("%Y-%m-%d"), "timer": "thread CPU time (time.thread_time), median of >= 9 calls", "command": "python experiments/calibrate_pipar.py --measure", "profiles": {}}
    import os
    import tempfile

    os.environ["PIPELAB_CACHE"] = tempfile.mkdtemp()  # measure, never read an old cache entry
    for model, ds in FIT + HELD_OUT:
        t0 = time.perf_counter()
        m = model_infos(model, ds)
        out["profiles"][f"{model}|{ds}"] = host_profile(m, BATCH, torch.float32, repeats=9, timer=time.thread_time)
        print(f"  measured {model} on {ds} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def features(info) -> np.ndarray:
    """FLOPs per sample of each priced kind, for one unit."""
    fk = info.flops_by_kind
    return np.array([fk.get("conv", 0.0), fk.get("depthwise", 0.0), fk.get("pointwise", 0.0), fk.get("linear", 0.0), sum(fk.get(k, 0.0) for k in ELEMENTWISE)])


def samples(profiles: dict, cases) -> list[tuple]:
    """(case, unit, kind of pass, batch, FLOPs by kind, seconds measured)."""
    rows = []
    for model, ds in cases:
        prof = profiles[f"{model}|{ds}"]
        infos = model_infos(model, ds).infos
        for u, info in enumerate(infos):
            f = features(info)
            for j, b in enumerate(prof["batches"]):
                rows.append(((model, ds), u, "fwd", b, f, prof["fwd"][u][j]))
                rows.append(((model, ds), u, "bwd", b, f, prof["bwd"][u][j]))
    return rows


def fit(rows: list[tuple]) -> dict:
    """Least squares on relative error of t = [b * sum_k F_k c_k + o] (forward) and
    [rho * b * sum_k F_k c_k + o] (backward), c_k = factor_k / R; rho by a grid."""
    best = None
    for rho in np.arange(1.0, 3.001, 0.01):
        A = np.array([[*(b * f * (rho if p == "bwd" else 1.0)), 1.0] for _, _, p, b, f, _ in rows])
        y = np.array([t for *_, t in rows])
        w = 1.0 / y
        used = [i for i in range(A.shape[1]) if A[:, i].any()]
        while True:  # non-negative: drop a column whose coefficient comes out negative, refit
            x, *_ = np.linalg.lstsq(A[:, used] * w[:, None], y * w, rcond=None)
            if (x >= 0).all():
                break
            used = [c for c, v in zip(used, x) if v >= 0]
        coef = np.zeros(A.shape[1])
        coef[used] = x
        err = float(np.sum(((A @ coef) / y - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, rho, coef)
    _, rho, coef = best
    R = 1.0 / coef[0]
    return {"flops_per_s": R, "backward_ratio": round(float(rho), 2), "call_overhead_s": float(coef[-1]),
            "kind_factors": {k: float(coef[i] * R) for i, k in enumerate(KINDS) if k != "conv"}}


def fit_step(profiles: dict, cases, R: float, overhead: float) -> float:
    """FLOPs per parameter of the optimizer step, given the rate and the per-call overhead."""
    num, den = 0.0, 0.0
    for model, ds in cases:
        for info, t in zip(model_infos(model, ds).infos, profiles[f"{model}|{ds}"]["step"]):
            if info.params:
                num += (t - overhead) * info.params / R
                den += (info.params / R) ** 2
    return max(0.0, num / den)


def rounded(c: dict) -> dict:
    def r3(x):
        return float(f"{x:.3g}")

    return {"flops_per_s": r3(c["flops_per_s"]), "backward_ratio": c["backward_ratio"], "call_overhead_s": r3(c["call_overhead_s"]),
            "step_flops_per_param": r3(c["step_flops_per_param"]), "kind_factors": {k: r3(v) for k, v in c["kind_factors"].items()}}


def analytic_device(consts: dict, slowdown: float = 1.0):
    from framework.config.schemas import DeviceConfig

    cfg = DeviceConfig(time_model="analytic", flops_per_s=consts["flops_per_s"], backward_ratio=consts["backward_ratio"], call_overhead_s=consts["call_overhead_s"],
                       step_flops_per_param=consts["step_flops_per_param"], kind_factors={**{k: v for k, v in consts["kind_factors"].items() if k != "elementwise"},
                                                                                          **{k: consts["kind_factors"]["elementwise"] for k in ELEMENTWISE}},
                       slowdown=slowdown)
    return cfg


def iteration_s(cfg, model: str, ds: str) -> float:
    from framework.cluster import Device, Work

    m = model_infos(model, ds)
    dev = Device("d", cfg, m.infos)
    Q = len(m.infos)
    return sum(dev.time(Work(k, 0, Q, BATCH)) for k in ("fwd", "bwd")) + dev.time(Work("step", 0, Q))


def errors(profiles: dict, cases, cfg) -> dict:
    from framework.cluster import Device, Work

    out = {}
    for model, ds in cases:
        m = model_infos(model, ds)
        prof = profiles[f"{model}|{ds}"]
        dev = Device("d", cfg, m.infos)
        rel = []
        for u in range(len(m.infos)):
            for j, b in enumerate(prof["batches"]):
                for p in ("fwd", "bwd"):
                    rel.append(dev.time(Work(p, u, u + 1, b)) / prof[p][u][j] - 1.0)
        Q = len(m.infos)
        measured = sum(sum(prof[p][u][-1] for u in range(Q)) for p in ("fwd", "bwd")) + sum(prof["step"])
        out[f"{model}|{ds}"] = {"unit_median_abs_err": float(np.median(np.abs(rel))), "unit_p90_abs_err": float(np.percentile(np.abs(rel), 90)),
                                "iteration_measured_s": measured, "iteration_model_s": iteration_s(cfg, model, ds)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="measure the host profiles again (run alone: other load inflates them)")
    args = ap.parse_args()
    if args.measure:
        data = measure()
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(data, indent=1))
    data = json.loads(DATA.read_text())
    profiles = data["profiles"]
    print(f"profiles: {data['cpu']}, torch {data['torch']}, {data['threads']} thread, measured {data['measured']}")
    consts = fit(samples(profiles, FIT))
    consts["step_flops_per_param"] = fit_step(profiles, FIT, consts["flops_per_s"], consts["call_overhead_s"])
    shipped = rounded(consts)
    core = analytic_device(shipped)
    print("\none core here (the server core), analytic constants:")
    print(json.dumps(shipped, indent=1))
    for title, cases in (("fitted on", FIT), ("held out", HELD_OUT)):
        for key, e in errors(profiles, cases, core).items():
            print(f"  {title:9s} {key:36s} per unit and batch: median |err| {e['unit_median_abs_err']:.0%}, 90th pct {e['unit_p90_abs_err']:.0%};"
                  f" iteration at {BATCH}: measured {e['iteration_measured_s']:.3f} s, model {e['iteration_model_s']:.3f} s")
    base = iteration_s(core, *S_FIT)
    slowdown = PAPER_S_WIFI[S_FIT] / base
    print(f"\nthe Pi 3B: slowdown = S(VGG-5, CIFAR-10, WiFi) {PAPER_S_WIFI[S_FIT]} s / {base:.4f} s = {slowdown:.2f} -> {float(f'{slowdown:.3g}')}")
    pi = analytic_device(shipped, float(f"{slowdown:.3g}"))
    for (model, ds), s in PAPER_S_WIFI.items():
        ours = iteration_s(pi, model, ds)
        tag = "fitted on" if (model, ds) == S_FIT else "held out"
        print(f"  {tag:9s} S {model} {ds}: paper {s} s, model {ours:.2f} s ({ours / s:.2f}x)")
    pi4b(core)


def pi4b(core) -> None:
    """The Pi 4B's slowdown against the fitted core, from the feature-replay paper's table."""
    import yaml

    from framework.cluster import Device, Work
    from framework.profile_tables import TABLE_DIR

    table = yaml.safe_load((TABLE_DIR / "feature_replay_resnet50_cifar10.yaml").read_text())
    batch = int(table["batch"])
    measured = table["iteration_s"]["prefix"]["pi4b"]
    from experiments.study_runs import build_job

    m = build_job(["scheduler=local", "model=resnet50", "dataset=synthetic_cifar10", f"train.batch_size={batch}", "runtime.numerics=false", "tracking=none", "runtime.progress=false",
                   "cluster=uniform", "cluster.num_devices=1"], Path("/tmp/calibrate_pipar")).model
    dev = Device("d", core, m.infos)
    ratios = sorted(t / (sum(dev.time(Work(k, 0, cut, batch)) for k in ("fwd", "bwd")) + dev.time(Work("step", 0, cut))) for cut, t in enumerate(measured, start=1))
    median = ratios[len(ratios) // 2]
    print(f"\nthe Pi 4B: table / model over ResNet-50's 19 cuts at batch {batch}: {ratios[0]:.2f} .. {ratios[-1]:.2f}, median {median:.2f} -> slowdown {float(f'{median:.3g}')}")


if __name__ == "__main__":
    main()
