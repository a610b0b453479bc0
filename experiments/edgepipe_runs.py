"""The EdgePipe study's runs (experiments/edgepipe_study.py): its configurations, one run of one
configuration on one placement, and what the study keeps of it (a JSON record)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# dataset.n_val=0: train on all 60 k images, 600 minibatches a data epoch, as the paper counts
# "epoch e, step s" (the preset holds 5 k out for validation, which this study never reads)
FAST = ["tracking=none", "runtime.progress=false", "dataset.n_val=0"]
BUDGET_MIN = 194.0  # Table III
FIG9B_EXPONENTS = (2.9, 3.1, 3.3, 3.5, 3.7)  # Table I's range of path-loss exponents, tested only (Fig. 9(b))


@dataclass(frozen=True)
class Config:
    overrides: tuple[str, ...]
    label: str
    placed: bool = True  # False: lossless, so every placement gives the same run: run once
    every_placement: bool = False  # True: on every placement; False: on the first few only (CPU time)
    max_placements: int | None = None  # fewer still (Fig. 9(e)'s three 4-device runs: the first placement)
    curve: bool = False  # test accuracy over time (time to 80 %, Fig. 7)
    budget_factor: float = 1.0  # x the budget (Model runs longer: its time to 80 % may pass 194 min)
    fig9b: bool = False  # also tested at other path-loss exponents (Fig. 9(b))
    group: str = "main"  # main | recovery | devices4 | ablation


CONFIGS = {
    "hybrid": Config((), "Hybrid (EdgePipe)", curve=True, fig9b=True, every_placement=True),
    "vertical": Config(("scheduler.partition_class=vertical",), "Vertical (PipeDream core)", fig9b=True, every_placement=True),
    "horizontal": Config(("scheduler.partition_class=horizontal",), "Horizontal", fig9b=True),
    "model": Config(("scheduler.pipeline=false",), "Model (no pipelining)", curve=True, budget_factor=2.5),
    "naive": Config(("scheduler.partition_class=vertical", "scheduler.n_devices=1", "scheduler.prr.source=cluster"), "Naive (1 device, lossless)", placed=False),
    "wo_failure": Config(("scheduler.prr.source=cluster",), "Hybrid w/o failure (lossless)", placed=False),
    "rtx": Config(("scheduler.recovery=rtx",), "Hybrid + r-TX", group="recovery"),
    "ack": Config(("scheduler.recovery=ack",), "Hybrid + ACK", group="recovery"),
    "hybrid_n4": Config(("scheduler.n_devices=4",), "Hybrid, 4 devices", group="devices4", max_placements=1),
    "vertical_n4": Config(("scheduler.partition_class=vertical", "scheduler.n_devices=4"), "Vertical, 4 devices", group="devices4", max_placements=1),
    "horizontal_n4": Config(("scheduler.partition_class=horizontal", "scheduler.n_devices=4"), "Horizontal, 4 devices", group="devices4", max_placements=1),
    # the notes' proposal for a lost logit share (2.10): train on the zero-filled view; the default
    # (abort) applies the paper's all-or-nothing backward to the output layer too
    "hybrid_zero_fill": Config(("scheduler.share_missing=zero_fill",), "Hybrid, share zero-fill", group="ablation"),
    "horizontal_zero_fill": Config(("scheduler.partition_class=horizontal", "scheduler.share_missing=zero_fill"), "Horizontal, share zero-fill", group="ablation"),
}


@dataclass(frozen=True)
class Settings:
    budget_min: float
    passes: int  # lossy test passes of a trained model (the paper's 100 test runs)
    curve_every_min: float
    curve_passes: int
    fig9b_passes: int
    seed: int = 0  # the training seed, the same on every placement: only the placement changes

    def key(self) -> dict:
        return dict(self.__dict__)

    def relevant(self, name: str) -> dict:
        """The settings a run of `name` depends on (a resumed study reuses a record that matches)."""
        c = CONFIGS[name]
        skip = (set() if c.curve else {"curve_every_min", "curve_passes"}) | (set() if c.fig9b else {"fig9b_passes"})
        return {k: v for k, v in self.key().items() if k not in skip}


def overrides(name: str, placement: int | None, s: Settings) -> list[str]:
    c = CONFIGS[name]
    over = ["experiment=edgepipe", f"seed={s.seed}", f"scheduler.budget_min={s.budget_min * c.budget_factor}",
            f"scheduler.lossy_test_passes={s.passes}", f"scheduler.lossy_test_seed={s.seed}", *c.overrides]
    if placement is not None:
        over.append(f"scheduler.prr.topology_seed={placement}")
    if c.curve:
        over += [f"scheduler.eval_every_min={s.curve_every_min}", f"scheduler.eval_passes={s.curve_passes}"]
    return over


def run(name: str, placement: int | None, s: Settings, out: Path) -> dict:
    """One run of configuration `name` on `placement` (None: the preset's, for a lossless one);
    its record."""
    from experiments.study_runs import build_job

    t0 = time.perf_counter()
    over = overrides(name, placement, s)
    job = build_job(FAST + over, out)
    summ = job.run()
    plan, ep = job.scheduler.plan(), summ["edgepipe"]
    lossy = ep["lossy_test"]
    if "error" in lossy:
        raise RuntimeError(f"{name} on placement {placement}: lossy test failed: {lossy['error']}")
    rec = {"name": name, "placement": placement, "overrides": over, "test_acc": summ["metrics"]["test/acc"], "lossy": lossy["acc"],
           "mean": lossy["mean"], "std": lossy["std"], "min": lossy["min"], "frac_below_0.3": lossy["frac_below_0.3"],
           "minibatches": ep["budget"]["minibatches"], "slots": ep["budget"]["slots"], "paper_epoch_step": ep["budget"]["paper_epoch_step"],
           "virtual_s": summ["virtual_time_s"], "slot_s": plan["slot_s"], "worst_op_s": plan["worst_op_s"], "worst_message_s": plan["worst_message_s"],
           "mean_prr": plan["prr"]["mean_true"], "min_prr": _min_link(plan["prr"]["true"]), "mapping": plan["mapping"]["devices"],
           "messages_per_minibatch": plan["messages_per_minibatch"], "max_message_width": plan["max_message_width"],
           "cycle_slots": plan["cycle_slots"], "partition": {k: plan["partition"][k] for k in ("groups", "devices_per_group", "m_layers", "P", "effective_class")},
           "prediction": summ["prediction"], "bwd_applied": ep["bwd_applied"], "fwd_arrival": ep["fwd_arrival"], "transmissions": ep["transmissions"]}
    if "curve" in ep:
        if "error" in ep["curve"]:
            raise RuntimeError(f"{name} on placement {placement}: curve failed: {ep['curve']['error']}")
        rec["curve"] = ep["curve"]
    c = CONFIGS[name]
    if c.budget_factor != 1.0:
        rec["at_budget"] = at_budget(job, s)
    if c.fig9b:
        rec["fig9b"] = test_at_exponents(job, s)
    if name == "naive":  # Table III's budget is when Naive's train loss drops below 0.5
        rec["train_loss"] = train_loss(job)
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _min_link(prr) -> float:
    a = np.asarray(prr, dtype=float)
    return float(a[~np.eye(len(a), dtype=bool)].min()) if len(a) > 1 else 1.0


def train_loss(job) -> float:
    """The trained model's cross-entropy over the whole training split."""
    import torch
    import torch.nn.functional as F

    x, y = job.context.dataset.split("train")
    with torch.no_grad():
        return float(F.cross_entropy(job.final_model()(x), y))


def at_budget(job, s: Settings) -> dict:
    """A run longer than the budget, as it stood at the budget: its snapshot nearest the budget
    (the study's grid has one on it), with the final test's passes; and the minibatches it had
    completed by then."""
    from plugins.schedulers.edgepipe import curve
    from plugins.schedulers.edgepipe.lossy_eval import lossy_test
    from plugins.schedulers.edgepipe.timing import cycle_slots, slots_for

    sched = job.scheduler
    ev = sched.plan()["eval"]
    target = s.budget_min * 60.0
    k = min(range(len(ev["at_s"])), key=lambda i: abs(ev["at_s"][i] - target))
    states = {r: st for r, st in sched.final_states.items() if curve.SNAP_SLOTS in st}
    layers = curve.layers_at(sched.partition, states, k, sched.trained_layers())
    x, y = job.context.dataset.split("test")
    res = lossy_test(sched.partition, layers, x, y, sched.test_prr(), s.passes, s.seed)
    p, pipe, slots = sched.partition, bool(sched.cfg.pipeline), ev["at_slots"][k]
    first, cyc = slots_for(p, 1, pipe), cycle_slots(p, pipe)
    done = 0 if slots < first else 1 + (slots - first) // cyc  # minibatches whose last op is in
    return {"t_min": ev["at_s"][k] / 60.0, "slots": slots, "minibatches": done, "lossy": res["acc"], "mean": res["mean"], "std": res["std"],
            "min": res["min"], "frac_below_0.3": res["frac_below_0.3"], "acc": curve.lossless_acc(layers, x, y)}


def test_at_exponents(job, s: Settings) -> dict:
    """Fig. 9(b): the trained model tested where the path-loss exponent differs from training's
    (the same placement and mapping; only the channel at test time changes)."""
    from plugins.schedulers.edgepipe import channel
    from plugins.schedulers.edgepipe.lossy_eval import lossy_test

    sched = job.scheduler
    pl, cfg = sched.plan()["prr"], sched.cfg.prr
    layers = sched.trained_layers()
    x, y = job.context.dataset.split("test")
    out = {}
    for n in FIG9B_EXPONENTS:
        true = channel.prr_matrix(np.array(pl["positions_m"]), n=n, sigma_db=float(cfg.sigma_db), k_db=float(cfg.k_margin_db))
        res = lossy_test(sched.partition, layers, x, y, sched.test_prr(true), s.fig9b_passes, [s.seed, int(round(n * 10))])
        out[f"{n:.1f}"] = {"mean_prr": channel.mean_prr(true), "mean": res["mean"], "std": res["std"]}
    return out
