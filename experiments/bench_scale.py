"""Scale: a timing-only epoch of PiPar, FL and SFL with K simulated devices.

    python experiments/bench_scale.py                          # K = 100, 1000 (about a minute)
    python experiments/bench_scale.py --devices 100,1000,10000 # K = 10,000 too (minutes)

Each run is a fresh `python -m framework` process (one torch thread, `tracking=none`) on
`cluster=pipar_wifi`, LeNet on the MNIST-shaped synthetic set with 96 samples per device and
batch 32, so every device trains 3 iterations in its epoch, `runtime.numerics=false`. Reported
per run: wall seconds (the whole process: imports, data, simulation, timeline.json and
timeline.png; Python's bytecode caches written, as in a user's installation), peak resident memory (the process's ru_maxrss), and the virtual time; and per
scheduler the wall-time ratio between consecutive K, which linear growth keeps near the ratio
of the K themselves (10). Results go to outputs/bench_scale/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(scheduler: str, k: int, out: Path) -> dict:
    args = [f"scheduler={scheduler}", "cluster=pipar_wifi", f"cluster.num_devices={k}", "model=lenet", "dataset=synthetic_mnist", f"dataset.n_train={96 * k}",
            "train.batch_size=32", "train.epochs=1", "runtime.numerics=false", "runtime.progress=false", "tracking=none", f"hydra.run.dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="")  # bytecode caches, as an installation has
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "framework", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{scheduler} K={k} failed:\n{stderr[-3000:]}")
    m = re.search(r"virtual time ([\d.e+-]+)s", stdout)
    return {"scheduler": scheduler, "devices": k, "wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024, "virtual_s": float(m.group(1)) if m else None,
            "timeline_png_kib": (out / "timeline.png").stat().st_size / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="100,1000")
    ap.add_argument("--schedulers", default="pipar,fl,sfl")
    args = ap.parse_args()
    ks = [int(k) for k in args.devices.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipelab-bench-scale-") as tmp:
        for s in args.schedulers.split(","):
            for k in ks:
                r = run(s, k, Path(tmp) / f"{s}-{k}")
                rows.append(r)
                print(f"{s:<6} K={k:<6} wall {r['wall_s']:7.1f} s   peak {r['peak_rss_mib']:7.0f} MiB   virtual {r['virtual_s']:.4g} s", file=sys.stderr, flush=True)
    print("\ntiming-only epoch (3 iterations per device), one process per run, one torch thread\n")
    print(f"{'scheduler':<9} | {'K':>6} | {'wall s':>7} | {'peak MiB':>8} | {'wall / previous K':>17}")
    for i, r in enumerate(rows):
        prev = rows[i - 1] if i and rows[i - 1]["scheduler"] == r["scheduler"] else None
        ratio = f"{r['wall_s'] / prev['wall_s']:.1f}x (K {r['devices'] // prev['devices']}x)" if prev else ""
        print(f"{r['scheduler']:<9} | {r['devices']:>6} | {r['wall_s']:7.1f} | {r['peak_rss_mib']:8.0f} | {ratio:>17}")
    out = ROOT / "outputs" / "bench_scale"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
