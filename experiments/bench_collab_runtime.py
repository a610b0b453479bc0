"""What do real processes over MQTT cost PiPar, against the simulator and a plain PyTorch loop?

One epoch of PiPar with K devices (default K = 4, LeNet, the MNIST-shaped set, WiFi cluster,
(P, N) chosen by select=auto once and then pinned so every variant does the same work), three ways,
alternating (ABCABC...) so machine noise hits all alike; medians reported:

- `local`: `runtime=local transport=mqtt`: one process per role (K devices, K server replicas,
  the aggregator) and a private mosquitto; `total` is the whole `train()` (process start-up,
  joining, building each role, training, evaluation), `training` the run's wall-clock makespan;
- `sim`: `runtime=sim`: every role in this process on the virtual clock (wire encoding included);
- `plain`: the same arithmetic as a plain single-process PyTorch loop: for each device, its
  iterations as full-batch SGD steps of the unsplit model on its own copy (PiPar's N micro-batches
  of B/N sum to exactly that gradient), then FedAvg of the K copies, then one evaluation.

Every process runs with one torch thread (2-core machines thrash otherwise).

    python experiments/bench_collab_runtime.py            # K = 4, LeNet, 3 repeats
    python experiments/bench_collab_runtime.py --devices 8 --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydra import compose, initialize_config_dir  # noqa: E402

from framework import registry  # noqa: E402
from framework.cli import CONF_DIR  # noqa: E402
from framework.job import Job  # noqa: E402
from framework.stage import make_optimizer  # noqa: E402
from plugins.schedulers.pipar.fedavg import fedavg  # noqa: E402


def overrides(args, P=None, N=None) -> list[str]:
    ov = ["scheduler=pipar", "cluster=pipar_wifi", f"cluster.num_devices={args.devices}", f"model={args.model}", f"dataset={args.dataset}",
          "train.epochs=1", "runtime.threads=1", "runtime.progress=false", "tracking=none"]
    if P is not None:
        ov += [f"scheduler.P={P}", f"scheduler.N={N}"]
    return ov


def make_job(ov, out) -> Job:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return Job(compose(config_name="config", overrides=ov), out)


def run_plain(job) -> float:
    """The same epoch as a plain loop; returns its wall seconds."""
    sched = job.scheduler
    t0 = time.perf_counter()
    models, counts = [], []
    for k in range(sched.K):
        model = copy.deepcopy(job.model)
        opt = make_optimizer(model.parameters(), job.cfg.train)
        n = 0
        for xs, ys in sched.iteration_batches(k, 0):
            x, y = torch.cat(xs), torch.cat(ys)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            n += len(y)
        models.append({k2: v.detach() for k2, v in model.state_dict().items()})
        counts.append(n)
    avg = fedavg(models, counts)
    model = copy.deepcopy(job.model)
    model.load_state_dict(avg)
    job.evaluate("val", model)
    job.evaluate("test", model)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--dataset", default="synthetic_mnist")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    registry.load_plugins()
    tmp = Path(tempfile.mkdtemp(prefix="bench_collab_"))
    probe = make_job(overrides(args), tmp / "probe")
    P, N = probe.scheduler.plans[0].P, probe.scheduler.plans[0].N
    print(f"PiPar K={args.devices} {args.model} {args.dataset}: P={P} N={N}, {probe.scheduler.iterations_per_epoch()} iterations/epoch", flush=True)
    ov = overrides(args, P, N)
    res = {"local_total": [], "local_training": [], "sim": [], "plain": []}
    for r in range(args.repeats):
        job = make_job(ov + ["runtime=local", "transport=mqtt"], tmp / f"local{r}")
        t0 = time.perf_counter()
        job.train()
        res["local_total"].append(time.perf_counter() - t0)
        res["local_training"].append(job.virtual_time)
        job = make_job(ov, tmp / f"sim{r}")
        t0 = time.perf_counter()
        job.train()
        res["sim"].append(time.perf_counter() - t0)
        res["plain"].append(run_plain(make_job(ov, tmp / f"plain{r}")))
        print("  repeat " + str(r) + ": " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in res.items()), flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print("medians: " + ", ".join(f"{k} {v:.2f}s" for k, v in med.items()))
    print(f"local (total) / sim     = {med['local_total'] / med['sim']:.2f}x")
    print(f"local (training) / sim  = {med['local_training'] / med['sim']:.2f}x")
    print(f"local (total) / plain   = {med['local_total'] / med['plain']:.2f}x")
    print(f"local (training) / plain = {med['local_training'] / med['plain']:.2f}x")
    print(f"sim / plain             = {med['sim'] / med['plain']:.2f}x")


if __name__ == "__main__":
    main()
