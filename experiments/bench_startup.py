"""Start-up: how long a user waits before anything happens, this tree against an older one.

    python experiments/bench_startup.py                    # against the commit before the start-up work
    python experiments/bench_startup.py --before-rev HEAD~3 --repeats 5

Every figure is the median wall time of `--repeats` fresh processes (one torch thread each),
the two trees alternating, so both see the same machine:

- `--help`, `--plugins`, and a bad override (`scheduler=nope`): the CLI before any training;
- a timing-only run of 10 devices (`scheduler=pipar runtime.numerics=false cluster.num_devices=10`,
  the default model and tracking, one epoch): what a planner study pays per run, once into a
  store that already exists (`timing_only_10_devices`, a user's usual case) and once into a
  fresh MLflow store (`..._fresh_store`: MLflow creates its tables first). Each must exit 0: a
  run that fails, a config error included, stops the benchmark instead of being timed;
- the first optimizer: building `framework.stage.make_optimizer` for a small model and its
  first step, in a process that has imported torch (torch.optim imports torch._dynamo there);
- the default synthetic set (8,000 MNIST-shaped samples): building it in a process that has
  imported torch.

The older tree is `git archive <rev>` unpacked in a temporary folder. Results go to
outputs/bench_startup/results.json.

`--phases` instead runs the 10-device case once, in a fresh process of this tree with timers
wrapped around its steps, and prints where the run process's wall time goes (imports, the role
building, the simulation, the written outputs, and how long it waits for MLflow's recorder,
which imports MLflow and writes the records beside it: framework.tracking.recorder):

    python experiments/bench_startup.py --phases
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE_REV = "157e63d"  # the last commit before declared plugins and the lean optimizer

IN_PROCESS = {
    "first_optimizer": r"""
import time, torch
torch.set_num_threads(1)
from omegaconf import OmegaConf
from framework.stage import make_optimizer
model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
cfg = OmegaConf.create({"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4})
t0 = time.perf_counter()
opt = make_optimizer(model.parameters(), cfg)
torch.nn.functional.cross_entropy(model(torch.randn(32, 784)), torch.randint(10, (32,))).backward()
opt.step()
opt.zero_grad()
print(time.perf_counter() - t0)
""",
    "synthetic_8000": r"""
import time, torch
torch.set_num_threads(1)
from omegaconf import OmegaConf
from framework import registry
e = registry.entry("dataset", "synthetic_mnist")
cfg = OmegaConf.structured(e.schema)
t0 = time.perf_counter()
d = e.factory(cfg)
assert len(d.x_train) + len(d.x_val) + len(d.x_test) == 8000
print(time.perf_counter() - t0)
""",
}


PHASES = r"""
import sys, time
t_start = time.perf_counter()
spent = []  # (label, seconds, nested: inside another timed step)


def timed(label, fn, nested=False):
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent.append((label, time.perf_counter() - t, nested))
    return wrapper


def imported(label, name):
    t = time.perf_counter()
    __import__(name)
    spent.append((label, time.perf_counter() - t, False))


imported("import framework's CLI (no torch)", "framework.cli")
import framework.cli as cli, framework.tracking.recorder as tp

fork = tp.start


def start(args):
    # the run's process from here on (the recorder is forked inside `fork`, before torch): the
    # steps that import torch are timed here, as the run would import them a moment later
    fork(args)
    imported("import torch", "torch")
    imported("import framework.job (torch already in)", "framework.job")
    import framework.job as job
    job.build_scheduler = timed("build the scheduler and its roles", job.build_scheduler)
    job.Job.train = timed("Job.train (the simulation)", job.Job.train)
    job.Job._write_outputs = timed("Job._write_outputs (timeline.png, summary)", job.Job._write_outputs)
    tp.Recorder.run_id = timed("  of which waiting for the recorder's MLflow run", tp.Recorder.run_id, nested=True)
    tp.Recorder.close = timed("waiting for the recorder to write the last records", tp.Recorder.close)


tp.start = start
sys.argv = ["framework", *sys.argv[1:]]
try:
    cli.main()
except SystemExit as e:
    if e.code not in (0, None):
        raise
total = time.perf_counter() - t_start
for label, s, nested in spent:
    print(f"{s:8.3f} s  {label}")
print(f"{total - sum(s for _, s, nested in spent if not nested):8.3f} s  the rest (Hydra, validation, plugins)")
print(f"{total:8.3f} s  in the run's process, after the interpreter started (MLflow works beside it, in its recorder)")
"""


def phases(tmp: Path) -> None:
    """Where a 10-device timing-only run's wall time goes, in a fresh process of this tree."""
    env = env_of(ROOT)
    timed([sys.executable, "-m", "framework", *argv_of(tmp, "timing_only_10_devices", "ours", "warm")], ROOT, env)  # the store exists, as for a user's next run
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", PHASES, *argv_of(tmp, "timing_only_10_devices", "ours", "phases")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"the timed run failed:\n{res.stderr[-2000:]}")
    print(f"a timing-only PiPar run of 10 devices, one torch thread, into an existing MLflow store: {wall:.3f} s wall")
    print("\n".join(line for line in res.stdout.splitlines() if " s  " in line))


def cli_cases(tmp: Path) -> dict[str, list[str]]:
    # PiPar: 10 devices and a server. (The default GPipe over LeNet's 5 units cannot have 10
    # stages: that is a config error, exit status 2, which this case once timed by mistake.)
    run = ["scheduler=pipar", "runtime.numerics=false", "cluster.num_devices=10", "train.epochs=1", "runtime.progress=false"]
    return {
        "help": ["--help"],
        "plugins": ["--plugins"],
        "bad_override": ["scheduler=nope"],
        "timing_only_10_devices": run + [f"tracking.uri=sqlite:///{tmp}/TREE.db", f"tracking.artifact_root={tmp}/art", f"hydra.run.dir={tmp}/RUN"],
        "timing_only_10_devices_fresh_store": run + [f"tracking.uri=sqlite:///{tmp}/STORE.db", f"tracking.artifact_root={tmp}/art", f"hydra.run.dir={tmp}/RUN"],
    }


EXIT_STATUS = {"bad_override": 2}  # every other case must succeed


def env_of(tree: Path) -> dict:
    """A fresh process of `tree`'s framework, one torch thread, writing Python's bytecode caches
    as a user's installation does (the untimed first run of each tree writes them; compiling the
    framework's sources costs a process 0.2-0.4 s on 2 cores)."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="")


def argv_of(tmp: Path, case: str, tree_name: str, r) -> list[str]:
    """`case`'s arguments for one tree's run `r`: a store per tree (TREE) or per run (STORE), a run folder per run."""
    return [a.replace("TREE", f"{tree_name}-store").replace("STORE", f"{tree_name}{r}").replace("RUN", f"{tree_name}-run{r}") for a in cli_cases(tmp)[case]]


def timed(cmd: list[str], cwd: Path, env: dict, expect: int = 0) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if res.returncode != expect:
        raise RuntimeError(f"{' '.join(cmd[:8])} ... exited {res.returncode} (expected {expect}) in {cwd}:\n{res.stderr[-2000:]}")
    return wall


def in_process(code: str, cwd: Path, env: dict) -> float:
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"failed in {cwd}:\n{res.stderr[-2000:]}")
    return float(res.stdout.strip().splitlines()[-1])


def unpack(rev: str, into: Path) -> Path:
    data = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before-rev", default=BEFORE_REV, help=f"the older commit (default {BEFORE_REV})")
    ap.add_argument("--before-tree", type=Path, help="an older checkout instead of --before-rev")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--phases", action="store_true", help="only: where one 10-device run's time goes")
    args = ap.parse_args()
    if args.phases:
        with tempfile.TemporaryDirectory(prefix="pipelab-bench-startup-") as tmpdir:
            phases(Path(tmpdir))
        return

    with tempfile.TemporaryDirectory(prefix="pipelab-bench-startup-") as tmpdir:
        tmp = Path(tmpdir)
        trees = {"ours": ROOT, "before": args.before_tree or unpack(args.before_rev, tmp / "before")}
        results: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
        for name, tree in trees.items():  # untimed: each tree's store exists before the timed runs into it
            timed([sys.executable, "-m", "framework", *argv_of(tmp, "timing_only_10_devices", name, "warm")], tree, env_of(tree))
        for r in range(args.repeats):
            for name, tree in trees.items():
                env = env_of(tree)
                for case in cli_cases(tmp):
                    cmd = [sys.executable, "-m", "framework", *argv_of(tmp, case, name, r)]
                    results[name].setdefault(case, []).append(timed(cmd, tree, env, EXIT_STATUS.get(case, 0)))
                for case, code in IN_PROCESS.items():
                    results[name].setdefault(case, []).append(in_process(code, tree, env))
                print(f"round {r + 1}/{args.repeats}: {name} done", file=sys.stderr)

    med = {name: {case: statistics.median(v) for case, v in cases.items()} for name, cases in results.items()}
    print(f"\nstart-up, median wall seconds of {args.repeats} fresh processes (one torch thread), this tree against {args.before_tree or args.before_rev}\n")
    print(f"{'case':<36} | {'before':>8} | {'ours':>8} | before / ours")
    for case in med["ours"]:
        b, o = med["before"][case], med["ours"][case]
        print(f"{case:<36} | {b:8.3f} | {o:8.3f} | {b / o:6.1f}x")
    out = ROOT / "outputs" / "bench_startup"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"median_s": med, "samples_s": results, "before": str(args.before_tree or args.before_rev)}, indent=2))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
