"""What a role process builds before it trains: seconds and peak memory, per role.

Each role is built in a fresh Python process (one torch thread), as `python -m framework.worker`
does after it receives the setup, and the process reports its build seconds and peak RSS:

- `after` (this tree): `build_scheduler(cfg, role=r, plan=plan)` and `build_role(r)`: the role's
  own state from the coordinator's shipped plan (no search, no other role's stage);
- `before` (`--before-tree PATH`, a checkout of an older pipelab): the old worker's build step,
  `Job(cfg)` plus `scheduler.plan()` and `scheduler.roles()`: every role's stages, K model copies
  and the plan search, in every role process. (Before this change, runtime=local rejected the
  collaborative schedulers outright; this is what a role process would have had to build.)

`imports` is the process's RSS and time after importing the framework, the same for both.

    python experiments/bench_role_startup.py                               # pipar K = 4 VGG-5
    python experiments/bench_role_startup.py --before-tree /tmp/old --devices 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
sys.path.insert(0, TREE)
from hydra import compose, initialize_config_dir
from framework import registry
from framework.cli import CONF_DIR
registry.load_plugins()
import torch
torch.set_num_threads(1)
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = compose(config_name="config", overrides=OVERRIDES)
t_import, rss_import = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t1 = time.perf_counter()
if MODE == "after":
    from framework.job import build_scheduler
    ctx, sched = build_scheduler(cfg, role=ROLE, plan=PLAN)
    sched.build_role(ROLE)
else:
    from framework.job import Job
    job = Job(cfg, "/tmp/pipelab-bench-startup")
    job.scheduler.plan()
    job.scheduler.roles()
print(json.dumps({"import_s": t_import, "import_rss_mib": rss_import, "build_s": time.perf_counter() - t1,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(tree: Path, mode: str, role: str, overrides: list[str], plan: dict | None) -> dict:
    code = CHILD.replace("TREE", repr(str(tree))).replace("OVERRIDES", repr(overrides)).replace("MODE", repr(mode)).replace("ROLE", repr(role)).replace("PLAN", repr(plan))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree, env=env)
    if p.returncode:
        raise RuntimeError(f"{mode} {role} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--model", default="vgg5")
    ap.add_argument("--dataset", default="synthetic_cifar10")
    ap.add_argument("--before-tree", type=Path, default=None)
    ap.add_argument("--roles", default=None, help="comma-separated roles to measure (default: all)")
    args = ap.parse_args()
    ov = ["scheduler=pipar", "cluster=pipar_4g", f"cluster.num_devices={args.devices}", f"model={args.model}", f"dataset={args.dataset}",
          "train.batch_size=100", "runtime.progress=false", "tracking=none"]
    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir

    from framework import registry
    from framework.cli import CONF_DIR
    from framework.job import build_scheduler

    registry.load_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=ov)
    _, sched = build_scheduler(cfg)
    plan = json.loads(json.dumps(sched.plan()))
    roles = args.roles.split(",") if args.roles else list(sched.role_devices())
    print(f"PiPar K={args.devices} {args.model} {args.dataset}: roles {', '.join(sched.role_devices())}; P={plan['P']} N={plan['N']}")
    print(f"{'role':<8} {'variant':<7} {'imports s':>9} {'build s':>8} {'peak RSS MiB':>12} {'RSS after imports':>17}")
    for role in roles:
        variants = [("after", ROOT)] + ([("before", args.before_tree)] if args.before_tree else [])
        for mode, tree in variants:
            m = measure(tree, mode, role, ov, plan if mode == "after" else None)
            print(f"{role:<8} {mode:<7} {m['import_s']:>9.2f} {m['build_s']:>8.3f} {m['peak_rss_mib']:>12.0f} {m['import_rss_mib']:>17.0f}", flush=True)


if __name__ == "__main__":
    main()
