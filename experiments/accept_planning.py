"""AccEPT's planning claims on the scenario devices, for experiments/accept_table5.py:

- Table 4.2.2 (the first 10 epochs where the links do not bind) under Table 2's partition points:
  the rows "Average partition" and "FTPipeHD" are what the devices' per-core speeds were fitted to
  (experiments/accept_calibrate.py), "LP" is held out; and the same with our own plans (the DP on
  FTPipeHD's ratio, on AccEPT's MLP and on the central node's profile for every device, FTPipeHD's
  "average partition"), whose cuts are set beside Table 2's.
- Fig. 4: FTPipeHD's per-layer estimate on worker d1 against its true time.
- The predictors' accuracy over every contiguous sub-model on each scenario device (Fig. 7's
  metric; its unseen Xeon Gold 6133 is scenario 1's worker).
- `true_cost_epoch_s`: a plan's epoch played out on the devices' own times (the oracle).
"""

from __future__ import annotations

from pathlib import Path

from experiments import accept_paper as paper
from experiments.verdicts import Claim, Ordering

NO_LINK_BOUND = "cluster.link.bandwidth_bps=inf"  # Table 4.2.2's bandwidth is not stated: the fit reads it as not binding


def true_cost_epoch_s(sched) -> float:
    """The scheduler's plan as its planner (framework.pipeline.cost) prices it with the devices' own times."""
    from plugins.predictors.basic import OraclePredictor

    ctx = sched.ctx
    held = ctx.predictor
    ctx.predictor = OraclePredictor(None)
    try:
        return sched.planner.predicted_epoch_s(sched.devices, sched.bounds)
    finally:
        ctx.predictor = held


def _cut_positions(last_layers) -> list[int]:
    """Table 2's 0-indexed last layers as our cut positions (the first unit of the next stage)."""
    return [c + 1 for c in last_layers]


def _last_layers(cuts) -> tuple[int, ...]:
    return tuple(c - 1 for c in cuts)


def average_cuts(job) -> list[int]:
    """FTPipeHD's average partition: the DP with every device taken as fast as the central node."""
    from framework.pipeline.partition import partition
    from plugins.predictors.basic import OraclePredictor

    d0 = job.cluster.device("dev0")
    n = int(job.cfg.cluster.num_devices)
    bounds = partition("dp", [d0] * n, len(job.model), job.model.name, OraclePredictor(None), int(job.cfg.train.batch_size), None)
    return [b for _, b in bounds[:-1]]


def fwd_bwd(predict, device, a: int, b: int, batch: int = 128) -> float:
    from framework.cluster import Work

    return sum(predict(device, Work(k, a, b, batch)) for k in ("fwd", "bwd"))


def accuracy(job) -> dict:
    """{device: (share within 5 %, within 10 %)} of the job's predictor over every sub-model."""
    from plugins.predictors.accept_data import submodels

    out = {}
    for name, dev in job.cluster.devices.items():
        err = [abs(fwd_bwd(job.predictor.predict, dev, a, b) / fwd_bwd(lambda d, w: d.time(w), dev, a, b) - 1) for a, b in submodels(len(job.model))]
        out[name] = (sum(e <= 0.05 for e in err) / len(err), sum(e <= 0.10 for e in err) / len(err))
    return out


def study(scenarios, quick: bool, in_flight: int | None, out: Path, command: str) -> dict:
    from experiments.accept_table5 import base_overrides, run_cell
    from experiments.study_runs import build_job

    claims, lines, results = [], ["## Table 4.2.2 and Table 2: where the links do not bind", "",
                                  "Seconds per mini-batch at `cluster.link.bandwidth_bps=inf` (Table 4.2.2's bandwidth is not stated), "
                                  "under Table 2's partition points (exact costs: `predictor=oracle`) and under our planners' own.", "",
                                  "| scenario | row | Table 2 cuts | paper s | ours s (paper's cuts) | role | our planner's cuts | ours s (own cuts) |", "|---|---|---|---|---|---|---|---|"], {}
    planners = {"average": None, "ftpipehd": "capacity", "lp": "accept_mobilenetv2"}
    for sc in scenarios:
        n = sc[-1]
        base = base_overrides(sc, quick, in_flight) + [NO_LINK_BOUND, "compressor=none"]
        job = build_job(base + ["predictor=capacity"], out / f"{sc}_probe")
        own_cuts = {"average": average_cuts(job)}
        for row, pred in planners.items():
            if pred:
                own_cuts[row] = [b for _, b in build_job(base + [f"predictor={pred}"], out / f"{sc}_{row}_plan").scheduler.bounds[:-1]]
        got = {}
        for row in planners:
            given = run_cell(base + ["predictor=oracle", f"scheduler.partition={_cut_positions(paper.TABLE2_CUTS[sc][row])}"], out / f"{sc}_{row}_paper_cuts")
            own = run_cell(base + ["predictor=oracle", f"scheduler.partition={own_cuts[row]}"], out / f"{sc}_{row}_own_cuts")
            got[row] = (given["per_batch_s"], own["per_batch_s"])
            ref = paper.per_batch_s(paper.TABLE422_MINUTES[sc][row], epochs=10)
            role = "held out" if row == "lp" else "fitted"
            lines.append(f"| {sc} | {row} | {paper.TABLE2_CUTS[sc][row]} | {ref:.4f} | {given['per_batch_s']:.4f} | {role} | {_last_layers(own_cuts[row])} | {own['per_batch_s']:.4f} |")
            if row == "lp":
                claims.append(Claim(f"S{n}: LP's 10 epochs under Table 2's cuts, s per mini-batch (held out of the fit)", ref, given["per_batch_s"], source="Table 4.2.2", command=command))
            claims.append(Ordering(f"S{n}: our {row} plan's partition points are Table 2's", str(paper.TABLE2_CUTS[sc][row]), str(_last_layers(own_cuts[row])),
                                   _last_layers(own_cuts[row]) == tuple(paper.TABLE2_CUTS[sc][row]), source="Table 2", command=command))
        t422 = paper.TABLE422_MINUTES[sc]
        for other in ("ftpipehd", "average"):
            claims.append(Claim(f"S{n}: {other} / LP, 10 epochs, our plans", t422[other] / t422["lp"], got[other][1] / got["lp"][1], source="Table 4.2.2", command=command))
        claims.append(Ordering(f"S{n}: LP faster than FTPipeHD, FTPipeHD faster than Average (our plans)", "LP < FTPipeHD < Average",
                               " < ".join(f"{r} {got[r][1]:.3f}" for r in sorted(got, key=lambda r: got[r][1])), got["lp"][1] < got["ftpipehd"][1] < got["average"][1],
                               source="Table 4.2.2", command=command))
        results[sc] = {"own_cuts": own_cuts, "per_batch_paper_cuts": {r: g[0] for r, g in got.items()}, "per_batch_own_cuts": {r: g[1] for r, g in got.items()}}
    lines += ["", "## FTPipeHD's per-layer estimate (Fig. 4) and the predictors' accuracy", "",
              "Fig. 4: each layer's forward + backward on worker dev1 (batch 128) by FTPipeHD's ratio (`predictor=capacity`) against the device's time. "
              "Accuracy: share of MobileNetV2's 210 contiguous sub-models predicted within 5 % / 10 % of the device's time.", "",
              "AccEPT's MLP as the study runs it (`predictor=accept_mobilenetv2`: pre-trained on transforms of the measured columns) and, for reference, "
              "pre-trained on analytic devices (`predictor=accept`, another device family than the scenarios').", "",
              "| scenario | device | FTPipeHD's ratio | AccEPT's MLP | AccEPT's MLP, analytic pool |", "|---|---|---|---|---|"]
    for sc in scenarios:
        n = sc[-1]
        acc = {}
        for pred in ("capacity", "accept_mobilenetv2", "accept"):
            job = build_job(base_overrides(sc, quick, in_flight) + [f"predictor={pred}"], out / f"{sc}_{pred}_accuracy")
            acc[pred] = accuracy(job)
            if pred == "capacity":
                d1 = job.cluster.device("dev1")
                err = [abs(fwd_bwd(job.predictor.predict, d1, j, j + 1) / fwd_bwd(lambda d, w: d.time(w), d1, j, j + 1) - 1) for j in range(len(job.model))]
                over = sum(e > 0.2 for e in err) / len(err)
                claims.append(Ordering(f"S{n}: most of d1's layers misestimated by FTPipeHD by more than 20 %", "most (Fig. 4)", f"{over:.0%} of 20 layers", over > 0.5,
                                       source="Fig. 4", command=command))
                claims.append(Claim(f"S{n}: FTPipeHD's largest per-layer error on d1", paper.FIG4_MAX_ERROR, max(err), source="Fig. 4", command=command))
                results.setdefault(sc, {})["fig4_errors"] = err
        for name in acc["accept"]:
            lines.append(f"| {sc} | {name} | " + " | ".join(f"{acc[p][name][0]:.0%} / {acc[p][name][1]:.0%}" for p in acc) + " |")
        for name in ("dev1", "dev2"):
            a5, a10 = acc["accept_mobilenetv2"][name]
            claims.append(Claim(f"S{n} {name}: AccEPT's MLP, sub-models within 5 %", paper.FIG7_PRETRAINED[0], a5, source="Fig. 7", command=command))
            claims.append(Claim(f"S{n} {name}: AccEPT's MLP, sub-models within 10 %", (paper.FIG7_PRETRAINED[1], 1.0), a10, source="Fig. 7", command=command))
            c5, c10 = acc["capacity"][name]
            claims.append(Ordering(f"S{n} {name}: AccEPT's MLP more accurate than FTPipeHD's ratio", "AccEPT above", f"5 %: {a5:.0%} vs {c5:.0%}; 10 %: {a10:.0%} vs {c10:.0%}",
                                   a5 > c5 and a10 > c10, source="Figs. 4, 7", command=command))
        results.setdefault(sc, {})["accuracy"] = {p: {k: list(v) for k, v in a.items()} for p, a in acc.items()}
    return {"claims": claims, "lines": lines, "results": results}
