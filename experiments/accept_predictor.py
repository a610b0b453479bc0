"""AccEPT's latency predictor against its baselines (Figs. 7-8): one command, one report.

    python experiments/accept_predictor.py              # MobileNetV2 (20 units), batch 32, 100 + 24 devices
    python experiments/accept_predictor.py --pool 40 --devices 8 --epochs 600   # quicker

1. Profiles every contiguous sub-model of the model (forward + backward) on this host on 1 and 2
   cores (accept_data.profile_host: one thread's CPU seconds at the batch and at half of it;
   cached in <out>/profile_<model>_b<batch>.npz; --reprofile times again).
2. Builds `--devices` synthetic devices, each a seeded non-linear transform of a host profile
   (plugins/predictors/accept_data.py: speed, per-layer-kind factors, saturation, launch
   overhead, 2 % noise).
3. The dual-stream MLP (plugins/predictors/accept_mlp.py) pre-trains on every sub-model of
   `--pool` devices (the paper's D), then predicts each held-out device's sub-models from its
   hardware vector (its 10 representative sub-models), before and after the adaptive update with
   2..14 of its own samples (the 10 representatives first, as the paper's evaluation does, then
   random others). The held-out devices are other seeds of the same generator: unseen devices,
   as the paper's Xeon Gold 6133 was to its 24 configurations.
4. Baselines on the same device: `flops` (time linear in FLOPs, least squares on the 10
   representatives), `capacity` (FTPipeHD: a central node's per-layer profile scaled by the ratio
   measured on one sub-model) and `lut` (the device's own single-unit times, summed).

Prints and writes <out>/report.md and accuracy.png: the share of all sub-models predicted within
+-5 % and +-10 %, averaged over the held-out devices, and two-sided verdicts (experiments/
verdicts.py): Fig. 7's pre-trained shares (about 88 % within 5 %, over 95 % within 10 %), Fig. 8's
after the adaptive update with 8 samples (about 90 % and 96 %), and its orderings (AccEPT above
the FLOPs and LUT baselines, and above FTPipeHD's ratio, Fig. 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import accept_paper as paper  # noqa: E402
from experiments.verdicts import Claim, Ordering, as_json, print_verdicts, verdict_table  # noqa: E402

from plugins.predictors import accept_data as ad  # noqa: E402
from plugins.predictors.accept_mlp import LatencyPredictor  # noqa: E402

SAMPLES = (0, 2, 4, 8, 14)
CENTRAL_SEED = 1000  # FTPipeHD's central node: a device of its own, outside the pool
POOL_SEED = 10_000  # the pre-training devices' seeds: disjoint from the held-out ones


def host_profile(args) -> tuple[ad.ModelFacts, dict]:
    path = args.out / f"profile_{args.model}_b{args.batch}.npz"
    if path.exists() and not args.reprofile:
        facts, host, _ = ad.load(path)
        print(f"host profile: {path} (cached; --reprofile to time again)")
        return facts, host
    import torch
    from hydra import compose, initialize_config_dir

    from framework import registry
    from framework.cli import CONF_DIR
    from framework.models import build_model

    registry.load_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={args.model}", f"dataset={args.dataset}"])
    torch.manual_seed(0)
    from framework.data import build_dataset

    ds = build_dataset(cfg.dataset)
    model = build_model(cfg.model, ds.input_shape, ds.num_classes)
    t0 = time.perf_counter()
    host = ad.profile_host(model, args.batch, [1, 2], args.repeats, progress=print)
    facts = ad.model_facts(model)
    ad.save(path, facts, host, args.batch)
    print(f"host profile: {path} ({time.perf_counter() - t0:.0f} s)")
    return facts, host


def within(pred: np.ndarray, true: np.ndarray, tol: float) -> float:
    return float(np.mean(np.abs(pred - true) / true <= tol))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenetv2")
    ap.add_argument("--dataset", default="synthetic_cifar10")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--devices", type=int, default=24, help="held-out devices evaluated")
    ap.add_argument("--pool", type=int, default=100, help="devices the predictor pre-trains on")
    ap.add_argument("--epochs", type=int, default=1500, help="pre-training epochs (full batch)")
    ap.add_argument("--reprofile", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "accept_predictor")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    facts, host = host_profile(args)
    L, subs = facts.L, ad.submodels(facts.L)
    flops = {ab: facts.flops(*ab) for ab in subs}
    reps = ad.representatives(flops)
    masks = np.stack([ad.mask(L, a, b) for a, b in subs])
    devices = [ad.SyntheticDevice(seed, facts, host) for seed in range(args.devices)]
    pool = [ad.SyntheticDevice(POOL_SEED + seed, facts, host) for seed in range(args.pool)]
    central = ad.SyntheticDevice(CENTRAL_SEED, facts, host)
    per_layer0 = np.array([central.time(j, j + 1) for j in range(L)])
    fl = np.array([flops[ab] for ab in subs])
    rows = {d.seed: (np.repeat(d.hardware_vector(reps)[None], len(subs), 0), d.times()) for d in devices + pool}
    results = {k: {"5": [], "10": []} for k in ["flops", "capacity", "lut"] + [f"accept_{n}" for n in SAMPLES]}
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    base = LatencyPredictor(L, seed=0).fit(np.concatenate([masks] * len(pool)), np.concatenate([rows[d.seed][0] for d in pool]),
                                          np.concatenate([rows[d.seed][1] for d in pool]), epochs=args.epochs)
    fit_s = time.perf_counter() - t0
    print(f"pre-trained on {len(pool)} devices x {len(subs)} sub-models in {fit_s:.0f} s", flush=True)
    state = {k: v.clone() for k, v in base.net.state_dict().items()}
    for i, d in enumerate(devices):
        true = d.times()
        h = rows[d.seed][0]
        order = [subs.index(r) for r in reps] + [j for j in rng.permutation(len(subs)) if subs[j] not in reps]
        preds = {}
        for n in SAMPLES:
            base.net.load_state_dict(state)
            if n:
                pick = order[:n]
                base.adapt(masks[pick], h[pick], true[pick])
            preds[f"accept_{n}"] = base.predict(masks, h)
        rep_idx = [subs.index(r) for r in reps]
        A = np.stack([fl[rep_idx], np.ones(len(rep_idx))], 1)
        coef, *_ = np.linalg.lstsq(A, true[rep_idx], rcond=None)
        preds["flops"] = np.maximum(coef[0] * fl + coef[1], 1e-9)
        mid = reps[5]  # the worker's current sub-model: the middle representative
        ratio = d.time(*mid) / per_layer0[mid[0]:mid[1]].sum()
        preds["capacity"] = np.array([ratio * per_layer0[a:b].sum() for a, b in subs])
        preds["lut"] = np.array([sum(d.time(j, j + 1) for j in range(a, b)) for a, b in subs])
        for k, p in preds.items():
            results[k]["5"].append(within(p, true, 0.05))
            results[k]["10"].append(within(p, true, 0.10))
        print(f"device {i + 1}/{len(devices)} (seed {d.seed}, {d.threads} core(s), speed {d.speed:.2f}): "
              + ", ".join(f"{k} {100 * results[k]['5'][-1]:.0f}/{100 * results[k]['10'][-1]:.0f}" for k in ("flops", "capacity", "lut", "accept_0", "accept_8")), flush=True)
    summary = {k: {t: float(np.mean(v)) for t, v in r.items()} for k, r in results.items()}
    a0, a8 = summary["accept_0"], summary["accept_8"]
    command = "python experiments/accept_predictor.py"
    claims = [Claim("pre-trained, unseen devices: share within 5 %", paper.FIG7_PRETRAINED[0], a0["5"], source="Fig. 7", command=command),
              Claim("pre-trained, unseen devices: share within 10 %", (paper.FIG7_PRETRAINED[1], 1.0), a0["10"], source="Fig. 7", command=command),
              Claim("after 8 adaptation samples: share within 5 %", paper.FIG8_ADAPTED[0], a8["5"], source="Fig. 8", command=command),
              Claim("after 8 adaptation samples: share within 10 %", paper.FIG8_ADAPTED[1], a8["10"], source="Fig. 8", command=command),
              Ordering("the adaptive update does not lower accuracy (8 samples against none)", "rises, converging at about 8",
                       f"{100 * a0['5']:.1f} -> {100 * a8['5']:.1f} % within 5 %", a8["5"] >= a0["5"], source="Fig. 8", command=command)]
    for base in ("flops", "lut", "capacity"):
        b = summary[base]
        claims.append(Ordering(f"AccEPT (pre-trained) more accurate than {base}", "AccEPT above, both tolerances",
                               f"5 %: {100 * a0['5']:.1f} vs {100 * b['5']:.1f}; 10 %: {100 * a0['10']:.1f} vs {100 * b['10']:.1f}",
                               a0["5"] > b["5"] and a0["10"] > b["10"], source="Figs. 4, 7", command=command))
    print_verdicts("AccEPT, the latency predictor (Figs. 7-8)", claims)
    wall = time.perf_counter() - t_start
    lines = ["# AccEPT latency predictor on held-out devices", "",
             f"{facts.name} ({L} units, {len(subs)} sub-models), batch {args.batch}; synthetic devices from this host's 1- and 2-core profiles: "
             f"pre-training on {len(pool)} ({args.epochs} epochs, {fit_s:.0f} s), evaluated on {len(devices)} others; {wall:.0f} s in all "
             "(`python experiments/accept_predictor.py`).", "",
             "| predictor | within 5 % | within 10 % |", "|---|---|---|"]
    for k, v in summary.items():
        names = {"flops": "FLOPs (linear fit on the 10 representatives)", "capacity": "capacity (FTPipeHD ratio)", "lut": "LUT (the device's own per-unit times)"}
        label = names[k] if k in names else f"AccEPT, {k.split('_')[1]} adaptation samples"
        lines.append(f"| {label} | {100 * v['5']:.1f} % | {100 * v['10']:.1f} % |")
    lines += ["", "![accuracy](accuracy.png)", "", "## Verdicts", ""] + verdict_table(claims, with_command=True)
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "per_device": results, "verdicts": as_json(claims)}, indent=1))
    plot(summary, args.out / "accuracy.png")
    print("\n".join(lines))
    return 0


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for t, style in (("5", "-o"), ("10", "--s")):
        ax.plot(SAMPLES, [100 * summary[f"accept_{n}"][t] for n in SAMPLES], style, color="C0", label=f"AccEPT, within {t} %")
        for k, c in (("flops", "C1"), ("capacity", "C2"), ("lut", "C3")):
            ax.axhline(100 * summary[k][t], color=c, ls=":" if t == "5" else "-.", lw=1, label=f"{k}, within {t} %")
    ax.set_xlabel("adaptation samples from the held-out device")
    ax.set_ylabel("sub-models predicted (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
