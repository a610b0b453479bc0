"""Feature replay's policy-aware cost model: the epoch the four modules take under the edge's
staleness policy, the default plan and decision-engine cost (`scheduler.cost_model=policy`).

The paper's Eq. 12 prices one rule, groups of K + 1 whose boundary costs
max(0, T_sum - (K + 1) T_max). It is close for the sliding window the official code runs
(`block`), but it does not describe the group barrier it was written for (every group fills and
drains the pipeline: 25-50% more than Eq. 12 on the Pi table), nor a policy that drops stale
gradients (`discard`: the edge skips their replay, so P1 shrinks). So the default model walks
one epoch of the pipeline as the policies define it (plugins.schedulers.feature_replay.scheduler):

- the edge (P1) forwards batch t and encodes its feature, then replays and backpropagates the
  gradients that have come back, waiting for more as the policy says (`block`: until t - last
  applied <= K; `fixed`: the gradient of t - K; `group`: every gradient of the group at its last
  batch; `discard`: only when 2 (K + 1) batches are in flight, and a gradient more than K
  batches old is dropped without its replay);
- the uplink (P2), the cloud (P3) and the downlink (P4) are FIFO servers: a message starts when
  its module is free and its input is there, and a link's latency delays the arrival, not the
  next message;
- the epoch ends with the flush (every outstanding gradient applied) and the cloud's last step.

This is a max-plus recurrence over the iterations, O(tau) per candidate (about 2 us an
iteration): the time each batch leaves each module is the max of when its input is ready and
when the module is free, plus the module's time. Epochs longer than 256 iterations are
extrapolated from the regime the walk settles into, so the online engine can price every cut
every iteration.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from framework.config.knobs import choices
from plugins.schedulers.feature_replay.schema import FeatureReplayConfig

POLICIES = choices(FeatureReplayConfig, "staleness_policy")  # what epoch_seconds walks


@dataclass(frozen=True)
class Stages:
    """One iteration's module times (seconds), split where the policy needs the split."""

    forward_s: float  # P1, the edge's forward of the new batch (its replies are checked after it)
    encode_s: float  # P1, compressing that feature (the device is busy; the role already checks)
    replay_s: float  # P1, per applied gradient: the replay forward (if charged), backward and step
    up_s: float  # P2, the uplink busy with one feature
    cloud_s: float  # P3 until the gradient leaves: decode, forward, backward
    cloud_step_s: float  # P3 after it: the cloud's optimizer step
    down_s: float  # P4, the downlink busy with one gradient
    up_latency_s: float = 0.0
    down_latency_s: float = 0.0

    @property
    def paper_modules(self) -> tuple[float, float, float, float]:
        """(T1, T2, T3, T4) as Eq. 9-12 take them (a link's latency inside its module)."""
        return (self.forward_s + self.encode_s + self.replay_s, self.up_s + self.up_latency_s,
                self.cloud_s + self.cloud_step_s, self.down_s + self.down_latency_s)


def _walk(st: Stages, K: int | None, policy: str, n: int) -> float:
    """Walk `n` iterations from an empty pipeline to the flush: the epoch's end."""
    edge_free = now = 0.0  # the edge device / the edge's program
    up_free = cloud_free = down_free = 0.0
    arrive: list[float] = []  # when batch j's gradient is back on the edge
    inflight: collections.deque[int] = collections.deque()
    last = -1

    def apply(t: int) -> None:
        nonlocal now, edge_free, last
        j = inflight.popleft()
        now = max(now, arrive[j])
        last = j
        if policy == "discard" and K is not None and t - j > K:
            return  # dropped: no replay
        now = edge_free = max(now, edge_free) + st.replay_s

    for t in range(n):
        now = max(now, edge_free) + st.forward_s
        edge_free = now + st.encode_s
        sent = max(edge_free, up_free)
        up_free = sent + st.up_s
        c = max(up_free + st.up_latency_s, cloud_free)
        grad = c + st.cloud_s
        cloud_free = grad + st.cloud_step_s
        down_free = max(grad, down_free) + st.down_s
        arrive.append(down_free + st.down_latency_s)
        inflight.append(t)
        if policy == "fixed":
            while inflight and K is not None and inflight[0] <= t - K:
                apply(t)
            continue
        while inflight and arrive[inflight[0]] <= now:  # what has come back by now
            apply(t)
        if K is None:
            continue
        if policy == "block":
            while t - last > K:
                apply(t)
        elif policy == "group" and (t + 1) % (K + 1) == 0:
            while inflight:
                apply(t)
        elif policy == "discard":
            while len(inflight) >= 2 * (K + 1):
                apply(t)
    while inflight:  # the epoch's flush
        apply(n - 1)
    # the end-of-epoch marker crosses the uplink; the cloud finishes its last step
    return max(now + st.up_latency_s, cloud_free)


EXACT_UP_TO = 256  # iterations walked one by one; a longer epoch is extrapolated


def epoch_seconds(st: Stages, K: int | None, policy: str, tau: float, exact: bool = False) -> float:
    """Seconds of `tau` iterations from an empty pipeline to the flush under `policy` (a real tau,
    the engine's EWMA, interpolates linearly). `exact` walks every iteration; otherwise an epoch
    longer than EXACT_UP_TO iterations is extrapolated from two walks a window apart, at the
    same phase of the group structure (K + 1 iterations) as the epoch. The regime the walk
    settles into can repeat over several groups, so the window spans at least 128 iterations:
    measured against exact walks, within 1% (tests/test_feature_replay_cost.py)."""
    if policy not in POLICIES:
        raise ValueError(f"{policy!r} is not a staleness policy; choices: {', '.join(POLICIES)}")
    if tau <= 0:
        return 0.0
    n = max(1, math.floor(tau))
    if exact or n <= EXACT_UP_TO:
        end = _walk(st, K, policy, n)
        return end if tau == n else end + (tau - n) * (_walk(st, K, policy, n + 1) - end)
    q = (K + 1) if K is not None else 1
    window = q * math.ceil(128 / q)
    m = window + (n - window) % q  # the same phase of the groups as n
    a, b = _walk(st, K, policy, m), _walk(st, K, policy, m + window)
    return a + (tau - m) * (b - a) / window


def policy_cost(policy: str):
    """The decision engine's cost M (feature_replay.cost.decide's `model`) under `policy`."""

    def cost(profile, dep, K, r_up, r_down, tau) -> float:
        return epoch_seconds(profile.stages(dep.cut, dep.bits, r_up, r_down), K, policy, tau)

    cost.__name__ = f"policy_cost_{policy}"
    return cost
