"""EdgePipe's slot clock (notes sections 2.8 and 2.12): the Eq. (2) pipeline schedule, Theorem 1's
slot count, the slot length of Eq. (4) from Table II, and what they give in a time budget.

All devices share a global slot clock; in each slot a super neuron runs at most one layer op
(FW or BW of one of its layers for one minibatch). The device holding SN[w, h] with layers
l_1 < ... < l_m of group w runs, after s_w = sum of the earlier groups' sizes stall slots,

    FW_{l_1}^i ... FW_{l_m}^i  BW_{l_m}^{i-P+w} ... BW_{l_1}^{i-P+w}        i = 1, 2, ...   (2)

where BW of data < 1 and BW of the input layer are stalls. `schedule()` returns the ops (the
list a later step executes on the simulator's slot clock); the total slot count is Theorem 1's
2L + 2M(N_data - 1) - 1 for uniform groups.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

from plugins.schedulers.edgepipe.partition import Partition, max_message_width, messages

# Table II: ms per pass on a Raspberry Pi 2 Model B (mean of 10 trials). I = input, H = hidden, O = output.
TABLE_II_MS = {
    "vertical": {"fw_ih": 341.42, "fw_hh": 49.04, "fw_ho": 4.24, "share_oo": 1.85, "bw_oh": 6.94, "bw_hh": 79.34},
    "hybrid": {"fw_ih": 161.15, "fw_hh": 24.87, "fw_ho": 2.19, "share_oo": 1.48, "bw_oh": 2.30, "bw_hh": 21.27},
    "horizontal": {"fw_ih": 56.09, "fw_hh": 8.66, "fw_ho": 1.49, "share_oo": 1.51, "bw_oh": 0.87, "bw_hh": 14.86},
}
RADIO_BPS = 250e3  # IEEE 802.15.4
BITS_PER_VALUE = 32
MARGIN_MS = 100.0
BUDGET_MIN = 194.0  # Table III: the time at which Naive's train loss drops below 0.5
STEPS_PER_EPOCH = 600  # 60 k samples, minibatch 100


class Op(NamedTuple):
    slot: int  # 1-based global slot
    sn: int  # super neuron index (its device is perm[sn] under a mapping)
    kind: str  # "FW" | "BW"
    layer: int
    data: int  # 1-based minibatch id


def slot_ms(compute_ms: float, m_pkt: int, *, bits: int = BITS_PER_VALUE, rate_bps: float = RADIO_BPS,
            margin_ms: float = MARGIN_MS) -> float:
    """A slot: worst per-layer compute + radio time of the widest message + margin. Eq. (4)
    charges one sample's vector (m_pkt values), not a minibatch's: reproduced literally (notes
    section 8 item 20), since Table III's slot counts follow from it."""
    return compute_ms + m_pkt * bits / rate_bps * 1e3 + margin_ms


def table_ii_slot_ms(p: Partition) -> float:
    """Eq. (4) for a partition: Table II's row of its class (the worst pass is the I->H
    forward) and its own widest message. A single device (Naive) uses the Vertical row (one
    whole layer per device) and has no radio. Table II is measured for the 6-layer, 6-device DNN
    only; other shapes get that row unscaled."""
    row = TABLE_II_MS["vertical" if len(p.super_neurons) == 1 else p.effective_class]
    return slot_ms(max(row.values()), max_message_width(p))


def pipelined(p: Partition) -> bool:
    """Eq. (2) pipelines across groups; a single group (Horizontal, Naive) cannot (Theorem 1's
    n_cut = N_data: it runs 2L - 1 slots per minibatch, the BW_1 stall dropped)."""
    return p.P > 1


def cycle_slots(p: Partition, pipeline: bool = True) -> int:
    """Slots between consecutive minibatches in steady state: 2 x the largest group when
    pipelined (Eq. 2 for uniform groups; the notes' choice for non-uniform ones, where shorter
    groups idle), else 2L - 1."""
    return 2 * p.m_layers if pipeline and pipelined(p) else 2 * p.L - 1


def schedule(p: Partition, n_data: int, pipeline: bool = True) -> list[Op]:
    """The ops of `n_data` minibatches, sorted by (slot, sn); stalls are absent.

    Pipelined: Eq. (2) with cycle C = cycle_slots(p) and start offset s_w. Not pipelined (a
    single group, or the Model baseline with pipeline=False): minibatch i occupies slots
    (i-1)(2L-1) + 1 .. i(2L-1), FW_l in its l-th slot and BW_l in its (2L-l+1)-th, on every
    holder of layer l."""
    if n_data < 1:
        raise ValueError(f"n_data must be >= 1, got {n_data}")
    ops: list[Op] = []
    if not (pipeline and pipelined(p)):
        C = 2 * p.L - 1
        for i in range(1, n_data + 1):
            base = (i - 1) * C
            for sn in p.super_neurons:
                for l in sn.layers:
                    ops.append(Op(base + l, sn.index, "FW", l, i))
                    if l > 1:
                        ops.append(Op(base + 2 * p.L - l + 1, sn.index, "BW", l, i))
        return sorted(ops)
    C, P = cycle_slots(p), p.P
    for sn in p.super_neurons:
        w, layers = sn.group, sn.layers
        m, start = len(layers), sum(len(g) for g in p.groups[: sn.group - 1])
        for i in range(1, n_data + P - w + 1):  # BW of data i - P + w runs in cycle i
            base = start + C * (i - 1)
            if i <= n_data:
                ops += [Op(base + k + 1, sn.index, "FW", l, i) for k, l in enumerate(layers)]
            j = i - P + w
            if 1 <= j <= n_data:
                ops += [Op(base + m + k + 1, sn.index, "BW", l, j) for k, l in enumerate(reversed(layers)) if l > 1]
    return sorted(ops)


def total_slots(ops: Sequence[Op]) -> int:
    """Slots until the last op ends (the clock starts at slot 1)."""
    return max(op.slot for op in ops)


def theorem1_slots(L: int, M: int, n_data: int, horizontal: bool = False) -> int:
    """Theorem 1: 2L + 2M(N_data - 1) - n_cut, n_cut = 1, or N_data for Horizontal (M = L)."""
    return 2 * L + 2 * M * (n_data - 1) - (n_data if horizontal else 1)


def device_timeline(ops: Sequence[Op], sn: int, n_slots: int) -> list[tuple[str, int, int] | None]:
    """Super neuron sn's slots 1..n_slots: (kind, layer, data), or None for a stall."""
    out: list[tuple[str, int, int] | None] = [None] * n_slots
    for op in ops:
        if op.sn == sn and op.slot <= n_slots:
            if out[op.slot - 1] is not None:
                raise ValueError(f"super neuron {sn} has two ops in slot {op.slot}")
            out[op.slot - 1] = (op.kind, op.layer, op.data)
    return out


def check_schedule(p: Partition, ops: Sequence[Op], n_data: int) -> None:
    """Raises if the schedule is not executable: an op of every holder for every (layer,
    minibatch) FW and BW (BW_1 excepted), at most one op per super neuron per slot, FW_l after
    every FW_{l-1}, BW_L after FW_L, BW_l after every BW_{l+1}."""
    seen: dict[tuple[int, int], Op] = {}
    when: dict[tuple[str, int, int], list[int]] = {}
    for op in ops:
        if (op.sn, op.slot) in seen:
            raise ValueError(f"two ops on super neuron {op.sn} in slot {op.slot}: {seen[(op.sn, op.slot)]}, {op}")
        seen[(op.sn, op.slot)] = op
        when.setdefault((op.kind, op.layer, op.data), []).append(op.slot)
    for i in range(1, n_data + 1):
        for l in range(1, p.L + 1):
            need = [("FW", l)] + ([("BW", l)] if l > 1 else [])
            for kind, layer in need:
                got = len(when.get((kind, layer, i), []))
                if got != len(p.holders(layer)):
                    raise ValueError(f"{kind}_{layer} of minibatch {i}: {got} ops for {len(p.holders(layer))} holders")
            if l > 1 and min(when[("FW", l, i)]) <= max(when[("FW", l - 1, i)]):
                raise ValueError(f"FW_{l} of minibatch {i} before FW_{l - 1}")
        if min(when[("BW", p.L, i)]) <= max(when[("FW", p.L, i)]):
            raise ValueError(f"BW_{p.L} of minibatch {i} before FW_{p.L}")
        for l in range(2, p.L):
            if min(when[("BW", l, i)]) <= max(when[("BW", l + 1, i)]):
                raise ValueError(f"BW_{l} of minibatch {i} before BW_{l + 1}")


def minibatches_in_budget(p: Partition, budget_s: float, pipeline: bool = True, slot_s: float | None = None) -> int:
    """The most minibatches whose whole schedule fits in `budget_s` (Theorem 1 inverted; Table
    III's 194 min). `slot_s` defaults to Eq. (4) from Table II."""
    t = table_ii_slot_ms(p) / 1e3 if slot_s is None else slot_s
    slots = int(budget_s / t + 1e-9)
    first = slots_for(p, 1, pipeline)
    return 0 if slots < first else 1 + (slots - first) // cycle_slots(p, pipeline)


def slots_for(p: Partition, n_data: int, pipeline: bool = True) -> int:
    """Slots for n_data minibatches without listing them: every minibatch's ops are the first
    one's shifted by one cycle, so it is the first's latency + cycle x (n_data - 1). For uniform
    groups that is Theorem 1 (the first latency is L forward + L - 1 backward slots); with
    non-uniform groups the shorter groups' idle slots make the first latency longer."""
    return total_slots(schedule(p, 1, pipeline)) + cycle_slots(p, pipeline) * (n_data - 1)


def time_for_s(p: Partition, n_data: int, pipeline: bool = True, slot_s: float | None = None) -> float:
    """Simulated seconds for n_data minibatches (e.g. 20 epochs = 12000: Hybrid 249 min)."""
    t = table_ii_slot_ms(p) / 1e3 if slot_s is None else slot_s
    return slots_for(p, n_data, pipeline) * t


def throughput_ratio(p: Partition) -> float:
    """Pipelined over non-pipelined steady-state throughput at the same slot length: (2L - 1) /
    (2M) (Theorem 2's usable content; Hybrid vs Model = 11/4 = 2.75)."""
    return cycle_slots(p, False) / cycle_slots(p, True)


def packets_per_device_per_s(p: Partition, slot_s: float | None = None, pipeline: bool = True) -> float:
    """Messages per device per second in steady state: messages per minibatch / N / (cycle x slot)
    (Hybrid 28 / 6 / (4 x 0.31133 s) = 3.75, the paper's Fig. 6(a) figure)."""
    t = table_ii_slot_ms(p) / 1e3 if slot_s is None else slot_s
    return len(messages(p)) / len(p.super_neurons) / (cycle_slots(p, pipeline) * t)


def ops_of(p: Partition, pipeline: bool, sn: int, n_data: int) -> tuple[list[Op], int]:
    """Super neuron sn's ops of an n_data-minibatch schedule, and the schedule's last slot. The
    schedule is built once for all the super neurons of a process (a 194-minute budget has ~250 k
    ops): every role asks with an equal partition."""
    by_sn, last = _ops_by_super_neuron(p, pipeline, n_data)
    return by_sn.get(sn, []), last


@functools.lru_cache(maxsize=1)
def _ops_by_super_neuron(p: Partition, pipeline: bool, n_data: int) -> tuple[dict[int, list[Op]], int]:
    every = schedule(p, n_data, pipeline)
    by_sn: dict[int, list[Op]] = {}
    for op in every:
        by_sn.setdefault(op.sn, []).append(op)
    return by_sn, total_slots(every)
