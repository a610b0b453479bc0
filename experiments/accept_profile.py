"""AccEPT's devices, measured here: MobileNetV2's per-unit training time on 1, 2 and 3 cores.

    python experiments/accept_profile.py                # about 4 minutes on the 2-core machine
    python experiments/accept_profile.py --rounds 3 --dry-run

The paper makes its devices heterogeneous with `taskset` (Table 1: a central node on 2 or 3 cores,
workers on 1). What a core count does to each layer's time is what makes FTPipeHD's single ratio
per worker wrong layer by layer (the paper's Fig. 4: a large layer speeds up nearly n-fold on n
cores, a small one hardly at all). This script measures it on this host for the paper's model and
batch: MobileNetV2 in 20 units, batch 128, 3x32x32 inputs (MNIST at the model's input size).

- n cores are modelled as intra-op data parallelism: each core runs 1/n of the batch, so a unit's
  time on n cores is its one-core time at batch 128/n. That is measured, one thread, at batches
  128, 64 and 43 (scaled by 128/3/43): the columns host_1c, host_2c and host_3c. Running two
  threads could not be measured here: on the shared 2-core machine (load 6-7 from other jobs)
  two threads took 5x longer than one.
- Every unit's forward and backward (with its input gradient, as a pipeline stage returns one; not
  for unit 0, whose input is data) in CPU seconds (`time.process_time`: with one thread, the time
  on a core, which other jobs on the machine do not stretch as they stretch the wall), `--rounds`
  rounds, the minimum over them (what load still adds, through shared caches, only ever adds; the
  rounds interleave the batch sizes, so a burst of it hits every column alike).

It writes `conf/profile_tables/accept_mobilenetv2_b128.yaml` (the `table` device time model,
framework/profile_tables.py: cumulative forward + backward seconds per cut) with each column's
measured forward share in a comment (the presets' `forward_fraction`). The scenario presets
(conf/cluster/accept_s1.yaml, accept_s2.yaml) price each device as its core count's column times
its CPU's per-core `slowdown` (experiments/accept_calibrate.py fits those to the paper's Table
4.2.2).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TABLE = ROOT / "conf" / "profile_tables" / "accept_mobilenetv2_b128.yaml"
BATCH = 128


def build_model():
    from framework import registry
    from framework.models import build_model as build

    registry.load_plugins()
    from omegaconf import OmegaConf

    torch.manual_seed(0)
    return build(OmegaConf.create({"name": "mobilenetv2"}), (3, 32, 32), 10)


def time_unit(unit, x: torch.Tensor, needs_input_grad: bool) -> tuple[float, float]:
    """(forward, backward) CPU seconds of one call (this process's: with one thread, the time the
    call spent on a core, whoever else the machine was running), after the caller's warm-up."""
    from framework.lean_torch import backward

    xin = x.detach().requires_grad_(needs_input_grad)
    t0 = time.process_time()
    y = unit(xin)
    t1 = time.process_time()
    g = torch.ones_like(y)
    t2 = time.process_time()
    backward(y, g)
    t3 = time.process_time()
    unit.zero_grad(set_to_none=True)
    return t1 - t0, t3 - t2


CORES = {1: 128, 2: 64, 3: 43}  # cores -> the batch one core runs (128 / n, rounded)


def profile(model, rounds: int, progress=print) -> dict[int, dict[str, list[float]]]:
    """{cores: {"fwd": [s per unit], "bwd": [...]}}: one thread at batch 128 / cores, the minimum
    over `rounds` of each call, scaled to exactly 128 / cores samples."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model.train()
    inputs = {}
    with torch.no_grad():
        for n, b in CORES.items():
            x, inputs[n] = torch.randn(b, 3, 32, 32), []
            for u in model.units:
                inputs[n].append(x)
                x = u(x)
    best = {n: {"fwd": [float("inf")] * len(model.units), "bwd": [float("inf")] * len(model.units)} for n in CORES}
    try:
        for r in range(rounds + 1):  # round 0 warms every kernel up at every batch size
            for n in CORES:
                for j, u in enumerate(model.units):
                    f, b = time_unit(u, inputs[n][j], j > 0)
                    if r:
                        best[n]["fwd"][j] = min(best[n]["fwd"][j], f)
                        best[n]["bwd"][j] = min(best[n]["bwd"][j], b)
            if r:
                progress(f"round {r}/{rounds}: " + ", ".join(f"{n} core(s) {sum(best[n]['fwd']) + sum(best[n]['bwd']):.3f} s" for n in CORES))
    finally:
        torch.set_num_threads(before)
    for n, b in CORES.items():
        scale = BATCH / n / b
        best[n] = {k: [t * scale for t in v] for k, v in best[n].items()}
    return best


def columns(best: dict) -> dict[str, dict[str, list[float]]]:
    return {f"host_{n}c": best[n] for n in sorted(best)}


def write_table(cols: dict, model, rounds: int, path: Path) -> str:
    fmt = lambda xs: "[" + ", ".join(f"{x:.5g}" for x in xs) + "]"  # noqa: E731
    lines = [
        "# MobileNetV2 (20 units), batch 128, 3x32x32: forward + backward seconds per cut, measured on the",
        f"# development machine ({platform.processor() or platform.machine()}, torch {torch.__version__}, {datetime.date.today()}) by",
        f"#   python experiments/accept_profile.py      (--rounds {rounds}: the minimum of {rounds} interleaved rounds per unit)",
        "# host_nc: n cores (the paper's taskset core limits, Table 1) as intra-op data parallelism: one",
        "# thread's time at batch 128/n. Used by conf/cluster/accept_s1.yaml and accept_s2.yaml.",
        "# Measured forward share of each column (the presets' forward_fraction): "
        + ", ".join(f"{k} {sum(c['fwd']) / (sum(c['fwd']) + sum(c['bwd'])):.4f}" for k, c in cols.items()),
        "model: mobilenetv2",
        f"units: {len(model.units)}",
        f"batch: {BATCH}",
        "iteration_s:",
        "  prefix:             # units [0, l), l = 1..units (the last: the whole model)",
    ]
    for k, c in cols.items():
        cum, s = [], 0.0
        for f, b in zip(c["fwd"], c["bwd"]):
            s += f + b
            cum.append(s)
        lines.append(f"    {k}: {fmt(cum)}")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dry-run", action="store_true", help="print the table, do not write it")
    args = ap.parse_args()
    model = build_model()
    t0 = time.perf_counter()
    best = profile(model, args.rounds)
    cols = columns(best)
    print(f"profiled in {time.perf_counter() - t0:.0f} s")
    print("unit  1 core fwd+bwd (ms)  2 cores  3 cores  speed-up 2/3 cores  forward share (1 core)")
    for j in range(len(model.units)):
        t = {n: best[n]["fwd"][j] + best[n]["bwd"][j] for n in best}
        print(f"{j:4d}  {1e3 * t[1]:19.2f}  {1e3 * t[2]:7.2f}  {1e3 * t[3]:7.2f}  {t[1] / t[2]:8.2f} {t[1] / t[3]:5.2f}  {best[1]['fwd'][j] / t[1]:.2f}")
    if args.dry_run:
        import tempfile

        print(write_table(cols, model, args.rounds, Path(tempfile.mkstemp(suffix=".yaml")[1])))
    else:
        write_table(cols, model, args.rounds, TABLE)
        print(f"wrote {TABLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
