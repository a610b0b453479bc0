"""PiPar's (P, N) selection, per device: the paper's (Zhang et al., Section III-C) and ours.

`select=paper` is the paper's method, in three phases:

1. **Profile** one iteration of the complete model at batch B on the device (units 1..Q') and
   on the server (units 1..Q): per-unit forward/backward times. On the virtual clock the
   "measurement" is the framework's predictor (`predictor=oracle` reads the device model, so
   profiling costs virtual time but no noise).
2. **Stage times** of one micro-batch (Eq. 5-10): compute scales linearly with the batch, so a
   micro-batch of B' samples costs t(B) x B'/B (= t(B)/N when N divides B). Transfers are
   priced with the *real packet* of B' samples (activation, labels and header, after the
   compressor), which the wire format fixes without measuring; the paper's v/(w N) is the
   same up to the header.
3. **Shortlist and choose**: for each P in 1..Q', the closed form N(P) (Eq. 14, with the
   server forward summed over P+1..Q, the notes' correction), clamped to min(B/2, 100) and
   snapped to N = B // (B // N) as the authors' code does; the iteration time of each
   candidate is the longest path through the stage DAG of Table I (with the notes'
   correction next(f^s_n) = b^s_n), and the candidate with the shortest *epoch*
   (iteration x floor(|D_k| / (B' N))) wins.

`dag_makespan(..., estimator="code_legacy")` is the authors' code's DAG (d_n after b^s_{n-1},
no f^c_N -> b^c_1 edge), kept for comparison.

`select=auto` (the default, `select_search`) accounts for what the paper's estimate leaves out
and the simulator models, so that its predicted epoch is the one the run then takes:
- **the shared server**: the server trains one replica per device on its `cores`, so with K
  replicas at work each server-side stage takes max(1, K / cores) times as long as alone
  (`server_share`; exact for identical devices, which stay in step under processor sharing);
- **each micro-batch's own cost**: stage times come from the device models at the micro-batch's
  size, not as B'/B of the batch (a small batch uses a processor worse: `call_overhead_s`);
- **every N**, not Eq. 14's one per P: each (P, N) is priced on the Table I DAG, which is cheap;
- **the epoch's end**: the device part's upload, FedAvg and the global model's download
  (`Planner.epoch_end_s`), which the paper counts as extra.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from framework.cluster import Work
from framework.config.knobs import choices
from plugins.schedulers.pipar.schema import CollabConfig

ESTIMATORS = choices(CollabConfig, "estimator")  # the DAGs table1_dag builds


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one micro-batch's stages (Table I): device forward/backward (fc, bc), server
    forward/backward (fs, bs), upload/download serialisation (u, d); plus one-way latencies and
    the two optimizer steps that close an iteration."""

    fc: float
    bc: float
    fs: float
    bs: float
    u: float
    d: float
    lat_u: float = 0.0
    lat_d: float = 0.0
    step_c: float = 0.0
    step_s: float = 0.0

    def total(self) -> float:
        """The six stage times (+ latencies): one micro-batch with no overlap at all."""
        return self.fc + self.u + self.lat_u + self.fs + self.bs + self.d + self.lat_d + self.bc


def table1_dag(n_mb: int, estimator: str = "table1") -> tuple[list[tuple[str, int]], dict]:
    """The stage DAG of one iteration with N micro-batches: (topological order, prev sets).

    Stages are (kind, n) with kind in fc, u, fs, bs, d, bc. Table I (corrected):
    f^c_n <- f^c_{n-1};  u_n <- u_{n-1}, f^c_n;  f^s_n <- u_n, b^s_{n-1};  b^s_n <- f^s_n;
    d_n <- d_{n-1}, b^s_n;  b^c_1 <- f^c_N, d_1;  b^c_n <- b^c_{n-1}, d_n."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choices: {', '.join(ESTIMATORS)}")
    prev: dict[tuple[str, int], list[tuple[str, int]]] = {}
    order = []
    for n in range(n_mb):
        prev[("fc", n)] = [("fc", n - 1)] if n else []
        prev[("u", n)] = ([("u", n - 1)] if n else []) + [("fc", n)]
        prev[("fs", n)] = [("u", n)] + ([("bs", n - 1)] if n else [])
        prev[("bs", n)] = [("fs", n)]
        if estimator == "table1":
            prev[("d", n)] = ([("d", n - 1)] if n else []) + [("bs", n)]
        else:  # the authors' code: d_n waits for b^s_{n-1}, not for d_{n-1}
            prev[("d", n)] = ([("bs", n - 1)] if n else []) + [("bs", n)]
        order += [("fc", n), ("u", n), ("fs", n), ("bs", n), ("d", n)]
    for n in range(n_mb):
        if n == 0:
            prev[("bc", 0)] = ([("fc", n_mb - 1)] if estimator == "table1" else []) + [("d", 0)]
        else:
            prev[("bc", n)] = [("bc", n - 1), ("d", n)]
        order.append(("bc", n))
    return order, prev


def dag_finish_times(t: StageTimes, n_mb: int, estimator: str = "table1") -> dict:
    """T(r) of Eq. 11-13: each stage's finish time from the iteration's start (longest path,
    in topological order). A transfer's successor starts `latency` after the channel frees."""
    order, prev = table1_dag(n_mb, estimator)
    dur = {"fc": t.fc, "u": t.u, "fs": t.fs, "bs": t.bs, "d": t.d, "bc": t.bc}
    lat = {"u": t.lat_u, "d": t.lat_d}
    finish: dict = {}
    for r in order:
        start = 0.0
        for p in prev[r]:
            ready = finish[p] + (lat.get(p[0], 0.0) if p[0] != r[0] else 0.0)  # FIFO channel: no latency
            start = max(start, ready)
        finish[r] = start + dur[r[0]]
    return finish


def dag_makespan(t: StageTimes, n_mb: int, estimator: str = "table1") -> float:
    """The estimated iteration time: T(b^c_N) (Eq. 11) plus the device's optimizer step, or the
    server's step after b^s_N if that ends later."""
    if estimator == "table1":
        return _table1_makespan(t, n_mb)
    fin = dag_finish_times(t, n_mb, estimator)
    return max(fin[("bc", n_mb - 1)] + t.step_c, fin[("bs", n_mb - 1)] + t.step_s)


def _table1_makespan(t: StageTimes, n_mb: int) -> float:
    """`dag_finish_times` for Table I in one pass over the micro-batches (the notes' O(N) forward
    recursion), the same float operations in the same order: `select=auto` prices every N."""
    fc = u = bs = d = 0.0
    ds = []
    for n in range(n_mb):
        fc = fc + t.fc
        u = max(u, fc) + t.u if n else fc + t.u
        fs = max(u + t.lat_u, bs) + t.fs if n else u + t.lat_u + t.fs
        bs = fs + t.bs
        d = max(d, bs) + t.d if n else bs + t.d
        ds.append(d + t.lat_d)
    bc = fc
    for n in range(n_mb):
        bc = max(bc, ds[n]) + t.bc
    return max(bc + t.step_c, bs + t.step_s)


# ---------------------------------------------------------------------------------------------
# profiles and the closed form


@dataclass
class SideProfile:
    """One side's profile at batch B: per-unit forward, backward and optimizer-step seconds."""

    batch: int
    fwd: list[float]
    bwd: list[float]
    step: list[float]

    def span(self, kind: str, a: int, b: int, batch: int | None = None) -> float:
        seconds = sum(getattr(self, kind)[a:b])
        return seconds if kind == "step" or batch is None else seconds * batch / self.batch

    def iteration_s(self, units: int) -> float:
        """What profiling costs: one iteration of units [0, units) at batch B."""
        return sum(self.fwd[:units]) + sum(self.bwd[:units]) + sum(self.step[:units])


def profile_side(predictor, device, num_units: int, batch: int) -> SideProfile:
    fwd = [predictor.predict(device, Work("fwd", q, q + 1, batch)) for q in range(num_units)]
    bwd = [predictor.predict(device, Work("bwd", q, q + 1, batch)) for q in range(num_units)]
    step = [predictor.predict(device, Work("step", q, q + 1)) for q in range(num_units)]
    return SideProfile(batch, fwd, bwd, step)


def closed_form_n(t_full: StageTimes) -> int:
    """Eq. 14 (corrected): enough micro-batches that the device's forwards fill its idle gap
    u + f^s + b^s + d, all at the full batch B."""
    gap = t_full.u + t_full.lat_u + t_full.fs + t_full.bs + t_full.d + t_full.lat_d
    denom = min(t_full.fc, t_full.bc)
    if denom <= 0:
        return 1
    return 1 + max(0, math.ceil(gap / denom - 1e-12))


def clamp_n(n: int, batch: int, clamp: bool) -> int:
    """The authors' clamps: N <= min(B/2, 100), then N = B // (B // N) so that B' = B // N is
    an integer and N micro-batches of B' use as much of B as possible."""
    n = max(1, min(int(n), batch))
    if clamp:
        n = max(1, min(n, batch // 2 if batch >= 2 else 1, 100))
        n = batch // (batch // n)
    return n


@dataclass(frozen=True)
class Candidate:
    P: int
    N: int
    micro_batch: int
    iterations: int
    iter_s: float
    epoch_s: float
    times: StageTimes

    def as_dict(self) -> dict:
        d = asdict(self)
        d["times"] = asdict(self.times)
        return d


class PairModel:
    """Stage times of one device-server pair from the two profiles, the links and the wire.

    `packet_bytes(tag, P, b)` gives the bytes on the link of one micro-batch of b samples cut
    after unit P (tag `act` up, `grad` down); `codec_s(kind, tag, P, b)` the codec seconds.
    `price(side, kind, a, b, batch)`, if given, prices units [a, b) on "dev" or "srv" at the
    micro-batch's own size (otherwise the profiles at B scale linearly, the paper's Eq. 5-8);
    `server_share` stretches every server-side stage (K replicas on fewer cores);
    `serial_peers`: devices a server role serving them in turn serves before this one each
    iteration (Fig. 3b), whose server work delays this device's."""

    def __init__(self, dev: SideProfile, srv: SideProfile, num_units: int, up_bps: float, down_bps: float, lat_up: float, lat_down: float, packet_bytes, codec_s=None,
                 price=None, server_share: float = 1.0, serial_peers: int = 0):
        self.dev, self.srv, self.Q = dev, srv, num_units
        self.up_bps, self.down_bps = up_bps, down_bps
        self.lat_up, self.lat_down = lat_up, lat_down
        self.packet_bytes = packet_bytes
        self.codec_s = codec_s or (lambda kind, tag, P, b: 0.0)
        self.price = price
        self.server_share = float(server_share)
        self.serial_peers = int(serial_peers)

    def _span(self, side: str, kind: str, a: int, b: int, batch: int | None = None) -> float:
        if self.price is not None:
            return self.price(side, kind, a, b, batch)
        return (self.dev if side == "dev" else self.srv).span(kind, a, b, batch)

    def _tx(self, nbytes: int, bps: float) -> float:
        return 0.0 if math.isinf(bps) else 8.0 * nbytes / bps

    def stage_times(self, P: int, b: int) -> StageTimes:
        """One micro-batch of b samples split after unit P (1 <= P < Q)."""
        Q, cs, span, s = self.Q, self.codec_s, self._span, self.server_share
        return StageTimes(
            fc=span("dev", "fwd", 0, P, b) + cs("encode", "act", P, b),
            bc=span("dev", "bwd", 0, P, b) + cs("decode", "grad", P, b),
            fs=s * (cs("decode", "act", P, b) + span("srv", "fwd", P, Q, b)),
            bs=s * (span("srv", "bwd", P, Q, b) + cs("encode", "grad", P, b)),
            u=self._tx(self.packet_bytes("act", P, b), self.up_bps),
            d=self._tx(self.packet_bytes("grad", P, b), self.down_bps),
            lat_u=self.lat_up,
            lat_d=self.lat_down,
            step_c=span("dev", "step", 0, P),
            step_s=s * span("srv", "step", P, Q),
        )

    def local_iteration_s(self, b: int) -> float:
        """P = Q (FL): the whole model on the device, no transfers."""
        return self._span("dev", "fwd", 0, self.Q, b) + self._span("dev", "bwd", 0, self.Q, b) + self._span("dev", "step", 0, self.Q)


def candidate(pair: PairModel, P: int, N: int, batch: int, n_samples: int, estimator: str = "table1") -> Candidate:
    b = max(1, batch // N)
    iters = max(1, n_samples // (b * N))
    if P >= pair.Q:
        t = StageTimes(0, 0, 0, 0, 0, 0)
        it_s = pair.local_iteration_s(b)
    else:
        t = pair.stage_times(P, b)
        # a server serving the devices in turn works through the others' iterations first: the
        # last device's chain starts that much later, whichever side bounds the pipeline
        it_s = dag_makespan(t, N, estimator) + pair.serial_peers * (N * (t.fs + t.bs) + t.step_s)
    return Candidate(P, N, b, iters, it_s, it_s * iters, t)


def select_closed_form(pair: PairModel, batch: int, n_samples: int, p_range, *, fixed_n: int | None = None, clamp: bool = True, estimator: str = "table1") -> tuple[Candidate, list[Candidate]]:
    """The paper's selection: one candidate (P, N(P)) per P, the shortest estimated epoch wins.
    `fixed_n` pins N (SFL: N = 1). Returns (choice, shortlist)."""
    shortlist = []
    for P in p_range:
        if fixed_n is not None:
            N = fixed_n
        elif P >= pair.Q:
            N = 1
        else:
            N = clamp_n(closed_form_n(pair.stage_times(P, batch)), batch, clamp)
        shortlist.append(candidate(pair, P, N, batch, n_samples, estimator))
    if not shortlist:
        raise ValueError("no split point to choose from")
    best = min(shortlist, key=lambda c: (c.epoch_s, c.P, c.N))
    return best, shortlist


def efficient_n(batch: int, n_samples: int, n_max: int | None = None) -> list[int]:
    """N in 1..n_max (default `batch`) that no smaller N dominates: a smaller N with the same
    micro-batch B // N and the same iterations per epoch is never slower."""
    top = max(1, min(int(n_max or batch), batch))
    seen, out = set(), []
    for n in range(1, top + 1):
        b = max(1, batch // n)
        key = (b, max(1, n_samples // (b * n)))
        if key not in seen:
            seen.add(key)
            out.append(n)
    return out


def select_search(pair: PairModel, batch: int, n_samples: int, p_range, *, fixed_n: int | None = None, estimator: str = "table1") -> tuple[Candidate, list[Candidate]]:
    """`select=auto`: every (P, N), N in 1..B less the dominated values (or `fixed_n`), priced on
    the Table I DAG with the pair's stage times; the shortest epoch wins. Returns (choice, the
    best candidate of each P)."""
    best_of_p = []
    for P in p_range:
        ns = [fixed_n] if fixed_n is not None else ([1] if P >= pair.Q else efficient_n(batch, n_samples))
        best_of_p.append(min((candidate(pair, P, N, batch, n_samples, estimator) for N in ns), key=lambda c: (c.epoch_s, c.N)))
    if not best_of_p:
        raise ValueError("no split point to choose from")
    return min(best_of_p, key=lambda c: (c.epoch_s, c.P, c.N)), best_of_p
