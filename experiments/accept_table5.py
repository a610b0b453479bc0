"""AccEPT's Table 5 and its planning claims (Tables 2 and 4.2.2, Fig. 4), with two-sided verdicts.

    python experiments/accept_table5.py                  # the full form: 469 mini-batches per epoch (about 25 minutes)
    python experiments/accept_table5.py --quick          # 40 mini-batches per epoch (about 4 minutes)
    python experiments/accept_table5.py --no-planning    # Table 5 and its figure alone (about 2 minutes once the predictor is cached)
    python experiments/accept_table5.py --in-flight 5    # a depth other than the preset's (not the paper's mechanism)
    python experiments/accept_table5.py --quick scheduler.partition=search   # any override, for every run (a what-if)

Each Table 5 cell is one simulated epoch (timing only) of `experiment=accept` (MobileNetV2, batch
128, PipeDream's asynchronous 1F1B with weight stashing and one mini-batch in flight per stage,
the DP partitioner) on the scenario's cluster (conf/cluster/accept_s1.yaml, accept_s2.yaml: the
paper's CPUs, per-unit times measured here times per-core speeds fitted to Table 4.2.2; see
docs/calibration.md) at one link bandwidth, with the method's predictor and compressor:

    FTPipeHD  predictor=capacity compressor=none
    BLC only  predictor=capacity compressor=mbq     (bit-level compression)
    LP only   predictor=accept_mobilenetv2 compressor=none  (the latency predictor)
    AccEPT    predictor=accept_mobilenetv2 compressor=mbq

The full form runs MNIST's 60000 samples per epoch (469 mini-batches), so a cell's seconds per
mini-batch compare with the paper's minutes / (100 epochs x 468.75). Every run also records the
epoch its plan predicted (plan/predicted_epoch_s); the report sets it beside the simulated one
and beside the same plan priced with the devices' true costs, which separates the predictor's
error from the planner's model of the pipeline.

Verdicts (experiments/verdicts.py) for every Table 5 number (seconds per mini-batch and speed-ups
over FTPipeHD, all four methods, five bandwidths, both scenarios), the speed-ups the text quotes,
the orderings the paper states, and (experiments/accept_planning.py) Table 4.2.2's held-out row,
Table 2's partition points, Fig. 4's per-layer error and the predictors' accuracy on the scenario
devices (Fig. 7's unseen Xeon Gold 6133 is scenario 1's worker). Writes <out>/report.md,
results.json and speedup_vs_bandwidth.png (the sensitivity: each method's speed-up against
bandwidth, ours beside the paper's with its +-20 % band), with its data beside it
(speedup_vs_bandwidth.json: the plotted numbers, experiments/figure_data.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import accept_paper as paper  # noqa: E402
from experiments import accept_planning as planning  # noqa: E402
from experiments import figure_data  # noqa: E402
from experiments.verdicts import Claim, Ordering, as_json, print_verdicts, verdict_table  # noqa: E402

METHODS = {
    "ftpipehd": ["predictor=capacity", "compressor=none"],
    "blc": ["predictor=capacity", "compressor=mbq"],
    "lp": ["predictor=accept_mobilenetv2", "compressor=none"],
    "accept": ["predictor=accept_mobilenetv2", "compressor=mbq"],
}
SCENARIOS = ("accept_s1", "accept_s2")
FULL_SAMPLES = 60000  # MNIST's training set: 469 mini-batches of 128


EXTRA: list[str] = []  # the command line's overrides, for every run


def base_overrides(scenario: str, quick: bool, in_flight: int | None) -> list[str]:
    return ["experiment=accept", f"cluster={scenario}", "runtime.numerics=false", "tracking=none", "runtime.progress=false",
            *([] if quick else [f"dataset.n_train={FULL_SAMPLES}"]), *([f"scheduler.in_flight={in_flight}"] if in_flight else []), *EXTRA]


def run_cell(overrides: list[str], out: Path) -> dict:
    """One run: its epoch, seconds per mini-batch (of 128 samples' compute), cuts, and the plan's
    predicted epoch, with the method's predictor and with the devices' true costs."""
    from experiments.study_runs import build_job

    job = build_job(overrides, out)
    summary = job.run()
    sched = job.scheduler
    samples = len(job.dataset.x_train)
    pred = summary["prediction"] or {}
    return {"epoch_s": summary["virtual_time_s"], "per_batch_s": summary["virtual_time_s"] / (samples / int(job.cfg.train.batch_size)),
            "cuts": [b for _, b in sched.bounds[:-1]], "predicted_epoch_s": pred.get("predicted_epoch_s"),
            "true_cost_epoch_s": planning.true_cost_epoch_s(sched), "in_flight": job.cfg.scheduler.in_flight}


def grid(scenarios, bandwidths, quick: bool, in_flight: int | None, out: Path) -> dict:
    cells = {}
    for sc in scenarios:
        for bw in bandwidths:
            for m, over in METHODS.items():
                c = cells[(sc, bw, m)] = run_cell(base_overrides(sc, quick, in_flight) + [f"cluster.link.bandwidth_bps={bw * 1e6}", *over], out / "runs" / f"{sc}_{bw:g}_{m}")
                print(f"{sc} {bw:g} Mbit/s {m:8s} epoch {c['epoch_s']:8.2f} s ({c['per_batch_s']:.3f} s per mini-batch)  cuts {c['cuts']}  "
                      f"predicted {c['predicted_epoch_s']:.2f} s, true-cost plan {c['true_cost_epoch_s']:.2f} s", flush=True)
    return cells


def table5_claims(cells: dict, scenarios, bandwidths, command: str) -> list:
    """Every Table 5 number, the quoted speed-ups and the stated orderings."""
    claims: list = []
    sp = {k: cells[(k[0], k[1], "ftpipehd")]["epoch_s"] / v["epoch_s"] for k, v in cells.items()}
    cols = [(bw, paper.BANDWIDTHS.index(bw)) for bw in bandwidths if bw in paper.BANDWIDTHS]
    for sc in scenarios:
        n = sc[-1]
        for bw, i in cols:
            for m, name in paper.METHOD_NAMES.items():
                claims.append(Claim(f"S{n} {bw:g} Mbit/s: {name}, s per mini-batch", paper.per_batch_s(paper.TABLE5_MINUTES[sc][m][i]),
                                    cells[(sc, bw, m)]["per_batch_s"], source="Table 5", command=command))
            for m in ("blc", "lp", "accept"):
                claims.append(Claim(f"S{n} {bw:g} Mbit/s: FTPipeHD / {paper.METHOD_NAMES[m]}", paper.speedups(sc, m)[i], sp[(sc, bw, m)],
                                    source="Table 5", command=command))
    for (sc, bw, m), value in paper.QUOTED.items():
        if sc in scenarios and bw in bandwidths:
            claims.append(Claim(f"S{sc[-1]} {bw:g} Mbit/s: FTPipeHD / {paper.METHOD_NAMES[m]} (quoted)", value, sp[(sc, bw, m)], source="Sec. 4.4 text", command=command))
    bws = sorted(bandwidths)
    for sc in scenarios:
        n = sc[-1]
        slower = [f"{bw:g}" for bw in bws if cells[(sc, bw, "accept")]["epoch_s"] > min(cells[(sc, bw, m)]["epoch_s"] for m in ("ftpipehd", "blc", "lp"))]
        claims.append(Ordering(f"S{n}: AccEPT the fastest of the four at every bandwidth", "at 0.25-4 Mbit/s",
                               "everywhere" if not slower else f"not at {', '.join(slower)} Mbit/s", not slower, source="Table 5", command=command))
        # the paper's every Table 5 speed-up is above 1 (its smallest: BLC's 1.02): a method that
        # ties FTPipeHD (the same plan) does not show it
        worse = [f"{paper.METHOD_NAMES[m]} {sp[(sc, bw, m)]:.2f} at {bw:g}" for bw in bws for m in ("blc", "lp", "accept") if not sp[(sc, bw, m)] > 1.0]
        claims.append(Ordering(f"S{n}: every method faster than FTPipeHD at every bandwidth", "all speed-ups > 1 (the smallest 1.02)",
                               "all" if not worse else "not: " + ", ".join(worse), not worse, source="Table 5", command=command))
        for m in ("blc", "accept"):
            seq = [sp[(sc, bw, m)] for bw in bws]
            claims.append(Ordering(f"S{n}: {paper.METHOD_NAMES[m]}'s gain falls as bandwidth grows", ", ".join(f"{x:.2f}" for x in paper.speedups(sc, m)),
                                   ", ".join(f"{x:.2f}" for x in seq), all(a >= b for a, b in zip(seq, seq[1:])), source="Table 5", command=command))
        for bw, lp_first in ((4.0, True), (2.0, True), (0.25, False)):
            if bw in bandwidths:
                lp, blc = sp[(sc, bw, "lp")], sp[(sc, bw, "blc")]
                i = paper.BANDWIDTHS.index(bw)
                pl, pb = paper.speedups(sc, "lp")[i], paper.speedups(sc, "blc")[i]
                claims.append(Ordering(f"S{n} {bw:g} Mbit/s: {'LP' if lp_first else 'BLC'}'s gain above {'BLC' if lp_first else 'LP'}'s",
                                       f"LP {pl:.2f}, BLC {pb:.2f}", f"LP {lp:.2f}, BLC {blc:.2f}", lp > blc if lp_first else blc > lp, source="Table 5, Sec. 4.4", command=command))
    return claims


def plot(cells: dict, scenarios, bandwidths, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 3.6), squeeze=False)
    bws = sorted(bandwidths)
    data = {"figure": "accept speed-up over FTPipeHD against bandwidth (Mbit/s), ours and the paper's (band: +-20 %)", "bandwidths": bws, "scenarios": {}}
    for ax, sc in zip(axes[0], scenarios):
        for m, color, style in (("blc", "C1", dict(marker="s", ms=5)), ("lp", "C2", dict(marker="s", ms=5)), ("accept", "C0", dict(marker="o", ms=9, mfc="none"))):
            ours = [cells[(sc, bw, "ftpipehd")]["epoch_s"] / cells[(sc, bw, m)]["epoch_s"] for bw in bws]
            ax.plot(bws, ours, "-", color=color, label=f"{paper.METHOD_NAMES[m]}, ours", **style)  # AccEPT hollow: it may cover BLC
            ref = paper.speedups(sc, m)
            pb = [bw for bw in bws if bw in paper.BANDWIDTHS]
            pv = [ref[paper.BANDWIDTHS.index(bw)] for bw in pb]
            data["scenarios"].setdefault(sc, {})[paper.METHOD_NAMES[m]] = {"ours": ours, "paper_bandwidths": pb, "paper": pv}
            ax.plot(pb, pv, "--", color=color, lw=1, label=f"{paper.METHOD_NAMES[m]}, paper")
            ax.fill_between(pb, [0.8 * v for v in pv], [1.2 * v for v in pv], color=color, alpha=0.12, lw=0)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(bws, [f"{bw:g}" for bw in bws])
        ax.set_xlabel("link bandwidth (Mbit/s)")
        ax.set_ylabel("speed-up over FTPipeHD")
        ax.set_title(f"scenario {sc[-1]} (shaded: paper +-20 %)", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    figure_data.save(fig, path, data, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: both")
    ap.add_argument("--bandwidths", type=float, nargs="+", default=list(paper.BANDWIDTHS), help="Mbit/s")
    ap.add_argument("--in-flight", type=int, default=None, help="scheduler.in_flight (default: the preset's, one per stage)")
    ap.add_argument("--quick", action="store_true", help="the synthetic set's 5000 samples per epoch (40 mini-batches) instead of 60000")
    ap.add_argument("--no-planning", dest="planning", action="store_false", help="Table 5 alone: skip Tables 2 and 4.2.2, Fig. 4 and the predictors' accuracy")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "accept_table5")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (a what-if beside the preset, e.g. scheduler.partition=search)")
    args = ap.parse_args()
    EXTRA[:] = args.overrides
    scenarios = args.scenario or list(SCENARIOS)
    args.out.mkdir(parents=True, exist_ok=True)
    command = ("python experiments/accept_table5.py" + (" --quick" if args.quick else "") + ("" if args.planning else " --no-planning")
               + (f" --in-flight {args.in_flight}" if args.in_flight else "") + "".join(f" {o}" for o in args.overrides))
    t0 = time.perf_counter()
    cells = grid(scenarios, args.bandwidths, args.quick, args.in_flight, args.out)
    claims = table5_claims(cells, scenarios, args.bandwidths, command)
    plan = planning.study(scenarios, args.quick, args.in_flight, args.out / "planning", command) if args.planning else {"claims": [], "lines": [], "results": {}}
    claims += plan["claims"]
    plot(cells, scenarios, args.bandwidths, args.out / "speedup_vs_bandwidth.png")
    print_verdicts("AccEPT, Table 5 and planning", claims)
    depth = next(iter(cells.values()))["in_flight"]
    lines = ["# AccEPT, Table 5 and planning", "",
             f"Simulated epochs (timing only) of `experiment=accept`, {'40' if args.quick else '469'} mini-batches of 128, "
             f"{depth or 'one per stage'} mini-batches in flight; `{command}` ({time.perf_counter() - t0:.0f} s).", "",
             "## Table 5: seconds per mini-batch (paper in brackets), speed-up over FTPipeHD", ""]
    for sc in scenarios:
        lines += [f"### {sc}", "", "| Mbit/s | FTPipeHD s | BLC only s (x) | LP only s (x) | AccEPT s (x) | cuts F / B / L / A |", "|---|---|---|---|---|---|"]
        for bw in args.bandwidths:
            i = paper.BANDWIDTHS.index(bw) if bw in paper.BANDWIDTHS else None
            ref = (lambda m: f" ({paper.per_batch_s(paper.TABLE5_MINUTES[sc][m][i]):.3f})" if i is not None else "")  # noqa: E731
            cell = (lambda m: f"{cells[(sc, bw, m)]['per_batch_s']:.3f}{ref(m)} ({cells[(sc, bw, 'ftpipehd')]['epoch_s'] / cells[(sc, bw, m)]['epoch_s']:.2f}x)")  # noqa: E731
            lines.append(f"| {bw:g} | {cells[(sc, bw, 'ftpipehd')]['per_batch_s']:.3f}{ref('ftpipehd')} | {cell('blc')} | {cell('lp')} | {cell('accept')} | "
                         + " / ".join(str(cells[(sc, bw, m)]["cuts"]) for m in METHODS) + " |")
        lines.append("")
    lines += ["![speed-up against bandwidth](speedup_vs_bandwidth.png)", "", "## The plans' predicted epochs", "",
              "`predicted`: plan/predicted_epoch_s (the method's predictor; framework/pipeline/cost.py plays the stages' actions out); "
              "`true-cost plan`: the same plan played out on the devices' own times; `simulated`: the epoch the run took.", "",
              "| scenario | Mbit/s | method | predicted s | true-cost plan s | simulated s | simulated / predicted | simulated / true-cost |", "|---|---|---|---|---|---|---|---|"]
    for (sc, bw, m), c in cells.items():
        lines.append(f"| {sc} | {bw:g} | {m} | {c['predicted_epoch_s']:.2f} | {c['true_cost_epoch_s']:.2f} | {c['epoch_s']:.2f} | "
                     f"{c['epoch_s'] / c['predicted_epoch_s']:.3f} | {c['epoch_s'] / c['true_cost_epoch_s']:.3f} |")
    lines += [""] + plan["lines"] + ["", "## Verdicts", ""] + verdict_table(claims, with_command=True)
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({"cells": {f"{k[0]} {k[1]:g} {k[2]}": v for k, v in cells.items()}, "planning": plan["results"],
                                                       "verdicts": as_json(claims)}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
