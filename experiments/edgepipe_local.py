"""EdgePipe on real processes against the simulator: one command, one table.

    python experiments/edgepipe_local.py                  # 3 seeds, one epoch of 3,000 Fashion-MNIST images
    python experiments/edgepipe_local.py --seeds 1 --n-train 1000 --recovery ack

For each seed, the EdgePipe preset (experiment=edgepipe: six devices, the calibrated channel of
mean PRR 0.809, the 784-128-128-128-128-10 MLP, hybrid partition) trains one epoch twice: on the
simulator, and as six role processes over a private mosquitto (`runtime=local transport=mqtt
runtime.emulate_links=true`: each process drops a message when its copy of the link, seeded by the
link's name, says so, and sleeps out the slot clock in real time). Prints and writes
<out>/report.md: messages per super-neuron pair and losses per link (equal or not), test and
lossy-test accuracy on both, and the wall time of the real run against the simulated makespan.
The issue's gate: the same message counts per pair, accuracy within 2 points over the seeds.
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

LOCAL = ["runtime=local", "transport=mqtt", "runtime.emulate_links=true"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=3000, help="training images: the epoch is n_train / 100 minibatches")
    ap.add_argument("--recovery", default="none", choices=("none", "rtx", "ack"))
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "edgepipe_local")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = ["experiment=edgepipe", "tracking=none", "runtime.progress=false", f"dataset.n_train={args.n_train}", "dataset.n_val=0",
            "scheduler.lossy_test_passes=10", f"scheduler.recovery={args.recovery}"]
    rows = []
    for seed in range(args.seeds):
        got = {}
        for rt in ("sim", "local"):
            t0 = time.perf_counter()
            s = run_job(base + [f"seed={seed}"] + (LOCAL if rt == "local" else []), args.out / f"seed{seed}_{rt}")
            got[rt] = (s, time.perf_counter() - t0)
        (s, _), (l, wall) = got["sim"], got["local"]
        row = {
            "seed": seed,
            "minibatches": s["iterations"],
            "messages": s["edgepipe"]["messages_sent"],
            "pairs_equal": s["edgepipe"]["messages_sent_per_sn_pair"] == l["edgepipe"]["messages_sent_per_sn_pair"],
            "lost_sim": sum(v["lost"] for v in s["links"].values()),
            "losses_equal": {k: v["lost"] for k, v in s["links"].items()} == {k: v["lost"] for k, v in l["links"].items()},
            "acc_sim": s["metrics"]["test/acc"], "acc_local": l["metrics"]["test/acc"],
            "lossy_sim": s["edgepipe"]["lossy_test"]["mean"], "lossy_local": l["edgepipe"]["lossy_test"]["mean"],
            "makespan_sim_s": s["virtual_time_s"], "makespan_local_s": l["virtual_time_s"], "command_wall_s": wall,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    gap = abs(statistics.mean(r["acc_local"] for r in rows) - statistics.mean(r["acc_sim"] for r in rows)) * 100
    ok = all(r["pairs_equal"] for r in rows) and gap <= 2.0
    lines = [
        "# EdgePipe: real processes over MQTT against the simulator", "",
        f"`experiment=edgepipe`, one epoch of {args.n_train} Fashion-MNIST images, recovery={args.recovery}, {args.seeds} seeds; "
        "local = `runtime=local transport=mqtt runtime.emulate_links=true`.", "",
        "| seed | minibatches | messages | per-pair counts equal | lost (sim) | losses per link equal | test acc sim / local | lossy test sim / local | makespan sim / local (s) | local command wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['minibatches']} | {r['messages']} | {r['pairs_equal']} | {r['lost_sim']} | {r['losses_equal']} | "
                     f"{r['acc_sim']:.4f} / {r['acc_local']:.4f} | {r['lossy_sim']:.4f} / {r['lossy_local']:.4f} | "
                     f"{r['makespan_sim_s']:.2f} / {r['makespan_local_s']:.2f} | {r['command_wall_s']:.1f} |")
    lines += ["", f"Mean test accuracy gap: {gap:.2f} points. Gate (same counts per pair, gap <= 2 points): {'pass' if ok else 'FAIL'}."]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
