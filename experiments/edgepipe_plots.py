"""The EdgePipe study's plots (experiments/edgepipe_study.py), from its results."""

from __future__ import annotations

import statistics
from pathlib import Path

from experiments import figure_data
from experiments.edgepipe_claims import pct
from experiments.edgepipe_runs import CONFIGS

MAIN = ("hybrid", "vertical", "horizontal")
COLOR = {"hybrid": "tab:blue", "vertical": "tab:orange", "horizontal": "tab:green", "model": "tab:red"}
PAPER = {"hybrid": 80.01, "vertical": 80.01 - 18.05, "horizontal": 80.01 - 67.25, "rtx": 84.62, "ack": 85.97}  # Fig. 9(f), 6(b) (V, Hz derived)


def plots(res: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for fn in (accuracy, placements, sensitivity, cdf, time_to_accuracy):
        drawn = fn(res, plt)  # (the file's name, the data it plots), or None
        if drawn:
            name, data = drawn
            figure_data.save(plt.gcf(), out / name, data, dpi=110)
            made.append(name)
        plt.close("all")
    return made


def accuracy(res: dict, plt) -> tuple[str, dict] | None:
    """Every configuration: its accuracy per placement (box), the paper's value (star)."""
    names = [n for n in CONFIGS if n in res["runs"]]
    data = {"figure": "edgepipe test accuracy at 194 min (%) per placement, per configuration; the paper's value", "configurations": {
        CONFIGS[n].label: {"per_placement": pct(n, res), "paper": PAPER.get(n)} for n in names}}
    fig, ax = plt.subplots(figsize=(10, 3.8))
    ax.boxplot([pct(n, res) for n in names], whis=(0, 100))
    ax.set_xticks(range(1, len(names) + 1), [CONFIGS[n].label.replace(" (", "\n(").replace(", ", ",\n") for n in names], fontsize=6.5)
    shown = False
    for i, n in enumerate(names, 1):
        if n in PAPER:
            ax.plot(i, PAPER[n], "r*", label=None if shown else "paper (Vertical, Horizontal: derived)")
            shown = True
    ax.set_ylabel("test accuracy at 194 min (%)\nper placement")
    ax.set_ylim(0, 100)
    ax.legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    return "accuracy.png", data


def _order(res: dict) -> list[int]:
    """Placement indices, worst channel first."""
    recs = res["runs"]["hybrid"]
    return sorted(range(len(recs)), key=lambda i: recs[i]["mean_prr"])


def placements(res: dict, plt) -> tuple[str, dict] | None:
    """Fig. 9(c): each placement's accuracy per allocation (std over test passes as error bar)."""
    if not all(n in res["runs"] for n in MAIN):
        return None
    order = _order(res)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    w = 0.27
    hy = res["runs"]["hybrid"]
    data = {"figure": "edgepipe Fig. 9(c): test accuracy at 194 min (%) per placement (worst channel first), mean and std over test passes",
            "placements": [{"placement": hy[i]["placement"], "mean_prr_pct": 100 * hy[i]["mean_prr"]} for i in order], "configurations": {}}
    for j, n in enumerate(MAIN):
        recs = res["runs"][n]
        at = [(x, i) for x, i in enumerate(order) if i < len(recs)]  # a configuration may run on the first placements only
        data["configurations"][CONFIGS[n].label] = [{"at": x, "mean": 100 * recs[i]["mean"], "std": 100 * recs[i]["std"]} for x, i in at]
        ax.bar([x + (j - 1) * w for x, _ in at], [100 * recs[i]["mean"] for _, i in at], w, yerr=[100 * recs[i]["std"] for _, i in at],
               color=COLOR[n], label=CONFIGS[n].label, capsize=2)
    ax.set_xticks(range(len(order)), [f"placement {hy[i]['placement']}\n(PRR {100 * hy[i]['mean_prr']:.1f} %)" for i in order], fontsize=7)
    ax.set_ylabel("test accuracy at 194 min (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Fig. 9(c): device placements in one 50 x 50 m region", fontsize=9)
    fig.tight_layout()
    return "placements.png", data


def sensitivity(res: dict, plt) -> tuple[str, dict] | None:
    """The headline against the channel: (left) per placement, against its mean PRR; (right)
    trained at exponent 3.1, tested at 2.9-3.7 (Fig. 9(b)), mean over placements with the range."""
    if not all(n in res["runs"] for n in MAIN):
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    order = _order(res)
    data = {"figure": "edgepipe accuracy (%) against the placement's mean PRR (%), and (Fig. 9(b)) against the path-loss exponent at test: mean, min, max over placements",
            "against_placement": {}, "paper_hybrid_minus_vertical": 18.05}
    for n in MAIN:
        recs = res["runs"][n]
        at = [i for i in order if i < len(recs)]  # a configuration may run on the first placements only
        line = data["against_placement"][CONFIGS[n].label] = {"mean_prr_pct": [100 * recs[i]["mean_prr"] for i in at], "accuracy_pct": [100 * recs[i]["mean"] for i in at]}
        a.plot(line["mean_prr_pct"], line["accuracy_pct"], "o-", color=COLOR[n], label=CONFIGS[n].label)
    h, v = res["runs"]["hybrid"], res["runs"]["vertical"]
    line = data["against_placement"]["Hybrid - Vertical"] = {"mean_prr_pct": [100 * h[i]["mean_prr"] for i in order], "accuracy_pct": [100 * (h[i]["mean"] - v[i]["mean"]) for i in order]}
    a.plot(line["mean_prr_pct"], line["accuracy_pct"], "k--", label="Hybrid - Vertical (points)")
    a.axhline(18.05, color="k", lw=0.6, ls=":", label="paper: Hybrid - Vertical 18.05")
    a.set_xlabel("the placement's mean PRR (%)")
    a.set_ylabel("test accuracy at 194 min (%)")
    a.set_title("against the placement", fontsize=9)
    a.legend(fontsize=6.5)
    if all("fig9b" in res["runs"][n][0] for n in MAIN):
        ns = list(res["runs"]["hybrid"][0]["fig9b"])
        data["against_exponent"] = fig9b = {"exponent": [float(e) for e in ns]}
        for n in MAIN:
            recs = res["runs"][n]
            ys = [[100 * r["fig9b"][e]["mean"] for r in recs] for e in ns]
            xs = [float(e) for e in ns]
            line = fig9b[CONFIGS[n].label] = {"mean": [statistics.mean(y) for y in ys], "min": [min(y) for y in ys], "max": [max(y) for y in ys]}
            b.plot(xs, line["mean"], "o-", color=COLOR[n], label=CONFIGS[n].label)
            b.fill_between(xs, line["min"], line["max"], color=COLOR[n], alpha=0.15)
        prr = [100 * statistics.mean(r["fig9b"][e]["mean_prr"] for r in res["runs"]["hybrid"]) for e in ns]
        fig9b["mean_prr_pct"] = prr
        b.set_xticks([float(e) for e in ns], [f"{e}\n({p:.0f} %)" for e, p in zip(ns, prr)], fontsize=7)
        b.set_xlabel("path-loss exponent at test (mean PRR); trained at 3.1")
        b.set_title("Fig. 9(b): against the channel at test", fontsize=9)
        b.set_ylim(0, 100)
        b.legend(fontsize=6.5)
    fig.tight_layout()
    return "sensitivity.png", data


def cdf(res: dict, plt) -> tuple[str, dict] | None:
    """Fig. 6(c): the CDF of the test passes' accuracy, pooled over the placements."""
    names = [n for n in MAIN + ("model",) if n in res["runs"]]
    if not names:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.6))
    data = {"figure": "edgepipe Fig. 6(c): the test passes' accuracy (%), sorted (the CDF's steps), pooled over placements", "accuracy_pct": {}}
    for n in names:
        accs = sorted(100 * a for r in res["runs"][n] for a in (r["at_budget"]["lossy"] if "at_budget" in r else r["lossy"]))
        data["accuracy_pct"][CONFIGS[n].label] = accs
        ax.step(accs, [(i + 1) / len(accs) for i in range(len(accs))], where="post", label=CONFIGS[n].label, color=COLOR.get(n))
    ax.set_xlabel("test accuracy (%)")
    ax.set_ylabel("CDF over test passes and placements")
    ax.set_xlim(0, 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return "cdf.png", data


def time_to_accuracy(res: dict, plt) -> tuple[str, dict] | None:
    """Fig. 7: test accuracy (lossy, mean over a curve point's passes) against simulated time."""
    names = [n for n in ("hybrid", "model") if n in res["runs"] and "curve" in res["runs"][n][0]]
    if not names:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    data = {"figure": "edgepipe Fig. 7: test accuracy (lossy, %) against simulated minutes, one line per placement", "budget_min": res["settings"]["budget_min"], "lines": {}}
    for n in names:
        for k, r in enumerate(res["runs"][n]):
            c = r["curve"]
            data["lines"].setdefault(CONFIGS[n].label, []).append({"t_min": c["t_min"], "accuracy_pct": [100 * a for a in c["lossy_mean"]]})
            ax.plot(c["t_min"], [100 * a for a in c["lossy_mean"]], color=COLOR[n], lw=0.8, alpha=0.7,
                    label=f"{CONFIGS[n].label} (one line per placement)" if k == 0 else None)
    ax.axhline(80, color="k", lw=0.6, ls=":")
    ax.axvline(res["settings"]["budget_min"], color="grey", lw=0.6, ls="--", label="the budget")
    ax.set_xlabel("simulated training time (min)")
    ax.set_ylabel("test accuracy, lossy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Fig. 7: time to 80 % (paper: Model 2.47x Hybrid's)", fontsize=9)
    fig.tight_layout()
    return "time_to_accuracy.png", data
