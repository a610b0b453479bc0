"""How much wall time does the simulator add to the tensor math it runs?

Runs, side by side in one process, the same training work two ways and prints the ratio:
- `sim`: `runtime=sim` with the chosen schedule (default GPipe, S=4 stages, M=8 micro-batches,
  VGG-5 on the CIFAR-shaped set): role programs on the virtual clock, activations and gradients
  encoded to wire bytes and back at every stage boundary, timeline recorded;
- `plain`: a plain PyTorch loop over the same model, mini-batches and micro-batches (forward,
  backward with gradient accumulation, one SGD step per mini-batch), plus the same
  evaluation passes.

Repeats alternate the two (ABAB...) and report medians, so machine noise hits both alike.

    python experiments/bench_sim_overhead.py                 # gpipe, S=4, M=8, vgg5
    python experiments/bench_sim_overhead.py --scheduler 1f1b --model lenet --dataset synthetic_mnist
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


def make_job(args, out_dir) -> Job:
    overrides = [
        f"model={args.model}",
        f"dataset={args.dataset}",
        f"scheduler={args.scheduler}",
        "cluster=uniform",
        f"cluster.num_devices={args.stages}",
        f"scheduler.microbatches={args.microbatches}",
        "train.epochs=1",
        f"train.batch_size={args.batch_size}",
        f"train.iterations_per_epoch={args.iterations}",
        "dataset.n_val=256",
        "dataset.n_test=256",
        "tracking=none",
        "runtime.progress=false",
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
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    registry.load_plugins()

    plain_s, sim_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        warm = make_job(args, Path(tmp) / "warm")  # first-touch costs (allocator, kernels) off the clock
        plain_loop(warm, copy.deepcopy(warm.model), args.microbatches)
        for r in range(args.repeats):
            job = make_job(args, Path(tmp) / f"r{r}")
            model = copy.deepcopy(job.model)
            order = [("plain", None), ("sim", None)] if r % 2 == 0 else [("sim", None), ("plain", None)]
            for which, _ in order:
                t0 = time.perf_counter()
                if which == "plain":
                    plain_loop(job, model, args.microbatches)
                    plain_s.append(time.perf_counter() - t0)
                else:
                    vt = job.train()
                    sim_s.append(time.perf_counter() - t0)
    p, s = statistics.median(plain_s), statistics.median(sim_s)
    print(f"simulator overhead: {args.scheduler}, S={args.stages}, M={args.microbatches}, {args.model} on {args.dataset}, batch {args.batch_size}, {args.iterations} iterations, torch threads {torch.get_num_threads()}")
    print(f"{'':<24}{'median s':>10}{'best s':>10}   runs (s)")
    print(f"{'plain PyTorch loop':<24}{p:>10.3f}{min(plain_s):>10.3f}   {', '.join(f'{x:.3f}' for x in plain_s)}")
    print(f"{'pipelab runtime=sim':<24}{s:>10.3f}{min(sim_s):>10.3f}   {', '.join(f'{x:.3f}' for x in sim_s)}")
    print(f"ratio sim / plain: {s / p:.3f}x (medians), {min(sim_s) / min(plain_s):.3f}x (best of each); virtual time of the simulated run {vt:.3f}s")

if __name__ == "__main__":
    main()
