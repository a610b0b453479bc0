"""`select=refine` against `select=auto` and the exhaustive search on the PiPar study's cases.

    OMP_NUM_THREADS=1 python experiments/pipar_refine_check.py              # 18 cases (~3 min on 2 cores)
    OMP_NUM_THREADS=1 python experiments/pipar_refine_check.py --device-model analytic

The cases are experiments/pipar_study.py's selection part: {VGG-5 MNIST, VGG-5 CIFAR-10,
MobileNetV3-Small CIFAR-10} x {4G, 4G+, WiFi}, B = 100, K = 4, on the analytic device model and on
host-profiled batch-size curves (`profile`: measured once, cached in ~/.cache/pipelab). For each
case, on one job: the exhaustive search over every P x N in 1..B (one timing-only trial iteration
each, device 0), auto's plan, and refine with the same trial function
(plugins/schedulers/pipar/refine.py).

score = T_opt / T_selected (epoch = trial iteration x floor(|D_k| / (B' N)), as `exhaustive`);
cost = virtual seconds: exhaustive's is the sum of its trials' iterations, refine's is auto's
profiling cost (`search_virtual_s`) plus the sum of refine's trial iterations. The issue's
acceptance: refine's score >= 0.96 in all 18 cases at cost <= 10% of exhaustive's.

Writes <out>/refine_check.json and <out>/refine_check.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

CASES = [("vgg5", "synthetic_mnist"), ("vgg5", "synthetic_cifar10"), ("mobilenetv3_small", "synthetic_cifar10")]


def run_case(device_model: str, model: str, ds: str, net: str, out: Path, refine_kw: dict) -> dict:
    from pipar_study import DEVICE_MODELS, job_for

    from plugins.schedulers.pipar.refine import refine, trial_cost
    from plugins.schedulers.pipar.search import exhaustive, trial_iteration

    t0 = time.perf_counter()
    job = job_for(["scheduler=pipar", f"cluster={net}", f"model={model}", f"dataset={ds}", "train.batch_size=100", "runtime.numerics=false", *DEVICE_MODELS[device_model]], out / "tmp")
    sched = job.scheduler
    plan = sched.planner  # the (P, N) planning part of the scheduler
    k = 0
    opt, trials = exhaustive(plan, k, plan.p_range())
    by = {(t["P"], t["N"]): t for t in trials}
    s_opt = sum(t["iter_s"] for t in trials)
    auto = sched.plans[k]  # select=auto, the default
    profiling = max(plan.profile_cost(j) for j in range(len(sched.plans)))  # what auto pays, refine too
    t1 = time.perf_counter()
    best, mine = refine(plan.pair_model(k), plan.B, plan.shard_sizes[k], plan.p_range(), lambda P, N: trial_iteration(plan, k, P, N), clamp=plan.knobs.n_clamp, estimator=plan.knobs.estimator, **refine_kw)
    wall_refine = time.perf_counter() - t1
    mismatch = max((abs(t["iter_s"] - by[(t["P"], t["N"])]["iter_s"]) for t in mine if (t["P"], t["N"]) in by), default=0.0)
    cost = profiling + trial_cost(mine)
    return {
        "device_model": device_model, "model": model, "data": ds.replace("synthetic_", ""), "net": net,
        "opt": [opt["P"], opt["N"]], "T_opt": opt["epoch_s"], "S_opt": s_opt,
        "auto": [auto.P, auto.N], "T_auto": by[(auto.P, auto.N)]["epoch_s"], "S_auto": profiling,
        "refine": [best["P"], best["N"]], "T_refine": best["epoch_s"], "S_refine": cost, "refine_trials": len(mine),
        "refine_phases": {ph: sum(t["phase"] == ph for t in mine) for ph in ("design", "refine", "bracket")},
        "score_auto": opt["epoch_s"] / by[(auto.P, auto.N)]["epoch_s"], "score_refine": opt["epoch_s"] / best["epoch_s"],
        "cost_ratio": cost / s_opt, "trial_mismatch_s": mismatch, "wall_s": time.perf_counter() - t0, "wall_refine_s": wall_refine,
    }


def main() -> None:
    from pipar_study import NET_LABEL, NETS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/pipar_refine_check")
    ap.add_argument("--device-model", choices=["analytic", "profile"], action="append", help="default: both")
    ap.add_argument("--refine", default="", help="refine() keyword overrides, e.g. 'top_p=2,design=3'")
    args = ap.parse_args()
    refine_kw = eval(f"dict({args.refine})", {})  # noqa: S307  (a local experiment's own flag)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    head = f"{'device model':12s} {'model':18s} {'data':8s} {'net':5s} | {'opt (P,N)':9s} | {'auto':8s} score | {'refine':8s} score trials cost/exh"
    print(head, flush=True)
    for dm in args.device_model or ["analytic", "profile"]:
        for model, ds in CASES:
            for net in NETS:
                r = run_case(dm, model, ds, net, out, refine_kw)
                rows.append(r)
                print(f"{dm:12s} {model:18s} {r['data']:8s} {NET_LABEL[net]:5s} | ({r['opt'][0]},{r['opt'][1]:3d})   | ({r['auto'][0]},{r['auto'][1]:3d})  {r['score_auto']:.3f} | "
                      f"({r['refine'][0]},{r['refine'][1]:3d})  {r['score_refine']:.3f} {r['refine_trials']:6d} {100 * r['cost_ratio']:6.2f}%", flush=True)
    ok_score = all(r["score_refine"] >= 0.96 for r in rows)
    ok_cost = all(r["cost_ratio"] <= 0.10 for r in rows)
    summary = (f"refine: score >= 0.96 in {sum(r['score_refine'] >= 0.96 for r in rows)}/{len(rows)} (min {min(r['score_refine'] for r in rows):.3f}), "
               f"exact optimum in {sum(r['refine'] == r['opt'] for r in rows)}/{len(rows)}, cost/exhaustive max {100 * max(r['cost_ratio'] for r in rows):.2f}% "
               f"(mean {100 * sum(r['cost_ratio'] for r in rows) / len(rows):.2f}%), trials {min(r['refine_trials'] for r in rows)}-{max(r['refine_trials'] for r in rows)}; "
               f"auto: score >= 0.96 in {sum(r['score_auto'] >= 0.96 for r in rows)}/{len(rows)} (min {min(r['score_auto'] for r in rows):.3f}); "
               f"acceptance {'MET' if ok_score and ok_cost else 'NOT MET'}; refine trials match exhaustive's to {max(r['trial_mismatch_s'] for r in rows):.1e} s")
    print(summary)
    (out / "refine_check.json").write_text(json.dumps({"rows": rows, "refine_kw": refine_kw, "summary": summary}, indent=1))
    lines = [f"# select=refine check\n\n`python experiments/pipar_refine_check.py {' '.join(sys.argv[1:])}`; B = 100, K = 4, device 0; virtual seconds.\n",
             "| device model | model | data | net | opt (P, N) | T_opt | auto (P, N) | auto score | refine (P, N) | refine score | trials | refine cost / exhaustive |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['device_model']} | {r['model']} | {r['data']} | {NET_LABEL[r['net']]} | ({r['opt'][0]}, {r['opt'][1]}) | {r['T_opt']:.2f} | ({r['auto'][0]}, {r['auto'][1]}) | {r['score_auto']:.3f} | "
                     f"({r['refine'][0]}, {r['refine'][1]}) | {r['score_refine']:.3f} | {r['refine_trials']} | {100 * r['cost_ratio']:.2f}% |")
    (out / "refine_check.md").write_text("\n".join(lines) + f"\n\n{summary}\n")
    print(f"wrote {out / 'refine_check.md'}")


if __name__ == "__main__":
    main()
