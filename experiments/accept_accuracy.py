"""AccEPT's Table 4 on HAR-shaped data: accuracy under MBQ against uniform quantisation.

    python experiments/accept_accuracy.py                 # 3 seeds x 5 configurations, 20 epochs
    python experiments/accept_accuracy.py --seeds 1 --epochs 5

The HAR CNN (model=har_cnn, 9 x 128 inputs, 6 classes) on the synthetic HAR set trains as the
paper's accuracy runs do: three stages (cluster=uniform, three devices) of PipeDream's
asynchronous 1F1B with weight stashing, the DP partition, batch 64, SGD lr 0.01, momentum 0.9,
weight decay 4e-5. Configurations: no compression (FTPipeHD), MBQ with 2, 3 and 4 forward bits
(8-bit stochastic gradients), and uniform 2-bit with a learned scale (LSQ, init 0.25: the paper's
baseline). Prints and writes <out>/report.md and results.json: test accuracy per seed and its
mean, the drop from no compression, and the issue's gates: 4-bit drop <= 1 pt, 2-bit <= 3 pt,
MBQ-2 >= uniform-2.
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

CONFIGS = {
    "none": (["compressor=none"], "No compression (FTPipeHD)"),
    "mbq2": (["compressor=mbq", "compressor.forward.bits=2"], "MBQ 2-bit"),
    "mbq3": (["compressor=mbq", "compressor.forward.bits=3"], "MBQ 3-bit"),
    "mbq4": (["compressor=mbq", "compressor.forward.bits=4"], "MBQ 4-bit"),
    "uniform2": (["compressor=uniform", "compressor.forward.bits=2"], "Uniform 2-bit (LSQ)"),
}
PAPER_HAR = {"none": 97.47, "mbq2": 94.93, "mbq3": 96.04, "mbq4": 96.79, "uniform2": 80.85}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "accept_accuracy")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = ["model=har_cnn", "dataset=synthetic_har", "scheduler=pipedream", "cluster=uniform", "cluster.num_devices=3", "train.batch_size=64",
            "train.lr=0.01", "train.momentum=0.9", "train.weight_decay=4e-5", f"train.epochs={args.epochs}", "train.checkpoint=false",
            "tracking=none", "runtime.progress=false", "runtime.threads=1"]
    t0 = time.perf_counter()
    acc: dict = {k: [] for k in CONFIGS}
    for seed in range(args.seeds):
        for name, (over, _) in CONFIGS.items():
            s = run_job(base + over + [f"seed={seed}"], args.out / "runs" / f"{name}_s{seed}")
            acc[name].append(100 * s["metrics"]["test/acc"])
            print(f"seed {seed} {name:9s} test/acc {acc[name][-1]:.2f} %", flush=True)
    mean = {k: statistics.mean(v) for k, v in acc.items()}
    drop = {k: mean["none"] - v for k, v in mean.items()}
    lines = ["# AccEPT, Table 4 on HAR-shaped data", "",
             f"HAR CNN on synthetic HAR, 3 PipeDream stages, {args.epochs} epochs, seeds {list(range(args.seeds))}; "
             f"`python experiments/accept_accuracy.py` ({time.perf_counter() - t0:.0f} s). Paper: UCI-HAR, 200 epochs.", "",
             "| configuration | test accuracy % (paper) | per seed | drop from none (paper) |", "|---|---|---|---|"]
    for k, (_, label) in CONFIGS.items():
        lines.append(f"| {label} | {mean[k]:.2f} ({PAPER_HAR[k]:.2f}) | {', '.join(f'{a:.2f}' for a in acc[k])} | {drop[k]:+.2f} ({PAPER_HAR['none'] - PAPER_HAR[k]:+.2f}) |")
    gates = [("4-bit drop <= 1 pt", drop["mbq4"] <= 1.0, f"{drop['mbq4']:+.2f} pt"), ("2-bit drop <= 3 pt", drop["mbq2"] <= 3.0, f"{drop['mbq2']:+.2f} pt"),
             ("MBQ-2 >= uniform-2", mean["mbq2"] >= mean["uniform2"], f"{mean['mbq2']:.2f} vs {mean['uniform2']:.2f}")]
    lines += ["", "| gate | result | measured |", "|---|---|---|"] + [f"| {g} | {'pass' if ok else 'FAIL'} | {m} |" for g, ok, m in gates]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({"acc": acc, "mean": mean, "drop": drop}, indent=1))
    print("\n".join(lines))
    return 0 if all(ok for _, ok, _ in gates) else 1


if __name__ == "__main__":
    sys.exit(main())
