"""AccEPT's devices: each CPU's per-core speed, fitted to the paper's Table 4.2.2 (fit rows named).

    python experiments/accept_calibrate.py

The paper names its CPUs (Table 1), not their speeds. What it does report about them is how long
its pipeline took with them, at a bandwidth where the links do not bind (Table 4.2.2: the first 10
epochs of MobileNetV2 on MNIST, 469 mini-batches of 128 per epoch; the bandwidth is not stated,
the notes read it as the LAN) under partition points it lists (Table 2). A steady pipeline then
takes, per mini-batch, its slowest stage's forward + backward: one device's compute over a known
slice of layers, the kind of component measurement a device model may be fitted to.

Each device is a column of the table measured here (conf/profile_tables/accept_mobilenetv2_b128
.yaml, experiments/accept_profile.py: this host's core count columns) times its CPU's per-core
`slowdown`, one unknown per CPU model:

- scenario 1: the Xeon E5-2640 (central node, 2 cores: host_2c) and the Xeon Gold 6133 (both
  workers, 1 core each: host_1c), from the rows "Average partition" (cuts (7,14)) and "FTPipeHD"
  ((8,14));
- scenario 2: the Kunpeng 920 and the Xeon Silver 4210R (1 core each), from the same two rows
  ((7,14) and (10,13)); its central node is the same E5-2640 on 3 cores (host_3c), at the
  per-core speed scenario 1 fitted.

Held out: the rows "Our method" (LP: (7,13) and (11,15)), which this prints beside the paper's,
and everything in Table 5. For each row the equation is max over stages of slowdown x column
seconds = the paper's minutes x 60 / (10 x 468.75) (an epoch of 60000 samples is 468.75 full
mini-batches of compute); which stage binds is searched over every combination, and every
consistent solution is printed (the fit is exact when one is). Prints the presets' `slowdown`s
(conf/cluster/accept_s1.yaml, accept_s2.yaml; tests/test_accept_calibration.py checks they are
these) and, beside them, the ratio of the host core's peak single-precision FLOP/s to each CPU's
(datasheets), a check the fit does not use.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from framework import profile_tables  # noqa: E402

TABLE = "accept_mobilenetv2_b128"
BATCHES_PER_EPOCH = 60000 / 128  # MNIST: 468 full mini-batches and one of 96 samples
PAPER_MINUTES = {  # Table 4.2.2: the first 10 epochs, minutes
    "accept_s1": {"average": 44.44, "ftpipehd": 42.26, "lp": 38.69},
    "accept_s2": {"average": 41.72, "ftpipehd": 38.46, "lp": 35.42},
}
PAPER_CUTS = {  # Table 2: 0-indexed last layer of each stage but the last
    "accept_s1": {"average": (7, 14), "ftpipehd": (8, 14), "lp": (7, 13)},
    "accept_s2": {"average": (7, 14), "ftpipehd": (10, 13), "lp": (11, 15)},
}
FIT_ROWS = ("average", "ftpipehd")
HELD_OUT = ("lp",)
# per scenario: (CPU, table column) of dev0, dev1, dev2 (Table 1; notes 3.1)
DEVICES = {
    "accept_s1": (("xeon_e5_2640", "host_2c"), ("xeon_gold_6133", "host_1c"), ("xeon_gold_6133", "host_1c")),
    "accept_s2": (("xeon_e5_2640", "host_3c"), ("kunpeng_920", "host_1c"), ("xeon_silver_4210r", "host_1c")),
}
# datasheet peak single-precision FLOP/s of one core: base GHz x FLOP per cycle (SIMD width x
# FMA units x 2); the host: this machine's AMD EPYC (Zen 3, 2.45 GHz TSC, 2 x 256-bit FMA)
PEAK_GFLOPS = {
    "host": 2.45 * 32,
    "xeon_e5_2640": 2.5 * 16,  # Sandy Bridge-EP, AVX without FMA: one 8-wide add and one 8-wide multiply
    "xeon_gold_6133": 2.5 * 64,  # Skylake-SP, two AVX-512 FMA units
    "kunpeng_920": 2.6 * 16,  # TaiShan v110, two 128-bit NEON FMA pipes
    "xeon_silver_4210r": 2.4 * 32,  # Cascade Lake, one AVX-512 FMA unit
}


@dataclass
class Row:
    scenario: str
    name: str
    bounds: list  # [(a, b)] per stage
    per_batch_s: float  # the paper's

    def stage_seconds(self, slowdown: dict) -> list[float]:
        table = profile_tables.load(TABLE)
        return [slowdown[cpu] * table.iteration_seconds(col, a, b) for (cpu, col), (a, b) in zip(DEVICES[self.scenario], self.bounds)]


def bounds(cuts, units: int = 20) -> list[tuple[int, int]]:
    edges = [0] + [c + 1 for c in cuts] + [units]
    return list(zip(edges[:-1], edges[1:]))


def row(scenario: str, name: str) -> Row:
    return Row(scenario, name, bounds(PAPER_CUTS[scenario][name]), PAPER_MINUTES[scenario][name] * 60 / (10 * BATCHES_PER_EPOCH))


def solve(rows: list[Row], known: dict, unknown: list[str], tol: float = 1e-9) -> list[dict]:
    """Every assignment of per-core slowdowns that makes each row's slowest stage take the row's
    time exactly (one binding stage per row, searched over all combinations)."""
    table = profile_tables.load(TABLE)
    solutions = []
    for binding in itertools.product(*(range(len(r.bounds)) for r in rows)):
        eq: dict = {}
        ok = True
        for r, s in zip(rows, binding):
            cpu, col = DEVICES[r.scenario][s]
            a, b = r.bounds[s]
            value = r.per_batch_s / table.iteration_seconds(col, a, b)
            if cpu in known:
                ok = abs(known[cpu] / value - 1) < 1e-6
            elif cpu in eq and abs(eq[cpu] / value - 1) > 1e-6:
                ok = False
            eq[cpu] = value
            if not ok:
                break
        if not ok or any(u not in eq for u in unknown):
            continue
        slow = {**known, **eq}
        if all(max(r.stage_seconds(slow)) <= r.per_batch_s * (1 + tol) for r in rows):
            solutions.append({"slowdown": {u: slow[u] for u in unknown}, "binding": binding})
    return solutions


def calibrate(verbose: bool = True) -> dict[str, float]:
    """The per-core slowdowns of the four CPUs (scenario 1 first, then scenario 2 given the E5)."""
    say = print if verbose else (lambda *a, **k: None)
    slowdown: dict = {}
    for scenario, unknown in (("accept_s1", ["xeon_e5_2640", "xeon_gold_6133"]), ("accept_s2", ["kunpeng_920", "xeon_silver_4210r"])):
        rows = [row(scenario, n) for n in FIT_ROWS]
        sols = solve(rows, dict(slowdown), unknown)
        if len(sols) != 1:
            raise SystemExit(f"{scenario}: {len(sols)} exact solutions for {unknown} from {FIT_ROWS}: {sols}")
        slowdown.update(sols[0]["slowdown"])
        say(f"{scenario}: fitted on Table 4.2.2 rows {', '.join(FIT_ROWS)} (binding stages {sols[0]['binding']}): "
            + ", ".join(f"{u} {slowdown[u]:.4g}" for u in unknown))
    return slowdown


def main() -> int:
    slowdown = calibrate()
    print("\n| CPU | per-core slowdown (fitted) | host / CPU peak SP FLOP/s per core (datasheets) |\n|---|---|---|")
    for cpu, s in slowdown.items():
        print(f"| {cpu} | {s:.3g} | {PEAK_GFLOPS['host'] / PEAK_GFLOPS[cpu]:.2f} |")
    print("\n| scenario | Table 4.2.2 row | cuts | paper s / mini-batch | model: slowest stage s | model / paper | stage seconds | role |\n|---|---|---|---|---|---|---|---|")
    for scenario in PAPER_MINUTES:
        for name in (*FIT_ROWS, *HELD_OUT):
            r = row(scenario, name)
            st = r.stage_seconds(slowdown)
            print(f"| {scenario} | {name} | {PAPER_CUTS[scenario][name]} | {r.per_batch_s:.4f} | {max(st):.4f} | {max(st) / r.per_batch_s:.3f} | "
                  f"{', '.join(f'{x:.3f}' for x in st)} | {'fit' if name in FIT_ROWS else 'held out'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
