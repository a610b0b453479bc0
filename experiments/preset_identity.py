"""Same numbers before and after: every preset and every scheduler, run in this tree and in an
older one, must write bit-identical results (issue 45: a restructuring changes no behaviour).

    python experiments/preset_identity.py --base main           # this working tree against main
    python experiments/preset_identity.py --base HEAD~5 --only experiment=edgepipe

Each case is one short run on the virtual clock (`--budget`: one epoch of two iterations, no
tracking) of an `experiment=` preset, or of a scheduler the presets do not cover on the embedded
defaults. Compared exactly (floats by their repr): summary.json without its wall-clock fields,
and the trained weights (model.safetensors: every tensor's bytes). A case that fails in both trees is
reported, not compared; one that fails in only one tree is a difference.

The older tree is `git archive <base>` unpacked in a temporary folder; both run with one torch
thread, one after the other. Prints one line per case; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET = ["train.epochs=1", "train.iterations_per_epoch=2", "tracking=none", "train.checkpoint=false"]
# schedulers no preset selects, on the embedded defaults (or the cluster they need)
SCHEDULER_CASES = [
    "scheduler=gpipe", "scheduler=1f1b", "scheduler=pipedream", "scheduler=local",
    "scheduler=pipar", "scheduler=fl", "scheduler=sfl", "scheduler=sl",
    "scheduler=pipar compressor=mbq", "scheduler=gpipe predictor=accept",
    "experiment=feature_replay_pi scheduler=jointdnn", "experiment=feature_replay_pi scheduler=edge_only",
]
VOLATILE = ("wall", "search_s", "processes", "mlflow_run_id")  # wall-clock fields differ run to run


def cases() -> list[str]:
    presets = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    return [f"experiment={p}" for p in presets] + SCHEDULER_CASES


def unpack(rev: str, into: Path) -> Path:
    data = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if not any(w in k for w in VOLATILE)}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def run_case(tree: Path, case: str, out: Path) -> dict:
    """One run in `tree`: its stable summary and the weights' digest, or the error's last line."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PIPELAB_TRACKING_PROCESS="0")
    args = [sys.executable, "-m", "framework", *case.split(), *BUDGET, f"hydra.run.dir={out}"]
    res = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)  # experiment=accept takes ~15 min under load
    if res.returncode != 0:
        return {"error": (res.stderr.strip().splitlines() or ["exit %d" % res.returncode])[-1]}
    summary = _stable(json.loads((out / "summary.json").read_text()))
    weights = out / "model.safetensors"
    return {"summary": json.dumps(summary, sort_keys=True), "weights": _weights_digest(weights) if weights.exists() else None}


def _weights_digest(path: Path) -> str:
    """The tensors' names, dtypes, shapes and bytes (the file's header order varies run to run)."""
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(str(path)).items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()


def first_difference(a: dict, b: dict) -> str:
    if "error" in a or "error" in b:
        return f"base: {a.get('error', 'ran')} | here: {b.get('error', 'ran')}"
    if a["weights"] != b["weights"]:
        return "the trained weights differ"
    sa, sb = json.loads(a["summary"]), json.loads(b["summary"])
    flat_a, flat_b = _flatten(sa), _flatten(sb)
    for key in sorted(set(flat_a) | set(flat_b)):
        if flat_a.get(key, "<absent>") != flat_b.get(key, "<absent>"):
            return f"{key}: base {flat_a.get(key, '<absent>')!r} here {flat_b.get(key, '<absent>')!r}"
    return "identical"


def _flatten(value, prefix=""):
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="the git revision to compare against (default: main)")
    ap.add_argument("--only", action="append", help="run only this case (repeatable), e.g. experiment=edgepipe")
    args = ap.parse_args()
    todo = args.only or cases()
    different = 0
    with tempfile.TemporaryDirectory(prefix="preset_identity_") as tmp:
        base = unpack(args.base, Path(tmp) / "base")
        for i, case in enumerate(todo):
            a = run_case(base, case, Path(tmp) / f"base_{i}")
            b = run_case(ROOT, case, Path(tmp) / f"here_{i}")
            verdict = first_difference(a, b) if a != b else ("both failed: " + a["error"] if "error" in a else "identical")
            same = a == b and "error" not in a
            different += not same and not verdict.startswith("both failed")
            print(f"{'same' if same else 'DIFF' if not verdict.startswith('both failed') else 'fail'}  {case:<55} {verdict}", flush=True)
    print(f"{len(todo) - different}/{len(todo)} cases unchanged against {args.base}")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
