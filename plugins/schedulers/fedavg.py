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
    out = {}
    for key in keys:
        ref = models[0][key]
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for m, n in zip(models, counts):
            if m.keys() != keys:
                raise ValueError(f"fedavg of models with different entries: {sorted(keys)} vs {sorted(m.keys())}")
            acc += (float(n) / total) * m[key].to(torch.float64)
        out[key] = acc.to(ref.dtype)
    return out
