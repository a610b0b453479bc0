"""Feature replay's plan, typed: what the coordinator decides once (the cut, the staleness bound,
the cost models' predictions) and the profile the edge's online engine re-runs Alg. 2 with.

`FeatureReplay.plan()` returns `FeatureReplayPlan.to_json()`: plan.json's keys, in this order.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.specs import Data


@dataclass(frozen=True)
class Profile(Data):
    """Every cut's module times and packet sizes; entry l - 1 is cut l = 1..L (L: edge-only).
    Priced as the simulator prices them (the devices' time models, the compressor's codec
    seconds, the packets' real sizes)."""

    edge_s: tuple[float, ...]  # the replaying side's P1 per iteration, compression included (at the run's bit width)
    edge_send_s: tuple[float, ...]  # of which the forward and compression of the sent batch
    cloud_s: tuple[float, ...]  # the other side's P3 per iteration
    cloud_step_s: tuple[float, ...]  # of which the step after the gradient has left
    uplink_bytes: tuple[int, ...]  # the (compressed) feature's packet, labels included
    downlink_bytes: tuple[int, ...]  # the fp32 feature's gradient packet
    encode_s: tuple[float, ...]  # compressing the feature
    block_bytes: tuple[int, ...]  # the weights of unit i (index i), what a migration moves
    latency_s: tuple[float, float]  # the links' one-way latencies (feature's, gradient's)
    overhead_s: tuple[float, float]  # the links' per-message channel time (a radio's wake-up)


@dataclass(frozen=True)
class Placement(Data):
    """Where one party runs and which units it holds, [start, stop)."""

    role: str
    device: str
    units: tuple[int, int]
    unit_names: tuple[str, ...]


@dataclass(frozen=True)
class ModuleTimes(Data):
    """One steady-state iteration's four modules at the cut (section 4.4)."""

    T1: float  # the replaying side: forward, replay, backward, step, compression
    T2: float  # the feature's link
    T3: float  # the other side: decode, forward, backward, step
    T4: float  # the gradient's link


@dataclass(frozen=True)
class PredictedEpoch(Data):
    """Seconds of one epoch as each model predicts it."""

    planned: float  # the configured cost model's
    policy: float  # the staleness policy's pipeline walked over the epoch
    serial_eq10: float
    grouped_eq12: float
    edge_only: float


@dataclass(frozen=True)
class LinkRates(Data):
    """Bytes per second at the start (the links' configured bandwidths)."""

    up: float
    down: float


@dataclass(frozen=True)
class Candidate(Data):
    cut: int
    cost_s: float  # M + U over an epoch (Alg. 2)


@dataclass(frozen=True)
class FeatureReplayPlan(Data):
    scheduler: str
    cut: int  # units upstream (the edge's, or the cloud's with upstream=cloud)
    cut_chosen_by: str  # engine | fixed (the configured cut)
    cost_model: str
    cut_by_cost_model: dict[str, int]  # each cost model's choice (empty for a configured cut)
    adaptive: bool
    upstream: str
    edge: Placement
    cloud: Placement
    uplink_bits: int
    K: int | None  # the staleness bound of epoch 0
    staleness_policy: str
    price_replay: bool
    module_times_s: ModuleTimes
    iterations_per_epoch: int
    predicted_epoch_s: PredictedEpoch
    predicted_iter_s: float
    link_bytes_per_s: LinkRates
    candidates: tuple[Candidate, ...]  # the configured cost model's, in Alg. 2's order
    profile: Profile
