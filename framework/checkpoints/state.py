"""Checkpoints: what a run needs to continue bit for bit, written at every epoch end.

    <run dir>/checkpoint/
        state.safetensors   every tensor: weights, optimizer state, RNG states, timeline columns
        meta.json           everything else as plain JSON: the epoch, counters, histories, stats

Loading runs no code: safetensors holds raw tensors, JSON holds data; nothing is unpickled.
A tensor bit-for-bit equal to one stored before it under the same name (the K device copies of
the model that FedAvg has just made equal) is stored once: `meta.json` names it under `aliases`,
and loading gives it a copy of its own.
A checkpoint is taken while every role waits at an epoch's end (nothing in flight), so the state
is the roles' own (`Role.checkpoint`), the job's records, and the simulator's clock, links and
timeline; `train.resume=<run dir>` rebuilds the run from its stored config and continues it from
there (framework.job).

`Bag` is the one container: tensors under flat string keys plus a JSON tree. Each part of a run
writes under its own key prefix (`role.stage0.`, `runtime.`, `job.`) and keeps the JSON that
`Bag.put` returns; `Bag.take` turns that JSON back into the values. The tensor file itself (its
one-pass writer, a GPU's tensors fetched as one block, duplicates found) is
framework/checkpoints/tensor_file.py; a GPU run's files are written in the background
(framework/checkpoints/writer.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

from framework.checkpoints import tensor_file as checkpoint_file
from framework.checkpoints.tensor_file import CheckpointError, duplicates
from framework.errors import ConfigError

save_file = checkpoint_file.save_file  # the tensor file's writer, as this module's since before it moved

DIR = "checkpoint"
FORMAT = 2  # 2: identical tensors stored once (`aliases`); format 1 files read as before
READS = (1, 2)


_SCALARS = (bool, int, float, str, type(None))


def _plain(v: Any) -> bool:
    if isinstance(v, _SCALARS):
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return False


@dataclass
class Bag:
    """Tensors by key and a JSON tree: one role's (or the runtime's, or the job's) checkpoint.

    A bag holds the live tensors it is given, not copies: `save` it before the run changes them,
    as `Job` does in the same step (copying them cost a 16-device PiPar epoch 1.5% of its wall
    time)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict, repr=False)  # key -> its name within its put (`units.0.weight`)

    def put(self, prefix: str, values: dict) -> dict:
        """Store a dict of mixed values under `prefix`; returns its JSON description (keep it in
        `meta`). Tensors, torch generators and numpy arrays go to `tensors`; other values must be
        JSON data, anything else is a CheckpointError naming the key (a plugin's state that needs
        a stored form)."""
        desc = {}
        for k, v in values.items():
            key = f"{prefix}.{k}"
            if isinstance(v, torch.Tensor):
                if v.device.type == "meta":
                    desc[k] = {"meta_shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
                    continue
                self.tensors[key] = v.detach() if v.requires_grad else v  # a state_dict's are detached already
                self.names[key] = k
                desc[k] = {"tensor": key}
            elif isinstance(v, torch.Generator):
                self.tensors[key] = v.get_state()
                desc[k] = {"generator": key}
            elif isinstance(v, np.ndarray):
                self.tensors[key] = torch.from_numpy(np.ascontiguousarray(v).copy())
                desc[k] = {"ndarray": key}
            elif _plain(v):
                desc[k] = {"value": v, "tuple": isinstance(v, tuple)}
            else:
                raise CheckpointError(f"cannot checkpoint {key}: a {type(v).__name__} has no stored form (tensors, generators, arrays and JSON data do)")
        return desc

    def take(self, desc: dict) -> dict:
        """The dict `put` described, rebuilt."""
        out = {}
        for k, d in desc.items():
            if "tensor" in d:
                out[k] = self.tensors[d["tensor"]]
            elif "generator" in d:
                g = torch.Generator()
                g.set_state(self.tensors[d["generator"]])
                out[k] = g
            elif "ndarray" in d:
                out[k] = self.tensors[d["ndarray"]].numpy()
            elif "meta_shape" in d:
                out[k] = torch.empty(d["meta_shape"], dtype=getattr(torch, d["dtype"]), device="meta")
            else:
                out[k] = tuple(d["value"]) if d.get("tuple") else d["value"]
        return out


# ---- state of torch objects ----------------------------------------------------------------------


def optimizer_state(bag: Bag, prefix: str, optimizer) -> dict:
    """An optimizer's state_dict (per-parameter buffers, param groups) into `bag`; returns its JSON."""
    sd = optimizer.state_dict()
    state = {str(i): bag.put(f"{prefix}.{i}", st) for i, st in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


def load_optimizer_state(bag: Bag, desc: dict, optimizer) -> None:
    state = {int(i): bag.take(d) for i, d in desc["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": desc["param_groups"]})


def module_state(bag: Bag, prefix: str, module) -> dict:
    return bag.put(prefix, dict(module.state_dict()))


def load_module_state(bag: Bag, desc: dict, module) -> None:
    with torch.no_grad():  # copies into the live parameters (optimizers keep pointing at them)
        module.load_state_dict(bag.take(desc))


def model_and_stage(bag: Bag, prefix: str, model, stage, numerics: bool) -> dict:
    """A role's whole model (runs with numerics) and its stage's optimizer state and counters:
    the stage's weights are the model's, stored once."""
    out = {"stage": stage.checkpoint(bag, f"{prefix}.stage", weights=False)}
    if numerics:
        out["model"] = module_state(bag, f"{prefix}.model", model)
    return out


def load_model_and_stage(bag: Bag, desc: dict, model, stage, numerics: bool) -> None:
    """What `model_and_stage` stored, back into `model` and `stage`."""
    if numerics:
        load_module_state(bag, desc["model"], model)
    stage.restore(bag, desc["stage"])


def random_state(rng) -> list:
    """A `random.Random`'s state as JSON."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_random_state(rng, state: list) -> None:
    rng.setstate((state[0], tuple(state[1]), state[2]))


# ---- files ---------------------------------------------------------------------------------------


def save(run_dir, bag: Bag) -> Path:
    """Write `bag` to <run_dir>/checkpoint atomically: a crash mid-write keeps the previous one."""
    return prepare(run_dir, bag).write()


class PreparedCheckpoint:
    """A checkpoint taken (`prepare`) and not yet written; `write` puts it in place atomically."""

    def __init__(self, run_dir: Path, file, meta: str):
        self.run_dir, self.file, self.meta = run_dir, file, meta

    def write(self) -> Path:
        final, tmp, old = self.run_dir / DIR, self.run_dir / (DIR + ".tmp"), self.run_dir / (DIR + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.file.write(str(tmp / "state.safetensors"))
        (tmp / "meta.json").write_text(self.meta)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return final


def prepare(run_dir, bag: Bag, detach_from_run: bool = False) -> PreparedCheckpoint:
    """`bag` as a checkpoint to write: duplicates found and the tensors' bytes on the host
    (framework/checkpoints/tensor_file.py); with `detach_from_run`, copies of the CPU tensors' bytes too."""
    aliases = duplicates(bag)
    tensors = {k: t for k, t in bag.tensors.items() if k not in aliases}
    file = checkpoint_file.prepare(tensors, detach_from_run)
    return PreparedCheckpoint(Path(run_dir), file, json.dumps({"format": FORMAT, "aliases": aliases, **bag.meta}))


def record_run_id(run_dir, run_id: str) -> None:
    """Put the MLflow run's id into the checkpoint in `run_dir` (one taken before the id was
    known), atomically: meta.json is replaced whole."""
    path = Path(run_dir) / DIR / "meta.json"
    meta = json.loads(path.read_text())
    if meta.get("mlflow_run_id") == run_id:
        return
    meta["mlflow_run_id"] = run_id
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, path)


def exists(run_dir) -> bool:
    return (Path(run_dir) / DIR / "meta.json").is_file()


def load(run_dir) -> Bag:
    d = Path(run_dir) / DIR
    if not (d / "meta.json").is_file():
        if (Path(run_dir) / (DIR + ".old") / "meta.json").is_file():  # the crash came between two renames
            d = Path(run_dir) / (DIR + ".old")
        else:
            raise CheckpointError(f"{run_dir} holds no checkpoint ({DIR}/meta.json); runs write one at each epoch end unless train.checkpoint=false")
    try:
        meta = json.loads((d / "meta.json").read_text())
        tensors = load_file(str(d / "state.safetensors"))
    except (OSError, ValueError, SafetensorError) as e:
        raise CheckpointError(f"cannot read the checkpoint in {d}: {e}") from None
    fmt = meta.pop("format", None)
    if fmt not in READS:
        raise CheckpointError(f"the checkpoint in {d} has format {fmt}; this pipelab reads formats {', '.join(map(str, READS))}")
    for key, same in meta.pop("aliases", {}).items():
        if same not in tensors:
            raise CheckpointError(f"cannot read the checkpoint in {d}: {key} is stored as {same}, which it does not hold")
        tensors[key] = tensors[same].clone()  # its own: loaded optimizer state may keep the tensor itself
    return Bag(tensors, meta)


# ---- resuming ------------------------------------------------------------------------------------

# what a resumed run may change: how long it trains on, how it shows progress and where it is
# tracked, nothing that would make its numbers differ from an uninterrupted run's
RESUME_KEYS = ("train.resume", "train.epochs", "train.checkpoint", "runtime.progress", "runtime.threads", "tracking")


def _resume_key(key: str) -> str | None:
    """The RESUME_KEYS entry an override key falls under (the `tracking` group: any of its keys)."""
    return next((k for k in RESUME_KEYS if key == k or key.startswith(k + ".")), None)


def config_fingerprint(cfg) -> str:
    """A digest of the resolved config without RESUME_KEYS: a checkpoint only continues the run it came from."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in RESUME_KEYS:
        *parents, name = key.split(".")
        node = plain
        for p in parents:
            node = node.get(p, {})
        node.pop(name, None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resumed_config(cfg, overrides: list[str]):
    """The config that `train.resume=<run dir>` continues with: the stopped run's own (its
    config.yaml), with the RESUME_KEYS this command sets. Any other override is refused, naming it."""
    run_dir = Path(str(cfg.train.resume)).expanduser()
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError("train.resume", f"{run_dir} is not a run directory (it has no config.yaml); give the folder a run printed at its end")
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    extra = sorted(k for k in given if _resume_key(k) is None and not k.startswith("hydra"))
    if extra:
        raise ConfigError("train.resume", f"a resumed run continues with its own config ({run_dir}/config.yaml); drop {', '.join(extra)} (a resume may set only {', '.join(RESUME_KEYS[1:])})")
    stored = OmegaConf.load(run_dir / "config.yaml")
    with open_dict(stored):
        for key in {_resume_key(k) for k in given} - {None}:
            OmegaConf.update(stored, key, OmegaConf.select(cfg, key), merge=False, force_add=True)
        stored.train.resume = str(run_dir)
    return stored
