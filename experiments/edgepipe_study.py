"""EdgePipe reproduction study (Yoon et al., IEEE IoT-J 2022): one command, one report.

    python experiments/edgepipe_study.py            # 3 seeds, the 194-minute budget (16 min 29 s on 2 cores, measured)
    python experiments/edgepipe_study.py --quick    # 1 seed, a tenth of the budget (55 s on 2 cores, measured)
    python experiments/edgepipe_study.py --only hybrid --only vertical

On the calibrated channel (experiment=edgepipe: mean PRR 0.809, topology_seed 6, GA mapping),
for each training seed, every configuration trains for the paper's 194 simulated minutes on its
own slot clock (scheduler.budget_min: the minibatches of Table III follow from the slot and
Theorem 1) and is tested with >= 30 lossy test passes (one draw per link per pass):

    hybrid (EdgePipe), vertical (PipeDream core), horizontal, naive (1 device, lossless),
    model (Hybrid without pipelining), hybrid w/o failure (lossless links),
    hybrid + r-TX (2 copies), hybrid + ACK (retransmit until ACKed, <= 3 retries),
    hybrid and horizontal with share_missing=zero_fill (the notes' proposal; abort is the default)

Writes <out>/report.md, <out>/results.json and PNG plots (accuracy per configuration with its
spread over the test passes; the CDF of the test-pass accuracies, as the paper's Fig. 6(c)), and
prints pass/FAIL per acceptance check (notes 6.2 items 4-5 and the issue's 30-point gate).

Accuracy is the lossy test's (for the lossless configurations it equals the plain test accuracy).
"Spread" is the std over the test passes of one trained model, averaged over the seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.study_runs import run_job  # noqa: E402

# dataset.n_val=0: train on all 60 k images, 600 minibatches a data epoch, as the paper counts
# "epoch e, step s" (the preset holds 5 k out for validation, which this study never reads)
FAST = ["tracking=none", "runtime.progress=false", "dataset.n_val=0"]
BUDGET_MIN = 194.0
HYBRID = "hybrid"
CONFIGS = {  # name: (overrides, label)
    "hybrid": ([], "Hybrid (EdgePipe)"),
    "vertical": (["scheduler.partition_class=vertical"], "Vertical (PipeDream core)"),
    "horizontal": (["scheduler.partition_class=horizontal"], "Horizontal"),
    "naive": (["scheduler.partition_class=vertical", "scheduler.n_devices=1", "scheduler.prr.source=cluster"], "Naive (1 device, lossless)"),
    "model": (["scheduler.pipeline=false"], "Model (no pipelining)"),
    "wo_failure": (["scheduler.prr.source=cluster"], "Hybrid w/o failure (lossless)"),
    "rtx": (["scheduler.recovery=rtx"], "Hybrid + r-TX"),
    "ack": (["scheduler.recovery=ack"], "Hybrid + ACK"),
    # the notes' proposal for a lost logit share (2.10): train on the zero-filled view; the default
    # (abort) applies the all-or-nothing rule to the output layer too
    "hybrid_zero_fill": (["scheduler.share_missing=zero_fill"], "Hybrid, share zero-fill"),
    "horizontal_zero_fill": (["scheduler.partition_class=horizontal", "scheduler.share_missing=zero_fill"], "Horizontal, share zero-fill"),
}
# The paper's numbers (notes section 4; % test accuracy at 194 min, Table III's minibatches).
# Fig. 9(f) gives "Ours" 80.01 (presumably Hybrid), r-TX 84.62 (2.0x), ACK 85.97 (2.16x); Fig.
# 6(b) gives Hybrid - Vertical = 18.05 and Hybrid - Horizontal = 67.25 points, so Vertical and
# Horizontal here are 80.01 minus those (derived, not printed in the paper). Naive, Model and w/o
# failure have no number in the text ("surpasses" Naive; Model 2.47x slower to 80 %).
PAPER = {"hybrid": (80.01, 9356, ""), "vertical": (80.01 - 18.05, 10750, "derived: 80.01 - 18.05"),
         "horizontal": (80.01 - 67.25, 6128, "derived: 80.01 - 67.25"), "naive": (None, 2400, "w/o failure 'surpasses' it"),
         "model": (None, None, "2.47x slower to 80 %"), "wo_failure": (None, 9356, "Hybrid 'slightly short' of it"),
         "rtx": (84.62, None, "2.0x transmissions"), "ack": (85.97, None, "2.16x transmissions"),
         "hybrid_zero_fill": (None, 9356, "notes' prototype 82.2"), "horizontal_zero_fill": (None, 6128, "notes' prototype 44.1")}


def run(overrides: list[str], out: Path) -> dict:
    """One run; its summary.json (plan and summary)."""
    return run_job(FAST + overrides, out)


def one(name: str, seed: int, budget_min: float, passes: int, out: Path) -> dict:
    over = ["experiment=edgepipe", f"seed={seed}", f"scheduler.budget_min={budget_min}", f"scheduler.lossy_test_passes={passes}",
            f"scheduler.lossy_test_seed={seed}"] + CONFIGS[name][0]
    t0 = time.perf_counter()
    s = run(over, out / "runs" / f"{name}_s{seed}")
    ep, lossy = s["edgepipe"], s["edgepipe"]["lossy_test"]
    if "error" in lossy:
        raise RuntimeError(f"{name} seed {seed}: lossy test failed: {lossy['error']}")
    return {"seed": seed, "test_acc": s["metrics"]["test/acc"], "lossy": lossy["acc"], "mean": lossy["mean"], "std": lossy["std"], "min": lossy["min"],
            "frac_below_0.3": lossy["frac_below_0.3"], "minibatches": ep["budget"]["minibatches"], "paper_epoch_step": ep["budget"]["paper_epoch_step"],
            "virtual_min": s["virtual_time_s"] / 60, "slot_s": s["plan"]["slot_s"], "mean_prr": s["plan"]["prr"]["mean_true"],
            "bwd_applied": ep["bwd_applied"], "fwd_arrival": ep["fwd_arrival"], "transmissions": ep["transmissions"], "wall_s": time.perf_counter() - t0}


def aggregate(runs: list[dict]) -> dict:
    accs = [a for r in runs for a in r["lossy"]]
    return {"runs": runs, "mean": statistics.mean(accs), "seed_means": [r["mean"] for r in runs], "spread": statistics.mean(r["std"] for r in runs),
            "min": min(accs), "frac_below_0.3": sum(a < 0.3 for a in accs) / len(accs), "minibatches": runs[0]["minibatches"],
            "data_per_message": statistics.mean(r["transmissions"]["data_per_message"] for r in runs),
            "packets_per_message": statistics.mean(r["transmissions"]["packets_per_message"] for r in runs)}


def checks(res: dict) -> list[tuple[str, bool, str]]:
    """Notes 6.2 items 4-5 and the issue's gate, on whatever configurations ran."""
    out = []
    pt = {k: 100 * v["mean"] for k, v in res.items()}

    def have(*names):
        return all(n in res for n in names)

    # Horizontal's hidden layers almost never get a complete backward. With share_missing=abort
    # (the default) its output layer rarely updates either: +49.8 pt over 3 seeds (Hybrid 83.42 %,
    # Horizontal 33.66 %; paper +67.25). With zero_fill it keeps training on random hidden
    # features: +29.7 pt (the notes' prototype +38).
    if have("hybrid", "horizontal"):
        d = pt["hybrid"] - pt["horizontal"]
        out.append(("hybrid - horizontal >= 30 pt (the issue's gate; paper +67.25)", d >= 30, f"{d:+.1f} pt"))
        out.append(("hybrid - horizontal >= 25 pt (notes 4c)", d >= 25, f"{d:+.1f} pt"))
    if have("hybrid_zero_fill", "horizontal_zero_fill"):
        d = pt["hybrid_zero_fill"] - pt["horizontal_zero_fill"]
        out.append(("with share_missing=zero_fill: hybrid - horizontal (notes' prototype +38; information)", True, f"{d:+.1f} pt"))
    if have("hybrid", "vertical"):
        h, v = res["hybrid"], res["vertical"]
        d = pt["hybrid"] - pt["vertical"]
        out.append(("hybrid > vertical in mean, with a lower spread over test passes", d > 0 and h["spread"] < v["spread"], f"{d:+.1f} pt; std {h['spread']:.3f} vs {v['spread']:.3f}"))
        out.append(("hybrid - vertical >= 5 pt (notes 4a; paper +18.05)", d >= 5, f"{d:+.1f} pt"))
        out.append(("vertical bimodal: std >= 0.15 and >= 10 % of passes < 30 % (notes 4b)", v["spread"] >= 0.15 and v["frac_below_0.3"] >= 0.10,
                    f"std {v['spread']:.3f}, {100 * v['frac_below_0.3']:.0f} % below 30 %"))
        out.append(("hybrid tight: std <= 0.05 and no pass < 30 % (notes 4b)", h["spread"] <= 0.05 and h["frac_below_0.3"] == 0,
                    f"std {h['spread']:.3f}, {100 * h['frac_below_0.3']:.0f} % below 30 %"))
    if have("wo_failure", "naive"):
        d = pt["wo_failure"] - pt["naive"]
        out.append(("hybrid w/o failure >= naive", d >= 0, f"{d:+.1f} pt"))
        out.append(("hybrid w/o failure - naive >= 2 pt (notes 4d)", d >= 2, f"{d:+.1f} pt"))
    if have("wo_failure", "hybrid"):
        d = pt["wo_failure"] - pt["hybrid"]
        out.append(("hybrid w/o failure - hybrid in [0, 8] pt (notes 4e)", 0 <= d <= 8, f"{d:+.1f} pt"))
    if have("hybrid", "model"):
        d = pt["hybrid"] - pt["model"]
        out.append(("hybrid > model at equal time (notes 4f)", d > 0, f"{d:+.1f} pt"))
    if have("rtx", "hybrid"):
        f, d = res["rtx"]["data_per_message"], pt["rtx"] - pt["hybrid"]
        out.append(("r-TX: 2.0 transmissions per message and accuracy >= hybrid - 0.5 pt (notes 5)", f == 2.0 and d >= -0.5, f"{f:.3f}x, {d:+.1f} pt"))
    if have("ack"):
        a = res["ack"]
        out.append(("ACK: transmissions (data + ACK frames) per message in [1.5, 3] (notes 5; paper 2.16)", 1.5 <= a["packets_per_message"] <= 3.0,
                    f"{a['packets_per_message']:.3f}x (data frames alone {a['data_per_message']:.3f}x)"))
    return out


def plots(res: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.boxplot([[100 * a for r in res[n]["runs"] for a in r["lossy"]] for n in names], whis=(0, 100))
    ax.set_xticks(range(1, len(names) + 1), [CONFIGS[n][1].replace(" (", "\n(") for n in names], fontsize=7)
    for i, n in enumerate(names, 1):
        if PAPER[n][0] is not None:
            ax.plot(i, PAPER[n][0], "r*", label="paper" if i == 1 or "paper" not in ax.get_legend_handles_labels()[1] else None)
    ax.set_ylabel("test accuracy over lossy passes (%)")
    ax.set_ylim(0, 100)
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for n in names:
        accs = sorted(100 * a for r in res[n]["runs"] for a in r["lossy"])
        ax.step(accs, [(i + 1) / len(accs) for i in range(len(accs))], where="post", label=CONFIGS[n][1])
    ax.set_xlabel("test accuracy (%)")
    ax.set_ylabel("CDF over test passes")
    ax.set_xlim(0, 100)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "cdf.png", dpi=120)
    plt.close(fig)
    return ["accuracy.png", "cdf.png"]


def report(res: dict, figs: list[str], args, budget_min: float) -> str:
    L = ["# EdgePipe: reproduction report", "", "Yoon et al., *EdgePipe: Tailoring Pipeline Parallelism With Deep Neural Networks for Volatile Wireless Edge Devices*, "
         "IEEE IoT-J 2022. Everything ran on the virtual slot clock; `python experiments/edgepipe_study.py" + (" --quick" if args.quick else "") + "` regenerates it. "
         f"Budget {budget_min:g} simulated minutes per run (paper 194), {args.passes} lossy test passes per trained model, seeds {list(range(args.seeds))}.", ""]
    ch = checks(res)
    if ch:
        L += ["## Acceptance checks", "", "| check | result | measured |", "|---|---|---|"] + [f"| {c} | {'pass' if ok else 'FAIL'} | {m} |" for c, ok, m in ch] + [""]
    L += ["## Accuracy at the budget (lossy test passes)", "",
          "Paper: notes section 4 (Fig. 6(b), 9(f), Table III); the Vertical and Horizontal values are derived from the stated gaps to Hybrid's 80.01 %.", "",
          "| configuration | minibatches (paper) | mean % (paper) | per seed % | std over passes | min % | passes < 30 % | tx / message (data, +ACK) | BW applied per layer |",
          "|---|---|---|---|---|---|---|---|---|"]
    for n, r in res.items():
        pv, pm, note = PAPER[n]
        paper = f"{pv:.2f}" if pv is not None else "-"
        bw = ", ".join(f"{v:.2f}" for v in r["runs"][0]["bwd_applied"].values())
        e, st = r["runs"][0]["paper_epoch_step"]
        L.append(f"| {CONFIGS[n][1]} | {r['minibatches']} = epoch {e}, step {st} ({pm if pm else '-'}) | {100 * r['mean']:.2f} ({paper}{'; ' + note if note else ''}) | "
                 f"{', '.join(f'{100 * m:.2f}' for m in r['seed_means'])} | {r['spread']:.3f} | {100 * r['min']:.1f} | {100 * r['frac_below_0.3']:.0f} % | "
                 f"{r['data_per_message']:.3f}, {r['packets_per_message']:.3f} | {bw} |")
    L += ["", "Minibatches: what the budget holds on each configuration's own slot (the cluster's Table-II-calibrated models; r-TX and ACK slots hold every "
          "copy or retry, so they train fewer). BW applied: fraction of backward steps per layer (2 .. L) that had every partial product, first seed.", ""]
    L += [f"![{f}]({f})" for f in figs]
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/edgepipe_study")
    ap.add_argument("--quick", action="store_true", help="1 seed, a tenth of the budget")
    ap.add_argument("--only", choices=list(CONFIGS), action="append")
    ap.add_argument("--seeds", type=int, default=None, help="training seeds (default 3, 1 with --quick)")
    ap.add_argument("--passes", type=int, default=30, help="lossy test passes per trained model")
    ap.add_argument("--budget-min", type=float, default=None, help=f"simulated minutes (default {BUDGET_MIN:g}, a tenth with --quick)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (fixed, so runs compare)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    args.seeds = args.seeds or (1 if args.quick else 3)
    budget_min = args.budget_min or (BUDGET_MIN / 10 if args.quick else BUDGET_MIN)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    res: dict = {}
    for name in args.only or list(CONFIGS):
        t0 = time.perf_counter()
        res[name] = aggregate([one(name, seed, budget_min, args.passes, out) for seed in range(args.seeds)])
        print(f"{name}: {100 * res[name]['mean']:.2f} % over {res[name]['minibatches']} minibatches, {time.perf_counter() - t0:.0f} s", flush=True)
        (out / "results.json").write_text(json.dumps({"budget_min": budget_min, "seeds": args.seeds, "passes": args.passes, "results": res}, indent=2))
    figs = plots(res, out)
    (out / "report.md").write_text(report(res, figs, args, budget_min))
    for c, ok, m in checks(res):
        print(f"{'pass' if ok else 'FAIL'}  {c}: {m}")
    print(f"report: {out / 'report.md'} ({time.perf_counter() - t_all:.0f} s)")


if __name__ == "__main__":
    main()
