"""The feature-replay paper's cost model and decision engine (Yao et al., IMWUT 2021, section 4.4-4.5).

Pure functions over module times, so that they are testable against the paper's identities and
the numbers its profile tables give (notes section 4.3):

- one iteration is four modules: T1 edge compute (send forward, replay, backward, compression),
  T2 uplink of the feature, T3 cloud forward and backward, T4 downlink of the gradient;
- serial (Eq. 10) tau * sum(T); full pipeline (Eq. 11) (tau - 1) max(T) + sum(T); grouped with
  staleness bound K (Eq. 12) adds a stall of max(0, sum(T) - (K + 1) max(T)) at every group
  boundary; K = 0 is Eq. 10 and K = None (unbounded) Eq. 11;
- moving the cut costs the moved blocks' weights over the link they cross (Eq. 13);
- tau, the iterations expected until the next re-deployment, is an EWMA (Eq. 14, beta 0.8, updated
  every iteration as the official code does);
- Alg. 2 searches every cut and bit width for the least M + U (K is scheduled, not searched).
  `decide` takes the cost M as a function: Eq. 12 (`paper_cost`, Alg. 2 as printed) or the
  policy-aware walk of the pipeline (feature_replay.pipeline.policy_cost, the default of
  `scheduler.cost_model`).

Units: seconds, bytes and bytes per second (the tables' MB are 2^20 bytes; convert at the edge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence
from plugins.schedulers.feature_replay.pipeline import Stages

MB = float(1 << 20)


def serial_cost(T: Sequence[float], tau: float) -> float:
    """Eq. 10: the four modules one after another, every iteration."""
    return tau * sum(T)


def full_pipeline_cost(T: Sequence[float], tau: float) -> float:
    """Eq. 11: a full pipeline; at most 4x faster than serial (T_M >= T_sum / 4)."""
    return (tau - 1) * max(T) + sum(T)


def grouped_cost(T: Sequence[float], K: int | None, tau: float) -> float:
    """Eq. 12: groups of K + 1 iterations; each group boundary costs the refill the pipeline
    cannot hide. K = None means no bound (Eq. 11)."""
    t_max, t_sum = max(T), sum(T)
    base = (tau - 1) * t_max + t_sum
    if K is None:
        return base
    return base + (math.ceil(tau / (K + 1)) - 1) * max(0.0, t_sum - (K + 1) * t_max)


def migration_cost(block_bytes: Sequence[float], old_cut: int, new_cut: int, r_up: float, r_down: float) -> float:
    """Eq. 13: the weights of the blocks that change sides, over the link they cross. A cut is the
    number of blocks on the edge; block i (1-based) is `block_bytes[i - 1]`."""
    if new_cut < old_cut:  # blocks new_cut+1 .. old_cut go up to the cloud
        return sum(block_bytes[new_cut:old_cut]) / r_up
    if new_cut > old_cut:  # blocks old_cut+1 .. new_cut come down to the edge
        return sum(block_bytes[old_cut:new_cut]) / r_down
    return 0.0


class TauEstimator:
    """Eq. 14 as the official code runs it: every iteration, tau <- beta tau + (1 - beta) h, where
    h counts the iterations since the last re-deployment (1 right after one)."""

    def __init__(self, tau0: float, beta: float = 0.8):
        self.tau = float(tau0)
        self.beta = float(beta)
        self.since = 1

    def update(self, redeployed: bool) -> float:
        self.since = 1 if redeployed else self.since + 1
        self.tau = self.beta * self.tau + (1.0 - self.beta) * self.since
        return self.tau


@dataclass
class CutProfile:
    """What the engine knows of a model on one edge/cloud pair, per cut l = 1..L (blocks on the
    edge; l = L is edge-only):

    - `edge_s[l-1]`: the edge's P1 compute per iteration without compression (for l = L: the
      whole local training iteration);
    - `cloud_s[l-1]`: the cloud's P3 per iteration (0 at l = L);
    - `feature_bytes[l-1]`: the fp32 feature crossing cut l (and its gradient), l < L;
    - `compress_s(l, bits)`: edge seconds to compress that feature to `bits` (0 at 32);
    - `block_bytes[i-1]`: the weights of block i (for migrations);
    - `min_bits[l-1]`: the fewest bits cut l tolerates (offline calibration), default 1;
    - `down_bytes[l-1]`: the gradient's bytes, when they are not the fp32 feature's;
    - `send_s[l-1]`: the part of `edge_s` the edge spends when it sends (the forward), the rest
      being spent per applied gradient (replay, backward, step); the policy-aware model needs it;
    - `cloud_step_s[l-1]`: the part of `cloud_s` after the gradient has left (the step);
    - `latency_s`: the links' one-way latencies (up, down), `overhead_s` their per-message
      channel time (a radio's wake-up).
    """

    edge_s: Sequence[float]
    cloud_s: Sequence[float]
    feature_bytes: Sequence[float]
    compress_s: Callable[[int, int], float]
    block_bytes: Sequence[float]
    min_bits: Sequence[int] | None = None
    down_bytes: Sequence[float] | None = None  # the gradient's bytes if not the fp32 feature's
    send_s: Sequence[float] | None = None
    cloud_step_s: Sequence[float] | None = None
    latency_s: tuple[float, float] = (0.0, 0.0)
    overhead_s: tuple[float, float] = (0.0, 0.0)

    @property
    def units(self) -> int:
        return len(self.edge_s)

    def module_times(self, cut: int, bits: int, r_up: float, r_down: float) -> tuple[float, float, float, float]:
        """(T1, T2, T3, T4) of a deployment: compressed uplink, fp32 downlink (Eq. 9)."""
        size = self.feature_bytes[cut - 1]
        down = self.down_bytes[cut - 1] if self.down_bytes is not None else size
        t1 = self.edge_s[cut - 1] + (self.compress_s(cut, bits) if bits < 32 else 0.0)
        return (t1, size * bits / 32.0 / r_up, self.cloud_s[cut - 1], down / r_down)

    def stages(self, cut: int, bits: int, r_up: float, r_down: float):
        """The deployment's module times split as the policy-aware model walks them
        (feature_replay.pipeline.Stages)."""

        if self.send_s is None:
            raise ValueError("the policy-aware cost needs the edge's send share of P1 (CutProfile.send_s); Eq. 12 (paper_cost) does not")
        size = self.feature_bytes[cut - 1]
        down = self.down_bytes[cut - 1] if self.down_bytes is not None else size
        send, edge = self.send_s[cut - 1], self.edge_s[cut - 1]
        step = self.cloud_step_s[cut - 1] if self.cloud_step_s is not None else 0.0
        return Stages(forward_s=send, encode_s=self.compress_s(cut, bits) if bits < 32 else 0.0, replay_s=edge - send,
                      up_s=self.overhead_s[0] + size * bits / 32.0 / r_up, cloud_s=self.cloud_s[cut - 1] - step, cloud_step_s=step,
                      down_s=self.overhead_s[1] + down / r_down, up_latency_s=self.latency_s[0], down_latency_s=self.latency_s[1])


def paper_cost(profile: CutProfile, dep, K: int | None, r_up: float, r_down: float, tau: float) -> float:
    """M of Alg. 2 as printed: Eq. 12 on the deployment's T1..T4 (Eq. 9)."""
    return grouped_cost(profile.module_times(dep.cut, dep.bits, r_up, r_down), K, tau)


@dataclass(frozen=True)
class Deployment:
    cut: int  # blocks on the edge; L = edge-only
    bits: int  # uplink bit width; 32 = uncompressed


@dataclass
class Decision:
    deployment: Deployment
    cost: float  # M + U over tau iterations (seconds)
    per_iteration: float  # cost / tau
    candidates: list = field(default_factory=list)  # (cut, bits, cost) of every candidate


def decide(profile: CutProfile, current: Deployment, K: int | None, r_up: float, r_down: float, tau: float, *,
           bits_candidates: Sequence[int] = (2, 4, 8, 16, 32), include_edge_only: bool = True, model: Callable | None = None) -> Decision:
    """Alg. 2: the deployment of least M(l, K, b, r_u, r_d, tau) + U(l_now, l), M = `model`
    (default `paper_cost`, Eq. 12; feature_replay.pipeline.policy_cost(policy) walks the
    staleness policy's pipeline). Candidates are
    every cut with the edge holding 1..L-1 blocks and every bit width the cut tolerates
    (b >= min_bits(l), the notes' proposal), then edge-only (the official code and section 6.3;
    its cost is tau x the local iteration). Ties keep the earlier candidate, the current
    deployment first."""
    L = profile.units
    found: list[tuple[float, Deployment]] = []

    def cost_of(dep: Deployment) -> float:
        u = migration_cost(profile.block_bytes, current.cut, dep.cut, r_up, r_down)
        if dep.cut == L:
            return profile.edge_s[L - 1] * tau + u
        return (model or paper_cost)(profile, dep, K, r_up, r_down, tau) + u

    def allowed(dep: Deployment) -> bool:
        if dep.cut == L:
            return include_edge_only
        return dep.bits in bits_candidates and dep.bits >= (profile.min_bits[dep.cut - 1] if profile.min_bits else 1)

    order = [current] if allowed(current) else []
    order += [Deployment(l, b) for l in range(1, L) for b in bits_candidates if Deployment(l, b) != current]
    if include_edge_only and current.cut != L:
        order.append(Deployment(L, 32))
    best: tuple[float, Deployment] | None = None
    for dep in order:
        if not allowed(dep):
            continue
        c = cost_of(dep)
        found.append((c, dep))
        if best is None or c < best[0]:
            best = (c, dep)
    if best is None:
        raise ValueError("no deployment is allowed (bit widths below every cut's minimum and edge-only excluded)")
    return Decision(best[1], best[0], best[0] / tau, [(d.cut, d.bits, c) for c, d in found])


def table_profile(table, edge: str, cloud: str, block_bytes: Sequence[float] | None = None, *,
                  forward_fraction: float | None = None, price_replay: bool = False) -> CutProfile:
    """A CutProfile from a shipped profile table (framework.profile_tables): the edge's measured
    iteration is P1 (as the official engine takes it), compression from the table's 8-bit column
    (the same seconds for any width below 32: the quantizer's passes do not depend on it).
    `forward_fraction` (the forward's share of a measured iteration, as the `table` time model
    splits it) gives the send share the policy-aware model needs; `price_replay` then adds the
    replay's forward to P1 (the device runs it; edge-only training has none)."""
    L = table.units
    edge_s = [table.cumulative(edge, l) for l in range(1, L + 1)]
    cloud_s = [table.cumulative(cloud, l) if l < L else 0.0 for l in range(1, L + 1)]
    send_s = None
    if forward_fraction is not None:
        send_s = [forward_fraction * e for e in edge_s]
        if price_replay:
            edge_s = [e + f for e, f in zip(edge_s[:-1], send_s[:-1])] + edge_s[-1:]
    elif price_replay:
        raise ValueError("price_replay needs forward_fraction: the table measures forward and backward together")
    comp = (table.compress_s or {}).get(edge)
    feature = [mb * MB for mb in table.feature_MB]

    def compress_s(cut: int, bits: int) -> float:
        if bits >= 32 or comp is None:
            return 0.0
        return comp[cut - 1]

    return CutProfile(edge_s, cloud_s, feature, compress_s, list(block_bytes) if block_bytes is not None else [0.0] * L, send_s=send_s)
