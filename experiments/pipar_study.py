"""PiPar reproduction study (Zhang et al., JPDC 2024): one command, one report, two-sided verdicts.

    python experiments/pipar_study.py                  # everything but accuracy (~20 min on 2 idle cores)
    python experiments/pipar_study.py --quick          # K = 4 and 25 instead of 100, fewer sweep points (~3 min)
    python experiments/pipar_study.py --accuracy       # the full form: everything, with the slow accuracy part (FL, SFL, PiPar on real Fashion-MNIST)
    python experiments/pipar_study.py --only accuracy  # the accuracy part alone
    python experiments/pipar_study.py --reuse          # everything else again, the last run's accuracy part kept
    python experiments/pipar_study.py --only speed --only selection   # parts: speed, selection, sensitivity, dp, accuracy, scale

The paper's testbed is K = 100 Raspberry Pi 3Bs and one 8-core i7 server (Sec. V-A): the
`pipar_*` clusters with cluster.num_devices=100 and 500 CIFAR-10 (600 MNIST) samples per device,
each constant sourced in docs/calibration.md. Every part runs on the virtual clock (deterministic):

1. speed: FL, SFL and PiPar (select=auto and the paper's select=paper) on VGG-5, CIFAR- and
   MNIST-shaped data, 4G / 4G+ / WiFi, at K = 100 and at the reduced K = 4; the heterogeneous
   testbed (half the devices at 600 MHz) at K = 100. Epoch time, server and device idle (Figs 4,
   6, 12; Table VII's T). `models`: ResNet-18 and MobileNetV3-Small the same way (Fig. 4);
   `batch`: batch sizes 20-200 (Fig. 10); `reselection`: the bandwidth cycling every 1, 10 and
   60 minutes, each change paying a full re-selection (Fig. 14).
2. selection: select=auto and select=paper against the exhaustive search (one timing-only trial
   iteration per (P, N), on one replica's share of the server) at K = 100: score, exact matches,
   search cost (Table VII).
3. sensitivity: T_FL / T_PiPar and T_SFL / T_PiPar against the number of devices K (the knob the
   shared server turns), 4G and WiFi.
4. dp: classic DP noise on uploaded device models, seconds per epoch added (Fig. 13).
5. accuracy (slow, not in the default run): FL, SFL and PiPar (P = 1, N = 4) on real
   Fashion-MNIST, K = 4, 10 epochs, one torch thread (Tables V and VI, Figs 8 and 9).
6. scale: wall time and memory of one timing-only PiPar epoch, K up to 100.

Every run's plan predicts its epoch (plan/predicted_epoch_s): the report tables predicted against
simulated for every configuration. Claims (experiments/pipar_claims.py) are printed as two-sided
verdicts and written to <out>/report.md with <out>/results.json and PNG plots (each with its
plotted numbers beside it as .json, experiments/figure_data.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import pipar_claims as pc  # noqa: E402
from experiments.pipar_claims import DATA_LABEL, NET_LABEL, NETS, PAPER_K  # noqa: E402
from experiments.study_runs import build_job  # noqa: E402
from experiments.verdicts import as_json, print_verdicts, verdict_table  # noqa: E402

SCHEDS = ["fl", "sfl", "pipar"]
PER_DEVICE = {"synthetic_cifar10": 500, "synthetic_mnist": 600}  # the paper's splits over 100 devices


def overrides(sched: str, net: str, ds: str, k: int, extra=(), model: str = "vgg5", batch: int = 100) -> list[str]:
    return [f"scheduler={sched}", f"cluster={net}", f"cluster.num_devices={k}", f"model={model}", f"dataset={ds}", f"dataset.n_train={PER_DEVICE[ds] * k}", f"train.batch_size={batch}",
            "train.epochs=1", "runtime.numerics=false", "runtime.progress=false", "tracking=none", *extra]


PREDICTIONS: list[dict] = []  # every timing run's predicted and simulated epoch


def timing_run(sched: str, net: str, ds: str, k: int, out: Path, extra=(), edit=None, model: str = "vgg5", batch: int = 100) -> dict:
    ov = overrides(sched, net, ds, k, extra, model, batch)
    job = build_job(ov, out / "runs", edit)
    summary = job.run()
    idle = summary["idle"]
    plan = summary["plan"]
    pred = summary["prediction"]
    r = {"epoch_s": summary["history"]["time/epoch_virtual_s"][0], "server_idle_s": idle["server_s"], "device_idle_s": idle["device_mean_s"], "P": plan["P"], "N": plan["N"],
         "predicted_epoch_s": pred["predicted_epoch_s"], "epoch_over_predicted": pred["epoch_over_predicted"], "paper_epoch_s": plan.get("paper_epoch_s"), "search_s": plan["search_s"]}
    label = " ".join(o for o in ov if not o.startswith(("runtime.", "tracking", "train.epochs")) and o not in ("model=vgg5", "train.batch_size=100")) + (" (heterogeneous)" if edit is not None else "")
    PREDICTIONS.append({"run": label, **{k_: r[k_] for k_ in ("epoch_s", "predicted_epoch_s", "epoch_over_predicted")}})
    return r


def _pn(r: dict) -> str:
    return f"P={r['P'] if isinstance(r['P'], int) else '/'.join(map(str, sorted(set(r['P']))))} N={r['N'] if isinstance(r['N'], int) else '/'.join(map(str, sorted(set(r['N']))))}"


# ---- 1. speed, idle, heterogeneity -----------------------------------------------------------


def part_speed(out: Path, ks: list[int]) -> dict:
    res: dict = {}
    for k in ks:
        sp = res[str(k)] = {}
        for ds in ("synthetic_cifar10", "synthetic_mnist"):
            for net in NETS:
                for s in SCHEDS:
                    sp[(ds, net, s)] = r = timing_run(s, net, ds, k, out)
                    print(f"  K={k:3d} {DATA_LABEL[ds]:8s} {NET_LABEL[net]:4s} {s:5s} epoch {r['epoch_s']:7.2f} s (predicted {r['predicted_epoch_s']:7.2f})  server idle {r['server_idle_s']:7.2f}  device idle {r['device_idle_s']:6.2f}  {_pn(r)}", flush=True)
                sp[(ds, net, "pipar_auto")] = sp[(ds, net, "pipar")]
                sp[(ds, net, "pipar_paper")] = r = timing_run("pipar", net, ds, k, out, ["scheduler.select=paper"])
                print(f"  K={k:3d} {DATA_LABEL[ds]:8s} {NET_LABEL[net]:4s} pipar select=paper: epoch {r['epoch_s']:7.2f} s (its own estimate {r['paper_epoch_s']:.2f}, ours {r['predicted_epoch_s']:.2f})  {_pn(r)}", flush=True)
    return res


def part_hetero(out: Path, k: int) -> dict:
    res = {}
    for net in NETS:
        for s in SCHEDS:
            res[(net, s)] = r = timing_run(s, net, "synthetic_cifar10", k, out, edit=half_speed)
            print(f"  heterogeneous K={k} {NET_LABEL[net]:4s} {s:5s} epoch {r['epoch_s']:7.2f} s (predicted {r['predicted_epoch_s']:7.2f})  {_pn(r)}", flush=True)
    return res


def half_speed(cfg) -> None:
    """The heterogeneous testbed (as conf/cluster/pipar_4g_hetero.yaml) on any network: the odd
    devices at 600 MHz instead of 1.2 GHz, twice as slow."""
    cfg.cluster.devices["dev*[13579]"] = {"slowdown": 2 * float(cfg.cluster.device.slowdown)}


def part_models(out: Path, k: int) -> dict:
    """ResNet-18 and MobileNetV3-Small: FL, SFL and PiPar (Fig. 4b,c,e,f)."""
    res = {}
    for model in ("mobilenetv3_small", "resnet18"):
        for ds in ("synthetic_cifar10", "synthetic_mnist"):
            for net in NETS:
                for s in SCHEDS:
                    res[(model, ds, net, s)] = r = timing_run(s, net, ds, k, out, model=model)
                    print(f"  {model} K={k} {DATA_LABEL[ds]:8s} {NET_LABEL[net]:4s} {s:5s} epoch {r['epoch_s']:7.2f} s (predicted {r['predicted_epoch_s']:7.2f})  {_pn(r)}", flush=True)
    return res


def part_batch(out: Path, k: int, sizes: list[int]) -> dict:
    """Fig. 10: VGG-5, CIFAR-10, FL and SFL at batch B, PiPar at B' = B // N."""
    res = {}
    for net in NETS:
        for b in sizes:
            for s in SCHEDS:
                res[(net, b, s)] = timing_run(s, net, "synthetic_cifar10", k, out, batch=b)["epoch_s"]
            print(f"  B={b:3d} {NET_LABEL[net]:4s} FL {res[(net, b, 'fl')]:7.2f}  SFL {res[(net, b, 'sfl')]:7.2f}  PiPar {res[(net, b, 'pipar')]:7.2f} s", flush=True)
    return res


def part_reselection(out: Path, intervals: list[int], k: int = 1) -> dict:
    """Fig. 14: the bandwidth cycles 4G -> 4G+ -> WiFi every `interval` seconds for three changes;
    every change re-selects (P, N) at the next epoch boundary by the paper's method, paying its
    profiling iteration (the paper's full re-selection). Overhead = the device's profiling time /
    the run's time. One device: the overhead is each device's own (and K devices' hours of
    virtual time would take hours to simulate)."""
    res = {}
    nets = [(10e6, 25e6), (20e6, 40e6), (50e6, 50e6)]
    for interval in intervals:
        def cycle(cfg, interval=interval):
            up = [[i * interval, nets[i % 3][0]] for i in range(4)]
            down = [[i * interval, nets[i % 3][1]] for i in range(4)]
            cfg.cluster.links["dev*->server"] = {"bandwidth_bps": nets[0][0], "trace": up}
            cfg.cluster.links["server->dev*"] = {"bandwidth_bps": nets[0][1], "trace": down}

        job = build_job(overrides("pipar", "pipar_4g", "synthetic_cifar10", k, [f"train.epochs={10 ** 6}", "scheduler.select=paper"]), out / "runs", cycle)
        epoch = job.scheduler.planned_epoch_s()
        from omegaconf import open_dict

        with open_dict(job.cfg):  # as many epochs as fill 3.5 intervals (the run ends after the third change)
            job.cfg.train.epochs = max(2, int(3.5 * interval / epoch))
        job.scheduler.epochs = int(job.cfg.train.epochs)
        job.run()
        tl = job.runtime.timeline
        prof = sum(iv.end - iv.start for iv in tl.intervals if iv.kind == "profile" and iv.resource == "dev0")
        res[interval] = 100 * prof / job.virtual_time
        print(f"  interval {interval:5d} s: {job.cfg.train.epochs} epochs, {job.virtual_time:.0f} s, re-selection {prof:.1f} s = {res[interval]:.3f} %", flush=True)
    return res


# ---- 2. selection ----------------------------------------------------------------------------


def part_selection(out: Path, k: int) -> dict:
    from plugins.schedulers.pipar.search import exhaustive

    res: dict = {"auto": {}, "paper": {}}
    for (model, ds, net) in pc.TABLE7:
        t0 = time.perf_counter()
        ov = ["scheduler=pipar", f"cluster={net}", f"cluster.num_devices={k}", f"model={model}", f"dataset={ds}", f"dataset.n_train={PER_DEVICE[ds] * k}", "train.batch_size=100",
              "runtime.numerics=false", "tracking=none", "runtime.progress=false"]
        jobs = {m: build_job(ov + [f"scheduler.select={m}"], out / "runs") for m in ("auto", "paper")}
        planner = jobs["auto"].scheduler.planner
        best, trials = exhaustive(planner, 0, planner.p_range())
        by = {(t["P"], t["N"]): t for t in trials}
        s_opt = sum(t["iter_s"] for t in trials)
        for m, job in jobs.items():
            p = job.scheduler.plans[0]
            t_sel = by[(p.P, p.N)]["epoch_s"]
            res[m][(model, ds, net)] = {"P": p.P, "N": p.N, "T": t_sel, "S": job.scheduler.search_virtual_s, "P_opt": best["P"], "N_opt": best["N"], "T_opt": best["epoch_s"], "S_opt": s_opt,
                                        "score": best["epoch_s"] / t_sel, "exact": (p.P, p.N) == (best["P"], best["N"]), "curve": [(t["N"], t["epoch_s"]) for t in trials if t["P"] == best["P"]]}
        a, q = res["auto"][(model, ds, net)], res["paper"][(model, ds, net)]
        print(f"  selection K={k} {model:18s} {DATA_LABEL[ds]:8s} {NET_LABEL[net]:4s} opt P={a['P_opt']} N={a['N_opt']:3d} T={a['T_opt']:6.2f} | auto P={a['P']} N={a['N']:3d} score {a['score']:.3f} |"
              f" paper P={q['P']} N={q['N']:3d} score {q['score']:.3f} | S {a['S']:.2f} s ({time.perf_counter() - t0:.0f} s)", flush=True)
    return res


# ---- 3. sensitivity to K ---------------------------------------------------------------------


def part_sensitivity(out: Path, ks: list[int]) -> dict:
    res = {}
    for net in ("pipar_4g", "pipar_wifi"):
        for k in ks:
            row = {s: timing_run(s, net, "synthetic_cifar10", k, out)["epoch_s"] for s in SCHEDS}
            res[(net, k)] = row
            print(f"  K={k:4d} {NET_LABEL[net]:4s} FL/PiPar {row['fl'] / row['pipar']:5.2f}  SFL/PiPar {row['sfl'] / row['pipar']:5.2f}  (PiPar {row['pipar']:.2f} s)", flush=True)
    return res


# ---- 4. differential privacy -----------------------------------------------------------------


def part_dp(out: Path, k: int) -> dict:
    res = {}
    for s in SCHEDS:
        base = timing_run(s, "pipar_wifi", "synthetic_cifar10", k, out)["epoch_s"]
        noisy = timing_run(s, "pipar_wifi", "synthetic_cifar10", k, out, ["scheduler.dp_sigma=0.01"])["epoch_s"]
        res[s] = noisy - base
        print(f"  classic DP, {s}: +{res[s]:.4f} s per epoch", flush=True)
    return res


# ---- 5. accuracy -----------------------------------------------------------------------------


def part_accuracy(out: Path, epochs: int) -> dict:
    from plugins.datasets.fashion_mnist import DEFAULT_ROOT, FILES

    if not all(os.path.exists(os.path.join(DEFAULT_ROOT, b)) or os.path.exists(os.path.join(DEFAULT_ROOT, b + ".gz")) for b in FILES.values()):
        print("  (Fashion-MNIST files not installed: the accuracy part needs Debian's dataset-fashion-mnist; see README)", flush=True)
        return {}
    res = {}
    for s in SCHEDS:
        extra = ["scheduler.P=1", "scheduler.N=4"] if s == "pipar" else []  # N divides B: PiPar's iteration covers FL's 100 samples
        ov = [f"scheduler={s}", "cluster=pipar_wifi", "cluster.num_devices=4", "model=vgg5", "dataset=fashion_mnist", "dataset.n_train=12000", "train.batch_size=100",
              f"train.epochs={epochs}", "train.lr=0.01", "train.momentum=0.9", "runtime.threads=1", "runtime.progress=false", "tracking=none", *extra]
        t0 = time.perf_counter()
        summary = build_job(ov, out / "runs").run()
        res[("Fashion-MNIST", s)] = r = {"test_acc": summary["metrics"]["test/acc"], "val_loss": summary["history"]["val/loss"], "val_acc": summary["history"]["val/acc"], "wall_s": time.perf_counter() - t0}
        print(f"  accuracy Fashion-MNIST {s:5s} test/acc {r['test_acc']:.4f}  final val/loss {r['val_loss'][-1]:.4f}  ({r['wall_s']:.0f} s)", flush=True)
    return res


# ---- 6. scale --------------------------------------------------------------------------------


def part_scale(out: Path, ks) -> dict:
    res = {}
    for k in ks:  # one process per K: its wall time and peak RSS are its own
        run_dir = out / "runs" / f"scale_{k}"
        cmd = [sys.executable, "-m", "framework", *overrides("pipar", "pipar_4g", "synthetic_cifar10", k), f"hydra.run.dir={run_dir}"]
        code = "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if p.returncode:
            raise RuntimeError(f"scale run K={k} failed:\n{p.stderr[-2000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        res[str(k)] = r = {"process_wall_s": wall, "job_wall_s": summary["wall_time_s"], "peak_rss_mib": int(p.stdout.strip().splitlines()[-1]) / 1024, "epoch_virtual_s": summary["history"]["time/epoch_virtual_s"][0]}
        print(f"  scale K={k:3d}: {r['process_wall_s']:.1f} s wall (job {r['job_wall_s']:.1f} s), peak RSS {r['peak_rss_mib']:.0f} MiB, epoch {r['epoch_virtual_s']:.2f} s virtual", flush=True)
    return res


# ---- the report ------------------------------------------------------------------------------


def claims_of(results: dict, k_paper: int) -> list:
    claims: list = []
    if "speed" in results:
        for k, sp in results["speed"].items():
            claims += pc.speed_claims(sp, int(k))
        if str(k_paper) in results["speed"]:
            for select in ("auto", "paper"):
                claims += pc.table7_claims(results["speed"][str(k_paper)], select, k_paper)
    if "hetero" in results and "speed" in results and str(k_paper) in results["speed"]:
        claims += pc.hetero_claims(results["hetero"], results["speed"][str(k_paper)], k_paper)
    if "selection" in results:
        for m in ("auto", "paper"):
            claims += pc.selection_claims(results["selection"][m], m)
    if "dp" in results:
        claims += pc.dp_claims(results["dp"], k_paper)
    if "models" in results:
        claims += pc.model_claims(results["models"], k_paper)
    if "batch" in results:
        claims += pc.batch_claims(results["batch"])
    if "reselection" in results:
        claims += pc.reselection_claims(results["reselection"])
    claims += pc.not_run()
    if results.get("accuracy"):
        claims += pc.accuracy_claims(results["accuracy"], "Fashion-MNIST")
    return claims


def report(results: dict, claims: list, args, figs: list[str]) -> str:
    from experiments.pipar_report import sections

    head = ["# PiPar reproduction study", "", f"`python experiments/pipar_study.py {' '.join(sys.argv[1:])}`, virtual clock, clusters `pipar_4g`, `pipar_4gplus`, `pipar_wifi` "
            "(sources: docs/calibration.md). Verdicts are two-sided (experiments/verdicts.py): a point value hits within 20 %, a range when ours lies in it.", "",
            "## Claims", ""] + verdict_table(claims, with_command=False) + [""]
    return "\n".join(head + sections(results, figs, PREDICTIONS)) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/pipar_study")
    ap.add_argument("--quick", action="store_true", help="K = 4 and 25 instead of 100, fewer sweep points")
    ap.add_argument("--only", choices=["speed", "models", "batch", "reselection", "selection", "sensitivity", "dp", "accuracy", "scale"], action="append")
    ap.add_argument("--accuracy", action="store_true", help="also run the accuracy part (slow: real Fashion-MNIST, about 10 minutes)")
    ap.add_argument("--epochs", type=int, default=10, help="accuracy epochs (default 10, the notes' AC6)")
    ap.add_argument("--reuse", action="store_true", help="keep the accuracy part of <out>/results.json (the slow one) unless it runs again")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    k_paper = 25 if args.quick else PAPER_K
    parts = args.only or ["speed", "models", "batch", "reselection", "selection", "sensitivity", "dp", "scale"] + (["accuracy"] if args.accuracy else [])
    results: dict = {"k_paper": k_paper}
    previous = out / "results.json"
    if args.reuse and "accuracy" not in parts and previous.is_file():
        acc = json.loads(previous.read_text())["results"].get("accuracy") or {}
        results["accuracy"] = {tuple(k.split("|")): v for k, v in acc.items()}  # keys ("Fashion-MNIST", scheduler)
        print(f"reusing the accuracy part of {previous} ({len(acc)} runs)", flush=True)
    t0 = time.perf_counter()
    if "speed" in parts:
        print(f"1. speed and idle at K = {k_paper} and 4; heterogeneous at K = {k_paper}", flush=True)
        results["speed"] = part_speed(out, [k_paper, 4])
        results["hetero"] = part_hetero(out, k_paper)
    if "models" in parts:
        print(f"1b. ResNet-18 and MobileNetV3-Small at K = {k_paper}", flush=True)
        results["models"] = part_models(out, k_paper)
    if "batch" in parts:
        print(f"1c. batch size at K = {k_paper}", flush=True)
        results["batch"] = part_batch(out, k_paper, [25, 50, 100] if args.quick else [20, 50, 100, 200])
    if "reselection" in parts:
        print("1d. re-selection under changing bandwidth (one device)", flush=True)
        results["reselection"] = part_reselection(out, [60, 600] if args.quick else [60, 600, 3600])
    if "selection" in parts:
        print(f"2. selection at K = {k_paper}", flush=True)
        results["selection"] = part_selection(out, k_paper)
    if "sensitivity" in parts:
        print("3. sensitivity to K", flush=True)
        results["sensitivity"] = part_sensitivity(out, [1, 4, 25, 100] if args.quick else [1, 2, 4, 8, 16, 25, 50, 100, 200])
    if "dp" in parts:
        print(f"4. classic DP at K = {k_paper}", flush=True)
        results["dp"] = part_dp(out, k_paper)
    if "accuracy" in parts:
        print(f"5. accuracy on Fashion-MNIST, {args.epochs} epochs", flush=True)
        results["accuracy"] = part_accuracy(out, args.epochs)
    if "scale" in parts:
        print("6. scale", flush=True)
        results["scale"] = part_scale(out, [10, 25] if args.quick else [10, 25, 50, 100])
    results["wall_s"] = time.perf_counter() - t0
    claims = claims_of(results, k_paper)
    print_verdicts("PiPar", claims)
    from experiments.pipar_report import plots

    figs = plots(results, out)
    (out / "results.json").write_text(json.dumps({"results": _jsonable(results), "predictions": PREDICTIONS, "verdicts": as_json(claims)}, indent=1))
    (out / "report.md").write_text(report(results, claims, args, figs))
    worst = max((abs(p["epoch_over_predicted"] - 1) for p in PREDICTIONS), default=0.0)
    print(f"predicted vs simulated epoch: {len(PREDICTIONS)} runs, worst |ratio - 1| = {worst:.3f}")
    print(f"report: {out / 'report.md'} ({results['wall_s']:.0f} s)")


def _jsonable(x):
    if isinstance(x, dict):
        return {("|".join(map(str, k)) if isinstance(k, tuple) else str(k)): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


if __name__ == "__main__":
    main()
