"""What each of the GPU epoch's mechanisms is worth, switched off one at a time in one process.

`bench_replicas.py` compares batched against one at a time; this takes the batched GPU epoch
(FL and PiPar, K = 64 VGG-5s, CIFAR-shaped, batch 32, as there) apart:

- **ablations**: the replica bank (framework/replicas/bank.py: the group's SGD step over one tensor
  per parameter), its held gradients (a batched backward's gradients left stacked in the bank,
  `replicas._holding_bank`), the block copies of models (`models._copy_in_blocks`) and checkpoint files
  written in the background (framework/checkpoints/writer.py), each switched off by replacing
  the function that does it, alternating with the full tree over `--repeats` rounds (medians);
  one epoch, and `--epochs` epochs for the background write, whose file overlaps the next epoch;
- **phases**: the seconds of a batched epoch spent taking its checkpoint and copying models,
  the GPU synchronised around each (the overlap lost makes them a little longer);
- **waits**: every call that makes the host wait for the GPU in one batched run
  (`torch.cuda.set_sync_debug_mode`), by the repository lines that made it.

Needs CUDA (`experiments/gpu_checks.sh` runs it). The switched-off variants are for measuring
only: the results are the same, but e.g. without the bank each replica steps alone.

    python experiments/bench_gpu_ablation.py --repeats 3
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import experiments.bench_replicas as bench  # noqa: E402
import framework.job as job_module  # noqa: E402
from framework import models, registry  # noqa: E402
from framework.checkpoints.writer import CheckpointWriter  # noqa: E402
from framework.replicas import bank as replica_bank
from framework.replicas import batched as replicas

_ORIGINAL = {"bank": replica_bank.step, "held": replicas._holding_bank, "blocks": models._copy_in_blocks, "writer": job_module.CheckpointWriter}
_OFF = {
    "bank": lambda stages: False,  # every group takes the per-replica update
    "held": lambda *a: None,  # a batched backward hands each replica its gradient rows
    "blocks": lambda module, memo: None,  # every tensor copied by itself
    "writer": lambda: CheckpointWriter(background=False),  # the file written before the run goes on
}


def switch(off: frozenset) -> None:
    replica_bank.step = _OFF["bank"] if "bank" in off else _ORIGINAL["bank"]
    replicas._holding_bank = _OFF["held"] if "held" in off else _ORIGINAL["held"]
    models._copy_in_blocks = _OFF["blocks"] if "blocks" in off else _ORIGINAL["blocks"]
    job_module.CheckpointWriter = _OFF["writer"] if "writer" in off else _ORIGINAL["writer"]


def ablations(args, scheduler: str) -> None:
    batched, alone = bench.variants(True)["gpu batched"], bench.variants(True)["gpu"]
    rows = {
        ("batched", 1): (batched, frozenset()),
        ("batched, no bank", 1): (batched, frozenset({"bank"})),
        ("batched, no held gradients", 1): (batched, frozenset({"held"})),
        ("batched, no block copies", 1): (batched, frozenset({"blocks"})),
        ("one at a time", 1): (alone, frozenset()),
        ("batched", args.epochs): (batched, frozenset()),
        ("batched, checkpoint written first", args.epochs): (batched, frozenset({"writer"})),
    }
    walls: dict = {k: [] for k in rows}
    for _ in range(args.repeats):
        for (name, epochs), (extra, off) in rows.items():
            switch(off)
            walls[(name, epochs)].append(bench.one_run(_with_epochs(args, epochs), scheduler, extra)[0])
    switch(frozenset())
    print(f"\n{scheduler}: training wall s, medians of {args.repeats} (alternating)")
    print("| variant | epochs | wall s | vs batched |")
    print("|---|---|---|---|")
    for (name, epochs), w in walls.items():
        med, base = statistics.median(w), statistics.median(walls[("batched", epochs)])
        print(f"| {name} | {epochs} | {med:.3f} | {med / base:.2f}x |")


def _with_epochs(args, epochs: int) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "epochs": epochs})


def phases(args, scheduler: str) -> None:
    spent: dict = collections.defaultdict(float)

    def timed(owner, name: str, key: str):
        fn, depth = getattr(owner, name), [0]

        def wrapper(*a, **kw):
            if depth[0]:  # recursive calls (`_clone`) count once
                return fn(*a, **kw)
            depth[0] += 1
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                torch.cuda.synchronize()
                spent[key] += time.perf_counter() - t0
                depth[0] -= 1

        setattr(owner, name, wrapper)
        return lambda: setattr(owner, name, fn)

    undo = [timed(job_module.Job, "_save_checkpoint", "checkpoint taken"), timed(models, "_copy_in_blocks", "model copies"),
            timed(models, "_clone", "model copies")]
    try:
        wall = bench.one_run(_with_epochs(args, 1), scheduler, bench.variants(True)["gpu batched"])[0]
    finally:
        for u in undo:
            u()
    print(f"\n{scheduler}: phases of a {wall:.3f} s batched epoch (GPU synchronised around each): "
          + ", ".join(f"{k} {v:.3f} s" for k, v in spent.items()))


def waits(args, scheduler: str) -> None:
    sites: collections.Counter = collections.Counter()
    root = str(ROOT) + "/"

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(root) and "/experiments/" not in f.filename]
        sites[" < ".join(f"{f.filename[len(root):]}:{f.lineno}" for f in frames[::-1][:3])] += 1

    with warnings.catch_warnings():  # restores showwarning too
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            bench.one_run(_with_epochs(args, 1), scheduler, bench.variants(True)["gpu batched"])
        finally:
            torch.cuda.set_sync_debug_mode(0)
    print(f"\n{scheduler}: calls that wait for the GPU in one batched run (set-up and evaluation included): {sum(sites.values())}")
    for where, n in sites.most_common(12):
        print(f"{n:>6}  {where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--per-device", type=int, default=256)
    ap.add_argument("--schedulers", default="fl,pipar")
    ap.add_argument("--model", default="vgg5")
    ap.add_argument("--dataset", default="synthetic_cifar10")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the background-write rows")
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu_ablation.py: needs a CUDA device")
    args.server_slots, args.override = 0, []
    torch.set_num_threads(args.threads)
    registry.load_plugins()
    print(f"K = {args.devices} devices, {args.model} on {args.dataset}, batch {args.batch_size}, {args.per_device} samples each; "
          f"{args.threads} CPU thread(s); GPU: {torch.cuda.get_device_name(0)}")
    for scheduler in args.schedulers.split(","):
        bench.one_run(_with_epochs(args, 1), scheduler, bench.variants(True)["gpu batched"])  # warm-up
        ablations(args, scheduler)
        phases(args, scheduler)
        waits(args, scheduler)


if __name__ == "__main__":
    main()
