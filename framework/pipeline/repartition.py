"""Moving units between pipeline stages at an epoch boundary, as messages.

A repartition changes which contiguous units each stage holds. Every unit that changes owner
travels from its old stage to its new one in one message per (old, new) pair of stages, with
its weights, buffers and the optimizer state of its parameters (momentum, Adam's moments), so
training goes on exactly as if the new partition had held the same weights all along. The
message is ordinary wire-format tensors: its bytes appear on the link like any other.
"""

from __future__ import annotations

import torch


def owner(bounds: list[tuple[int, int]], unit: int) -> int:
    for s, (a, b) in enumerate(bounds):
        if a <= unit < b:
            return s
    raise ValueError(f"unit {unit} is in no stage of {bounds}")


def moves(old: list[tuple[int, int]], new: list[tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
    """{(from_stage, to_stage): [units]} for every unit whose stage changes."""
    out: dict[tuple[int, int], list[int]] = {}
    for s, (a, b) in enumerate(old):
        for u in range(a, b):
            t = owner(new, u)
            if t != s:
                out.setdefault((s, t), []).append(u)
    return out


def pack_units(model, optimizer, units: list[int], numerics: bool) -> dict[str, torch.Tensor]:
    """Weights, floating buffers and optimizer state of `units`, named `u<i>.<kind>.<name>`."""
    out = {}
    for u in units:
        mod = model.units[u]
        for name, p in mod.named_parameters():
            out[f"u{u}.p.{name}"] = p.detach() if numerics else torch.empty(p.shape, dtype=p.dtype, device="meta")
            state = optimizer.state.get(p, {}) if optimizer is not None else {}
            for key, v in state.items():
                if isinstance(v, torch.Tensor):
                    out[f"u{u}.o.{name}.{key}"] = v.detach() if numerics else torch.empty(v.shape, dtype=v.dtype, device="meta")
        for name, b in mod.named_buffers():
            out[f"u{u}.b.{name}"] = b.detach() if numerics else torch.empty(b.shape, dtype=b.dtype, device="meta")
    return out


def unpack_units(model, packet: dict[str, torch.Tensor], numerics: bool) -> dict[torch.nn.Parameter, dict]:
    """Load a packet's weights and buffers into `model`'s units; return the optimizer state it
    carried, per parameter, for the new stage's optimizer."""
    opt_state: dict = {}
    if not numerics:
        return opt_state
    with torch.no_grad():
        for key, t in packet.items():
            unit, kind, rest = key.split(".", 2)
            mod = model.units[int(unit[1:])]
            if kind == "p":
                mod.get_parameter(rest).copy_(t)
            elif kind == "b":
                mod.get_buffer(rest).copy_(t)
            else:
                pname, skey = rest.rsplit(".", 1)
                opt_state.setdefault(mod.get_parameter(pname), {})[skey] = t.clone()
    return opt_state
