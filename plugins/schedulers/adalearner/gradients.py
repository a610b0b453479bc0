"""The whole model's gradient as AdaLearner's roles and planner see it, from a run's parts
(framework.scheduler.SchedulerContext): every role holds a replica of the whole model, so a
gradient, the fp32 weights and the 1-bit answer all have the model's parameter shapes."""

from __future__ import annotations

import torch

from framework.models import clone_module


def param_shapes(model) -> dict[str, tuple]:
    """The whole model's parameters by the names a role's Stage gives them."""
    return {n: tuple(p.shape) for n, p in model.slice(0, len(model)).named_parameters()}


def meta_grads(shapes: dict[str, tuple], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A gradient (or the weights) as meta tensors: what a timing-only run sends."""
    return {n: torch.empty(s, dtype=dtype, device="meta") for n, s in shapes.items()}


def gradient_codec(compressor):
    """The codec of the 1-bit architecture (the compressor's gradient codec), or None."""
    return compressor.codec(compressor.backward_tag)


def aggregate_meta(codec, shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The 1-bit answer's tensors (each parameter's scalars and bits, uint8) as meta tensors."""
    out = {}
    for n, shape in shapes.items():
        meta_n, payload_n = codec.wire_size(shape)
        out[f"{n}.meta"] = torch.empty(meta_n, dtype=torch.uint8, device="meta")
        out[f"{n}.bits"] = torch.empty(payload_n, dtype=torch.uint8, device="meta")
    return out


def decode_aggregate(codec, shapes: dict[str, tuple], dtype: torch.dtype, packet: dict) -> dict[str, torch.Tensor]:
    """The GO's 1-bit sum, per tensor, as a worker decodes it (a malformed packet: WireError), on
    the CPU, where the codecs run (a message's tensors arrive where the roles' tensor work runs:
    on a GPU run, its bytes come back from there)."""
    codec_cls = type(codec)
    out = {}
    for n, shape in shapes.items():
        meta = packet[f"{n}.meta"].cpu().numpy().tobytes()
        bits = packet[f"{n}.bits"].cpu().numpy()
        out[n] = codec_cls.decode(meta, memoryview(bits), shape, dtype)
    return out


def own_model(parts):
    """A role's replica: a copy of the seeded model when it trains, the shared one when only timed."""
    return clone_module(parts.model) if parts.numerics else parts.model
