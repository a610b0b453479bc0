"""Convolutions of stacked replicas as one batched matrix product (`runtime.replica_conv=matmul`).

Under `torch.func.vmap` over K replicas' stacked weights, a 2-D convolution becomes one grouped
convolution with K groups. In float32 on a GPU cuDNN runs that group by group: measured on an
H100 (27 November, K = 64 VGG-5, batch 32, one FL epoch under torch.profiler) the
convolutions launched 5,120 kernels (per group, and layout transposes), 0.23 s of the GPU's
0.35 s. Written as a matrix product instead (the input's windows laid out as rows, one
copy; the weights as a matrix), vmap turns each convolution into one `bmm` over the K replicas,
and the backward into two: the same epoch's GPU time fell to 0.15 s and its wall time from
0.48-0.60 s to 0.38 s (`experiments/bench_replicas.py`). The price is memory: the windows are
saved for the backward, about 9x the input for a 3x3 kernel (3.7 GiB peak against 2.5 GiB for
that step), so `grouped` stays available. On a CPU the grouped convolution (oneDNN) is faster
(K = 4: 167 ms a step against 331-382 ms), so the default is `matmul` on CUDA only.

The windows come from `Tensor.unfold` views and one `reshape` copy, not `F.unfold`: CUDA's
im2col launches a kernel per sample (tried 26 November: 50 ms a step against 17.8 ms).

`ConvAsMatmul` is a `TorchFunctionMode`: inside it, `conv2d` calls this module's version; what
it does not cover (grouped or depthwise convolutions, `padding="same"` with an even kernel) goes
to torch's own. Results equal the convolution's up to rounding (float64: about 1e-15).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_CONV2D_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[-1]))  # torch takes (s,) for (s, s)


def _padding(padding, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int] | None:
    """Zero-padding per side as (rows, columns); None where torch's convolution should decide
    ('same' with an even span is asymmetric; with a stride it is torch's error to raise)."""
    if padding == "valid":
        return 0, 0
    if padding == "same":
        if stride != (1, 1):
            return None
        spans = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return None if any(s % 2 for s in spans) else (spans[0] // 2, spans[1] // 2)
    return _pair(padding)


def conv2d_as_matmul(x: torch.Tensor, weight: torch.Tensor, bias=None, stride=1, padding=(0, 0), dilation=1) -> torch.Tensor:
    """`F.conv2d(x, weight, bias, stride, padding, dilation)` (groups=1, `padding` as per-side
    ints) as one matrix product over the input's windows. `x` is (N, C, H, W)."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), padding, _pair(dilation)
    n, c = x.shape[0], x.shape[1]
    out_ch, _, kh, kw = weight.shape
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    windows = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)  # (N, C, OH, OW, span_h, span_w): views
    if dh > 1 or dw > 1:
        windows = windows[..., ::dh, ::dw]
    oh, ow = windows.shape[2], windows.shape[3]
    rows = windows.permute(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)  # the one copy
    w = weight.reshape(out_ch, c * kh * kw).t()
    y = rows @ w if bias is None else torch.addmm(bias, rows, w)
    # contiguous NCHW: cuDNN's BatchNorm asks a channels-last tensor's layout, which vmap cannot answer
    return y.view(n, oh, ow, out_ch).permute(0, 3, 1, 2).contiguous()


class ConvAsMatmul(TorchFunctionMode):
    """Inside this mode, 2-D convolutions with groups=1 run as `conv2d_as_matmul`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.conv2d:
            a = {**dict(zip(_CONV2D_ARGS, args)), **kwargs}
            x, weight = a["input"], a["weight"]
            stride, dilation = _pair(a.get("stride", 1)), _pair(a.get("dilation", 1))
            padding = _padding(a.get("padding", 0), tuple(weight.shape[2:]), stride, dilation)
            if a.get("groups", 1) == 1 and padding is not None and x.dim() == 4:
                return conv2d_as_matmul(x, weight, a.get("bias"), stride, padding, dilation)
        return func(*args, **kwargs)
