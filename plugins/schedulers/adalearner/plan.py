"""AdaLearner's planner (notes 2.3-2.8): how the global minibatch is split over n worker nodes,
what one iteration's communication costs with fp32 and with 1-bit error feedback by the paper's
formulas, and Algorithm 1 (corrected), which picks n, the slices and the architecture; and the
plan a run takes (`AdaLearnerPlan`: plan.json).

Pure functions over profiles: a caller gives each node's minibatch-to-time profile, the WLAN's
bandwidth and wake-up latency, the codec speeds and the model's gradient size. The scheduler puts
the chosen plan, and the estimate of every n it looked at, in plan.json.

Decisions (notes section 9):
- Nodes are ranked by capability, "favoring devices with higher computing capability": the
  minibatch they finish within the largest threshold (lookup table; ties by the next threshold
  down, and so on) or their rate (linear), then by name.
- A lookup-table split that overshoots the global minibatch takes the excess from the slowest
  chosen nodes first, leaving each at least 1; one that cannot reach it within the table's last
  threshold is infeasible (infinite time).
- The linear split (`W_i = C_i (T - a_i)`, the default of the notes, since the table is coarse)
  rounds by largest remainder so the slices sum to the minibatch.
- Algorithm 1's lines 4 and 7 cite Eq. 7 and Eq. 8 the wrong way round; here the 1-bit time is
  Eq. 8's and the fp32 time Eq. 7's. n = 1 is local training on the group owner: no communication.
- The paper's communication (`CommModel`), two readings. `eq4` (`scheduler.planner=paper`): Eq. 4
  as written, `(W_trans / B) N + sum_j D[j]`, with W_trans both directions (gradients up, weights
  or the 1-bit sum down: 2n messages, one after another) and D[j] the wake-up worker j's transfers
  pay per iteration; 1-bit adds Eq. 8's codec terms. `printed` (`planner=paper_printed`): Eq. 7
  and Eq. 8 as printed, one direction and one constant D, except that Eq. 8's `T_comm / Z` is
  taken as `n W / (B Z)`: the printed form divides D by Z too and then adds D again.
  Both add compute and communication; the FIFO overlap the roles run is the default planner's
  (plugins/schedulers/adalearner/fifo.py), and `schedule` takes either estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from framework.config.knobs import choices
from framework.specs import Data, absent_when_none
from plugins.schedulers.adalearner.schema import AdaLearnerConfig


@dataclass(frozen=True)
class Split:
    """The global minibatch over the chosen worker nodes, most capable first."""

    nodes: tuple[str, ...]
    sizes: tuple[int, ...]
    compute_s: float  # the slowest slice's estimated time (math.inf: infeasible)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.nodes, self.sizes))


def _ranked(capability: dict, n: int) -> list[str]:
    """The n most capable nodes (capabilities compare as numbers or as tuples), ties by name."""
    neg = lambda c: tuple(-x for x in c) if isinstance(c, tuple) else -c  # noqa: E731
    return sorted(capability, key=lambda node: (neg(capability[node]), node))[:n]


def largest_remainder(total: int, weights: list[float]) -> list[int]:
    """`total` split in proportion to `weights` into integers that sum to `total`: each share
    rounded down, the spares to the largest remainders (ties to the first)."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    sizes = [math.floor(e) for e in exact]
    for i in sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def lookup_split(total: int, n: int, table: dict[str, list[int]], thresholds_s: list[float]) -> Split:
    """Fig. 6: `table[node][j]` is the largest minibatch `node` finishes within `thresholds_s[j]`
    (both increasing in j). The n most capable nodes, at the first threshold where their
    minibatches reach `total`; the excess is taken from the slowest of them first."""
    sel = _ranked({node: tuple(reversed(caps)) for node, caps in table.items()}, n)  # ties at the last threshold: the next one down
    for j, t in enumerate(thresholds_s):
        caps = [int(table[node][j]) for node in sel]
        if sum(caps) >= total:
            excess = sum(caps) - total
            for i in reversed(range(len(sel))):  # the slowest (last ranked) first
                cut = max(0, min(excess, caps[i] - 1))
                caps[i] -= cut
                excess -= cut
            return Split(tuple(sel), tuple(caps), float(t))
    return Split(tuple(sel), (), math.inf)


def linear_split(total: int, n: int, rate: dict[str, float], overhead_s: dict[str, float] | None = None) -> Split:
    """`time_i(b) = a_i + b / C_i` (`rate` C_i in samples per second, `overhead_s` a_i): the n
    fastest nodes finish together at `T = (total + sum C_i a_i) / sum C_i` with `W_i = C_i (T - a_i)`,
    rounded by largest remainder to integers >= 1 that sum to `total`."""
    a = overhead_s or {}
    sel = _ranked(rate, n)
    c = [float(rate[node]) for node in sel]
    oh = [float(a.get(node, 0.0)) for node in sel]
    t = (total + sum(ci * ai for ci, ai in zip(c, oh))) / sum(c)
    exact = [ci * (t - ai) for ci, ai in zip(c, oh)]
    if total < n or min(exact) < 1.0:
        return Split(tuple(sel), (), math.inf)  # a node would get less than one sample
    sizes = largest_remainder(total, exact)
    return Split(tuple(sel), tuple(sizes), max(ai + s / ci for ai, s, ci in zip(oh, sizes, c)))


@dataclass(frozen=True)
class CommModel:
    """One iteration's communication on the group owner's WLAN by the paper's formulas (notes 2.3,
    2.7): `eq4` (Eq. 4 as written) or `printed` (Eq. 7 and 8 as printed)."""

    bandwidth_Bps: float  # B, bytes per second
    wake_s: float  # eq4: D[j], one worker's wake-up per iteration; printed: Eq. 7's constant D
    quantize_Bps: float = math.inf  # S_q, S_uq: the codec's speed in bytes of fp32 input per second
    unquantize_Bps: float = math.inf
    Z: float = 32.0  # the 1-bit compression factor
    mode: str = "eq4"

    def __post_init__(self):
        if self.mode not in COMM_MODES:
            raise ValueError(f"mode {self.mode!r}; choices: {', '.join(COMM_MODES)}")

    def fp32_s(self, n: int, nbytes: float) -> float:
        """Eq. 7 (gradients up, weights down)."""
        if self.mode == "printed":
            return n * nbytes / self.bandwidth_Bps + self.wake_s
        return 2 * n * nbytes / self.bandwidth_Bps + n * self.wake_s

    def codec_s(self, n: int, nbytes: float) -> float:
        """Eq. 8's codec terms: one quantization on the nodes (in parallel) and one at the group
        owner; n decodes at the group owner, one by one, and one on the nodes (in parallel)."""
        return 2 * nbytes / self.quantize_Bps + (n + 1) * nbytes / self.unquantize_Bps

    def onebit_s(self, n: int, nbytes: float, wire_bytes: float | None = None) -> float:
        """Eq. 8. `wire_bytes`: the 1-bit message's real size (bits and per-group scalars), where
        known; else `nbytes / Z`."""
        sent = nbytes / self.Z if wire_bytes is None else wire_bytes
        if self.mode == "printed":
            return self.codec_s(n, nbytes) + n * sent / self.bandwidth_Bps + self.wake_s
        return self.codec_s(n, nbytes) + 2 * n * sent / self.bandwidth_Bps + n * self.wake_s


COMM_MODES = ("eq4", "printed")


@dataclass(frozen=True)
class Estimate:
    n: int
    split: Split
    scheme: str  # "local", "fp32" or "onebit"
    comm_s: float  # what the estimate adds to the slowest slice's compute
    total_s: float  # one iteration

    def tried(self) -> Tried:
        return Tried(self.n, self.split.nodes, self.split.sizes, self.scheme, self.split.compute_s, self.comm_s, self.total_s)


@dataclass
class Schedule:
    """Algorithm 1's answer: the best estimate and every n it looked at, in order."""

    best: Estimate
    tried: list[Estimate] = field(default_factory=list)


ARCHITECTURES = choices(AdaLearnerConfig, "architecture")


def check_architecture(architecture: str) -> None:
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture {architecture!r}; choices: {', '.join(ARCHITECTURES)}")


def paper_estimate(comm: CommModel, nbytes: float, *, onebit_bytes: float | None = None, architecture: str = "auto"):
    """Eq. 4 with Eq. 7-9: `estimate(n, split)` for `schedule`. `nbytes` is the fp32 gradient (and
    weight) message, `onebit_bytes` the 1-bit one; `architecture` is `auto` (Eq. 9: 1-bit where
    its Eq. 8 time is below Eq. 7's), `fp32` or `onebit`."""
    check_architecture(architecture)

    def estimate(n: int, sp: Split) -> Estimate:
        fp, ob = comm.fp32_s(n, nbytes), comm.onebit_s(n, nbytes, onebit_bytes)
        use_onebit = architecture == "onebit" or (architecture == "auto" and ob < fp)  # Eq. 9
        c = ob if use_onebit else fp
        return Estimate(n, sp, "onebit" if use_onebit else "fp32", c, sp.compute_s + c)

    return estimate


def schedule(split, max_n: int, estimate, *, early_stop: bool = True, local=None) -> Schedule:
    """Algorithm 1 (corrected). `split(n)` gives the n-node Split, `estimate(n, split)` its
    Estimate (`paper_estimate`, or the scheduler's FIFO one); `local(split)`, where given, is
    n = 1: the group owner training alone. With `early_stop` (the paper's) the search ends at the
    first n whose estimate is worse than the best so far."""
    best, tried = None, []
    for n in range(1, max_n + 1):
        sp = split(n)
        est = local(sp) if (n == 1 and local is not None) else estimate(n, sp)
        tried.append(est)
        if best is not None and est.total_s > best.total_s and early_stop:
            break
        if best is None or est.total_s < best.total_s:
            best = est
    return Schedule(best, tried)


def worker_slices(samples: tuple[int, ...], batch: int) -> list[tuple[int, int]]:
    """Each worker's [start, stop) of a global minibatch of `batch` samples, the plan's `samples`
    per worker (a short last minibatch is split in the same proportions)."""
    sizes = list(samples)
    if batch != sum(sizes):
        sizes = largest_remainder(batch, sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(a, a + s) for a, s in zip(starts, sizes)]


# ---- the plan a run takes (plan.json) ---------------------------------------------------------------


@dataclass(frozen=True)
class Tried(Data):
    """One n Algorithm 1 looked at: its split, scheme and estimate."""

    n: int
    nodes: tuple[str, ...]
    sizes: tuple[int, ...]
    scheme: str
    compute_s: float
    comm_s: float
    total_s: float


@dataclass(frozen=True)
class WorkerShare(Data):
    """A chosen worker node: its device and its samples of every global minibatch."""

    device: str
    samples: int


@dataclass(frozen=True)
class LinkFacts(Data):
    """Eq. 4's link inputs: B and D[j] (one worker's wake-ups and latencies per iteration)."""

    bandwidth_Bps: float
    wake_per_worker_s: float
    shared_medium: bool


@dataclass(frozen=True)
class CodecSeconds(Data):
    """Modelled seconds of one encode and one decode of a whole gradient."""

    encode: float
    decode: float


@dataclass(frozen=True)
class LookupTable(Data):
    """Fig. 6's table: per device, the largest minibatch it finishes within each threshold."""

    thresholds_s: tuple[float, ...]
    batches: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class AdaLearnerPlan(Data):
    """Algorithm 1's choice for a run and what it estimated (plan.json; `summary.json` `plan`
    without the lookup table)."""

    scheduler: str
    planner: str  # fifo | paper | paper_printed
    scheme: str  # local (the GO alone), fp32 or onebit
    n: int
    workers: tuple[WorkerShare, ...]  # in FIFO tie order; none when local
    estimate_s: float
    compute_s: float
    comm_s: float
    go_update_s: float
    predicted_iteration_s: float
    predicted_epoch_s: float
    local_iteration_s: float
    tried: tuple[Tried, ...]
    fp32_bytes: int
    onebit_bytes: int | None  # None: the compressor codes no gradients
    downlink_bytes: dict[str, int]  # per scheme: the answer's bytes
    link: LinkFacts
    codec_s: CodecSeconds
    partition: str
    architecture: str
    lookup_table: LookupTable | None = absent_when_none()  # partition=lookup_table only
