"""The AdaLearner study's two figures: speed-up against n (simulated, the FIFO plan, Eq. 4, the
paper's points) and LeNet's headline against the link's rate and wake-up."""

from __future__ import annotations

from pathlib import Path

from experiments import figure_data


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scaling(res: dict, paper: dict, path: Path) -> None:
    plt = _plt()
    models = sorted({m for m, _, _ in res}, key=["lenet", "convnet", "mlp"].index)
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4))
    ns = list(range(1, 9))
    data = {"figure": "adalearner speed-up over one phone against the worker nodes n: simulated, the FIFO plan, Eq. 4, the paper's points", "n": ns, "models": {}}
    for ax, model in zip(axes, models):
        loc = res[(model, "fp32", 1)]["iteration_s"]
        panel = data["models"][model] = {}
        for arch, color in (("fp32", "tab:blue"), ("onebit", "tab:orange")):
            panel[arch] = lines = {"simulated": [res[(model, arch, n)]["speedup"] for n in ns], "fifo_plan": [loc / res[(model, arch, n)]["predicted_s"] for n in ns],
                                   "eq4": [loc / res[(model, arch, n)]["eq4_s"] for n in ns]}
            ax.plot(ns, lines["simulated"], "o-", color=color, label=f"{arch}, simulated")
            ax.plot(ns, lines["fifo_plan"], "x", color="k", ms=5, label="FIFO plan" if arch == "fp32" else None)
            ax.plot(ns, lines["eq4"], "--", color=color, alpha=0.6, label=f"{arch}, Eq. 4")
        pts = [(n, v) for (m, _, n), v in paper.items() if m == model]
        panel["paper"] = [list(p) for p in pts]
        if pts:
            ax.plot(*zip(*pts), "k*", ms=11, label="paper")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=f"{model}: speed-up over one phone", xlabel="worker nodes n", ylabel="speed-up")
        ax.legend(fontsize=7)
    fig.tight_layout()
    figure_data.save(fig, path, data, dpi=110)
    plt.close(fig)


def sensitivity(sens: dict, paper: dict, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    data = {"figure": "adalearner LeNet's speed-up against the link's rate and wake-up: fp32 at its best n (annotated), 1-bit at n = 8; the paper's values; the preset's",
            "paper": {"fp32_n4": paper[("lenet", "fp32", 4)], "onebit_n8": paper[("lenet", "onebit", 8)]}, "panels": {}}
    for ax, key, label, scale in ((axes[0], "bandwidth_bps", "link rate B (Mbit/s)", 1e-6), (axes[1], "wakeup_s", "wake-up D per worker (s)", 1.0)):
        pts = sorted(((v["value"] * scale, v) for (k, _), v in sens.items() if k == key), key=lambda p: p[0])
        xs = [x for x, _ in pts]
        data["panels"][label] = {"x": xs, "fp32_best": [v["fp32_peak"] for _, v in pts], "fp32_best_n": [v["fp32_peak_n"] for _, v in pts], "onebit_n8": [v["onebit_8"] for _, v in pts],
                                 "preset": sorted(v["value"] * scale for (k, f), v in sens.items() if k == key and f == 1.0)}
        ax.plot(xs, [v["fp32_peak"] for _, v in pts], "o-", color="tab:blue", label="fp32, best n")
        for x, v in pts:
            ax.annotate(str(v["fp32_peak_n"]), (x, v["fp32_peak"]), textcoords="offset points", xytext=(0, 5), fontsize=7, color="tab:blue")
        ax.plot(xs, [v["onebit_8"] for _, v in pts], "s-", color="tab:orange", label="1-bit, n = 8")
        ax.axhline(paper[("lenet", "fp32", 4)], color="tab:blue", ls=":", label="paper fp32 (n = 4)")
        ax.axhline(paper[("lenet", "onebit", 8)], color="tab:orange", ls=":", label="paper 1-bit (n = 8)")
        preset = sorted(v["value"] * scale for (k, f), v in sens.items() if k == key and f == 1.0)
        for x in preset:
            ax.axvline(x, color="grey", lw=0.8)
        ax.set(xscale="log" if key == "bandwidth_bps" else "linear", xlabel=label, ylabel="LeNet speed-up", title=f"LeNet against the {label.split(' (')[0]}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    figure_data.save(fig, path, data, dpi=110)
    plt.close(fig)
