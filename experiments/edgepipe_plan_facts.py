"""What the EdgePipe study measures without training (experiments/edgepipe_study.py): the
partition and traffic of the paper's main DNN (Alg. 1, Eq. 4, the super-neuron topology), the
cluster's per-op compute beside Table II (the one entry the preset is fitted to, and the held-out
rest), and the mapping's scores on each placement (Fig. 8: GA, Random over 5 trials, Upper)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from framework.config.knobs import choices
from plugins.schedulers.edgepipe.schema import SuperNeuronConfig

SIZES = (784, 128, 128, 128, 128, 10)  # Sec. V: the input layer, four hidden layers of 128, ten outputs
CLASSES = choices(SuperNeuronConfig, "partition_class")  # vertical, hybrid, horizontal
# Table II's columns as ops of a super neuron: (kind, layer); BW O->H is the output layer's
# backward (its weight gradient and the partial products for H4), BW H->H a hidden layer's
TABLE_II_OPS = {"fw_ih": ("FW", 2), "fw_hh": ("FW", 3), "fw_ho": ("FW", 6), "bw_oh": ("BW", 6), "bw_hh": ("BW", 3)}


def partition_facts() -> dict:
    """Per class on 6 devices (and Naive on 1): Eq. 1's M, Alg. 1's groups and devices, the widest
    message (Eq. 4's M_pkt), messages per minibatch and the SNNet anchors, Table II's slot."""
    from plugins.schedulers.edgepipe import partition as part
    from plugins.schedulers.edgepipe import timing

    out = {}
    for cls in CLASSES:
        p = part.partition(SIZES, 6, cls)
        counts = part.message_counts(p)
        out[cls] = {"m_layers": p.m_layers, "groups": [list(g) for g in p.groups], "devices": list(p.devices), "max_width": part.max_message_width(p),
                    "messages": int(counts.sum()), "counts": counts.tolist(), "table_ii_slot_ms": timing.table_ii_slot_ms(p),
                    "table_ii_minibatches": timing.minibatches_in_budget(p, timing.BUDGET_MIN * 60, True)}
    naive = part.partition(SIZES, 1, "vertical")
    out["naive"] = {"table_ii_slot_ms": timing.table_ii_slot_ms(naive), "table_ii_minibatches": timing.minibatches_in_budget(naive, timing.BUDGET_MIN * 60, True)}
    return out


def component_facts(out: Path) -> dict:
    """The cluster's time for each Table II op, per class: the slowest super neuron's (ms)."""
    from experiments.edgepipe_runs import FAST
    from experiments.study_runs import build_job

    res = {}
    for cls in CLASSES:
        job = build_job(FAST + ["experiment=edgepipe", f"scheduler.partition_class={cls}", "scheduler.lossy_test_passes=0"], out / f"components_{cls}")
        s = job.scheduler
        ops = [s.op_seconds(i, s.perm) for i in range(len(s.perm))]
        res[cls] = {col: 1e3 * max(o.get(key, 0.0) for o in ops) for col, key in TABLE_II_OPS.items()}
    return res


def mapping_facts(placements: list[int], generations: int | None = None) -> dict:
    """Fig. 8 on each placement's measured PRR (what the coordinator sees): the GA's score, the
    brute-force optimum (Upper) and Random's mean over 5 trials, per class."""
    from plugins.schedulers.edgepipe import channel, mapping
    from plugins.schedulers.edgepipe import partition as part

    out = {}
    for seed in placements:
        topo = channel.random_topology(seed, 6)
        row = {"mean_prr": channel.mean_prr(topo.true_prr)}
        for cls in CLASSES:
            sn = part.snnet(part.partition(SIZES, 6, cls))
            row[cls] = {"ga": mapping.ga_mapping(sn, topo.measured_prr, generations, 0).score, "upper": mapping.upper_mapping(sn, topo.measured_prr).score,
                        "random": mapping.random_baseline_score(sn, topo.measured_prr, mapping.RANDOM_TRIALS, 0),
                        "all_equal": bool(np.ptp(mapping.all_scores(sn, topo.measured_prr)) < 1e-9)}
        out[str(seed)] = row
    return out
