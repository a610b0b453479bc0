"""EdgePipe's lossy test passes (notes 2.10, 6.2 item 4): inference runs the same lossy forward
as training. Per test pass, every forward and output-sharing message of the ownership model is
drawn once (Bernoulli with its link's true PRR; one draw per (link, layer) for the whole test set,
the notes' default that gives Vertical its "binary" accuracy); a missing slice is zero. Each output
holder predicts from its own view of the logits; a pass's accuracy is the mean over the output
holders (the notes' default for item 4 of section 8).

The first dense layer's inputs are the test images themselves, the same in every pass: its
partial products (one per input slice a holder may or may not receive) are computed once per
test and summed per pass, which makes a pass about three times cheaper than a full forward
(the study's accuracy-over-time curves run thousands of passes)."""

from __future__ import annotations

import numpy as np
import torch

from plugins.schedulers.edgepipe.partition import Partition, messages


@torch.no_grad()
def first_layer_parts(p: Partition, layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor) -> dict[tuple[int, int], torch.Tensor]:
    """{(s, a): x[:, slice of a] @ W_2[chunk of s, slice of a]^T} for every holder s of layer 2 and
    a of layer 1: layer 2's pre-activation is the sum of those its holder received."""
    x = x.reshape(len(x), -1)
    W = layers[0][0]
    return {(s, a): x[:, plo:phi] @ W[lo:hi, plo:phi].T for s, lo, hi in p.holders(2) for a, plo, phi in p.holders(1)}


@torch.no_grad()
def lossy_logits(p: Partition, layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor, received, first=None) -> dict[int, torch.Tensor]:
    """Each output holder's logits for inputs `x`. `layers[l - 2]` = (W_l, b_l) whole (torch
    layout, out x in); `received(kind, src, dst, layer)` says whether that message arrived;
    `first`: first_layer_parts(p, layers, x), when several passes share them."""
    x = x.reshape(len(x), -1)
    first = first_layer_parts(p, layers, x) if first is None else first
    act = {}
    for l in range(2, p.L + 1):
        W, b = layers[l - 2]
        nxt = {}
        for s, lo, hi in p.holders(l):
            if l == 2:
                z = b[lo:hi].expand(len(x), hi - lo)
                for a, _, _ in p.holders(1):
                    if a == s or received("fw", a, s, 1):
                        z = z + first[(s, a)]
            else:
                prev = torch.zeros((len(x), p.sizes[l - 2]), dtype=x.dtype, device=x.device)
                for a, plo, phi in p.holders(l - 1):
                    if a == s or received("fw", a, s, l - 1):
                        prev[:, plo:phi] = act[a]
                z = prev @ W[lo:hi].T + b[lo:hi]
            nxt[s] = z if l == p.L else torch.relu(z)
        act = nxt
    out = {}
    for s, _, _ in p.holders(p.L):
        logits = torch.zeros((len(x), p.sizes[-1]), dtype=x.dtype, device=x.device)
        for a, plo, phi in p.holders(p.L):
            if a == s or received("share", a, s, p.L):
                logits[:, plo:phi] = act[a]
        out[s] = logits
    return out


def lossy_test(p: Partition, layers, x: torch.Tensor, y: torch.Tensor, sn_prr: np.ndarray, passes: int, seed=0) -> dict:
    """`passes` lossy test passes over (x, y); `sn_prr[s, t]` = true PRR from super neuron s's
    device to t's; `seed`: an int or a sequence of ints (numpy's SeedSequence entropy). Returns
    the accuracies and their summary (mean, std, min, fraction < 30 %)."""
    rng = np.random.default_rng(seed)
    keys = sorted({(m.kind, m.src, m.dst, m.src_layer) for m in messages(p) if m.kind in ("fw", "share")})
    first = first_layer_parts(p, layers, x) if passes else None
    accs = []
    for _ in range(passes):
        draw = {k: bool(rng.random() < sn_prr[k[1], k[2]]) for k in keys}
        views = lossy_logits(p, layers, x, lambda kind, a, b, l: draw[(kind, a, b, l)], first)
        accs.append(float(np.mean([float((v.argmax(1) == y).double().mean()) for v in views.values()])))
    a = np.array(accs)
    return {"passes": passes, "seed": seed if isinstance(seed, int) else list(seed), "acc": accs, "mean": float(a.mean()) if passes else None, "std": float(a.std()) if passes else None,
            "min": float(a.min()) if passes else None, "frac_below_0.3": float((a < 0.3).mean()) if passes else None}
