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
`Bag.put` returns; `Bag.take` turns that JSON back into the values.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch._utils import _flatten_dense_tensors

from framework.errors import PipelabError

DIR = "checkpoint"
FORMAT = 2  # 2: identical tensors stored once (`aliases`); format 1 files read as before
READS = (1, 2)


class CheckpointError(PipelabError):
    """A checkpoint cannot be written (state that has no stored form) or read (missing, damaged)."""


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


_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def save_file(tensors: dict[str, torch.Tensor], path) -> None:
    """`tensors` as a safetensors file (read back by `safetensors.torch.load_file`).

    The format is a little-endian u64 header length, a JSON header (dtype, shape and byte range
    of each tensor) padded to 8 bytes, then the bytes. Written here in one pass because
    `safetensors.torch.save_file` spends about 20 us of Python per tensor, and a 16-device
    PiPar checkpoint holds 500 small ones: 10 of the epoch's 600 ms."""
    import struct

    header, parts, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _ST_DTYPES:
            raise CheckpointError(f"cannot checkpoint {name}: safetensors has no {t.dtype}")
    fetched = _fetch_to_host(tensors)
    for name, t in tensors.items():
        data = fetched.get(name)
        if data is None:
            data = _host_bytes(t)
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + data.nbytes]}
        parts.append(data)
        offset += data.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for data in parts:
            f.write(data.data)


def _host_bytes(t: torch.Tensor):
    """A CPU tensor's bytes as a flat uint8 numpy array, reshaped by numpy (no torch call per
    step: a checkpoint holds thousands of small tensors)."""
    t = t.detach() if t.requires_grad else t  # what `put` stores is detached already
    if t.dtype is torch.bfloat16:  # numpy has no bfloat16
        return t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8)


def _fetch_to_host(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The bytes of every tensor not on the CPU (flat uint8 numpy arrays), copied back as one
    block per device: a GPU run's checkpoint holds thousands of small tensors, and one copy each
    (with its synchronisation) cost 0.3 s of a 64-device epoch on an H200."""
    by_device: dict = {}
    for name, t in tensors.items():
        if t.device.type != "cpu":
            by_device.setdefault(t.device, []).append(name)
    out = {}
    for names in by_device.values():
        out.update(zip(names, device_bytes([tensors[n] for n in names])))
    return out


def device_bytes(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """Each tensor's bytes (all on one device, none requiring grad) as a flat uint8 numpy array,
    through one block on the host: the tensors of each dtype are flattened by one call (torch's
    `_flatten_dense_tensors` loops in C++: a Python call per tensor costs the host about what a
    kernel launch does), the block is copied back once and cut up with numpy, not torch.

    A CUDA block lands in pinned (page-locked) memory: copied into ordinary memory, the 301 MB
    block of a 64-device FL VGG-5 checkpoint took 0.24 s of GPU time on an H100 (26 November,
    1.2 GB/s), pinned it fell out of the profile's top copies (under 10 ms); the buffer comes
    from torch's caching host allocator, so later epochs reuse it."""
    if not tensors:
        return []
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    order, flats = [], []
    for idx in by_dtype.values():
        flats.append(_flatten_dense_tensors([tensors[i] for i in idx]).view(torch.uint8))
        order.extend(idx)
    block = flats[0] if len(flats) == 1 else torch.cat(flats)
    if block.device.type == "cuda":
        host = torch.empty(block.numel(), dtype=torch.uint8, pin_memory=True)
        host.copy_(block, non_blocking=True)
        torch.cuda.current_stream(block.device).synchronize()
        block = host
    elif block.device.type != "cpu":
        block = block.cpu()
    data = block.numpy()
    out: list = [None] * len(tensors)
    offset = 0
    for i in order:
        t = tensors[i]
        n = t.numel() * t.element_size()
        out[i] = data[offset : offset + n]
        offset += n
    return out


def duplicates(bag: Bag) -> dict[str, str]:
    """{key: earlier key} for each tensor bit-for-bit equal to the first one stored under the same
    name, shape, dtype and device. After an FL or PiPar round every device holds the aggregate:
    64 devices' VGG-5 copies were half of a 301 MB checkpoint, and writing it took 0.27 s of a
    2-core machine's epoch. Only the first of each name is compared against (a differing tensor
    usually differs in its first bytes, and torch.equal stops there), so the cost is one pass over
    the duplicates. Bits, not values: -0.0 and 0.0 are not merged; two NaNs with the same bits are."""
    first: dict[tuple, str] = {}  # signature -> the first key stored under it
    pairs: list[tuple[str, str]] = []  # (key, earlier key)
    for key, t in bag.tensors.items():
        sig = (bag.names.get(key, key), t.shape, t.dtype, t.device)
        seen = first.get(sig)
        if seen is None:
            first[sig] = key
        else:
            pairs.append((key, seen))
    flags = _equal_bits_each([(bag.tensors[key], bag.tensors[earlier]) for key, earlier in pairs])
    return {key: earlier for (key, earlier), equal in zip(pairs, flags) if equal}


def _equal_bits_each(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """Whether each (same-shape, same-dtype) pair is equal bit for bit. On the CPU one
    torch.equal of their bits each (it stops at the first difference); on another device all of
    that device's pairs at once (`_equal_on_device`): there each torch.equal would wait for the
    device, ~650 times per checkpoint of 64 FL devices."""
    by_device: dict = {}
    for i, (a, _) in enumerate(pairs):
        by_device.setdefault(a.device, []).append(i)
    out = [False] * len(pairs)
    for device, idx in by_device.items():
        group = [pairs[i] for i in idx]
        if device.type == "cpu":
            bits: dict = {}  # id -> bits: the first of a name is compared with every later one

            def of(t: torch.Tensor) -> torch.Tensor:
                got = bits.get(id(t))
                if got is None:
                    got = bits[id(t)] = _bits(t)
                return got

            flags = [torch.equal(of(a), of(b)) for a, b in group]
        else:
            flags = _equal_on_device(group)
        for i, f in zip(idx, flags):
            out[i] = f
    return out


_STACK_BYTES = 256 * 2**20  # what one stacked comparison may copy of each side


def _equal_on_device(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """Whether each pair (one device) is equal bit for bit, compared there and read back once. Pairs of one
    shape and dtype are stacked and compared in one call (`eq` and `all` per pair were two kernel
    launches each, 5,200 for a checkpoint of 64 FL VGG-5 devices; stacked, a few per parameter
    name), in chunks of at most `_STACK_BYTES` a side."""
    by_kind: dict = {}
    for i, (a, _) in enumerate(pairs):
        by_kind.setdefault((a.shape, a.dtype), []).append(i)
    order, flags = [], []
    for (shape, dtype), idx in by_kind.items():
        numel = shape.numel()
        per = max(1, _STACK_BYTES // max(1, numel * dtype.itemsize))
        for j in range(0, len(idx), per):
            chunk = idx[j : j + per]
            a = _bits(torch.stack([pairs[i][0] for i in chunk])).view(len(chunk), numel)  # bits: the stack, not each tensor, is viewed
            b = _bits(torch.stack([pairs[i][1] for i in chunk])).view(len(chunk), numel)
            flags.append(torch.eq(a, b).all(1))
            order.extend(chunk)
    out = [False] * len(pairs)
    for i, f in zip(order, torch.cat(flags).tolist() if flags else []):
        out[i] = f
    return out


_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _bits(t: torch.Tensor) -> torch.Tensor:
    int_type = _SAME_WIDTH_INT.get(t.dtype)
    return t if int_type is None else t.view(int_type)


def save(run_dir, bag: Bag) -> Path:
    """Write `bag` to <run_dir>/checkpoint atomically: a crash mid-write keeps the previous one."""
    run_dir = Path(run_dir)
    final, tmp, old = run_dir / DIR, run_dir / (DIR + ".tmp"), run_dir / (DIR + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    aliases = duplicates(bag)
    save_file({k: t for k, t in bag.tensors.items() if k not in aliases}, str(tmp / "state.safetensors"))
    (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "aliases": aliases, **bag.meta}))
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


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
    from safetensors import SafetensorError
    from safetensors.torch import load_file

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
    import hashlib

    from omegaconf import OmegaConf

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
    from omegaconf import OmegaConf, open_dict

    from framework.errors import ConfigError

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
