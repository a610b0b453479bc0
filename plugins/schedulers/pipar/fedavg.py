"""FedAvg (McMahan et al. 2017; PiPar Eq. 3): the weighted mean of models, a pure function.

    global = fedavg([w_1, ..., w_K], [n_1, ..., n_K])  =  sum_k n_k / sum(n) * w_k

over models given as dicts of tensors with the same keys and shapes (flat parameter vectors,
state dicts, anything), weighted by the samples each trained on. The sum runs in float64 and the
result comes back in each entry's dtype, so the order of the K models changes nothing beyond
float64 rounding. FL, SFL, PiPar and AdaLearner's parameter averaging all use it.
"""

from __future__ import annotations

import torch


def fedavg(models: list[dict[str, torch.Tensor]], counts: list[float]) -> dict[str, torch.Tensor]:
    """The sample-weighted mean of `models`. Raises ValueError on no models, mismatched keys or
    no samples at all (the caller decides what an empty round means)."""
    if not models:
        raise ValueError("fedavg of no models")
    if len(models) != len(counts):
        raise ValueError(f"{len(models)} models but {len(counts)} sample counts")
    total = float(sum(counts))
    if not total > 0:
        raise ValueError(f"fedavg needs a positive sample count, got {counts}")
    keys = models[0].keys()
    for m in models:
        if m.keys() != keys:
            raise ValueError(f"fedavg of models with different entries: {sorted(keys)} vs {sorted(m.keys())}")
    weights = [float(n) / total for n in counts]
    out = {}
    for key in keys:
        ref = models[0][key]
        # the K models' entries as one float64 tensor and their weighted terms by one multi-tensor
        # multiply (on a GPU: a few launches, not 2K), then summed one by one in the models'
        # order: the same float64 operations, in the same order, as term by term
        parts = [m[key] for m in models]
        if all(t.dtype == ref.dtype for t in parts):
            wide = list(torch.stack(parts).to(torch.float64).unbind(0))
        else:  # each converted alone: stacking would first promote them to a common dtype
            wide = [t.to(torch.float64) for t in parts]
        terms = torch._foreach_mul(wide, weights)
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for t in terms:
            acc += t
        out[key] = acc.to(ref.dtype)
    return out
