"""AccEPT's 'Uniform Quant.' baseline (Table 4): uniform quantization with a learned scale.

Forward, the sender rounds x/s to the nearest of the 2^k signed levels [-2^(k-1), 2^(k-1)-1]
and sends the codes with s. The scale is learned as in LSQ (Esser et al. 2020), initialised at
s = 0.25 as the paper says: when the gradient of a micro-batch comes back, the sender
(which kept x and s) computes dL/ds = sum(g * d x_hat/d s) / sqrt(N * Qp), with
d x_hat/d s = round(x/s) - x/s inside the range and -Qn or Qp where x was clipped, steps s, and
passes the gradient on with LSQ's straight-through estimator (zero where x was clipped).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from framework.codec import Encoded, register_codec
from framework.compression import Compressor
from plugins.compressors.accept_codecs import _SU_META, StochasticUniform, _bytes_view, _pack_nibbles, _rel_err, _split_shape


@register_codec
class LearnedScaleUniform(StochasticUniform):
    """Round-to-nearest uniform quantization with the scale the stream carries (LSQ)."""

    codec_id = 7
    name = "uniform_lsq"

    def encode(self, x: torch.Tensor, stream: dict) -> Encoded:
        k = self.bits
        qn, qp = 1 << (k - 1), (1 << (k - 1)) - 1
        s = float(np.float32(stream.setdefault("scale", 0.25)))
        g = x.detach().reshape(-1).to("cpu", torch.float32)
        q = torch.round(g / s).clamp_(-qn, qp)
        qv = q.numpy()
        stream["rel_err"] = _rel_err(qv * np.float32(s), g.numpy())
        n, rest = _split_shape(tuple(x.shape))
        codes = qv.astype(np.int8)
        payload = codes if k == 8 else _pack_nibbles(codes.reshape(n, rest), k)
        return Encoded(self.codec_id, x.dtype, tuple(x.shape), _SU_META.pack(k, s), _bytes_view(payload))


class LSQCompressor(Compressor):
    """Learned-scale uniform activations; the sender learns the scale from returned gradients."""

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.scale_lr = float(cfg.get("scale_lr", 0.01)) if cfg is not None else 0.01
        self.init_scale = float(cfg.get("init_scale", 0.25)) if cfg is not None else 0.25  # both in range: checked when built (registry.build)

    def encode_tensor(self, d, t, stream, **where):
        stream.setdefault("scale", self.init_scale)
        return super().encode_tensor(d, t, stream, **where)

    def remember(self, d, x, enc, stream):
        if not isinstance(d.codec, LearnedScaleUniform):
            return None
        return x, float(stream["scale"]), stream, d.codec.bits

    def on_gradient(self, g, kept):
        x, s, stream, k = kept
        qn, qp = 1 << (k - 1), (1 << (k - 1)) - 1
        v = x.to(g.device, g.dtype) / s  # x was kept where the codec ran (the CPU); g may be on a GPU
        low, high = v <= -qn, v >= qp
        inside = ~(low | high)
        dxds = torch.where(inside, torch.round(v) - v, torch.where(low, torch.full_like(v, -qn), torch.full_like(v, qp)))
        grad_s = float((g * dxds).sum()) / math.sqrt(v.numel() * qp)
        stream["scale"] = max(1e-8, stream["scale"] - self.scale_lr * grad_s)
        return g * inside  # LSQ's straight-through estimator
