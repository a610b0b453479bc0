"""How much wall time does the simulator add to the tensor math it runs?

Runs, side by side in one process, the same training work two ways and prints the ratio:
- `sim`: `runtime=sim` with the chosen schedule (default GPipe, S=4 stages, M=8 micro-batches,
  VGG-5 on the CIFAR-shaped set): role programs on the virtual clock, activations and gradients
  copied across every stage boundary (in-process, raw tensors skip the wire bytes; their byte
  counts are the packets'), timeline recorded;
- `plain`: a plain PyTorch loop over the same model, mini-batches and micro-batches (forward,
  backward with gradient accumulation, one SGD step per mini-batch), plus the same
  evaluation passes.

For the collaborative schedulers (`--scheduler pipar|fl|sfl`, K = `--devices`), `plain` is K
model copies, each training its shard in the same mini-batches split into the same N
micro-batches (forward and backward per micro-batch, one SGD step per mini-batch), then their
average and the same evaluation: PiPar's arithmetic without its roles, messages and clock. The
ratio is per sample (both process the same samples).

Repeats alternate the two (AB BA AB...) and report medians, so machine noise hits both alike,
and the paired ratio: the median over repeats of each repeat's sim / plain, the two runs of a
repeat back to back (slow drift of the machine's speed cancels within a pair).

    python experiments/bench_sim_overhead.py                 # gpipe, S=4, M=8, vgg5
    python experiments/bench_sim_overhead.py --scheduler 1f1b --model lenet --dataset synthetic_mnist
    python experiments/bench_sim_overhead.py --scheduler pipar --devices 16 --model lenet --dataset synthetic_mnist

`--baseline checks-off` compares two simulated runs instead: the default `train.on_nonfinite=fail`
(every loss and updated parameter checked for NaN/inf, framework/nonfinite.py) against
`train.on_nonfinite=ignore` (no checks), same schedule and work; the ratio is their cost, within
this machine's noise; it also prints the time spent inside the checks during the checked runs.
"""

from __future__ import annotations

import argparse
import copy
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
from framework.data import split_microbatches  # noqa: E402
from framework.job import Job  # noqa: E402
from framework.stage import make_optimizer  # noqa: E402


COLLABORATIVE = ("pipar", "fl", "sfl")


def make_job(args, out_dir, extra=()) -> Job:
    if args.scheduler in COLLABORATIVE:
        shape = ["cluster=pipar_wifi", f"cluster.num_devices={args.devices}", f"scheduler.P={args.split}", f"scheduler.N={args.microbatches}"]
        shape = shape if args.scheduler != "fl" else shape[:2]
    else:
        shape = ["cluster=uniform", f"cluster.num_devices={args.stages}", f"scheduler.microbatches={args.microbatches}", f"train.iterations_per_epoch={args.iterations}"]
    overrides = [
        f"model={args.model}",
        f"dataset={args.dataset}",
        f"scheduler={args.scheduler}",
        *shape,
        "train.epochs=1",
        f"train.batch_size={args.batch_size}",
        "dataset.n_val=256",
        "dataset.n_test=256",
        "tracking=none",
        "runtime.progress=false",
        *extra,
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return Job(cfg, out_dir)


def plain_loop(job: Job, model: torch.nn.Module, microbatches: int) -> None:
    """The reference: the same forward/backward/step work with nothing around it."""
    opt = make_optimizer(model.parameters(), job.cfg.train)
    model.train()
    for x, y in job.context.train_batches(0):
        for xm, ym in zip(split_microbatches(x, microbatches), split_microbatches(y, microbatches)):
            loss = torch.nn.functional.cross_entropy(model(xm), ym, reduction="sum") / x.shape[0]
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    evaluate(job, model)


def plain_collaborative(job: Job, model: torch.nn.Module, k_devices: int, microbatches: int) -> None:
    """K copies train their shards (the scheduler's own shards and mini-batches), then average."""
    from framework.data import batches, shard_indices

    ds, cfg = job.dataset, job.cfg
    n_mb = 1 if cfg.scheduler.name == "fl" else microbatches
    size = cfg.train.batch_size // n_mb * n_mb
    models = [copy.deepcopy(model) for _ in range(k_devices)]
    for m, shard in zip(models, shard_indices(ds.y_train, k_devices, "contiguous", seed=cfg.seed)):
        opt = make_optimizer(m.parameters(), cfg.train)
        m.train()
        for x, y in batches(ds.x_train, ds.y_train, size, cfg.seed, 0, indices=shard, drop_last=True):
            for xm, ym in zip(split_microbatches(x, n_mb), split_microbatches(y, n_mb)):
                loss = torch.nn.functional.cross_entropy(m(xm), ym, reduction="sum") / x.shape[0]
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        states = [m.state_dict() for m in models]
        model.load_state_dict({k: sum(s[k] for s in states) / k_devices if states[0][k].is_floating_point() else states[0][k] for k in states[0]})
    evaluate(job, model)


def time_the_checks() -> list:
    """[seconds, calls] inside framework.nonfinite.Guard's checks from now on (the warm-up run's
    are taken off again by the caller)."""
    from framework import nonfinite

    spent = [0.0, 0]
    for name in ("received", "parameters", "number"):
        def timed(self, *a, _check=getattr(nonfinite.Guard, name), **k):
            if not self.enabled:  # the unchecked runs' (train.on_nonfinite=ignore) return at once
                return _check(self, *a, **k)
            t0 = time.perf_counter()
            try:
                return _check(self, *a, **k)
            finally:
                spent[0] += time.perf_counter() - t0
                spent[1] += 1
        setattr(nonfinite.Guard, name, timed)
    return spent


def evaluate(job: Job, model: torch.nn.Module) -> None:
    model.eval()
    with torch.no_grad():
        for split in ("val", "test"):
            xs, _ = job.dataset.split(split)
            for i in range(0, len(xs), job.cfg.train.eval_batch_size):
                model(xs[i : i + job.cfg.train.eval_batch_size])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vgg5")
    ap.add_argument("--dataset", default="synthetic_cifar10")
    ap.add_argument("--scheduler", default="gpipe")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8, help="M of a pipeline; PiPar's and SFL's N")
    ap.add_argument("--devices", type=int, default=16, help="K of pipar/fl/sfl")
    ap.add_argument("--split", type=int, default=2, help="PiPar's and SFL's P (units on the device)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--baseline", choices=("plain", "checks-off"), default="plain",
                    help="plain: a PyTorch loop; checks-off: the same simulated run with train.on_nonfinite=ignore")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    registry.load_plugins()

    plain_s, sim_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        collaborative = args.scheduler in COLLABORATIVE

        def plain(job, model):
            if collaborative:
                plain_collaborative(job, model, args.devices, args.microbatches)
            else:
                plain_loop(job, model, args.microbatches)

        checks_off = args.baseline == "checks-off"
        timed = time_the_checks() if checks_off else None
        warm = make_job(args, Path(tmp) / "warm")  # first-touch costs (allocator, kernels) off the clock
        warm.train() if checks_off else plain(warm, copy.deepcopy(warm.model))
        if timed is not None:
            timed[:] = [0.0, 0]
        for r in range(args.repeats):
            job = make_job(args, Path(tmp) / f"r{r}")
            model = copy.deepcopy(job.model)
            unchecked = make_job(args, Path(tmp) / f"u{r}", ["train.on_nonfinite=ignore"]) if checks_off else None
            order = [("plain", None), ("sim", None)] if r % 2 == 0 else [("sim", None), ("plain", None)]
            for which, _ in order:
                t0 = time.perf_counter()
                if which == "plain":
                    unchecked.train() if checks_off else plain(job, model)
                    plain_s.append(time.perf_counter() - t0)
                else:
                    vt = job.train()
                    sim_s.append(time.perf_counter() - t0)
    p, s = statistics.median(plain_s), statistics.median(sim_s)
    if args.scheduler in COLLABORATIVE:
        shape = f"K={args.devices}" + ("" if args.scheduler == "fl" else f", P={args.split}, N={args.microbatches}") + f", {job.dataset.n_train if hasattr(job.dataset, 'n_train') else len(job.dataset.y_train)} samples"
    else:
        shape = f"S={args.stages}, M={args.microbatches}, {args.iterations} iterations"
    print(f"simulator overhead: {args.scheduler}, {shape}, {args.model} on {args.dataset}, batch {args.batch_size}, torch threads {torch.get_num_threads()}")
    print(f"{'':<24}{'median s':>10}{'best s':>10}   runs (s)")
    if args.baseline == "checks-off":  # the checks' own time, summed inside the checked runs: no noise between runs
        print(f"the checks themselves: {timed[0] / sum(sim_s) * 100:.2f}% of the checked runs' wall time ({timed[1] // len(sim_s)} checks a run, {timed[0] / len(sim_s) * 1000:.1f} ms)")
    base, ours = ("sim, checks off", "sim, checks on") if args.baseline == "checks-off" else ("plain PyTorch loop", "pipelab runtime=sim")
    print(f"{base:<24}{p:>10.3f}{min(plain_s):>10.3f}   {', '.join(f'{x:.3f}' for x in plain_s)}")
    print(f"{ours:<24}{s:>10.3f}{min(sim_s):>10.3f}   {', '.join(f'{x:.3f}' for x in sim_s)}")
    paired = statistics.median(a / b for a, b in zip(sim_s, plain_s))
    print(f"ratio {ours} / {base}: {s / p:.3f}x (medians), {paired:.3f}x (paired), {min(sim_s) / min(plain_s):.3f}x (best of each); virtual time of the simulated run {vt:.3f}s")

if __name__ == "__main__":
    main()
