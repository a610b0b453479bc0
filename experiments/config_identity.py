"""Same configs before and after: every composed config of this tree must equal another tree's
(issue 45: knobs moved into their schema fields, and YAML presets that set only what they change,
must compose exactly the configs they composed before).

    python experiments/config_identity.py --base main        # this working tree against main

Cases: the embedded defaults, every option of every group on them, every `experiment=` preset,
and every preset with every option of every group (a pair that does not compose must fail in
both trees). Each is composed with Hydra's compose API, as the CLI composes, and compared as
`OmegaConf.to_yaml(cfg, resolve=True)` without the `hydra` node; a case that fails is compared
by its error's type and first line. The other tree is `git archive <base>` unpacked in a
temporary folder (experiments/preset_identity.py); both trees compose at once. Prints the
differences; exits 1 on any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.preset_identity import unpack  # noqa: E402

# run in each tree (cwd and PYTHONPATH = the tree): reads the cases as JSON on stdin
COMPOSE = """
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from framework import registry

CONF_DIR = str(Path.cwd() / "conf")  # the tree's own (run with the tree as cwd)

registry.load_plugins()
out = {}
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    for case in json.load(sys.stdin):
        try:
            cfg = compose(config_name="config", overrides=case)
            cfg = OmegaConf.to_container(cfg, resolve=True)
            cfg.pop("hydra", None)
            out[" ".join(case)] = OmegaConf.to_yaml(OmegaConf.create(cfg))
        except Exception as e:
            out[" ".join(case)] = "ERROR " + type(e).__name__ + ": " + (str(e).splitlines() or [""])[0]
json.dump(out, sys.stdout)
"""


def cases() -> list[list[str]]:
    from framework import registry
    from framework.cli import group_choices

    registry.load_plugins()
    options = [f"{g}={o}" for g in registry.GROUPS for o in group_choices(g)]
    experiments = [f"experiment={e}" for e in group_choices("experiment")]
    return [[]] + [[o] for o in options] + [[e] for e in experiments] + [[e, o] for e in experiments for o in options]


def composing(tree: Path, todo: list[list[str]]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", COMPOSE], cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(todo))
    proc.stdin.close()
    return proc


def composed(proc: subprocess.Popen, tree: Path) -> dict[str, str]:
    out, err = proc.stdout.read(), proc.stderr.read()
    if proc.wait() != 0:
        raise SystemExit(f"composing in {tree} failed:\n{err[-3000:]}")
    return json.loads(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="the git revision to compare this tree with")
    ap.add_argument("--no-pairs", action="store_true", help="leave out the presets with every option (quicker)")
    args = ap.parse_args()
    todo = [c for c in cases() if not (args.no_pairs and len(c) > 1)]
    with tempfile.TemporaryDirectory() as tmp:
        base = unpack(args.base, Path(tmp))
        procs = [(composing(tree, todo), tree) for tree in (ROOT, base)]  # both trees at once
        ours, theirs = (composed(proc, tree) for proc, tree in procs)
    differ = [c for c in ours if ours[c] != theirs.get(c)]
    for case in differ:
        print(f"differs: {case or '(defaults)'}\n--- {args.base}\n{theirs.get(case)}\n--- this tree\n{ours[case]}")
    failed = sum(v.startswith("ERROR") for v in ours.values())
    print(f"{len(todo)} configs composed ({failed} fail in both trees alike), {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
