"""A model's unit range as flat vectors: what crosses a link when split models are exchanged.

`UnitLayout` lays every unit's floating parameters and floating buffers (BatchNorm statistics)
end to end, so the device part [0, P) and the server part [P, Q) of a split model concatenate into
the complete model's vectors, and averaging or shipping a part is one tensor per kind.
"""

from __future__ import annotations

import weakref

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layout_of(model) -> "UnitLayout":
    """The layout of `model`'s units, made once per model in a process: every role of a run lays
    its own copy of the model out alike (and the layout keeps each copy's tensors once)."""
    layout = _LAYOUTS.get(model)
    if layout is None:
        layout = _LAYOUTS[model] = UnitLayout(model)
    return layout


class UnitLayout:
    """Offsets of each unit's float parameters ("p") and buffers ("b") in flat vectors."""

    def __init__(self, model):
        self.p_off, self.b_off = [0], [0]
        for u in model.units:
            self.p_off.append(self.p_off[-1] + sum(p.numel() for p in u.parameters()))
            self.b_off.append(self.b_off[-1] + sum(b.numel() for b in u.buffers() if b.is_floating_point()))
        # model -> {(a, b, what): its tensors}: every round each of K devices flattens and loads
        # its part, and walking the modules for them (slicing a ModuleList builds a new one) was 8%
        # of a batched FL epoch's host time. Parameters and buffers are updated in place
        # everywhere (optimizers, load_state_dict, these loads), as a Stage, which keeps its own
        # references to them, also relies on
        self._tensors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def tensors(self, model, a: int, b: int, what: str) -> list[torch.Tensor]:
        """The float parameters ("p") or float buffers ("b") of units [a, b), in layout order."""
        known = self._tensors.setdefault(model, {})
        out = known.get((a, b, what))
        if out is None:
            units = [model.units[i] for i in range(a, b)]
            if what == "p":
                out = [t for u in units for t in u.parameters()]
            else:
                out = [t for u in units for t in u.buffers() if t.is_floating_point()]
            known[(a, b, what)] = out
        return out

    def flat(self, model, a: int, b: int, dtype, numerics: bool) -> dict:
        """Units [a, b) as {"p": params, "b": buffers}; shapes only (meta) in timing-only runs."""
        if not numerics:
            return {
                "p": torch.empty(self.p_off[b] - self.p_off[a], dtype=dtype, device="meta"),
                "b": torch.empty(self.b_off[b] - self.b_off[a], dtype=dtype, device="meta"),
            }
        out = {}
        with torch.no_grad():  # a copy of the values, outside any graph
            for what in ("p", "b"):
                ts = self.tensors(model, a, b, what)
                if len(ts) > 1:  # one call that loops in C++, not a Python call per tensor (K devices a round)
                    out[what] = _flatten_dense_tensors(ts)
                else:  # flattening one tensor gives a view of it: the vector must be a copy
                    out[what] = ts[0].reshape(-1).clone() if ts else torch.empty(0, dtype=dtype)
        return out

    def load(self, model, a: int, b: int, flat: dict) -> None:
        """Copy {"p", "b"} vectors of units [a, b) into `model`."""
        with torch.no_grad():
            for what in ("p", "b"):
                ts = self.tensors(model, a, b, what)
                off = self.p_off if what == "p" else self.b_off
                if flat[what].numel() != off[b] - off[a]:
                    raise ValueError(f"units [{a}, {b}) hold {off[b] - off[a]} values of kind {what!r}; the vector has {flat[what].numel()}")
                if ts:  # one multi-tensor copy: on a GPU, one launch instead of one per tensor
                    torch._foreach_copy_(ts, _unflatten_dense_tensors(flat[what], ts))
