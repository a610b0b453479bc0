"""The PiPar study's tables and plots (experiments/pipar_study.py): Markdown sections and PNGs."""

from __future__ import annotations

from pathlib import Path

from experiments import figure_data
from experiments.pipar_claims import DATA_LABEL, NET_LABEL, NETS, TABLE7

SCHEDS = ["fl", "sfl", "pipar"]


def _pn(r: dict) -> str:
    def one(v):
        return str(v) if isinstance(v, int) else "/".join(map(str, sorted(set(v))))

    return f"({one(r['P'])}, {one(r['N'])})"


def sections(results: dict, figs: list[str], predictions: list[dict]) -> list[str]:
    L: list[str] = []
    for k, sp in results.get("speed", {}).items():
        L += [f"## Time per epoch and idle time, VGG-5, K = {k} (Figs 4, 6; Table VII's T)", "",
              "| data | net | FL s | SFL s | PiPar s (P, N) | PiPar select=paper s (P, N; its own estimate) | FL/PiPar | SFL/PiPar | server idle FL/PiPar | SFL/PiPar | device idle SFL/PiPar |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for ds in ("synthetic_cifar10", "synthetic_mnist"):
            for net in NETS:
                fl, sfl, pp, pa = (sp[(ds, net, s)] for s in ("fl", "sfl", "pipar", "pipar_paper"))
                L.append(f"| {DATA_LABEL[ds]} | {NET_LABEL[net]} | {fl['epoch_s']:.2f} | {sfl['epoch_s']:.2f} | {pp['epoch_s']:.2f} {_pn(pp)} | {pa['epoch_s']:.2f} {_pn(pa)}; {pa['paper_epoch_s']:.2f} | "
                         f"{fl['epoch_s'] / pp['epoch_s']:.2f} | {sfl['epoch_s'] / pp['epoch_s']:.2f} | {fl['server_idle_s'] / pp['server_idle_s']:.1f} | {sfl['server_idle_s'] / pp['server_idle_s']:.2f} | "
                         f"{sfl['device_idle_s'] / pp['device_idle_s']:.2f} |")
        L.append("")
    if "hetero" in results:
        het = results["hetero"]
        L += [f"## Heterogeneous testbed, VGG-5, CIFAR-10, K = {results['k_paper']} (Fig. 12)", "", "Half the devices at 600 MHz (twice as slow).", "",
              "| net | FL s | SFL s | PiPar s (P, N) | FL/PiPar | SFL/PiPar |", "|---|---|---|---|---|---|"]
        for net in NETS:
            fl, sfl, pp = (het[(net, s)] for s in SCHEDS)
            L.append(f"| {NET_LABEL[net]} | {fl['epoch_s']:.2f} | {sfl['epoch_s']:.2f} | {pp['epoch_s']:.2f} {_pn(pp)} | {fl['epoch_s'] / pp['epoch_s']:.2f} | {sfl['epoch_s'] / pp['epoch_s']:.2f} |")
        L.append("")
    if "speed.png" in figs:
        L += ["![epoch time and idle time](speed.png)", ""]
    if "selection" in results:
        L += [f"## Parameter selection against the exhaustive search, K = {results['k_paper']} (Table VII)", "",
              "T: one trial iteration's epoch (virtual s) on one replica's share of the server; S: the selection's search cost.", "",
              "| model | data | net | opt (P, N) T | auto (P, N) T score | paper (P, N) T score | the paper's (P, N) T, opt (P, N) T | S | S_opt |", "|---|---|---|---|---|---|---|---|---|"]
        for key in TABLE7:
            a, q = results["selection"]["auto"][key], results["selection"]["paper"][key]
            row = TABLE7[key]
            L.append(f"| {key[0]} | {DATA_LABEL[key[1]]} | {NET_LABEL[key[2]]} | ({a['P_opt']}, {a['N_opt']}) {a['T_opt']:.2f} | ({a['P']}, {a['N']}) {a['T']:.2f} {a['score']:.3f} | "
                     f"({q['P']}, {q['N']}) {q['T']:.2f} {q['score']:.3f} | ({row[0]}, {row[1]}) {row[2]}, ({row[4]}, {row[5]}) {row[6]} | {a['S']:.2f} | {a['S_opt']:.0f} |")
        L.append("")
        if "selection.png" in figs:
            L += ["![epoch against N at the optimal P](selection.png)", ""]
    if "sensitivity" in results:
        sens = results["sensitivity"]
        ks = sorted({k for _, k in sens})
        L += ["## Sensitivity: the speed-ups against the number of devices K (VGG-5, CIFAR-10)", "", "| K | 4G FL/PiPar | 4G SFL/PiPar | WiFi FL/PiPar | WiFi SFL/PiPar |", "|---|---|---|---|---|"]
        for k in ks:
            a, b = sens[("pipar_4g", k)], sens[("pipar_wifi", k)]
            L.append(f"| {k} | {a['fl'] / a['pipar']:.2f} | {a['sfl'] / a['pipar']:.2f} | {b['fl'] / b['pipar']:.2f} | {b['sfl'] / b['pipar']:.2f} |")
        L += ["", "![speed-ups against K](sensitivity.png)", ""] if "sensitivity.png" in figs else [""]
    if "dp" in results:
        L += ["## Classic DP overhead per epoch (Fig. 13), VGG-5, CIFAR-10, WiFi", "", "| scheduler | seconds added |", "|---|---|"]
        L += [f"| {s} | {v:.4f} |" for s, v in results["dp"].items()] + [""]
    if results.get("accuracy"):
        acc = results["accuracy"]
        L += ["## Accuracy (Tables V, VI; Figs 8, 9): real Fashion-MNIST, K = 4, VGG-5 with BN, PiPar (P, N) = (1, 4)", "", "| data | FL | SFL | PiPar |", "|---|---|---|---|"]
        for data in sorted({d for d, _ in acc}):
            L.append(f"| {data} | " + " | ".join(f"{100 * acc[(data, s)]['test_acc']:.2f}" for s in SCHEDS) + " |")
        L += ["", "![validation loss](accuracy.png)", ""] if "accuracy.png" in figs else [""]
    if predictions:
        worst = max(abs(p["epoch_over_predicted"] - 1) for p in predictions)
        L += ["## The plan's predicted epoch against the simulated one", "", f"{len(predictions)} runs; the largest |simulated / predicted - 1| is {worst:.3f}.", "",
              "| run | predicted s | simulated s | simulated / predicted |", "|---|---|---|---|"]
        L += [f"| {p['run']} | {p['predicted_epoch_s']:.3f} | {p['epoch_s']:.3f} | {p['epoch_over_predicted']:.3f} |" for p in predictions] + [""]
    if "scale" in results:
        L += ["## Scale: one timing-only PiPar epoch with K devices", "", "| K | wall s (process) | wall s (job) | peak RSS MiB | epoch (virtual s) |", "|---|---|---|---|---|"]
        L += [f"| {k} | {r['process_wall_s']:.1f} | {r['job_wall_s']:.1f} | {r['peak_rss_mib']:.0f} | {r['epoch_virtual_s']:.2f} |" for k, r in results["scale"].items()] + [""]
    return L


def plots(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name: str, data: dict) -> None:
        fig.tight_layout()
        figure_data.save(fig, out / name, data, dpi=100)
        plt.close(fig)
        made.append(name)

    k = str(results.get("k_paper"))
    if k in results.get("speed", {}):
        sp = results["speed"][k]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        data = {"figure": "pipar speed: VGG-5, CIFAR-10, per network", "K": int(k), "networks": [NET_LABEL[n] for n in NETS], "bars": {}}
        for ax, key, title in zip(axes, ("epoch_s", "server_idle_s", "device_idle_s"), ("time per epoch (s)", "server idle per epoch (s)", "mean device idle per epoch (s)")):
            for i, s in enumerate(SCHEDS):
                heights = [sp[("synthetic_cifar10", n, s)][key] for n in NETS]
                data["bars"].setdefault(key, {})[s] = heights
                ax.bar([x + 0.27 * i for x in range(3)], heights, 0.27, label={"fl": "FL", "sfl": "SFL", "pipar": "PiPar"}[s])
            ax.set_xticks([x + 0.27 for x in range(3)], [NET_LABEL[n] for n in NETS])
            ax.set_title(f"VGG-5, CIFAR-10, K = {k}: {title}", fontsize=9)
        axes[0].legend(fontsize=8)
        save(fig, "speed.png", data)
    if "sensitivity" in results:
        sens = results["sensitivity"]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        data = {"figure": "pipar sensitivity: T_FL / T_PiPar and T_SFL / T_PiPar against K, VGG-5, CIFAR-10", "paper_bands": {"fl": [1.4, 3.4], "sfl": [1.4, 2.0]}, "networks": {}}
        for ax, net in zip(axes, ("pipar_4g", "pipar_wifi")):
            ks = sorted(k_ for n, k_ in sens if n == net)
            data["networks"][NET_LABEL[net]] = panel = {"K": ks}
            for s, paper in (("fl", (1.4, 3.4)), ("sfl", (1.4, 2.0))):
                panel[f"{s}_over_pipar"] = ratios = [sens[(net, k_)][s] / sens[(net, k_)]["pipar"] for k_ in ks]
                line = ax.plot(ks, ratios, marker="o", label=f"T_{s.upper()} / T_PiPar")[0]
                ax.axhspan(*paper, color=line.get_color(), alpha=0.12)
            ax.axvline(100, color="grey", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.set_xlabel("devices K")
            ax.set_title(f"VGG-5, CIFAR-10, {NET_LABEL[net]} (bands: the paper's ranges)", fontsize=9)
            ax.legend(fontsize=8)
        save(fig, "sensitivity.png", data)
    if "selection" in results:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        data = {"figure": "pipar selection: epoch (s) against N at the optimal P; opt, auto's and paper's (N, T) where their P is the optimal one", "panels": {}}
        for ax, (model, ds) in zip(axes, (("vgg5", "synthetic_mnist"), ("vgg5", "synthetic_cifar10"), ("mobilenetv3_small", "synthetic_cifar10"))):
            panel = data["panels"][f"{model}, {DATA_LABEL[ds]}"] = {}
            for net in NETS:
                a, q = results["selection"]["auto"][(model, ds, net)], results["selection"]["paper"][(model, ds, net)]
                ns, ts = zip(*a["curve"])
                panel[NET_LABEL[net]] = {"P_opt": a["P_opt"], "curve": [list(c) for c in a["curve"]], "opt": [a["N_opt"], a["T_opt"]],
                                         "auto": [a["N"], a["T"]] if a["P"] == a["P_opt"] else None, "paper": [q["N"], q["T"]] if q["P"] == q["P_opt"] else None}
                line = ax.plot(ns, ts, label=NET_LABEL[net], lw=1)[0]
                ax.plot([a["N_opt"]], [a["T_opt"]], "*", color=line.get_color(), ms=11)
                if a["P"] == a["P_opt"]:
                    ax.plot([a["N"]], [a["T"]], "o", mfc="none", color=line.get_color(), ms=8)
                if q["P"] == q["P_opt"]:
                    ax.plot([q["N"]], [q["T"]], "x", color=line.get_color(), ms=8)
            ax.set_xscale("log")
            ax.set_xlabel("N")
            ax.set_title(f"{model}, {DATA_LABEL[ds]}: epoch vs N at P_opt (* opt, o auto, x paper)", fontsize=8)
        axes[0].legend(fontsize=8)
        save(fig, "selection.png", data)
    if results.get("accuracy"):
        acc = results["accuracy"]
        fig, ax = plt.subplots(figsize=(5, 3.4))
        data = {"figure": "pipar accuracy: validation loss per epoch", "val_loss": {}}
        for (dataset, s), r in acc.items():
            data["val_loss"][f"{s} ({dataset})"] = r["val_loss"]
            ax.plot(range(1, len(r["val_loss"]) + 1), r["val_loss"], marker=".", label=f"{s} ({dataset})")
        ax.set_xlabel("epoch")
        ax.set_title("validation loss", fontsize=9)
        ax.legend(fontsize=8)
        save(fig, "accuracy.png", data)
    return made
