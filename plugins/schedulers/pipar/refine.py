"""PiPar's (P, N) selection refined by a few timing-only trial iterations (`select=refine`).

Why. The closed form (`pipar.plan.select_closed_form`: Eq. 14 + the Table I estimate) has two
separate weaknesses, and the PiPar study (experiments/pipar_study.py, part 2, and
experiments/pipar_refine_check.py) shows both:

* it looks at one N per P. On the analytic device model the Table I estimate *is* the simulated
  iteration (tests/test_pipar.py checks they are equal), yet auto's epoch is up to 1.3x the
  optimum (score 0.77): Eq. 14 only fills the device's idle gap, while the epoch keeps
  shrinking past that N (the pipeline's fill and drain are amortised over more micro-batches),
  and the epoch's iteration count floor(|D_k| / (B' N)) rewards an N just below a multiple
  (at |D_k| = 1250, N = 97 micro-batches of 1 run the same 12 iterations as N = 100, each
  shorter). The optimum sits at N = 94..97 in all 9 analytic cases; auto picks 4..33.
* it scales the batch-B profile linearly to a micro-batch of b (Eq. 5-10, the notes' section
  2.4: "the linear 1/N scaling ignores small-batch inefficiency"). On host-profiled curves the
  estimate is off by a factor that depends on b: trial / estimate runs from 0.65 to 8.4 across
  the study's cases (1 at b = B, where the profile was measured), so the estimated
  optimum (b = 1 nearly everywhere) is often the worst real choice (MobileNetV3: score 0.22),
  and the real epoch-vs-N curve need not be unimodal (VGG-5/MNIST/WiFi on this host: a local
  optimum at N = 12 and the global one at N = 94, with N = 50 40% worse between them).

The algorithm (a surrogate-guided search: the estimate, corrected by the trials; every trial is
one timing-only iteration, priced at its own virtual seconds):

1. **Domain.** N ranges over 1..n_max (default B, the exhaustive search's range) less the
   dominated values: N is dropped when a smaller N has the same micro-batch B' = B // N and
   the same iterations per epoch floor(|D_k| / (B' N)) (one more micro-batch of the same size
   never shortens an iteration). For B = 100 that leaves 46-50 of the 100 values. `fixed_n`
   pins N (SFL: N = 1). P >= Q (FL) has N = 1 and is priced by the estimate alone: that is the
   profiled iteration itself, and there is no split iteration to time.
2. **Shortlist P** (free): the Table I estimate of every (P, N) in the domain, epoch =
   estimate x iterations (the closed form's N(P) is among them, up to the dominance above).
   The `top_p` P with the shortest estimated epoch go on (default 3; in the study the best P
   is always among the estimate's first two).
3. **Design.** The first `design_p` (default 2) shortlisted P get `design` trials each
   (default 4): micro-batch sizes spread evenly in log b over [1, B) (b = 1, 3, 10, 33 for
   B = 100; b = B, i.e. N = 1, is the slowest and dearest trial, and the profile already
   measured it), each at the N of that size with the best estimated epoch. The other
   shortlisted P get one probe each, at the N step 4's borrowed correction predicts best.
4. **Correct.** Per P, c_P(b) = trial / estimate at the trialled micro-batch sizes (the mean
   if several); the prediction of an untried (P, N) is estimate x c_P(B // N) x iterations.
   Between two trialled sizes c_P is the smaller of the two (optimism: the interval might hold
   something better, so it is not ruled out until a trial says so); beyond them, the nearest.
   A P with trials at fewer than two sizes borrows the shape of c from the nearest designed P,
   scaled to its own trials' level (the small-batch misfit is mostly the device's compute,
   shared by neighbouring split points; the level is not). Within one size the correction is
   shared, so the estimate, exact in its iteration count and pipeline shape, ranks the N of
   that size (N = 97 among B' = 1's 51..97 above).
5. **Refine.** Trial the untried candidate with the best prediction while it promises to beat
   the best trial by more than `rel_tol` (default 1%); each trial sharpens c_P where it
   matters. When nothing promises more, **bracket** the incumbent: trial the neighbouring
   micro-batch sizes on both sides (same P) that have no trial yet, and go back to 5 (a better
   neighbour moves the incumbent). Stop when both neighbours are tried and nothing is
   predicted to win, or after `max_trials` trials (default 2 x top_p x design = 24).
6. The fastest trialled epoch wins (ties: smaller P, then N), as `exhaustive` decides.

Linear interpolation of c_P in log b instead of step 4's optimism (`optimistic=False`) was
tried first: it misses optima where c_P changes sharply between two design sizes (scores
0.973 on VGG-5/CIFAR-10/4G profiled and 0.961 on the analytic model with a 2 ms per-call
overhead, 0.956 without the bracket step); with optimism every case checked (the study's 18 and
7 others: ResNet-18, LeNet, MobileNetV2, B = 32..128, other slowdowns) reaches its exact
optimum, for a few more trials.

Giving every shortlisted P the whole design (`design_p=3`) finds the same optima at ~30% more
cost; `design_p=1` costs ~25% less and still scored >= 0.998 everywhere checked.

Cost. The profiling iteration auto pays (the estimate needs it), design_p x design + (top_p -
design_p) design trials (9 by default), and 1-9 refinement and bracket trials: 10-18
iterations in all, most near the optimum, where iterations are short. Exhaustive runs
|P| x B trials (400 for VGG-5, 1400 for MobileNetV3-Small at B = 100). On the study's 18 cases
(9 per device model) refine finds the exhaustive optimum in every case at 0.2-3.3% of
exhaustive's cost; auto's score is 0.71-0.97 there (experiments/pipar_refine_check.py). Against
auto, the extra search costs 0.7-3.3 of auto's epochs, which the faster epochs repay after
3-52 epochs (median 17): worth it for a run of tens of epochs, not for a short one.

The function is pure: `trial(P, N)` is injected (the planner passes
`lambda P, N: trial_iteration(planner, k, P, N)`), and it only reads `pair` for the estimate.
Its cost is `trial_cost(trials)` (a P >= Q entry is in `trials` but ran no trial).
"""

from __future__ import annotations

import bisect
import math

from plugins.schedulers.pipar import plan as plan_mod
from plugins.schedulers.pipar.plan import efficient_n  # noqa: F401  (the domain of N, shared with select=auto)


class _Correction:
    """c(b) = trial / estimate of one split point, as a function of the micro-batch size b: the
    mean of the trials at b; between two trialled sizes, the smaller of theirs (optimistic:
    a size between two measured ones is assumed no worse than the better of them, so an
    interval that might hold a better candidate gets a trial); beyond them, the nearest one."""

    def __init__(self, optimistic: bool = True):
        self.by_b: dict[int, list[float]] = {}
        self.optimistic = optimistic

    def add(self, b: int, ratio: float) -> None:
        self.by_b.setdefault(b, []).append(ratio)

    def __call__(self, b: int) -> float:
        if not self.by_b:
            return 1.0
        xs = sorted(self.by_b)
        ys = [sum(self.by_b[x]) / len(self.by_b[x]) for x in xs]
        if b <= xs[0]:
            return ys[0]
        if b >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_left(xs, b)
        if xs[i] == b:
            return ys[i]
        if self.optimistic:
            return min(ys[i - 1], ys[i])
        w = (math.log(b) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
        return ys[i - 1] + w * (ys[i] - ys[i - 1])


def refine(
    pair: plan_mod.PairModel,
    batch: int,
    n_samples: int,
    p_range,
    trial,
    *,
    fixed_n: int | None = None,
    clamp: bool = True,
    estimator: str = "table1",
    top_p: int = 3,
    design: int = 4,
    rel_tol: float = 0.01,
    max_trials: int | None = None,
    n_max: int | None = None,
    optimistic: bool = True,
    design_p: int = 2,
) -> tuple[dict, list[dict]]:
    """Choose (P, N) for one device: the closed form's estimate, then timing-only trials (the
    module docstring has the algorithm). `trial(P, N)` returns the seconds of one iteration.

    `top_p`: split points that get trials; `design_p`: how many of them get `design` trials
    before the refinement (the others one probe each); `rel_tol`: the predicted gain below which the refinement stops; `max_trials`:
    a hard cap on the trials (default 2 x top_p x design); `n_max`: the largest N searched
    (default B); `optimistic`: the correction between trialled sizes (step 4; False =
    linear in log b); `clamp` and `estimator` as in `select_closed_form` (clamp only shapes the
    closed form's N(P), reported with P as `closed_form_P`/`closed_form_N` in the best).

    Returns (best, trials) in the format of `pipar.search.exhaustive`: dicts with P, N,
    micro_batch, iterations, iter_s and epoch_s (= iter_s x iterations), plus `estimate_iter_s`
    and `phase` (design, refine, bracket; or profile for a P >= Q candidate, priced by the
    estimate without a trial). The trials' cost is `trial_cost(trials)`."""
    p_list = list(p_range)
    if not p_list:
        raise ValueError("no split point to choose from")
    if fixed_n is not None and not 1 <= fixed_n <= batch:
        raise ValueError(f"fixed_n={fixed_n} is outside 1..{batch}")
    cap = max_trials if max_trials is not None else 2 * max(1, top_p) * max(1, design)
    if cap < 1:
        raise ValueError(f"max_trials must be >= 1, got {max_trials}")
    dom = [fixed_n] if fixed_n is not None else efficient_n(batch, n_samples, n_max)

    def iterations(N):
        return max(1, n_samples // (max(1, batch // N) * N))

    # 1-2. the Table I estimate of every candidate (free), the shortlist of P; P >= Q has N = 1
    local_n = fixed_n if fixed_n is not None else 1
    est: dict[tuple[int, int], float] = {}
    for P in p_list:
        for N in [local_n] if P >= pair.Q else dom:
            est[(P, N)] = plan_mod.candidate(pair, P, N, batch, n_samples, estimator).iter_s
    closed, _ = plan_mod.select_closed_form(pair, batch, n_samples, p_list, fixed_n=fixed_n, clamp=clamp, estimator=estimator)
    best_est: dict[int, float] = {}
    for (P, N), it_s in est.items():
        best_est[P] = min(best_est.get(P, math.inf), it_s * iterations(N))
    ranked = sorted(p_list, key=lambda P: (best_est[P], P))[: max(1, top_p)]
    split = [P for P in ranked if P < pair.Q]

    trials: list[dict] = []
    done: set[tuple[int, int]] = set()
    corr = {P: _Correction(optimistic) for P in split}

    def record(P, N, it_s, phase):
        b = max(1, batch // N)
        t = {"P": P, "N": N, "micro_batch": b, "iterations": iterations(N), "iter_s": it_s, "epoch_s": it_s * iterations(N), "estimate_iter_s": est[(P, N)], "phase": phase}
        trials.append(t)
        done.add((P, N))
        if P in corr and est[(P, N)] > 0:
            corr[P].add(b, it_s / est[(P, N)])

    def run(P, N, phase):
        record(P, N, float(trial(P, N)), phase)

    def budget_left():
        return sum(t["phase"] != "profile" for t in trials) < cap

    full = split[: max(1, design_p)]  # the split points that get the whole design

    def correction(P, b):
        """c_P(b); a P with fewer than two trialled sizes borrows the shape of the nearest
        fully designed P, scaled to the level of its own trials."""
        if P in full or len(corr[P].by_b) >= 2:
            return corr[P](b)
        ref = corr[min(full, key=lambda q: (abs(q - P), q))]
        level = [sum(v) / len(v) / ref(bb) for bb, v in corr[P].by_b.items()]
        return ref(b) * (sum(level) / len(level) if level else 1.0)

    def predicted(P, N):
        return est[(P, N)] * correction(P, max(1, batch // N)) * iterations(N)

    def incumbent():
        return min(trials, key=lambda t: (t["epoch_s"], t["P"], t["N"]))

    for P in ranked:  # P >= Q: the whole model on the device, the profiled iteration itself
        if P >= pair.Q:
            record(P, local_n, est[(P, local_n)], "profile")

    # 3. design: micro-batch sizes spread evenly in log b over [1, B), the best estimated N of each
    by_b: dict[int, list[int]] = {}
    for N in dom:
        by_b.setdefault(max(1, batch // N), []).append(N)
    sizes = sorted(by_b)
    below_b = [s for s in sizes if s < batch] or sizes
    picks: list[int] = []
    for i in range(max(1, design)):
        target = math.log(batch) * i / max(1, design)
        b = min(below_b, key=lambda s: (abs(math.log(s) - target), s))
        if b not in picks:
            picks.append(b)
    for P in full:
        for b in picks:
            N = min(by_b[b], key=lambda n: (est[(P, n)] * iterations(n), n))
            if (P, N) not in done and budget_left():
                run(P, N, "design")
    for P in split[len(full):]:  # the others: one probe where the borrowed correction points
        N = min((n for n in dom if (P, n) not in done), key=lambda n: (predicted(P, n), n), default=None)
        if N is not None and budget_left():
            run(P, N, "design")

    # 4-5. correct and refine: trial the best prediction while one promises to beat the best
    # trial by rel_tol; then bracket the incumbent by its neighbouring micro-batch sizes
    while split and budget_left():
        best = incumbent()
        cands = [(predicted(P, N), P, N) for P in split for N in dom if (P, N) not in done]
        if cands and min(cands)[0] < best["epoch_s"] * (1.0 - rel_tol):
            _, P, N = min(cands)
            run(P, N, "refine")
            continue
        if best["phase"] == "profile":
            break
        i = sizes.index(best["micro_batch"])
        todo = [min(by_b[sizes[j]], key=lambda n: (predicted(best["P"], n), n)) for j in (i - 1, i + 1) if 0 <= j < len(sizes) and not any((best["P"], n) in done for n in by_b[sizes[j]])]
        if not todo:
            break
        for N in todo:
            if budget_left():
                run(best["P"], N, "bracket")

    out = dict(incumbent())
    out["closed_form_P"], out["closed_form_N"] = closed.P, closed.N
    return out, trials


def trial_cost(trials: list[dict]) -> float:
    """Virtual seconds the trials cost, as `exhaustive` counts its own: the sum of their iter_s
    (the P >= Q candidate, priced by the profile, costs none)."""
    return sum(t["iter_s"] for t in trials if t.get("phase") != "profile")
