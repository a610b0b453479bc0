"""PiPar reproduction study (Zhang et al., JPDC 2024): one command, one report.

    python experiments/pipar_study.py                 # everything (~15 min on 2 cores)
    python experiments/pipar_study.py --quick         # fewer epochs and K values (~4 min)
    python experiments/pipar_study.py --only speed    # one part: speed, selection, accuracy, scale

Parts (all on the virtual clock, so the numbers are deterministic):

1. speed: FL, SFL and PiPar on VGG-5, CIFAR- and MNIST-shaped data, under 4G, 4G+ and WiFi
   (cluster=pipar_*, K = 4): epoch time, server idle, mean device idle; the paper's Figs 4-7
   ratios and the issue's acceptance thresholds beside ours.
2. selection: automated (P, N) against the exhaustive search (one timing-only trial iteration per
   (P, N), the paper's "Opt") for VGG-5 (both shapes) and MobileNetV3-Small (CIFAR), x 3 networks;
   score T_opt/T_auto, exact matches, search cost, as the paper's Table VII. Twice: on the
   analytic device model, and on per-layer batch-size curves profiled on this host.
3. accuracy: FL, SFL and PiPar, same seed and shards, K = 4, VGG-5 with BN, WiFi; test accuracy
   and validation-loss curves (also on real Fashion-MNIST when its files are installed).
4. scale: a timing-only PiPar epoch with K devices up to 100 (the paper's testbed): wall time and
   peak memory.

Writes <out>/report.md, <out>/results.json and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NETS = ["pipar_4g", "pipar_4gplus", "pipar_wifi"]
NET_LABEL = {"pipar_4g": "4G", "pipar_4gplus": "4G+", "pipar_wifi": "WiFi"}
SCHEDS = ["fl", "sfl", "pipar"]

# the paper's Table VII rows for the cases we reproduce: (P, N, T, S, P_opt, N_opt, T_opt, S_opt)
PAPER_TABLE7 = {
    ("vgg5", "mnist", "pipar_4g"): (2, 4, 10.5, 1.7, 2, 4, 10.5, 481.8),
    ("vgg5", "mnist", "pipar_4gplus"): (1, 10, 7.9, 1.4, 1, 11, 7.7, 477.0),
    ("vgg5", "mnist", "pipar_wifi"): (1, 6, 4.5, 1.3, 1, 6, 4.5, 474.2),
    ("vgg5", "cifar10", "pipar_4g"): (1, 12, 19.8, 6.2, 1, 12, 19.8, 2034.2),
    ("vgg5", "cifar10", "pipar_4gplus"): (1, 6, 13.1, 4.5, 1, 8, 12.9, 1818.4),
    ("vgg5", "cifar10", "pipar_wifi"): (1, 3, 10.3, 4.2, 1, 3, 10.3, 1816.2),
    ("mobilenetv3_small", "cifar10", "pipar_4g"): (2, 8, 12.8, 4.1, 2, 8, 12.8, 33549.2),
    ("mobilenetv3_small", "cifar10", "pipar_4gplus"): (1, 12, 8.4, 3.7, 1, 12, 8.4, 33382.1),
    ("mobilenetv3_small", "cifar10", "pipar_wifi"): (1, 9, 6.7, 3.1, 1, 9, 6.7, 32780.5),
}


def compose(overrides):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from framework.cli import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hcompose(config_name="config", overrides=["runtime.progress=false", "tracking=none"] + list(overrides))


def job_for(overrides, out):
    from framework import registry
    from framework.job import Job

    registry.load_plugins()
    return Job(compose(overrides), out)


def timing_run(sched, net, dataset, out, extra=()):
    job = job_for([f"scheduler={sched}", f"cluster={net}", "model=vgg5", f"dataset={dataset}", "train.batch_size=100", "train.epochs=1", "runtime.numerics=false", *extra], out)
    t = job.train()
    idle = job.scheduler.idle(job.runtime.timeline, 0.0, t)
    p = job.scheduler.plans[0]
    return {"epoch_s": job.history["time/epoch_virtual_s"][0], "server_idle_s": idle["server_s"], "device_idle_s": idle["device_mean_s"], "P": p.P, "N": p.N}


# ---- 1. speed and idle -----------------------------------------------------------------------


def part_speed(out: Path) -> dict:
    res = {}
    for ds in ("synthetic_cifar10", "synthetic_mnist"):
        for net in NETS:
            for s in SCHEDS:
                res[f"{ds}|{net}|{s}"] = r = timing_run(s, net, ds, out / "tmp")
                print(f"  speed {ds} {NET_LABEL[net]:5s} {s:5s} epoch {r['epoch_s']:7.2f}s  server idle {r['server_idle_s']:7.2f}s  device idle {r['device_idle_s']:6.2f}s  P={r['P']} N={r['N']}", flush=True)
    return res


def speed_checks(res: dict, ds: str = "synthetic_cifar10") -> list[tuple[str, bool, str]]:
    """The issue's acceptance checks on the CIFAR-shaped runs."""
    g = lambda net, s, k: res[f"{ds}|{net}|{s}"][k]  # noqa: E731
    checks = []
    for net in NETS:
        fl, sfl, pp = (g(net, s, "epoch_s") for s in SCHEDS)
        checks.append((f"{NET_LABEL[net]}: PiPar fastest", pp < min(fl, sfl), f"FL {fl:.2f}, SFL {sfl:.2f}, PiPar {pp:.2f} s"))
        checks.append((f"{NET_LABEL[net]}: 1.2 <= T_SFL/T_PiPar <= 2.5", 1.2 <= sfl / pp <= 2.5, f"{sfl / pp:.2f}"))
        checks.append((f"{NET_LABEL[net]}: T_FL/T_PiPar >= 1.3", fl / pp >= 1.3, f"{fl / pp:.2f}"))
        si = {s: g(net, s, "server_idle_s") for s in SCHEDS}
        di = {s: g(net, s, "device_idle_s") for s in SCHEDS}
        checks.append((f"{NET_LABEL[net]}: server idle FL/PiPar >= 5", si["fl"] / si["pipar"] >= 5, f"{si['fl'] / si['pipar']:.1f}"))
        checks.append((f"{NET_LABEL[net]}: server idle SFL/PiPar >= 1.3", si["sfl"] / si["pipar"] >= 1.3, f"{si['sfl'] / si['pipar']:.2f}"))
        checks.append((f"{NET_LABEL[net]}: device idle SFL/PiPar >= 2", di["sfl"] / di["pipar"] >= 2, f"{di['sfl'] / di['pipar']:.2f}"))
    fl = [g(n, "fl", "epoch_s") for n in NETS]
    pp = [g(n, "pipar", "epoch_s") for n in NETS]
    checks.append(("FL epoch varies <= 10% across networks", (max(fl) - min(fl)) / min(fl) <= 0.10, f"{100 * (max(fl) - min(fl)) / min(fl):.1f}% (paper 5.6%)"))
    checks.append(("PiPar epoch varies >= 30% across networks", (max(pp) - min(pp)) / min(pp) >= 0.30, f"{100 * (max(pp) - min(pp)) / min(pp):.1f}% (paper 57%)"))
    return checks


# ---- 2. selection ----------------------------------------------------------------------------


# The two device models the selection is measured on. `analytic`: the clusters as shipped (FLOPs
# over a calibrated rate: a micro-batch of b costs b/B of a batch of B, so the more micro-batches
# the better). `profile`: per-layer times measured on this host at batch sizes 1..B (the server
# is this host, devices `cluster.device.slowdown` times slower), so tiny micro-batches cost what
# they really cost; its numbers depend on the host that measured them.
DEVICE_MODELS = {
    "analytic": [],
    "profile": ["cluster.device.time_model=profile", "cluster.device.kind_factors={}"],
}


def part_selection(out: Path, device_model: str = "analytic") -> dict:
    from plugins.schedulers.pipar_search import exhaustive

    res = {}
    for model, ds in (("vgg5", "synthetic_mnist"), ("vgg5", "synthetic_cifar10"), ("mobilenetv3_small", "synthetic_cifar10")):
        for net in NETS:
            t0 = time.perf_counter()
            job = job_for(["scheduler=pipar", f"cluster={net}", f"model={model}", f"dataset={ds}", "train.batch_size=100", "runtime.numerics=false", *DEVICE_MODELS[device_model]], out / "tmp")
            sched = job.scheduler
            auto = sched.plans[0]
            best, trials = exhaustive(sched.planner, 0, sched.p_range())
            by = {(t["P"], t["N"]): t for t in trials}
            t_auto = by[(auto.P, auto.N)]["epoch_s"]
            s_opt = sum(t["iter_s"] for t in trials)
            key = f"{model}|{ds.replace('synthetic_', '')}|{net}"
            res[key] = {
                "P": auto.P, "N": auto.N, "T": t_auto, "S": sched.search_virtual_s, "predicted_T": auto.predicted_epoch_s,
                "P_opt": best["P"], "N_opt": best["N"], "T_opt": best["epoch_s"], "S_opt": s_opt,
                "score": best["epoch_s"] / t_auto, "exact": (auto.P, auto.N) == (best["P"], best["N"]),
                "curve": [(t["N"], t["epoch_s"]) for t in trials if t["P"] == best["P"]], "wall_s": time.perf_counter() - t0,
            }
            r = res[key]
            print(f"  selection ({device_model}) {key:36s} auto P={r['P']} N={r['N']:3d} T={r['T']:7.2f}  opt P={r['P_opt']} N={r['N_opt']:3d} T={r['T_opt']:7.2f}  score {r['score']:.3f}  S/T {r['S'] / r['T']:.2f}", flush=True)
    return res


# ---- 3. accuracy -----------------------------------------------------------------------------


def part_accuracy(out: Path, epochs: int, datasets) -> dict:
    res = {}
    for ds, extra in datasets:
        for s in SCHEDS:
            job = job_for([f"scheduler={s}", "cluster=pipar_wifi", "model=vgg5", f"dataset={ds}", "train.batch_size=100", f"train.epochs={epochs}", "train.lr=0.01", "train.momentum=0.9", *extra], out / "tmp")
            t0 = time.perf_counter()
            job.train()
            res[f"{ds}|{s}"] = r = {"test_acc": job._final["test/acc"], "val_loss": job.history["val/loss"], "val_acc": job.history["val/acc"], "wall_s": time.perf_counter() - t0}
            print(f"  accuracy {ds} {s:5s} test/acc {r['test_acc']:.4f}  final val/loss {r['val_loss'][-1]:.4f}  ({r['wall_s']:.0f}s)", flush=True)
    return res


# ---- 4. scale --------------------------------------------------------------------------------


def part_scale(out: Path, ks) -> dict:
    res = {}
    for k in ks:  # one process per K: its wall time and peak RSS are its own
        run_dir = out / "tmp" / f"scale_{k}"
        cmd = [sys.executable, "-m", "framework", "scheduler=pipar", "cluster=pipar_4g", f"cluster.num_devices={k}", "model=vgg5", "dataset=synthetic_cifar10", f"dataset.n_train={500 * k}",
               "train.batch_size=100", "train.epochs=1", "runtime.numerics=false", "runtime.progress=false", "tracking=none", f"hydra.run.dir={run_dir}"]
        code = "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if p.returncode:
            raise RuntimeError(f"scale run K={k} failed:\n{p.stderr[-2000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        res[str(k)] = r = {"process_wall_s": wall, "job_wall_s": summary["wall_time_s"], "peak_rss_mib": int(p.stdout.strip().splitlines()[-1]) / 1024, "epoch_virtual_s": summary["history"]["time/epoch_virtual_s"][0]}
        print(f"  scale K={k:3d}: {r['process_wall_s']:.1f}s wall (job {r['job_wall_s']:.1f}s), peak RSS {r['peak_rss_mib']:.0f} MiB, epoch {r['epoch_virtual_s']:.2f}s virtual", flush=True)
    return res


# ---- report ----------------------------------------------------------------------------------


def plots(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name: str) -> str:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        return name

    if "speed" in results:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, key, title in zip(axes, ("epoch_s", "server_idle_s", "device_idle_s"), ("time per epoch (s)", "server idle per epoch (s)", "mean device idle per epoch (s)")):
            for i, s in enumerate(SCHEDS):
                vals = [results["speed"][f"synthetic_cifar10|{n}|{s}"][key] for n in NETS]
                ax.bar([x + 0.27 * i for x in range(3)], vals, 0.27, label=s.upper() if s != "pipar" else "PiPar")
            ax.set_xticks([x + 0.27 for x in range(3)], [NET_LABEL[n] for n in NETS])
            ax.set_title(f"VGG-5, CIFAR-shaped: {title}", fontsize=9)
        axes[0].legend(fontsize=8)
        made.append(save(fig, "speed.png"))
    for part in ("selection", "selection_profile"):
        if part not in results:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        for ax, (model, ds) in zip(axes, (("vgg5", "mnist"), ("vgg5", "cifar10"), ("mobilenetv3_small", "cifar10"))):
            for net in NETS:
                r = results[part][f"{model}|{ds}|{net}"]
                ns, ts = zip(*r["curve"])
                line = ax.plot(ns, ts, label=NET_LABEL[net], lw=1)[0]
                ax.plot([r["N"]], [r["T"]], "o", color=line.get_color())
                ax.plot([r["N_opt"]], [r["T_opt"]], "*", color=line.get_color(), ms=10)
            ax.set_xscale("log")
            ax.set_title(f"{model}, {ds}: epoch time vs N at P_opt (o auto, * opt)", fontsize=8)
            ax.set_xlabel("N")
        axes[0].legend(fontsize=8)
        made.append(save(fig, f"{part}.png"))
    if "accuracy" in results:
        dss = sorted({k.split("|")[0] for k in results["accuracy"]})
        fig, axes = plt.subplots(1, len(dss), figsize=(5 * len(dss), 3.4), squeeze=False)
        for ax, ds in zip(axes[0], dss):
            for s in SCHEDS:
                r = results["accuracy"][f"{ds}|{s}"]
                ax.plot(range(1, len(r["val_loss"]) + 1), r["val_loss"], label=s, marker=".")
            ax.set_title(f"{ds}: validation loss", fontsize=9)
            ax.set_xlabel("epoch")
            ax.legend(fontsize=8)
        made.append(save(fig, "accuracy.png"))
    return made


def selection_section(sel: dict, part: str, title: str) -> list[str]:
    lines = [f"## 2. Automated parameter selection (Table VII): {title}", "", "T: epoch time of one trial iteration x iterations per epoch (virtual s); S: search cost (virtual s).", "",
             "| model | data | net | P | N | T | S | P_opt | N_opt | T_opt | S_opt | score | paper (P, N, P_opt, N_opt, score) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in sel.items():
        model, ds, net = key.split("|")
        pap = PAPER_TABLE7.get((model, ds, net))
        ptxt = f"({pap[0]}, {pap[1]}, {pap[4]}, {pap[5]}, {pap[6] / pap[2]:.2f})" if pap else ""
        lines.append(f"| {model} | {ds} | {NET_LABEL[net]} | {r['P']} | {r['N']} | {r['T']:.2f} | {r['S']:.2f} | {r['P_opt']} | {r['N_opt']} | {r['T_opt']:.2f} | {r['S_opt']:.0f} | {r['score']:.3f} | {ptxt} |")
    n = len(sel)
    scores = [r["score"] for r in sel.values()]
    return lines + [
        "", f"- score >= 0.96 in every case: **{'yes' if min(scores) >= 0.96 else 'no'}** (min {min(scores):.3f}, mean {sum(scores) / n:.3f}; paper: all >= 0.96)",
        f"- P = P_opt: {sum(r['P'] == r['P_opt'] for r in sel.values())}/{n} (paper: all)",
        f"- exact (P, N): {sum(r['exact'] for r in sel.values())}/{n} (paper: 83.3%; acceptance >= 80%)",
        f"- search cost S/T: mean {sum(r['S'] / r['T'] for r in sel.values()) / n:.2f}, max {max(r['S'] / r['T'] for r in sel.values()):.2f} (paper mean 0.27); S_opt/S: mean {sum(r['S_opt'] / r['S'] for r in sel.values()) / n:.0f}x",
        "", f"![{part}]({part}.png)", ""]


def report(results: dict, out: Path, args) -> str:
    lines = ["# PiPar reproduction study", "", f"`python experiments/pipar_study.py {' '.join(sys.argv[1:])}`; virtual clock; clusters `pipar_4g`, `pipar_4gplus`, `pipar_wifi` (K = 4 unless said).", ""]
    if "speed" in results:
        sp = results["speed"]
        lines += ["## 1. Time per epoch and idle time (Figs 4-7)", "", "| data | net | FL epoch s | SFL epoch s | PiPar epoch s | FL/PiPar | SFL/PiPar | server idle FL/PiPar | SFL/PiPar | device idle SFL/PiPar | PiPar (P, N) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for ds in ("synthetic_cifar10", "synthetic_mnist"):
            for net in NETS:
                fl, sfl, pp = (sp[f"{ds}|{net}|{s}"] for s in SCHEDS)
                lines.append(f"| {ds} | {NET_LABEL[net]} | {fl['epoch_s']:.2f} | {sfl['epoch_s']:.2f} | {pp['epoch_s']:.2f} | {fl['epoch_s'] / pp['epoch_s']:.2f} | {sfl['epoch_s'] / pp['epoch_s']:.2f} | "
                             f"{fl['server_idle_s'] / pp['server_idle_s']:.1f} | {sfl['server_idle_s'] / pp['server_idle_s']:.2f} | {sfl['device_idle_s'] / pp['device_idle_s']:.2f} | ({pp['P']}, {pp['N']}) |")
        lines += ["", "Paper (VGG-5, MNIST and CIFAR-10): PiPar 1.4-3.4x faster than FL and 1.4-2.0x faster than SFL; FL's epoch varies 5.6% across networks, PiPar's 57%; idle reductions up to 64.1x (server vs FL), 2.9x (server vs SFL), 23.1x (device vs SFL).", "",
                  "Acceptance checks (CIFAR-shaped):", "", "| check | holds | measured |", "|---|---|---|"]
        lines += [f"| {name} | {'yes' if ok else '**no**'} | {val} |" for name, ok, val in speed_checks(sp)]
        lines += ["", "![speed](speed.png)", ""]
    for part, title in (("selection", "analytic device model (the shipped clusters)"), ("selection_profile", "host-profiled device model (real small-batch costs)")):
        if part in results:
            lines += selection_section(results[part], part, title)
    if "accuracy" in results:
        acc = results["accuracy"]
        lines += ["## 3. Accuracy parity (Tables V, VI; Figs 8, 9)", "", f"K = 4, same seed and shards, {args.epochs} epochs, VGG-5 with BN, SGD lr 0.01 momentum 0.9 (the authors' code), WiFi.", "",
                  "| data | FL | SFL | PiPar | PiPar - max(FL, SFL) (points) |", "|---|---|---|---|---|"]
        for ds in sorted({k.split("|")[0] for k in acc}):
            a = {s: acc[f"{ds}|{s}"]["test_acc"] for s in SCHEDS}
            lines.append(f"| {ds} | {100 * a['fl']:.2f} | {100 * a['sfl']:.2f} | {100 * a['pipar']:.2f} | {100 * (a['pipar'] - max(a['fl'], a['sfl'])):+.2f} |")
        lines += ["", "Paper: -0.2 to +2.07 points. ![accuracy](accuracy.png)", ""]
    if "scale" in results:
        lines += ["## 4. Scale: one timing-only PiPar epoch with K devices", "", "500 samples per device (the paper's CIFAR-10 split), cluster=pipar_4g; one process per K.", "", "| K | wall s (process) | wall s (job) | peak RSS MiB | epoch (virtual s) |", "|---|---|---|---|---|"]
        for k, r in results["scale"].items():
            lines.append(f"| {k} | {r['process_wall_s']:.1f} | {r['job_wall_s']:.1f} | {r['peak_rss_mib']:.0f} | {r['epoch_virtual_s']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/pipar_study")
    ap.add_argument("--quick", action="store_true", help="3 accuracy epochs, K up to 50")
    ap.add_argument("--only", choices=["speed", "selection", "accuracy", "scale"], action="append")
    ap.add_argument("--epochs", type=int, default=None, help="accuracy epochs (default 10, 3 with --quick)")
    args = ap.parse_args()
    args.epochs = args.epochs or (3 if args.quick else 10)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.only or ["speed", "selection", "accuracy", "scale"]
    results: dict = {}
    t0 = time.perf_counter()
    if "speed" in parts:
        print("1. speed and idle", flush=True)
        results["speed"] = part_speed(out)
    if "selection" in parts:
        print("2. selection", flush=True)
        results["selection"] = part_selection(out, "analytic")
        results["selection_profile"] = part_selection(out, "profile")
    if "accuracy" in parts:
        print("3. accuracy", flush=True)
        import os

        from plugins.datasets.fashion_mnist import DEFAULT_ROOT, FILES

        datasets = [("synthetic_cifar10", [])]
        if all(os.path.exists(os.path.join(DEFAULT_ROOT, b)) or os.path.exists(os.path.join(DEFAULT_ROOT, b + ".gz")) for b in FILES.values()):
            datasets.append(("fashion_mnist", ["dataset.n_train=12000"]))  # 3000 per device keeps it to minutes
        else:
            print("  (Fashion-MNIST files not installed: skipped; see README)", flush=True)
        results["accuracy"] = part_accuracy(out, args.epochs, datasets)
    if "scale" in parts:
        print("4. scale", flush=True)
        results["scale"] = part_scale(out, [10, 25, 50] if args.quick else [10, 25, 50, 100])
    results["wall_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plots(results, out)
    (out / "report.md").write_text(report(results, out, args))
    print(f"report: {out / 'report.md'} ({results['wall_s']:.0f}s)")


if __name__ == "__main__":
    main()
