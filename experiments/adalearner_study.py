"""AdaLearner's Figs. 8, 9 and 11 as ratios, Algorithm 1's choices by both planners, the sensitivity of
the headline to the link, and two-sided verdicts for every claim of the paper.

    python experiments/adalearner_study.py                 # the full form (timing ~6 min, accuracy ~1 h on 2 cores)
    python experiments/adalearner_study.py --no-accuracy   # timing only
    python experiments/adalearner_study.py --quick         # fewer iterations and sweep points, no accuracy

1. Curves (timing only, `experiment=adalearner` / `adalearner_convnet` and the MLP 784-128-64-10):
   one global minibatch of 128 on n = 1..8 workers (every n the paper plots), fp32 and 1-bit; the
   steady-state iteration (the group owner's, the first left out), the speed-up over n = 1 (the
   group owner alone), the plan's FIFO prediction and the paper's Eq. 4 estimate for the same n,
   the communication share (1 - the slowest slice's compute / iteration), the codec share (Eq.
   8's 2 encodes and n + 1 decodes / iteration) and the channel's busy time per iteration.
2. Choices: Algorithm 1 with `scheduler.planner=fifo` (the default: the iteration as the FIFO star
   runs it) and `planner=paper` (Eq. 4, 7-9), each run, with its predicted / simulated epoch,
   beside the simulator's fastest n; for every model, and with fp32 only.
3. Sensitivity: LeNet's headline (fp32's best speed-up and where it peaks, 1-bit at n = 8) against
   the link rate and the wake-up, around the preset's (docs/calibration.md); and under the other
   reading of the MLP's quoted transfer time (a wake-up on every transfer, n = 3: half the rate).
4. Accuracy (slow; real Fashion-MNIST, MNIST is not offline here): the MLP and LeNet trained with
   fp32 (the group owner alone: fp32 over n workers is the same minibatch SGD, tested) and 1-bit
   over n = 2, 3, 4 workers; `runtime.threads=1`.

Writes <out>/report.md, results.json, scaling.png and sensitivity.png (each with its plotted numbers
beside it as .json, experiments/figure_data.py); prints the verdicts
(experiments/adalearner_claims.py). The exit status is 0 whatever the verdicts: a miss is a finding.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import adalearner_plots as plots  # noqa: E402
from experiments.adalearner_claims import CMD, accuracy_claims, timing_claims  # noqa: E402
from experiments.study_runs import build_job  # noqa: E402
from experiments.verdicts import as_json, print_verdicts, verdict_table  # noqa: E402

MODELS = {"lenet": ["experiment=adalearner"], "convnet": ["experiment=adalearner_convnet"], "mlp": ["experiment=adalearner", "model=mlp", "model.widths=[128,64]"]}
PAPER = {("lenet", "fp32", 4): 11.031 / 6.208, ("lenet", "onebit", 8): 11.031 / 3.276, ("lenet", "onebit", 2): 1.75,
         ("convnet", "fp32", 8): 14.780 / 3.976, ("convnet", "onebit", 8): 14.780 / 3.262}
WLAN = {"bandwidth_bps": 4.32e7, "wakeup_s": 0.1}  # the preset's (conf/cluster/adalearner_wlan.yaml), the sweeps' centre


def compose_job(overrides: list[str], out: Path, wakeup_s: dict | None = None):
    """`build_job`, with link wake-ups set by `src->dst` pattern (a link key has no command-line form)."""
    if not wakeup_s:
        return build_job(overrides, out)
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from framework.cli import CONF_DIR
    from framework.job import Job

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    with open_dict(cfg):
        for pattern, seconds in wakeup_s.items():
            cfg.cluster.links[pattern] = {"wakeup_s": seconds}
    return Job(cfg, out)


def timing_run(out: Path, extra: list[str], iterations: int, wakeup_s: dict | None = None) -> dict:
    """One timing-only run: its steady-state iteration, the plan, predicted / simulated epoch and
    the channel's busy seconds per iteration."""
    job = compose_job(["runtime.numerics=false", "tracking=none", "runtime.progress=false", "train.epochs=1",
                       f"train.iterations_per_epoch={iterations}", *extra], out, wakeup_s)
    summary = job.run()
    its = job.runtime.roles["go"].stats()["iteration_s"]
    steady = its[1:] if len(its) > 1 else its
    tl = job.runtime.timeline
    busy = sum(iv.end - iv.start for iv in tl.intervals if iv.resource in tl.links)
    return {"iteration_s": sum(steady) / len(steady), "plan": job.scheduler.plan(), "epoch_over_predicted": summary["prediction"]["epoch_over_predicted"],
            "channel_s": busy / len(its)}


def plan_only(out: Path, extra: list[str]) -> dict:
    return build_job(["runtime.numerics=false", "tracking=none", "train.epochs=1", *extra], out).scheduler.plan()


def curves(args) -> dict:
    res = {}
    for model, arch in itertools.product(MODELS, ("fp32", "onebit")):
        local = None
        for n in range(1, 9):
            over = [*MODELS[model], f"scheduler.workers={n}", f"scheduler.architecture={arch}"]
            r = timing_run(args.out / "runs" / f"{model}_{arch}_{n}", over, args.iterations)
            p = r["plan"]
            local = r["iteration_s"] if n == 1 else local
            eq4 = plan_only(args.out / "runs" / "plan", over + ["scheduler.planner=paper"])
            codec = (2 * p["codec_s"]["encode"] + (n + 1) * p["codec_s"]["decode"]) if p["scheme"] == "onebit" else 0.0
            res[(model, arch, n)] = {"iteration_s": r["iteration_s"], "speedup": local / r["iteration_s"], "predicted_s": p["predicted_iteration_s"],
                                     "epoch_over_predicted": r["epoch_over_predicted"], "eq4_s": eq4["predicted_iteration_s"],
                                     "comm_share": 1.0 - p["compute_s"] / r["iteration_s"] if n > 1 else 0.0, "codec_share": codec / r["iteration_s"],
                                     "channel_s": r["channel_s"], "sizes": [w["samples"] for w in p["workers"]]}
        print(f"{model:7s} {arch:6s} speed-up n=1..8: " + " ".join(f"{res[(model, arch, n)]['speedup']:.2f}" for n in range(1, 9)), flush=True)
    return res


def choices(args, res: dict) -> dict:
    """Algorithm 1 by both planners, run; and the simulator's fastest n among the curves."""
    out: dict = {"fp32_only": {}}
    for model in MODELS:
        out[model] = {}
        for planner in ("fifo", "paper"):
            r = timing_run(args.out / "runs" / f"{model}_{planner}", [*MODELS[model], f"scheduler.planner={planner}"], args.iterations)
            p = r["plan"]
            local = res[(model, "fp32", 1)]["iteration_s"]
            out[model][planner] = {"n": p["n"], "scheme": p["scheme"], "predicted_s": p["predicted_iteration_s"], "iteration_s": r["iteration_s"],
                                   "speedup": local / r["iteration_s"], "epoch_over_predicted": r["epoch_over_predicted"]}
        best = min(((a, n) for a in ("fp32", "onebit") for n in range(1, 9)), key=lambda k: res[(model, *k)]["iteration_s"])
        out[model]["simulator"] = {"n": best[1], "scheme": "local" if best[1] == 1 else best[0], "speedup": res[(model, *best)]["speedup"]}
        print(f"{model}: fifo picks n = {out[model]['fifo']['n']} ({out[model]['fifo']['scheme']}), paper n = {out[model]['paper']['n']} "
              f"({out[model]['paper']['scheme']}); simulator's fastest n = {best[1]} ({out[model]['simulator']['scheme']})", flush=True)
    for planner in ("fifo", "paper"):  # LeNet with fp32 only: the paper's "4 WNs is optimal"
        r = timing_run(args.out / "runs" / f"lenet_fp32_{planner}", [*MODELS["lenet"], "scheduler.architecture=fp32", f"scheduler.planner={planner}"], args.iterations)
        out["fp32_only"][planner] = {"n": r["plan"]["n"], "epoch_over_predicted": r["epoch_over_predicted"], "iteration_s": r["iteration_s"]}
    out["fp32_only"]["simulator"] = {"n": min(range(1, 9), key=lambda n: res[("lenet", "fp32", n)]["iteration_s"])}
    return out


def sensitivity(args, res: dict) -> dict:
    """LeNet's headline with one link constant scaled, the other at the preset's."""
    local = res[("lenet", "fp32", 1)]["iteration_s"]
    out = {}
    factors = (0.5, 1.0, 2.0) if args.quick else (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
    cases = [(key, f, WLAN[key] * f) for key, f in itertools.product(("bandwidth_bps", "wakeup_s"), factors)]
    cases.append(("per_transfer_n3", 1.0, WLAN["bandwidth_bps"] / 2))  # the other reading of the MLP's transfer time (docs/reproductions.md)
    for key, f, value in cases:
        over = [f"cluster.link.bandwidth_bps={value}"] if key != "wakeup_s" else []
        wake = {"wakeup_s": {"dev*->go": value}, "per_transfer_n3": {"dev*->go": WLAN["wakeup_s"], "go->dev*": WLAN["wakeup_s"]}}.get(key)
        t = {(a, n): timing_run(args.out / "runs" / "sens", [*MODELS["lenet"], f"scheduler.workers={n}", f"scheduler.architecture={a}", *over], args.iterations, wake)["iteration_s"]
             for a in ("fp32", "onebit") for n in range(2, 9)}
        peak = min(range(2, 9), key=lambda n: t[("fp32", n)])
        out[(key, f)] = {"value": value, "fp32_peak_n": peak, "fp32_peak": local / t[("fp32", peak)], "fp32_4": local / t[("fp32", 4)],
                         "onebit_8": local / t[("onebit", 8)], "onebit_2": local / t[("onebit", 2)]}
        print(f"{key} x{f}: fp32 best {out[(key, f)]['fp32_peak']:.2f}x at n = {peak}, 1-bit n = 8 {out[(key, f)]['onebit_8']:.2f}x", flush=True)
    return out


def accuracy(args) -> dict:
    out = {}
    common = ["dataset=fashion_mnist", "tracking=none", "runtime.progress=false", "runtime.threads=1"]
    for model, epochs in (("mlp", args.mlp_epochs), ("lenet", args.epochs)):
        base = [*MODELS[model], *common, f"train.epochs={epochs}"]
        acc = {"onebit": {}, "epochs": epochs}
        for arch, n in [("fp32", 1), ("onebit", 2), ("onebit", 3), ("onebit", 4)]:
            job = build_job([*base, f"scheduler.workers={n}", f"scheduler.architecture={arch}"], args.out / "runs" / f"acc_{model}_{arch}_{n}")
            s = job.run()
            a = s["metrics"]["test/acc"]
            if arch == "fp32":
                acc["fp32"] = a
            else:
                acc["onebit"][n] = a
            print(f"accuracy {model} {arch} n={n}: test {a:.4f} ({epochs} epochs)", flush=True)
        out[model] = acc
    return out


def report(args, res, picks, sens, acc, claims, seconds) -> list[str]:
    lines = ["# AdaLearner: Figs. 8, 9 and 11 as ratios", "",
             f"`{CMD}{' --quick' if args.quick else ''}` ({seconds:.0f} s): timing-only runs of {args.iterations} iterations per point (steady-state iteration: "
             "the first left out); speed-up over the group owner alone; paper in brackets.", ""]
    for model in MODELS:
        lines += [f"## {model}", "", "| n | fp32 | FIFO plan | Eq. 4 | 1-bit | FIFO plan | Eq. 4 | fp32 comm share | 1-bit codec share | epoch / predicted (fp32, 1-bit) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for n in range(1, 9):
            f, o = res[(model, "fp32", n)], res[(model, "onebit", n)]
            loc = res[(model, "fp32", 1)]["iteration_s"]
            pp = lambda a: f" ({PAPER[(model, a, n)]:.2f})" if (model, a, n) in PAPER else ""  # noqa: E731
            lines.append(f"| {n} | {f['speedup']:.2f}{pp('fp32')} | {loc / f['predicted_s']:.2f} | {loc / f['eq4_s']:.2f} | {o['speedup']:.2f}{pp('onebit')} | "
                         f"{loc / o['predicted_s']:.2f} | {loc / o['eq4_s']:.2f} | {f['comm_share']:.2f} | {o['codec_share']:.3f} | {f['epoch_over_predicted']:.3f}, {o['epoch_over_predicted']:.3f} |")
        lines.append("")
    lines += ["## Algorithm 1's choices", "", "| model | planner | n | scheme | speed-up | epoch / predicted |", "|---|---|---|---|---|---|"]
    for model in MODELS:
        for planner in ("fifo", "paper"):
            c = picks[model][planner]
            lines.append(f"| {model} | {planner} | {c['n']} | {c['scheme']} | {c['speedup']:.2f} | {c['epoch_over_predicted']:.3f} |")
        c = picks[model]["simulator"]
        lines.append(f"| {model} | simulator's fastest | {c['n']} | {c['scheme']} | {c['speedup']:.2f} | |")
    fo = picks["fp32_only"]
    lines += ["", f"fp32 only, LeNet: fifo picks n = {fo['fifo']['n']} (epoch / predicted {fo['fifo']['epoch_over_predicted']:.3f}), "
              f"paper (Eq. 4) n = {fo['paper']['n']} ({fo['paper']['epoch_over_predicted']:.3f}); the simulator's fastest n = {fo['simulator']['n']}; the paper's: 4.", ""]
    lines += ["## Sensitivity (LeNet)", "", "| constant | value | fp32 best (n) | fp32 n = 4 | 1-bit n = 2 | 1-bit n = 8 |", "|---|---|---|---|---|---|"]
    for (key, f), v in sens.items():
        name = "the other reading: a wake-up per transfer (both ways), B from n = 3" if key == "per_transfer_n3" else f"{key} x{f}"
        lines.append(f"| {name} | {v['value']:.4g} | {v['fp32_peak']:.2f} ({v['fp32_peak_n']}) | {v['fp32_4']:.2f} | {v['onebit_2']:.2f} | {v['onebit_8']:.2f} |")
    lines.append("")
    if acc:
        lines += ["## Accuracy (real Fashion-MNIST, test set)", "", "| model | epochs | fp32 | 1-bit n = 2 | n = 3 | n = 4 |", "|---|---|---|---|---|---|"]
        lines += [f"| {m} | {a['epochs']} | {a['fp32']:.4f} | " + " | ".join(f"{a['onebit'][n]:.4f}" for n in (2, 3, 4)) + " |" for m, a in acc.items()] + [""]
    lines += ["## Verdicts", "", *verdict_table(claims, with_command=True), "", "![scaling](scaling.png)", "", "![sensitivity](sensitivity.png)"]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="6 iterations per point, 3 sweep points, no accuracy")
    ap.add_argument("--iterations", type=int, default=None, help="simulated iterations per point (default 20; --quick 6)")
    ap.add_argument("--no-accuracy", dest="accuracy", action="store_false", help="skip the accuracy runs")
    ap.add_argument("--epochs", type=int, default=10, help="accuracy runs: LeNet's epochs (the paper reports epoch 20)")
    ap.add_argument("--mlp-epochs", type=int, default=10, help="accuracy runs: the MLP's epochs")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "adalearner_study")
    args = ap.parse_args()
    args.iterations = args.iterations or (6 if args.quick else 20)
    args.accuracy = args.accuracy and not args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = curves(args)
    picks = choices(args, res)
    n6 = {a: res[("mlp", a, 6)]["channel_s"] for a in ("fp32", "onebit")}
    claims = timing_claims(res, picks, n6)
    sens = sensitivity(args, res)
    acc = accuracy(args) if args.accuracy else {}
    if acc:
        claims += accuracy_claims(acc, f"{CMD} (accuracy: {args.epochs} epochs LeNet, {args.mlp_epochs} MLP)")
    plots.scaling(res, PAPER, args.out / "scaling.png")
    plots.sensitivity(sens, PAPER, args.out / "sensitivity.png")
    print_verdicts("AdaLearner", claims)
    lines = report(args, res, picks, sens, acc, claims, time.perf_counter() - t0)
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({"curves": {" ".join(map(str, k)): v for k, v in res.items()}, "choices": picks,
                                                       "sensitivity": {f"{k} {f}": v for (k, f), v in sens.items()}, "accuracy": acc, "verdicts": as_json(claims)}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
