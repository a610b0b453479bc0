"""The checkpoint's tensor file: every tensor of a run's state in one safetensors file, written
in one pass, with a GPU run's tensors fetched as one block per device, and tensors that are
bit-for-bit equal to an earlier one under the same name found so that they are stored once
(framework/checkpoints/state.py keeps the names of the duplicates in `meta.json`).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch
from torch._utils import _flatten_dense_tensors

from framework.errors import PipelabError


class CheckpointError(PipelabError):
    """A checkpoint cannot be written (state that has no stored form) or read (missing, damaged)."""


_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def save_file(tensors: dict[str, torch.Tensor], path) -> None:
    """`tensors` as a safetensors file (read back by `safetensors.torch.load_file`).

    The format is a little-endian u64 header length, a JSON header (dtype, shape and byte range
    of each tensor) padded to 8 bytes, then the bytes. Written here in one pass because
    `safetensors.torch.save_file` spends about 20 us of Python per tensor, and a 16-device
    PiPar checkpoint holds 500 small ones: 10 of the epoch's 600 ms."""
    prepare(tensors).write(path)


class PreparedFile:
    """A safetensors file's header and bytes, ready to write (`prepare`). `detached`: no part is a
    view of a live tensor, so it may be written while the run goes on (framework.checkpoints.writer)."""

    __slots__ = ("head", "parts", "detached")

    def __init__(self, head: bytes, parts: list, detached: bool):
        self.head, self.parts, self.detached = head, parts, detached

    def write(self, path) -> None:
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(self.head)))
            f.write(self.head)
            for data in self.parts:
                f.write(data.data)


def prepare(tensors: dict[str, torch.Tensor], detach_from_run: bool = False) -> PreparedFile:
    """The file of `tensors`, its bytes on the host: the tensors on a device fetched as one block
    per device (a copy, taken now), those on the CPU as views of their memory (no copy), or with
    `detach_from_run` as one copy of them all (a checkpoint written in the background must not
    see the next epoch's updates; in a GPU run the CPU holds only small state: RNG states, the
    timeline).

    The file holds each device's tensors in their block's order, so that a block is written by
    one call: written tensor by tensor, a background write of a 64-device checkpoint made a
    thousand calls, each taking the interpreter's lock back from the training thread."""
    for name, t in tensors.items():
        if t.dtype not in _ST_DTYPES:
            raise CheckpointError(f"cannot checkpoint {name}: safetensors has no {t.dtype}")
    header, parts, offset = {}, [], 0

    def add(name: str, nbytes: int) -> None:
        nonlocal offset
        t = tensors[name]
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes

    on_device: set = set()
    for names, block in _fetch_blocks(tensors):
        for name in names:
            t = tensors[name]
            add(name, t.numel() * t.element_size())
        parts.append(block)
        on_device.update(names)
    here = [(name, _host_bytes(t)) for name, t in tensors.items() if name not in on_device]
    for name, data in here:
        add(name, data.nbytes)
    if detach_from_run and here:
        parts.append(np.concatenate([data for _, data in here]))
    else:
        parts.extend(data for _, data in here)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return PreparedFile(head, parts, detach_from_run or not here)


def on_device(tensors) -> bool:
    """Whether any of `tensors` is on a device other than the CPU (what a checkpoint fetches as a
    block, a copy that the run's next steps cannot change)."""
    return any(_fetched(t) for t in tensors)


def _fetched(t: torch.Tensor) -> bool:
    """Whether a checkpoint takes `t`'s bytes through a block fetched from its device."""
    return t.device.type != "cpu"


def _host_bytes(t: torch.Tensor):
    """A CPU tensor's bytes as a flat uint8 numpy array, reshaped by numpy (no torch call per
    step: a checkpoint holds thousands of small tensors)."""
    t = t.detach() if t.requires_grad else t  # what `put` stores is detached already
    if t.dtype is torch.bfloat16:  # numpy has no bfloat16
        return t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8)


def _fetch_blocks(tensors: dict[str, torch.Tensor]) -> list[tuple[list[str], np.ndarray]]:
    """The tensors not on the CPU, copied back as one block per device: (their names in the
    block's order, the block's bytes as a flat uint8 numpy array). A GPU run's checkpoint holds
    thousands of small tensors, and one copy each (with its synchronisation) cost 0.3 s of a
    64-device epoch on an H200."""
    by_device: dict = {}
    for name, t in tensors.items():
        if _fetched(t):
            by_device.setdefault(t.device, []).append(name)
    out = []
    for names in by_device.values():
        block, order = _device_block([tensors[n] for n in names])
        out.append(([names[i] for i in order], block))
    return out


def _device_block(tensors: list[torch.Tensor]) -> tuple[np.ndarray, list[int]]:
    """The bytes of `tensors` (one device, none requiring grad, at least one) as one flat uint8
    numpy array on the host, and the order of the tensors in it: the tensors of each dtype are
    flattened by one call (torch's `_flatten_dense_tensors` loops in C++: a Python call per
    tensor costs the host about what a kernel launch does) and the block is copied back once.

    A CUDA block lands in pinned (page-locked) memory: copied into ordinary memory, the 301 MB
    block of a 64-device FL VGG-5 checkpoint took 0.24 s of GPU time on an H100 (26 November,
    1.2 GB/s), pinned it fell out of the profile's top copies (under 10 ms); the buffer comes
    from torch's caching host allocator, so later epochs reuse it."""
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
    return block.numpy(), order


def duplicates(bag) -> dict[str, str]:
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
