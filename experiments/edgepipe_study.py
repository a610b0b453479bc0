"""EdgePipe reproduction study (Yoon et al., IEEE IoT-J 2022): one command, one report.

    python experiments/edgepipe_study.py            # 4 placements (2 for most), the 194-minute budget, 100 test passes
    python experiments/edgepipe_study.py --quick    # 2 placements (1), a tenth of the budget, 10 test passes
    python experiments/edgepipe_study.py --only hybrid --only vertical --placements 3
    python experiments/edgepipe_study.py --groups ablation      # only the share_missing ablation
    python experiments/edgepipe_study.py --resume   # reuse the runs an interrupted study finished

The paper's numbers come from random device placements in a 50 x 50 m region (Fig. 3(a) is one;
Fig. 9(c) reports the spread over several). So every configuration that sees the channel runs on
placements 0 .. n-1 (`scheduler.prr.topology_seed`, unselected: their mean PRRs scatter around
the paper's 80.9 %, which the channel's K is fitted to), each with the same training seed, so
only the placement changes; a lossless one (Naive, w/o Failure) runs once. CPU time decides how
many: Hybrid and Vertical, the pair whose spread over placements Fig. 9(c) reports, run on all
(4); every other configuration on the first 2, and each claim compares configurations on the
placements they share. (A 194-minute run takes 2.5-10 CPU minutes here; Horizontal's 300
messages a minibatch cost the most.) Each trains for the
paper's 194 simulated minutes on its own slot clock (Table III's minibatches follow from the
cluster's slot and Theorem 1) and is tested with the paper's 100 lossy test passes (one draw per
link per pass). Configurations (experiments/edgepipe_runs.py):

    main:      Hybrid (EdgePipe), Vertical (PipeDream core), Horizontal, Model (no pipelining; runs
               2.5 x the budget for its time to 80 %, and is read at 194 min), Naive, w/o Failure
    recovery:  Hybrid + r-TX (2 copies), Hybrid + ACK (<= 3 retries)          (Fig. 9(f))
    devices4:  Hybrid, Vertical, Horizontal on 4 devices, first placement only (Fig. 9(e))
    ablation:  Hybrid and Horizontal with share_missing=zero_fill (the notes' proposal; only with
               --groups ablation: it is no claim of the paper)

Hybrid and Model record test accuracy over time (65 snapshots in the budget, every 2.98
simulated minutes, 5 lossy passes each) for Fig. 7's time to 80 %; Hybrid, Vertical and Horizontal are also tested at the
other path-loss exponents of Table I (Fig. 9(b)). Without training, the study measures the
partition, the traffic, the cluster's compute beside Table II and the mapping's scores (Fig. 8).

Prints two-sided verdicts (experiments/verdicts.py) for every claim of the notes
(experiments/edgepipe_claims.py), the planner's predicted epoch beside the simulated one, and
writes <out>/report.md, verdicts.md (the table with the command, for docs/reproductions.md),
results.json, records/ (one JSON per run) and the plots (each with its plotted numbers beside it
as .json, experiments/figure_data.py).
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

from experiments import edgepipe_plan_facts as facts  # noqa: E402
from experiments.edgepipe_claims import all_claims, pct, planner_rows  # noqa: E402
from experiments.edgepipe_plots import plots  # noqa: E402
from experiments.edgepipe_runs import BUDGET_MIN, CONFIGS, Settings, run  # noqa: E402
from experiments.verdicts import as_json, print_verdicts, verdict_table  # noqa: E402

GROUPS = ("main", "recovery", "devices4", "ablation")
DEFAULT_GROUPS = ("main", "recovery", "devices4")


def settings(args) -> Settings:
    q = args.quick
    budget = args.budget_min or (BUDGET_MIN / 10 if q else BUDGET_MIN)
    # the accuracy curve's grid divides the budget, so a longer run (Model) has a snapshot on it
    return Settings(budget_min=budget, passes=args.passes or (10 if q else 100),
                    curve_every_min=budget / (args.curve_points or (20 if q else 65)), curve_passes=args.curve_passes or (3 if q else 5),
                    fig9b_passes=args.fig9b_passes or (5 if q else 20))


def one(name: str, placement: int | None, s: Settings, out: Path, resume: bool) -> dict:
    """A run's record, reused from records/ with --resume when it ran with these settings."""
    tag = f"{name}_p{placement}" if placement is not None else name
    path = out / "records" / f"{tag}.json"
    if resume and path.exists():
        saved = json.loads(path.read_text())
        if all(saved.get("settings", {}).get(k) == v for k, v in s.relevant(name).items()):
            return saved["record"]
    rec = run(name, placement, s, out / "runs" / tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": s.key(), "record": rec}))
    return rec


def report(res: dict, claims: list, figs: list[str], args, s: Settings) -> str:
    runs = res["runs"]
    L = ["# EdgePipe: reproduction report", "",
         "Yoon et al., *EdgePipe: Tailoring Pipeline Parallelism With Deep Neural Networks for Volatile Wireless Edge Devices*, IEEE IoT-J 2022. "
         f"Everything ran on the virtual slot clock: `python experiments/edgepipe_study.py{' --quick' if args.quick else ''}` regenerates it. "
         f"Budget {s.budget_min:g} simulated minutes (paper 194), placements {res['placements']} (topology seeds), training seed {s.seed}, "
         f"{s.passes} lossy test passes per trained model; accuracy over time every {s.curve_every_min:g} min with {s.curve_passes} passes; "
         f"Fig. 9(b) with {s.fig9b_passes} passes per exponent.", "",
         "## Verdicts", ""] + verdict_table(claims) + [""]
    L += ["## The planner against the simulator", "", "Predicted epoch (`plan/predicted_epoch_s`, Theorem 1's slots x the slot) and the simulated one, "
          "the placement furthest off per configuration.", "", "| configuration | predicted s | simulated s | simulated / predicted |", "|---|---|---|---|"]
    L += [f"| {CONFIGS[n].label} | {p:.2f} | {e:.2f} | {r:.4f} |" for n, p, e, r in planner_rows(res)] + [""]
    L += ["## Accuracy at the budget", "", "Mean over placements of the mean over test passes (%); Model as it stood at 194 min of its longer run.", "",
          "| configuration | minibatches | mean % | per placement % | std over passes | min % | passes < 30 % | tx / message (data, +ACK) | BW applied per layer (first placement) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for n, recs in runs.items():
        a = pct(n, res)
        src = [r.get("at_budget", r) for r in recs]
        accs = [x for r in src for x in r["lossy"]]
        mb = recs[0]["at_budget"]["minibatches"] if "at_budget" in recs[0] else recs[0]["minibatches"]
        tx = recs[0]["transmissions"]
        L.append(f"| {CONFIGS[n].label} | {mb} | {statistics.mean(a):.2f} | {', '.join(f'{x:.1f}' for x in a)} | {statistics.mean(r['std'] for r in src):.3f} | "
                 f"{100 * min(accs):.1f} | {100 * sum(x < 0.3 for x in accs) / len(accs):.0f} % | {tx['data_per_message']:.3f}, {tx['packets_per_message']:.3f} | "
                 f"{', '.join(f'{v:.2f}' for v in recs[0]['bwd_applied'].values())} |")
    if "hybrid" in runs:
        placed = [n for n in runs if CONFIGS[n].placed]
        at = {n: dict(zip((r["placement"] for r in runs[n]), pct(n, res))) for n in placed}
        L += ["", "## Placements", "", "Accuracy (%) per placement; the 4-device runs place 4 devices with the same seed.", "",
              "| placement | mean PRR % | weakest link PRR % | " + " | ".join(CONFIGS[n].label for n in placed) + " |", "|---|---|---|" + "---|" * len(placed)]
        for r in runs["hybrid"]:
            p = r["placement"]
            L.append(f"| {p} | {100 * r['mean_prr']:.1f} | {100 * r['min_prr']:.1f} | " + " | ".join(f"{at[n][p]:.1f}" if p in at[n] else "" for n in placed) + " |")
    L += ["", "Minibatches: what the budget holds on each configuration's own slot (r-TX and ACK slots hold every copy or retry, so they train fewer). "
          "BW applied: fraction of backward steps per layer (2 .. L) that had every partial product.", ""]
    L += [f"![{f}]({f})" for f in figs]
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/edgepipe_study")
    ap.add_argument("--quick", action="store_true", help="2 placements, a tenth of the budget, fewer test passes")
    ap.add_argument("--only", choices=list(CONFIGS), action="append", help="run only these configurations")
    ap.add_argument("--groups", choices=GROUPS, action="append", help=f"configuration groups (default: {', '.join(DEFAULT_GROUPS)})")
    ap.add_argument("--placements", type=int, default=None, help="topology seeds 0 .. n-1 of Hybrid and Vertical (default 4, 2 with --quick)")
    ap.add_argument("--side-placements", type=int, default=None, help="the first placements of the others (default 2, 1 with --quick)")
    ap.add_argument("--passes", type=int, default=None, help="lossy test passes per trained model (default 100, the paper's; 10 with --quick)")
    ap.add_argument("--budget-min", type=float, default=None, help=f"simulated minutes (default {BUDGET_MIN:g}, a tenth with --quick)")
    ap.add_argument("--curve-points", type=int, default=None, help="accuracy snapshots within the budget (default 65: every 2.98 min; 20 with --quick)")
    ap.add_argument("--curve-passes", type=int, default=None, help="lossy passes per snapshot (default 5, 3 with --quick)")
    ap.add_argument("--fig9b-passes", type=int, default=None, help="lossy passes per test exponent (default 20, 5 with --quick)")
    ap.add_argument("--no-plan-facts", action="store_true", help="skip the Table II components and the mapping over placements")
    ap.add_argument("--resume", action="store_true", help="reuse records/ of runs with the same settings")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (fixed, so runs compare)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    s = settings(args)
    placements = list(range(args.placements or (2 if args.quick else 4)))
    side = placements[: args.side_placements or (1 if args.quick else 2)]
    groups = args.groups or DEFAULT_GROUPS
    names = [n for n in (args.only or CONFIGS) if CONFIGS[n].group in groups]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    res: dict = {"settings": s.key(), "placements": placements, "plan": {"partition": facts.partition_facts()}, "runs": {}}
    if not args.no_plan_facts:
        res["plan"]["components"] = facts.component_facts(out)
        res["plan"]["mapping"] = facts.mapping_facts(placements)
    todo = [(n, None) for n in names if not CONFIGS[n].placed]
    todo += [(n, p) for p in placements for n in names if CONFIGS[n].placed and (CONFIGS[n].every_placement or p in side[: CONFIGS[n].max_placements])]
    for n, p in todo:
        t0 = time.perf_counter()
        res["runs"].setdefault(n, []).append(rec := one(n, p, s, out, args.resume))
        where = "lossless" if p is None else f"placement {p} (PRR {100 * rec['mean_prr']:.1f} %)"
        print(f"{where} {n}: {100 * rec['mean']:.2f} % over {rec['minibatches']} minibatches, {time.perf_counter() - t0:.0f} s", flush=True)
    res["runs"] = {n: res["runs"][n] for n in CONFIGS if n in res["runs"]}  # the table's order
    claims = all_claims(res)
    res["verdicts"] = as_json(claims)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    figs = plots(res, out)
    (out / "report.md").write_text(report(res, claims, figs, args, s))
    (out / "verdicts.md").write_text("\n".join(verdict_table(claims, with_command=True)) + "\n")  # for docs/reproductions.md
    print_verdicts("EdgePipe", claims)
    print("planner: simulated / predicted epoch, the furthest placement per configuration")
    for n, p_s, e_s, r in planner_rows(res):
        print(f"  {n}: {p_s:.2f} s predicted, {e_s:.2f} s simulated, {r:.4f}")
    print(f"report: {out / 'report.md'} ({time.perf_counter() - t_all:.0f} s)")


if __name__ == "__main__":
    main()
