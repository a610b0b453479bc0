"""Many simulated devices on one processor: replicas one at a time against batched, CPU against GPU.

Runs one epoch of FL and PiPar with K devices (default 64, VGG-5 on the CIFAR-shaped set,
batch 32, `cluster=pipar_wifi`: identical devices) under `runtime=sim`, side by side in one
process, in these ways (the `gpu` ones where CUDA exists):

- `cpu`: tensor work on the CPU, each replica's forward and backward its own call;
- `cpu batched`: `runtime.batch_replicas=true`, identical replicas as one vmapped call;
- `gpu` and `gpu batched`: the same with `runtime.torch_device=cuda` (only where CUDA exists);
  batched on a GPU, convolutions run as batched matrix products (`runtime.replica_conv=matmul`,
  framework/replicas/conv.py); `gpu batched grouped` runs them as vmap's grouped convolutions;
- `gpu tf32` and `gpu batched tf32`: the same with `runtime.tf32=true` (float32 math on the
  tensor cores: faster, and drifts from the CPU run; accuracy is printed beside).

It prints, per variant, the wall seconds of the epoch's training (`Job.train`: the role programs
from building them to the epoch's checkpoint, its file written, which a GPU run does in the
background: `--epochs 2` shows that write overlapping the next epoch; the written outputs, the
same in every variant, are left out), samples per second and the ratios, and checks that every variant
has the same virtual time (time comes from the device models, whatever runs the math). A
`timing-only` row (`runtime.numerics=false`: the same program with no tensor math) is the
simulator's own bookkeeping, the floor under any variant. With `--epochs` 2 or more, a second
table times the last epoch alone, from the end of the one before (its validation and checkpoint
included): what each further epoch of a long run costs, without the run's one-time costs (the
roles built, the 2K model copies made). The variants alternate over
`--repeats` rounds; medians are reported. `--profile VARIANT` then runs that variant once more
under torch.profiler and prints where its time went: the GPU's busy time, the kernels launched
and the operators that cost the most host time (the work left between a variant and its floor).

    python experiments/bench_replicas.py                         # K = 64, fl and pipar
    python experiments/bench_replicas.py --devices 16 --schedulers fl --model lenet --dataset synthetic_mnist
    python experiments/bench_replicas.py --schedulers fl --repeats 3 --profile "gpu batched tf32"

Without a GPU, the host's share can still be measured: with a 2-wide MLP the tensor math is
negligible, so each row is the host's own time, and "beyond the floor" (the row minus
timing-only) is what the numerics cost the host per epoch: the part no GPU takes over.

    python experiments/bench_replicas.py --model mlp --override model.hidden=2 --dataset synthetic_mnist \
        --batch-size 4 --per-device 32 --variants "timing-only,cpu,cpu batched" --repeats 5

`--count-calls VARIANT` runs a variant once more counting the torch calls its training makes
(and where in this repository they come from): a number that, unlike wall time on a shared
machine, is the same in every run, so two commits compare exactly; on a GPU each call costs the
host a dispatch and most a kernel launch.

    python experiments/bench_replicas.py --model vgg5 --batch-size 4 --per-device 32 --schedulers fl \
        --variants "cpu batched" --repeats 1 --count-calls "cpu batched"

Without CUDA, `--count-calls "gpu batched"` (or "gpu") counts on a GPU emulated on the CPU
(tests/emulated_gpu.py): the GPU path's calls (checkpoint blocks fetched from the device, the
convolutions as matrix products), not its times; model copies take their CPU path there (the
emulated parameters are not `nn.Parameter` objects), so their count is not the GPU's.

`--instructions VARIANT` counts the host instructions of a variant's training under valgrind's
callgrind (a run of about 80 s for the MLP proxy; valgrind must be installed): all the host's
work, Python included, in a number that varied by 0.04% between two runs where wall time varied
by 30%.

    python experiments/bench_replicas.py --model mlp --override model.hidden=2 --dataset synthetic_mnist \
        --batch-size 4 --per-device 32 --schedulers fl --variants timing-only --repeats 1 --instructions "cpu batched"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydra import compose, initialize_config_dir  # noqa: E402

from framework import registry  # noqa: E402
from framework.cli import CONF_DIR  # noqa: E402
from framework.job import Job  # noqa: E402
from tests import emulated_gpu  # noqa: E402  (--count-calls of a GPU variant without CUDA)


def variants(with_gpu: bool) -> dict[str, list[str]]:
    out = {"timing-only": ["runtime.numerics=false"], "cpu": ["runtime.batch_replicas=false"], "cpu batched": ["runtime.batch_replicas=true"]}
    if with_gpu:
        out["gpu"] = ["runtime.torch_device=cuda", "runtime.batch_replicas=false"]
        out["gpu batched"] = ["runtime.torch_device=cuda", "runtime.batch_replicas=true"]
        out["gpu batched grouped"] = ["runtime.torch_device=cuda", "runtime.batch_replicas=true", "runtime.replica_conv=grouped"]
        out["gpu tf32"] = ["runtime.torch_device=cuda", "runtime.batch_replicas=false", "runtime.tf32=true"]
        out["gpu batched tf32"] = ["runtime.torch_device=cuda", "runtime.batch_replicas=true", "runtime.tf32=true"]
    return out


def _synced() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def one_run(args, scheduler: str, extra: list[str], profile: bool | str = False) -> tuple[float, float, int, float, float | None]:
    """(wall seconds of the training, virtual seconds, samples trained, validation accuracy, wall
    seconds of the last epoch or None in a one-epoch run); with `profile`, the training runs
    under torch.profiler and its summary is printed (with `profile="count"`, its torch calls are
    counted instead).

    The last epoch runs from the end of the one before to its own end (its validation and the
    taking of its checkpoint included, and the wait for the previous checkpoint's file): what
    each further epoch of a long run costs, without what a run pays once (building the roles,
    copying the models, warming up)."""
    overrides = [
        f"scheduler={scheduler}",
        f"model={args.model}",
        f"dataset={args.dataset}",
        f"dataset.n_train={args.devices * args.per_device}",
        "dataset.n_val=256",
        "dataset.n_test=256",
        "cluster=pipar_wifi",
        f"cluster.num_devices={args.devices}",
        f"train.epochs={args.epochs}",
        f"train.batch_size={args.batch_size}",
        "tracking=none",
        "runtime.progress=false",
        f"runtime.threads={args.threads}",
        *(["scheduler.P=1", "scheduler.N=1"] if scheduler == "pipar" else []),
        *([f"cluster.devices.server.slots={args.server_slots}"] if args.server_slots else []),
        *args.override,
        *extra,
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    with tempfile.TemporaryDirectory() as d:
        job = Job(cfg, Path(d))
        train, spent, epoch_ends = job.train, [], []
        epoch_end = job.on_epoch_end

        def timed_epoch_end(*a, **kw):
            out = epoch_end(*a, **kw)
            epoch_ends.append(_synced())
            return out

        if not profile:
            job.on_epoch_end = timed_epoch_end

        def timed_train(*a, **kw):
            if profile == "count":
                return counted(train, args.devices, *a, **kw)
            if profile == "instructions":
                return instrumented(train, *a, **kw)
            if profile:
                return profiled(train, *a, **kw)
            t0 = _synced()
            out = train(*a, **kw)
            job.checkpoints.wait()  # the last checkpoint's file, which a GPU run writes in the background
            spent.append(_synced() - t0)
            return out

        job.train = timed_train
        res = job.run()
        if profile:
            return 0.0, 0.0, 0, 0.0, None
        last = epoch_ends[-1] - epoch_ends[-2] if len(epoch_ends) > 1 else None
        return spent[0], float(res["virtual_time_s"]), job.scheduler.samples_per_epoch() * args.epochs, float(res["metrics"].get("val/acc", float("nan"))), last


def profiled(train, *a, **kw):
    """`train` under torch.profiler: prints the GPU's busy time, the kernels launched and the
    operators with the most host time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    t0 = _synced()
    with profile(activities=activities) as prof:
        out = train(*a, **kw)
        _synced()
    wall = time.perf_counter() - t0
    ops = prof.key_averages()
    # the device's own events (kernels, copies), as torch's table totals them: an operator's row
    # repeats its kernels' time (summing every row counted the GPU's time twice)
    on_device = [e for e in ops if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    busy = sum(e.self_device_time_total for e in on_device) / 1e6
    kernels = sum(e.count for e in on_device)
    print(f"profiled training: {wall:.3f} s wall under the profiler; GPU busy {busy:.3f} s in {kernels:,} kernels")
    print(ops.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    if torch.cuda.is_available():
        print(ops.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))
    return out


def counted(train, replicas: int, *a, **kw):
    """`train` with every torch call counted (a TorchDispatchMode sees each call that reaches
    torch's dispatcher, views included; a foreach call counts once): prints the total, per
    replica, and the call sites in this repository that made the most. Unlike wall time on a
    shared machine, the count is the same in every run, and on a GPU each call costs the host
    a dispatch and, for most, a kernel launch."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    root = str(Path(__file__).resolve().parent.parent) + "/"
    sites: Counter = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            f, where = sys._getframe(1), "(torch internals)"
            while f is not None:
                name = f.f_code.co_filename
                if name.startswith(root) and not name.endswith(("bench_replicas.py", "emulated_gpu.py")):
                    where = f"{name[len(root):]}:{f.f_code.co_name}:{f.f_lineno}"
                    break
                f = f.f_back
            sites[where] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        out = train(*a, **kw)
    total = sum(sites.values())
    print(f"torch calls in the training: {total:,}, {total / replicas:,.0f} per device")
    for where, n in sites.most_common(15):
        print(f"{n:>8,}  {where}")
    return out


def instrumented(train, *a, **kw):
    """`train` with callgrind's instrumentation on (this process runs under valgrind with it off:
    `instructions`); callgrind_control returns once the process has switched."""
    import subprocess

    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    out = train(*a, **kw)
    subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)
    return out


def instructions(scheduler: str, variant: str) -> int:
    """The host instructions of one run of `variant`'s training, counted by valgrind's callgrind
    in a child process (this script again, with `--callgrind-child`: a warm-up run, then one run
    with only its training instrumented). Unlike wall time the count hardly varies between runs
    (0.04% in two runs, 27 November), so two commits compare on a noisy machine; with a 2-wide
    MLP it is the host's own work, what a GPU does not take over."""
    import re
    import shutil
    import subprocess

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind and callgrind_control (apt-get install valgrind)")
    argv = [a for a in sys.argv[1:]]
    with tempfile.TemporaryDirectory() as d:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={d}/callgrind.out", sys.executable, str(Path(__file__).resolve()),
               *argv, "--schedulers", scheduler, "--callgrind-child", variant]
        res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", res.stderr)
    if res.returncode != 0 or found is None:
        raise SystemExit(f"the run under callgrind failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--per-device", type=int, default=256, help="training samples per device (256: eight iterations of batch 32)")
    ap.add_argument("--schedulers", default="fl,pipar")
    ap.add_argument("--model", default="vgg5")
    ap.add_argument("--dataset", default="synthetic_cifar10")
    ap.add_argument("--batch-size", type=int, default=32, help="train.batch_size (small batches: the regime where launches, not math, cost)")
    ap.add_argument("--epochs", type=int, default=1,
                    help="epochs per run (2 or more: the second epoch's training overlaps the first checkpoint's write, as in a "
                         "longer run, and the last epoch is also timed alone)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed: the default thrashes on small machines)")
    ap.add_argument("--no-gpu", action="store_true", help="skip the GPU variants even where CUDA exists")
    ap.add_argument("--variants", default="", help="comma-separated subset of: timing-only, cpu, cpu batched, gpu, gpu batched, gpu batched grouped, gpu tf32, gpu batched tf32")
    ap.add_argument("--profile", default="", metavar="VARIANT", help="after the timed runs, run this variant once more under torch.profiler and print its summary")
    ap.add_argument("--count-calls", default="", metavar="VARIANT",
                    help="after the timed runs, run this variant once more counting its torch calls (the same in every run: compare commits without timing noise)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for every variant (repeatable), e.g. model.hidden=2")
    ap.add_argument("--server-slots", type=int, default=0,
                    help="computations the server runs at once (cluster.devices.server.slots; 0: the cluster's own, 1). "
                         "PiPar's per-device server replicas batch only when the server runs them together")
    ap.add_argument("--instructions", default="", metavar="VARIANT",
                    help="after the timed runs, count the host instructions of this variant's training under valgrind's callgrind "
                         "(nearly the same in every run: compare commits on a noisy machine)")
    ap.add_argument("--callgrind-child", default="", help=argparse.SUPPRESS)  # the run `--instructions` starts under valgrind
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    registry.load_plugins()
    if args.count_calls.startswith("gpu") and not torch.cuda.is_available():
        emulated_gpu.device()  # before any backward: autograd counts a backend's devices once
    if args.callgrind_child:
        for scheduler in args.schedulers.split(","):
            one_run(args, scheduler, variants(False)[args.callgrind_child])  # warm-up: imports, caches
            one_run(args, scheduler, variants(False)[args.callgrind_child], profile="instructions")
        return
    gpu = torch.cuda.is_available() and not args.no_gpu
    ways = variants(gpu)
    if args.variants:
        wanted = [w.strip() for w in args.variants.split(",")]
        unknown = [w for w in wanted if w not in ways]
        if unknown:
            raise SystemExit(f"--variants: unknown or unavailable {unknown}; choices here: {', '.join(ways)}")
        ways = {w: ways[w] for w in wanted}
    for flag, wanted, choices in (("--profile", args.profile, variants(gpu)), ("--count-calls", args.count_calls, variants(True)),
                                  ("--instructions", args.instructions, variants(False))):  # valgrind runs no GPU
        if wanted and wanted not in choices:
            raise SystemExit(f"{flag}: unknown or unavailable variant {wanted!r}; choices here: {', '.join(choices)}")
    print(f"K = {args.devices} devices, {args.model}{''.join(f' {o}' for o in args.override)} on {args.dataset}, {args.per_device} samples each, {'one epoch' if args.epochs == 1 else f'{args.epochs} epochs'}; "
          f"{args.threads} CPU thread(s); GPU: {torch.cuda.get_device_name(0) if gpu else 'none'}")
    for scheduler in args.schedulers.split(","):
        one_run(args, scheduler, next(iter(ways.values())) if not gpu else variants(gpu)["gpu batched"])  # warm-up: imports, kernels, caches
        walls: dict[str, list[float]] = {w: [] for w in ways}
        lasts: dict[str, list[float]] = {w: [] for w in ways}
        virtual: dict[str, float] = {}
        acc: dict[str, float] = {}
        samples = 0
        for _ in range(args.repeats):
            for name, extra in ways.items():
                wall, virtual[name], samples, acc[name], last = one_run(args, scheduler, extra)
                walls[name].append(wall)
                if last is not None:
                    lasts[name].append(last)
        if len(set(virtual.values())) != 1:
            raise SystemExit(f"{scheduler}: virtual times differ between variants: {virtual}")
        med = {w: statistics.median(v) for w, v in walls.items()}
        print(f"\n{scheduler}: {samples} samples, virtual {'epoch' if args.epochs == 1 else 'time'} {next(iter(virtual.values())):.3f} s (the same in every variant)")
        floor = med.get("timing-only")
        print("| variant | training wall s (median) | beyond the floor s | samples/s | vs cpu | vs its one-at-a-time | val acc |")
        print("|---|---|---|---|---|---|---|")
        for w, s in med.items():
            alone = w.replace(" batched", "").replace(" grouped", "")
            rel = f"{med[alone] / s:.2f}x" if w != alone and alone in med else ""
            vs_cpu = f"{med['cpu'] / s:.2f}x" if "cpu" in med else ""
            beyond = "" if floor is None or w == "timing-only" else f"{s - floor:.3f}"
            print(f"| {w} | {s:.3f} | {beyond} | {samples / s:,.0f} | {vs_cpu} | {rel} | {'' if w == 'timing-only' else f'{acc[w]:.4f}'} |")
        if args.epochs > 1:  # what each further epoch costs, without the run's one-time costs
            last = {w: statistics.median(v) for w, v in lasts.items()}
            print(f"\n{scheduler}, the last of {args.epochs} epochs alone (its validation and checkpoint included; medians):")
            print("| variant | last epoch wall s | samples/s | vs cpu | vs its one-at-a-time |")
            print("|---|---|---|---|---|")
            per_epoch = samples / args.epochs
            for w, s in last.items():
                alone = w.replace(" batched", "").replace(" grouped", "")
                rel = f"{last[alone] / s:.2f}x" if w != alone and alone in last else ""
                vs_cpu = f"{last['cpu'] / s:.2f}x" if "cpu" in last else ""
                print(f"| {w} | {s:.3f} | {per_epoch / s:,.0f} | {vs_cpu} | {rel} |")
        if args.profile:
            print(f"\n{scheduler}, {args.profile}:")
            one_run(args, scheduler, variants(gpu)[args.profile], profile=True)
        if args.count_calls:
            extra = variants(True)[args.count_calls]
            if "runtime.torch_device=cuda" in extra and not torch.cuda.is_available():
                print(f"\n{scheduler}, {args.count_calls}, on a GPU emulated on the CPU (calls, not times):")
                with emulated_gpu.emulated_gpu():  # and matrix-product convolutions, CUDA's default
                    one_run(args, scheduler, extra + ["runtime.replica_conv=matmul"] * ("batched" in args.count_calls and "grouped" not in args.count_calls), profile="count")
            else:
                print(f"\n{scheduler}, {args.count_calls}:")
                one_run(args, scheduler, extra, profile="count")
        if args.instructions:
            n = instructions(scheduler, args.instructions)
            print(f"\n{scheduler}, {args.instructions}: host instructions in the training: {n:,} ({n / args.devices:,.0f} per device)")

if __name__ == "__main__":
    main()
