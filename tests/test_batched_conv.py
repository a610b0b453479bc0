"""Convolutions as batched matrix products (framework/replicas/conv.py): the same numbers as
torch's convolution, forwards and gradients, alone and under vmap over stacked replicas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from framework.replicas import conv as batched_conv
from framework.replicas.conv import ConvAsMatmul, conv2d_as_matmul

CASES = [  # (kernel, stride, padding, dilation, bias)
    ((3, 3), 1, 1, 1, True),
    ((3, 3), 2, 0, 1, False),
    ((3, 2), (2, 1), (1, 0), 1, True),
    ((3, 3), 1, 2, 2, True),
    ((5, 5), 1, "same", 1, True),
    ((3, 3), 1, "valid", (1, 2), False),
    ((3, 3), (2,), (1,), (1,), True),  # one-element tuples: torch repeats them
]


def _inputs(kernel, bias, groups=1, replicas=None):
    g = torch.Generator().manual_seed(0)
    lead = () if replicas is None else (replicas,)
    x = torch.randn(*lead, 2, 4, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(*lead, 6, 4 // groups, *kernel, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(*lead, 6, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    return x, w, b


@pytest.mark.parametrize("kernel,stride,padding,dilation,bias", CASES)
def test_values_and_gradients_equal_torchs_convolution(kernel, stride, padding, dilation, bias):
    x, w, b = _inputs(kernel, bias)
    with ConvAsMatmul():
        ours = F.conv2d(x, w, b, stride, padding, dilation)
    ref = F.conv2d(x, w, b, stride, padding, dilation)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    assert ours.is_contiguous()
    seed = torch.randn_like(ref)
    leaves = [t for t in (x, w, b) if t is not None]
    for got, want in zip(torch.autograd.grad(ours, leaves, seed), torch.autograd.grad(ref, leaves, seed)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_under_vmap_each_replica_convolves_with_its_own_weights():
    x, w, b = _inputs((3, 3), True, replicas=5)

    def conv(xi, wi, bi):
        return F.conv2d(xi, wi, bi, 1, 1)

    with ConvAsMatmul():
        ours = torch.func.vmap(conv)(x, w, b)
    ref = torch.stack([F.conv2d(x[i], w[i], b[i], 1, 1) for i in range(5)])
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    seed = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(ours, (x, w, b), seed), torch.autograd.grad(ref, (x, w, b), seed)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("groups,kernel,padding", [(2, (3, 3), 1), (1, (2, 2), "same")], ids=["grouped", "same-even-kernel"])
def test_what_it_does_not_cover_goes_to_torch(monkeypatch, groups, kernel, padding):
    calls = []
    monkeypatch.setattr(batched_conv, "conv2d_as_matmul", lambda *a, **kw: calls.append(1) or conv2d_as_matmul(*a, **kw))
    x, w, b = _inputs(kernel, True, groups=groups)
    with ConvAsMatmul():
        ours = F.conv2d(x, w, b, 1, padding, 1, groups)
    assert not calls
    assert torch.equal(ours, F.conv2d(x, w, b, 1, padding, 1, groups))


def test_same_padding_with_a_stride_is_torchs_error():
    x, w, b = _inputs((3, 3), True)
    with ConvAsMatmul(), pytest.raises(RuntimeError, match="same"):
        F.conv2d(x, w, b, 2, "same")


def test_other_operators_pass_through():
    x = torch.randn(2, 3, 10, dtype=torch.float64)
    w = torch.randn(4, 3, 3, dtype=torch.float64)
    with ConvAsMatmul():
        y = F.conv1d(x, w, padding=1)
        z = F.relu(y)
    assert torch.equal(y, F.conv1d(x, w, padding=1)) and torch.equal(z, F.relu(y))
