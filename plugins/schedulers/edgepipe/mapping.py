"""EdgePipe's super-neuron-to-device mapping (Algorithm 2; notes section 2.7) and its baselines.

A mapping is a permutation `perm`: super neuron s runs on device perm[s]. Its score is the
element-wise sum of the Hadamard product the paper maximises,

    score(perm) = sum_{s,t} SNNet[s, t] * devNet[perm[s], perm[t]],

with SNNet the normalised super-neuron topology and devNet the (measured) PRR matrix: a
quadratic assignment problem. Methods:

- `ga`: the paper's "simple genetic algorithm", really a (1+2) hill climb: every generation it
  scores a random reordering of the best and its cyclic shift by one, and keeps the best of the
  three, ties preferring the random one, then the shift (neutral moves, as Algorithm 2 lines
  11-16). 1000 generations for N <= 6, 10000 beyond (the paper's defaults).
- `upper`: brute force over all N! permutations (the paper's upper bound).
- `random`: uniform random mappings; the paper's baseline is the mean over 5 trials.

Determinism (the notes warn that a chain and its reverse can tie and that the choice changes the
Vertical result): every method is a function of its seed; scores within `TIE_TOL` of each other
are ties (float sums in another order must not break them), and among tied best mappings the
lexicographically smallest permutation is returned. Super neurons of one group are "twins"
(identical SNNet rows and columns), so swapping their devices never changes the score; the GA
puts every candidate in canonical form (devices ascending within each twin class) before
comparing, so that it returns the same permutation as brute force whenever it finds an optimum.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

TIE_TOL = 1e-9
RANDOM_TRIALS = 5
UPPER_MAX_DEVICES = 10  # 10! = 3.6 M permutations, scored in chunks; beyond that brute force is out


def default_generations(n_devices: int) -> int:
    """The paper's generation counts: 1000 for up to 6 devices, 10000 beyond."""
    return 1000 if n_devices <= 6 else 10_000


@dataclass(frozen=True)
class Mapping:
    method: str
    perm: tuple[int, ...]  # super neuron s -> device perm[s]
    score: float
    evaluated: int  # candidate mappings scored


def _check(snnet: np.ndarray, dev_prr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s, d = np.asarray(snnet, dtype=float), np.asarray(dev_prr, dtype=float)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or s.shape != d.shape:
        raise ValueError(f"SNNet {s.shape} and the device PRR matrix {d.shape} must be the same square shape "
                         "(one super neuron per device)")
    return s, d


def score(snnet: np.ndarray, dev_prr: np.ndarray, perm) -> float:
    """The objective: sum(SNNet o devNet reordered by perm) (Algorithm 2's element-sum)."""
    s, d = _check(snnet, dev_prr)
    p = np.asarray(perm, dtype=np.intp)
    if sorted(p.tolist()) != list(range(len(s))):
        raise ValueError(f"not a permutation of 0..{len(s) - 1}: {list(perm)}")
    return float((s * d[np.ix_(p, p)]).sum())


def scores(snnet: np.ndarray, dev_prr: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """score() of a (B, N) batch of permutations at once."""
    s, d = _check(snnet, dev_prr)
    p = np.asarray(perms, dtype=np.intp)
    return (d[p[:, :, None], p[:, None, :]] * s).sum(axis=(1, 2))


def _better(a_score: float, a_perm: tuple, b_score: float, b_perm: tuple) -> bool:
    """Is (a) preferred to (b): higher beyond the tie tolerance, or tied and lexicographically smaller."""
    if a_score > b_score + TIE_TOL:
        return True
    return abs(a_score - b_score) <= TIE_TOL and a_perm < b_perm


def twin_classes(snnet: np.ndarray) -> list[list[int]]:
    """Classes of super neurons any two of which can swap devices without changing any score
    (the swap leaves SNNet unchanged); every pair inside a class is checked directly."""
    s = np.asarray(snnet, dtype=float)
    classes: list[list[int]] = []
    for i in range(len(s)):
        for c in classes:
            if all(_swap_invariant(s, i, j) for j in c):
                c.append(i)
                break
        else:
            classes.append([i])
    return classes


def _swap_invariant(s: np.ndarray, i: int, j: int) -> bool:
    p = np.arange(len(s))
    p[[i, j]] = p[[j, i]]
    return bool(np.array_equal(s[np.ix_(p, p)], s))


def canonical(perm, classes: list[list[int]]) -> tuple[int, ...]:
    """The representative of perm's twin orbit: devices sorted ascending within each class
    (the lexicographically smallest mapping of the orbit; same score)."""
    out = list(perm)
    for c in classes:
        for pos, dev in zip(c, sorted(out[i] for i in c)):
            out[pos] = dev
    return tuple(out)


def ga_mapping(snnet: np.ndarray, dev_prr: np.ndarray, generations: int | None = None,
               seed: int | np.random.Generator | None = 0) -> Mapping:
    """Algorithm 2. Starts from the identity (bestNet = devNet). The permutation composition
    best[rand] is the paper's reorder-nodes(bestNet, randOrder) (rows and columns together);
    best[[1..N-1, 0]] is its swipe. The returned mapping is the best visited (ties as above);
    the climb itself moves exactly as the paper's, neutral moves included."""
    s, d = _check(snnet, dev_prr)
    n = len(s)
    gens = default_generations(n) if generations is None else int(generations)
    rng = np.random.default_rng(seed)
    shift = np.r_[1:n, 0]
    twins = twin_classes(s)
    cur = np.arange(n)
    cur_hp = float((s * d).sum())
    best, best_hp = tuple(cur.tolist()), cur_hp
    for _ in range(gens):
        rand = cur[rng.permutation(n)]
        swipe = cur[shift]
        rand_hp = float((s * d[np.ix_(rand, rand)]).sum())
        swipe_hp = float((s * d[np.ix_(swipe, swipe)]).sum())
        m = max(rand_hp, swipe_hp, cur_hp)
        if rand_hp >= m - TIE_TOL:
            cur, cur_hp = rand, rand_hp
        elif swipe_hp >= m - TIE_TOL:
            cur, cur_hp = swipe, swipe_hp
        for cand, hp in ((rand, rand_hp), (swipe, swipe_hp)):
            if hp >= best_hp - TIE_TOL:
                t = canonical(cand.tolist(), twins)
                if _better(hp, t, best_hp, best):
                    best, best_hp = t, hp
    return Mapping("ga", best, best_hp, 1 + 2 * gens)


def upper_mapping(snnet: np.ndarray, dev_prr: np.ndarray, chunk: int = 40_320) -> Mapping:
    """Brute force: the best of all N! mappings; ties go to the lexicographically smallest
    (itertools order is lexicographic and the first index within the tolerance wins)."""
    s, d = _check(snnet, dev_prr)
    n = len(s)
    if n > UPPER_MAX_DEVICES:
        raise ValueError(f"brute force over {n}! mappings is out of reach (at most {UPPER_MAX_DEVICES} devices)")
    it = itertools.permutations(range(n))
    best, best_hp = None, -math.inf
    while True:
        block = np.array(list(itertools.islice(it, chunk)), dtype=np.intp).reshape(-1, n)
        if not len(block):
            break
        hp = scores(s, d, block)
        top = hp.max()
        if best is None or top > best_hp + TIE_TOL:
            i = int(np.flatnonzero(hp >= top - TIE_TOL)[0])
            best, best_hp = tuple(block[i].tolist()), float(hp[i])
    return Mapping("upper", best, best_hp, math.factorial(n))


def all_scores(snnet: np.ndarray, dev_prr: np.ndarray) -> np.ndarray:
    """The score of every mapping, in lexicographic permutation order (small N only)."""
    s, _ = _check(snnet, dev_prr)
    if len(s) > 8:
        raise ValueError("all_scores is for N <= 8; use upper_mapping for larger N")
    return scores(snnet, dev_prr, np.array(list(itertools.permutations(range(len(s)))), dtype=np.intp))


def random_mappings(snnet: np.ndarray, dev_prr: np.ndarray, trials: int = RANDOM_TRIALS,
                    seed: int | np.random.Generator | None = 0) -> list[Mapping]:
    """`trials` uniform random mappings (the paper's Random baseline averages 5)."""
    s, d = _check(snnet, dev_prr)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(trials):
        p = rng.permutation(len(s))
        out.append(Mapping("random", tuple(p.tolist()), float((s * d[np.ix_(p, p)]).sum()), 1))
    return out


def random_baseline_score(snnet: np.ndarray, dev_prr: np.ndarray, trials: int = RANDOM_TRIALS,
                          seed: int | np.random.Generator | None = 0) -> float:
    """The Random baseline as Fig. 8 reports it: the mean score over `trials` random mappings."""
    return float(np.mean([m.score for m in random_mappings(snnet, dev_prr, trials, seed)]))


def map_devices(method: str, snnet: np.ndarray, dev_prr: np.ndarray, *, seed: int = 0,
                generations: int | None = None) -> Mapping:
    """One mapping by name: `ga` (default planner), `upper`, or `random` (its first trial: a run
    needs one mapping; the 5-trial mean is `random_baseline_score`)."""
    if method == "ga":
        return ga_mapping(snnet, dev_prr, generations, seed)
    if method == "upper":
        return upper_mapping(snnet, dev_prr)
    if method == "random":
        return random_mappings(snnet, dev_prr, 1, seed)[0]
    raise ValueError(f"mapping method must be one of ga, upper, random; got {method!r}")


def device_prr_for_super_neurons(dev_prr: np.ndarray, perm) -> np.ndarray:
    """PRR between super neurons s -> t under a mapping: devNet[perm[s], perm[t]]."""
    p = np.asarray(perm, dtype=np.intp)
    return np.asarray(dev_prr, dtype=float)[np.ix_(p, p)]
