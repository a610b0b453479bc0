"""EdgePipe's plan (plugins.schedulers.edgepipe.scheduler explains it): the links' PRR, the mapping of
super neurons to devices, the slot length, and the typed plan written to plan.json
(`EdgePipePlan`; its budget and curve parts are edgepipe.budget's and edgepipe.curve's)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from framework.errors import ConfigError
from framework.runtime import wire
from framework.specs import Data, absent_when_none
from plugins.schedulers.edgepipe import budget, channel, curve, mapping, recovery, timing
from plugins.schedulers.edgepipe import partition as part
from plugins.schedulers.edgepipe.budget import Budget
from plugins.schedulers.edgepipe.curve import EvalGrid

log = logging.getLogger("plugins.schedulers.edgepipe.scheduler")


@dataclass(frozen=True)
class SuperNeuronFacts(Data):
    sn: int
    group: int
    h: int
    device: str  # where the mapping puts it
    chunks: tuple[tuple[int, int, int], ...]  # (layer, lo, hi)


@dataclass(frozen=True)
class PartitionFacts(Data):
    """Algorithm 1's partition as plan.json records it (its class under the key `class`)."""

    kind: str  # the class asked for
    effective_class: str
    sizes: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    devices_per_group: tuple[int, ...]
    m_layers: int
    P: int
    notes: tuple[str, ...]
    super_neurons: tuple[SuperNeuronFacts, ...]

    def to_json(self) -> dict:
        d = super().to_json()
        return {"class": d.pop("kind"), **d}

    @classmethod
    def from_json(cls, data: dict) -> "PartitionFacts":
        d = dict(data)
        d["kind"] = d.pop("class")
        return super().from_json(d)


@dataclass(frozen=True)
class MappingFacts(Data):
    method: str
    perm: tuple[int, ...]  # super neuron s runs on the run's device perm[s]
    score: float
    evaluated: int
    devices: dict[str, str]  # role -> device


@dataclass(frozen=True)
class PRRFacts(Data):
    """The links' packet reception ratios in device space (row sends to column)."""

    source: str
    true: tuple[tuple[float, ...], ...]  # what drives the losses
    measured: tuple[tuple[float, ...], ...]  # what the mapper saw (probe packets)
    mean_true: float
    positions_m: tuple[tuple[float, ...], ...] | None = absent_when_none()  # source=channel
    topology_seed: int | None = absent_when_none()  # source=channel


@dataclass(frozen=True)
class EdgePipePlan(Data):
    """The plan a run takes (plan.json)."""

    scheduler: str
    partition: PartitionFacts
    mapping: MappingFacts
    prr: PRRFacts
    coordinator: str
    messages_per_minibatch: int
    messages_per_pair: tuple[tuple[int, ...], ...]  # device space: row sends to column, per minibatch
    max_message_width: int
    pipeline: bool
    weight_stashing: bool
    recovery: str
    max_transmissions_per_message: int
    ack_max_retries: int | None  # recovery=ack only
    bwd_mode: str
    slot_s: float  # the slot the run uses
    derived_slot_s: float  # worst op + slowest message + margin
    worst_op_s: float
    worst_message_s: float
    margin_s: float
    cycle_slots: int
    slots_per_epoch: int
    predicted_epoch_s: float
    predicted_iter_s: float
    paper_table_ii_slot_ms: float
    iterations_per_epoch: int
    budget: Budget | None = absent_when_none()  # scheduler.budget_min only
    eval: EvalGrid | None = absent_when_none()  # scheduler.eval_every_min only


def prr(sched) -> tuple[np.ndarray, np.ndarray, dict]:
    """(true PRR driving the losses, PRR the mapper sees, where the devices are) in device space."""
    cfg, n = sched.cfg.prr, len(sched.devices)
    if cfg.source == "channel":
        topo = channel.random_topology(int(cfg.topology_seed), n, roi_m=float(cfg.roi_m), probe_packets=int(cfg.probe_packets),
                                       n=float(cfg.pathloss_exp), sigma_db=float(cfg.sigma_db), k_db=float(cfg.k_margin_db))
        return topo.true_prr, topo.measured_prr, {"positions_m": topo.positions.tolist(), "topology_seed": int(cfg.topology_seed)}
    if cfg.source == "given":
        try:
            m = channel.as_prr_matrix([list(r) for r in cfg.matrix])
        except ValueError as e:
            raise ConfigError("scheduler.prr.matrix", str(e)) from None
        if m.shape != (n, n):
            raise ConfigError("scheduler.prr.matrix", f"is {m.shape[0]} x {m.shape[1]}; the run uses {n} devices")
        return m, m, {}
    m = np.ones((n, n))
    for i, a in enumerate(sched.devices):
        for j, b in enumerate(sched.devices):
            if i != j:
                m[i, j] = 1.0 - float(sched.ctx.cluster.link(a, b).cfg.loss)
    return m, m, {}


def map_devices(sched, measured: np.ndarray) -> mapping.Mapping:
    cfg, sn = sched.cfg, part.snnet(sched.partition)
    if cfg.mapping == "identity" or len(sched.devices) == 1:
        ident = tuple(range(len(sched.devices)))
        return mapping.Mapping("identity", ident, mapping.score(sn, measured, ident), 1)
    return mapping.map_devices(str(cfg.mapping), sn, measured, seed=int(cfg.mapping_seed), generations=cfg.generations)


def message_bytes(sched, width: int) -> int:
    B = int(sched.ctx.cfg.train.batch_size)
    return wire.encoded_size({"x": torch.empty((B, width), dtype=sched.ctx.dtype, device="meta"), "id": torch.zeros(1, dtype=torch.int64)})


def slot(sched, perm) -> dict:
    comp = max((t for s in range(len(perm)) for t in sched.op_seconds(s, perm).values()), default=0.0)
    radio, tx = 0.0, recovery.max_transmissions(sched.cfg)
    for m in part.messages(sched.partition):
        a, b = sched.devices[perm[m.src]], sched.devices[perm[m.dst]]
        link = sched.ctx.cluster.link(a, b)
        ack = recovery.ack_wait_s(sched.ctx.cluster, a, b) if sched.cfg.recovery == "ack" else 0.0  # each attempt's ACK wait
        radio = max(radio, (link.tx_time(message_bytes(sched, m.width), 0.0) + ack) * tx + link.cfg.latency_s)
    derived = comp + radio + float(sched.cfg.slot_margin_s)
    if sched.cfg.slot_s is not None and float(sched.cfg.slot_s) < comp + radio:
        log.warning("scheduler.slot_s=%s is shorter than the worst op plus the slowest message (%.6g s): ops overrun their slots "
                    "and the schedule slips behind the slot clock", sched.cfg.slot_s, comp + radio)
    return {"slot_s": float(sched.cfg.slot_s) if sched.cfg.slot_s is not None else derived, "derived_slot_s": derived,
            "worst_op_s": comp, "worst_message_s": radio, "margin_s": float(sched.cfg.slot_margin_s)}


def make_plan(sched) -> EdgePipePlan:
    p = sched.partition
    true, measured, where = prr(sched)
    mp = map_devices(sched, measured)
    n_data = sched.ctx.iterations_per_epoch()
    counts = part.message_counts(p, perm=mp.perm)
    pipe = bool(sched.cfg.pipeline)
    sl = slot(sched, mp.perm)
    plan_budget = None
    if sched.cfg.budget_min is not None:
        try:
            plan_budget = budget.budget_plan(p, float(sched.cfg.budget_min), pipe, sl["slot_s"], n_data)
        except ValueError as e:
            raise ConfigError("scheduler.budget_min", str(e)) from None
    n_run = plan_budget.minibatches if plan_budget else n_data
    return EdgePipePlan(
        scheduler=sched.cfg.name,
        partition=PartitionFacts(p.kind, p.effective_class, p.sizes, p.groups, p.devices, p.m_layers, p.P, p.notes,
                                 tuple(SuperNeuronFacts(sn.index, sn.group, sn.h, sched.devices[mp.perm[sn.index]], sn.chunks) for sn in p.super_neurons)),
        mapping=MappingFacts(mp.method, tuple(mp.perm), mp.score, mp.evaluated, {f"sn{s}": sched.devices[d] for s, d in enumerate(mp.perm)}),
        prr=PRRFacts(sched.cfg.prr.source, _rows(true), _rows(measured), channel.mean_prr(true) if len(true) > 1 else 1.0,
                     _rows(where["positions_m"]) if "positions_m" in where else None, where.get("topology_seed")),
        coordinator=sched.devices[part.elect_coordinator(true)],
        messages_per_minibatch=int(counts.sum()),
        messages_per_pair=_rows(counts),
        max_message_width=part.max_message_width(p),
        pipeline=pipe and timing.pipelined(p),
        weight_stashing=bool(sched.cfg.weight_stashing),
        recovery=sched.cfg.recovery,
        max_transmissions_per_message=recovery.max_transmissions(sched.cfg),
        ack_max_retries=int(sched.cfg.ack_max_retries) if sched.cfg.recovery == "ack" else None,
        bwd_mode=sched.cfg.bwd_mode,
        **sl,
        cycle_slots=timing.cycle_slots(p, pipe),
        slots_per_epoch=timing.slots_for(p, n_run, pipe),
        predicted_epoch_s=timing.slots_for(p, n_run, pipe) * sl["slot_s"],
        predicted_iter_s=timing.cycle_slots(p, pipe) * sl["slot_s"],
        paper_table_ii_slot_ms=timing.table_ii_slot_ms(p),
        iterations_per_epoch=n_data,
        budget=plan_budget,
        eval=curve.plan(sched.cfg, sl["slot_s"], timing.slots_for(p, n_run, pipe), int(sched.ctx.cfg.train.epochs)),
    )


def _rows(matrix) -> tuple[tuple, ...]:
    """A matrix (numpy or nested lists) as rows of Python numbers."""
    return tuple(tuple(row) for row in np.asarray(matrix).tolist())
