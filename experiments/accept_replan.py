"""AccEPT's re-planning when a device drifts (notes 2.1, `scheduler.replan_epsilon`), as ratios.

    python experiments/accept_replan.py                  # about 1 minute
    python experiments/accept_replan.py --factor 2 --at 30 --bandwidth 1

`experiment=accept` (MobileNetV2, batch 128, PipeDream's asynchronous 1F1B, the DP partitioner) on
scenario 1 for four epochs, timing only; worker dev1 computes `--factor` times slower from
`--at` seconds on (a device speed trace: another app took its core). FTPipeHD (predictor=capacity,
no compression) and AccEPT (predictor=accept_mobilenetv2, MBQ) each run with the plan fixed and with
re-planning at epsilon = 0.15: every stage reports its measured forward + backward time per
mini-batch at each epoch's end, and stage 0 re-plans when one is more than 15 % off. Prints and
writes <out>/report.md and results.json: total virtual time, the speed-up re-planning gives, and
each decision (the epoch, the stages called off, measured against predicted, the new cuts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.study_runs import run_job  # noqa: E402

METHODS = {"ftpipehd": ["predictor=capacity", "compressor=none"], "accept": ["predictor=accept_mobilenetv2", "compressor=mbq"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factor", type=float, default=3.0, help="how many times slower dev1 computes after --at")
    ap.add_argument("--at", type=float, default=60.0, help="virtual seconds into the run when dev1 slows down")
    ap.add_argument("--bandwidth", type=float, default=4.0, help="Mbit/s per link")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--epsilon", type=float, default=0.15)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "accept_replan")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base = ["experiment=accept", "runtime.numerics=false", "tracking=none", "runtime.progress=false", f"train.epochs={args.epochs}",
            f"cluster.link.bandwidth_bps={args.bandwidth * 1e6}", f"+cluster.devices.dev1.trace=[[{args.at},{args.factor}]]"]
    results: dict = {}
    for m, over in METHODS.items():
        for mode, extra in (("fixed", []), ("replan", [f"scheduler.replan_epsilon={args.epsilon}"])):
            s = run_job(base + over + extra, args.out / "runs" / f"{m}_{mode}")
            results[(m, mode)] = {"virtual_s": s["virtual_time_s"], "cuts": [st["units"][1] for st in s["plan"]["stages"][:-1]], "replans": s.get("replans", [])}
            print(f"{m:9s} {mode:6s} {s['virtual_time_s']:8.2f} s  replans {len(s.get('replans', []))}", flush=True)
    lines = ["# AccEPT: re-planning when a device drifts", "",
             f"`experiment=accept` on scenario 1 at {args.bandwidth:g} Mbit/s, {args.epochs} epochs, timing only; dev1 computes {args.factor:g}x slower "
             f"from {args.at:g} s on. Re-planning: epsilon = {args.epsilon}. `python experiments/accept_replan.py` ({time.perf_counter() - t0:.0f} s).", "",
             "| method | plan fixed (s) | re-planning (s) | speed-up |", "|---|---|---|---|"]
    for m in METHODS:
        fixed, rep = results[(m, "fixed")]["virtual_s"], results[(m, "replan")]["virtual_s"]
        lines.append(f"| {m} | {fixed:.2f} | {rep:.2f} | {fixed / rep:.2f}x |")
    lines += ["", "Decisions (stage 0 at an epoch's end: measured against predicted fwd+bwd seconds per mini-batch, then the new cuts):", ""]
    for m in METHODS:
        lines.append(f"- {m}: planned cuts {results[(m, 'replan')]['cuts']}")
        for e in results[(m, "replan")]["replans"]:
            pairs = ", ".join(f"{r} {e['measured_s'][i]:.2f}/{e['predicted_s'][i]:.2f}" for i, r in enumerate(f"stage{k}" for k in range(len(e["measured_s"]))))
            lines.append(f"  - epoch {e['epoch']} (t = {e['time_s']:.1f} s): off {', '.join(e['drifted'])} ({pairs}); cuts {[b for _, b in e['bounds'][:-1]]}, "
                         f"predicted epoch {e['predicted_epoch_s']:.2f} s")
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({f"{m} {mode}": v for (m, mode), v in results.items()}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
