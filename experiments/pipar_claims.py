"""PiPar's claims (Zhang et al., JPDC 2024; ../shared/papers/pipar.notes.md sections 4 and 6) as
two-sided verdicts over the study's results (experiments/pipar_study.py).

Each function takes the study's results and returns `Claim`s and `Ordering`s
(experiments/verdicts.py). A claim the paper makes over models we do not run (ResNet-18, the
large DNNs) is compared where our scope matches it, and says so in its note.
"""

from __future__ import annotations

from experiments.verdicts import Claim, NotRun, Ordering

NETS = ["pipar_4g", "pipar_4gplus", "pipar_wifi"]
NET_LABEL = {"pipar_4g": "4G", "pipar_4gplus": "4G+", "pipar_wifi": "WiFi"}
DATA_LABEL = {"synthetic_cifar10": "CIFAR-10", "synthetic_mnist": "MNIST"}
PAPER_K = 100
CMD = "python experiments/pipar_study.py"

# Table VII, the cases we run: (P, N, T, S, P_opt, N_opt, T_opt, S_opt)
TABLE7 = {
    ("vgg5", "synthetic_mnist", "pipar_4g"): (2, 4, 10.5, 1.7, 2, 4, 10.5, 481.8),
    ("vgg5", "synthetic_mnist", "pipar_4gplus"): (1, 10, 7.9, 1.4, 1, 11, 7.7, 477.0),
    ("vgg5", "synthetic_mnist", "pipar_wifi"): (1, 6, 4.5, 1.3, 1, 6, 4.5, 474.2),
    ("vgg5", "synthetic_cifar10", "pipar_4g"): (1, 12, 19.8, 6.2, 1, 12, 19.8, 2034.2),
    ("vgg5", "synthetic_cifar10", "pipar_4gplus"): (1, 6, 13.1, 4.5, 1, 8, 12.9, 1818.4),
    ("vgg5", "synthetic_cifar10", "pipar_wifi"): (1, 3, 10.3, 4.2, 1, 3, 10.3, 1816.2),
    ("mobilenetv3_small", "synthetic_cifar10", "pipar_4g"): (2, 8, 12.8, 4.1, 2, 8, 12.8, 33549.2),
    ("mobilenetv3_small", "synthetic_cifar10", "pipar_4gplus"): (1, 12, 8.4, 3.7, 1, 12, 8.4, 33382.1),
    ("mobilenetv3_small", "synthetic_cifar10", "pipar_wifi"): (1, 9, 6.7, 3.1, 1, 9, 6.7, 32780.5),
}
# S of VGG-5 / CIFAR-10 / WiFi calibrated the devices (experiments/calibrate_pipar.py): not a claim
CALIBRATION_CASE = ("vgg5", "synthetic_cifar10", "pipar_wifi")


def speed_claims(sp: dict, k: int) -> list:
    """Sec. V-B, Figs 4 and 6, for VGG-5 at K devices (`sp[(data, net, sched)]`)."""
    out: list = []
    scope = f"K = {k}" + ("" if k == PAPER_K else f" (the paper: {PAPER_K})")
    for ds in ("synthetic_cifar10", "synthetic_mnist"):
        for net in NETS:
            fl, sfl, pp = (sp[(ds, net, s)]["epoch_s"] for s in ("fl", "sfl", "pipar"))
            where = f"VGG-5, {DATA_LABEL[ds]}, {NET_LABEL[net]}, {scope}"
            out.append(Claim(f"{where}: T_FL / T_PiPar", (1.4, 3.4), fl / pp, source="Sec. V-B (Fig. 4a,d)", command=CMD))
            out.append(Claim(f"{where}: T_SFL / T_PiPar", (1.4, 2.0), sfl / pp, source="Sec. V-B (Fig. 4a,d)", command=CMD))
            out.append(Ordering(f"{where}: PiPar the fastest", "PiPar < FL, SFL", f"{pp:.2f} s vs FL {fl:.2f}, SFL {sfl:.2f}", pp < min(fl, sfl), source="Sec. V-B"))
        fl4, sfl4 = sp[(ds, "pipar_4g", "fl")]["epoch_s"], sp[(ds, "pipar_4g", "sfl")]["epoch_s"]
        out.append(Ordering(f"VGG-5, {DATA_LABEL[ds]}, 4G, {scope}: FL faster than SFL", "FL < SFL", f"FL {fl4:.2f} s, SFL {sfl4:.2f} s", fl4 < sfl4, source="Sec. V-B"))
        for net in ("pipar_4gplus", "pipar_wifi"):
            f, s_ = sp[(ds, net, "fl")]["epoch_s"], sp[(ds, net, "sfl")]["epoch_s"]
            out.append(Ordering(f"VGG-5, {DATA_LABEL[ds]}, {NET_LABEL[net]}, {scope}: SFL faster than FL", "SFL < FL", f"SFL {s_:.2f} s, FL {f:.2f} s", s_ < f, source="Sec. V-B"))
        for sched, paper in (("fl", 5.6), ("sfl", 59.0), ("pipar", 57.0)):
            ts = [sp[(ds, n, sched)]["epoch_s"] for n in NETS]
            out.append(Claim(f"VGG-5, {DATA_LABEL[ds]}, {scope}: {sched.upper() if sched != 'pipar' else 'PiPar'} epoch varies across 4G/4G+/WiFi (%)", paper, 100 * (max(ts) - min(ts)) / min(ts),
                             source="Sec. V-B", note="the paper's figure is over both datasets" if ds == "synthetic_mnist" else "", command=CMD))
        gains = {net: sp[(ds, net, "fl")]["epoch_s"] / sp[(ds, net, "pipar")]["epoch_s"] for net in NETS}
        out.append(Ordering(f"VGG-5, {DATA_LABEL[ds]}, {scope}: PiPar's gain over FL largest at the least bandwidth", "largest at 4G", ", ".join(f"{NET_LABEL[n]} {g:.2f}" for n, g in gains.items()),
                            max(gains, key=gains.get) == "pipar_4g", source="Sec. V-B"))
    ratios = [(sp[(ds, n, "fl")]["server_idle_s"] / sp[(ds, n, "pipar")]["server_idle_s"], sp[(ds, n, "sfl")]["server_idle_s"] / sp[(ds, n, "pipar")]["server_idle_s"],
               sp[(ds, n, "sfl")]["device_idle_s"] / sp[(ds, n, "pipar")]["device_idle_s"]) for ds in ("synthetic_cifar10", "synthetic_mnist") for n in NETS]
    note = "the paper's largest over VGG-5, ResNet-18 and MobileNetV3-Small; ours over VGG-5"
    out.append(Claim(f"VGG-5, {scope}: server idle FL / PiPar, the largest of the 6 cases", 64.1, max(r[0] for r in ratios), source="Sec. V-B (Fig. 6)", note=note, command=CMD))
    out.append(Claim(f"VGG-5, {scope}: server idle SFL / PiPar, the largest", 2.9, max(r[1] for r in ratios), source="Sec. V-B (Fig. 6)", note=note, command=CMD))
    out.append(Claim(f"VGG-5, {scope}: device idle SFL / PiPar, the largest", 23.1, max(r[2] for r in ratios), source="Sec. V-B (Fig. 6)", note=note, command=CMD))
    out.append(Ordering(f"VGG-5, {scope}: the FL server is idle most of the time", "FL server idle > half the epoch",
                        f"{min(sp[(ds, n, 'fl')]['server_idle_s'] / sp[(ds, n, 'fl')]['epoch_s'] for ds in ('synthetic_cifar10', 'synthetic_mnist') for n in NETS):.0%} of the epoch at least",
                        all(sp[(ds, n, "fl")]["server_idle_s"] > 0.5 * sp[(ds, n, "fl")]["epoch_s"] for ds in ("synthetic_cifar10", "synthetic_mnist") for n in NETS), source="Sec. V-B"))
    return out


def table7_claims(sp: dict, select: str, k: int) -> list:
    """Table VII's T (PiPar's epoch at K = 100) and the (P, N) the selection makes, VGG-5, K devices."""
    out: list = []
    for (model, ds, net), row in TABLE7.items():
        if model != "vgg5":
            continue
        r = sp[(ds, net, f"pipar_{select}")]
        where = f"VGG-5, {DATA_LABEL[ds]}, {NET_LABEL[net]}, K = {k}, select={select}"
        out.append(Claim(f"{where}: PiPar epoch T (s)", row[2], r["epoch_s"], source="Table VII", command=CMD))
        out.append(Ordering(f"{where}: the chosen P", f"P = {row[0]}", f"P = {r['P']}", r["P"] == row[0], source="Table VII"))
        out.append(Claim(f"{where}: the chosen N", float(row[1]), float(r["N"]), source="Table VII", command=CMD))
    for ds in ("synthetic_cifar10", "synthetic_mnist"):
        ns = [sp[(ds, net, f"pipar_{select}")]["N"] for net in NETS]
        out.append(Ordering(f"VGG-5, {DATA_LABEL[ds]}, select={select}: N falls as bandwidth rises (4G, 4G+, WiFi)", "non-increasing (CIFAR-10: 12, 6, 3)", ", ".join(map(str, ns)),
                            ns[0] >= ns[1] >= ns[2] and ns[0] > ns[2], source="Table VII"))
    return out


def hetero_claims(het: dict, hom: dict, k: int) -> list:
    """Sec. V-F1, Fig. 12: half the devices at 600 MHz instead of 1.2 GHz (VGG-5, CIFAR-10)."""
    out: list = []
    for net in NETS:
        fl, sfl, pp = (het[(net, s)]["epoch_s"] for s in ("fl", "sfl", "pipar"))
        where = f"VGG-5, CIFAR-10, {NET_LABEL[net]}, heterogeneous, K = {k}"
        out.append(Ordering(f"{where}: PiPar the fastest", "PiPar < FL, SFL", f"{pp:.2f} s vs FL {fl:.2f}, SFL {sfl:.2f}", pp < min(fl, sfl), source="Sec. V-F1"))
        growth = {s: het[(net, s)]["epoch_s"] / hom[("synthetic_cifar10", net, s)]["epoch_s"] for s in ("fl", "sfl", "pipar")}
        out.append(Ordering(f"{where}: FL slows down the most from the homogeneous testbed", "FL's growth > SFL's, PiPar's", ", ".join(f"{s} x{g:.2f}" for s, g in growth.items()),
                            growth["fl"] > max(growth["sfl"], growth["pipar"]), source="Sec. V-F1"))
    fl_best = max(het[(n, "fl")]["epoch_s"] / het[(n, "pipar")]["epoch_s"] for n in NETS)
    sfl_best = max(het[(n, "sfl")]["epoch_s"] / het[(n, "pipar")]["epoch_s"] for n in NETS)
    note = "the paper's largest over VGG-5, ResNet-18 and MobileNetV3-Small; ours over VGG-5"
    out.append(Claim(f"heterogeneous, K = {k}: T_FL / T_PiPar, the largest", 32.0, fl_best, source="Sec. V-F1", note=note, command=CMD))
    out.append(Claim(f"heterogeneous, K = {k}: T_SFL / T_PiPar, the largest", 1.8, sfl_best, source="Sec. V-F1", note=note, command=CMD))
    return out


def selection_claims(sel: dict, method: str) -> list:
    """Sec. V-D, Table VII: the selection against the exhaustive search, K = 100."""
    out: list = []
    scores, exact, p_ok, s_over_t, opt_over_s = [], 0, 0, [], []
    for key, r in sel.items():
        model, ds, net = key
        scores.append(r["score"])
        exact += r["exact"]
        p_ok += r["P"] == r["P_opt"]
        s_over_t.append(r["S"] / r["T"])
        opt_over_s.append(r["S_opt"] / r["S"])
        row = TABLE7[key]
        if key != CALIBRATION_CASE:  # that S calibrated the devices
            out.append(Claim(f"{model}, {DATA_LABEL[ds]}, {NET_LABEL[net]}: search cost S (s)", row[3], r["S"], source="Table VII", command=CMD,
                             note="held out from the calibration (VGG-5/CIFAR-10/WiFi)"))
        out.append(Claim(f"{model}, {DATA_LABEL[ds]}, {NET_LABEL[net]}: score T_opt / T_sel, select={method}", (0.96, 1.0), r["score"], source="Table VII", command=CMD))
    n = len(sel)
    out.append(Claim(f"select={method}: exact (P, N) optimum, share of the {n} cases", 0.833, exact / n, source="Sec. V-D", command=CMD))
    out.append(Claim(f"select={method}: the optimal P, share of cases", 1.0, p_ok / n, source="Sec. V-D", command=CMD))
    out.append(Claim(f"select={method}: mean search cost S / T", 0.27, sum(s_over_t) / n, source="Sec. V-D", note="the paper's mean over its 36 cases; ours over 9", command=CMD))
    vgg = [v for (m, _, _), v in zip(sel, opt_over_s) if m == "vgg5"]
    out.append(Claim("VGG-5: S_opt / S, the smallest", 283.0, min(vgg), source="Table VII (283-432x)", command=CMD))
    out.append(Claim("VGG-5: S_opt / S, the largest", 432.0, max(vgg), source="Table VII (283-432x)", command=CMD))
    return out


def accuracy_claims(acc: dict, data: str) -> list:
    """Tables V and VI, Figs 8 and 9: PiPar trains the same samples per iteration as FL."""
    out: list = []
    a = {s: acc[(data, s)]["test_acc"] for s in ("fl", "sfl", "pipar")}
    out.append(Claim(f"VGG-5, {data}: PiPar - max(FL, SFL) test accuracy (points)", (-0.2, 2.07), 100 * (a["pipar"] - max(a["fl"], a["sfl"])), source="Tables V, VI",
                     note="the paper's range over 12 model/data pairs", command=f"{CMD} --only accuracy"))
    out.append(Claim(f"VGG-5, {data}: PiPar - FL test accuracy (points)", (-0.2, 2.07), 100 * (a["pipar"] - a["fl"]), source="Table V (VGG-5: -0.02, -0.08)", command=f"{CMD} --only accuracy"))
    vl = {s: acc[(data, s)]["val_loss"] for s in ("fl", "sfl", "pipar")}
    gap = max(abs(vl["pipar"][e] - vl["fl"][e]) for e in range(min(3, len(vl["fl"]) - 1), len(vl["fl"])))
    out.append(Ordering(f"VGG-5, {data}: validation-loss curves overlap after epoch 3", "curves overlap (notes AC6: within 0.05)", f"largest |PiPar - FL| {gap:.3f}", gap <= 0.05,
                        source="Figs 8, 9"))
    return out


def dp_claims(dp: dict, k: int) -> list:
    """Sec. V-F2, Fig. 13: classic DP noise on uploaded device models, seconds per epoch added."""
    note = "the paper's largest over three models; ours VGG-5, CIFAR-10, WiFi"
    return [Claim(f"classic DP overhead per epoch, {s.upper() if s != 'pipar' else 'PiPar'}, K = {k} (s)", paper, dp[s], source="Sec. V-F2 (Fig. 13)", note=note, command=CMD)
            for s, paper in (("fl", 11.7), ("sfl", 0.16), ("pipar", 0.15))] + [
        Ordering("classic DP costs FL far more than SFL and PiPar", "FL >> SFL, PiPar", ", ".join(f"{s} {v:.3f} s" for s, v in dp.items()), dp["fl"] > 10 * max(dp["sfl"], dp["pipar"]), source="Sec. V-F2")]


# Sec. V-B: the other small DNNs' ranges over both datasets and the three networks
MODEL_RANGES = {"mobilenetv3_small": ("MobileNetV3-Small", (10.5, 34.6), (1.2, 2.3)), "resnet18": ("ResNet-18", (15.5, 30.5), (1.4, 2.2))}


def model_claims(other: dict, k: int) -> list:
    """T_FL / T_PiPar and T_SFL / T_PiPar of ResNet-18 and MobileNetV3-Small (Fig. 4b,c,e,f)."""
    out: list = []
    for model, (label, fl_range, sfl_range) in MODEL_RANGES.items():
        for ds in ("synthetic_cifar10", "synthetic_mnist"):
            for net in NETS:
                if (model, ds, net, "pipar") not in other:
                    continue
                fl, sfl, pp = (other[(model, ds, net, s)]["epoch_s"] for s in ("fl", "sfl", "pipar"))
                where = f"{label}, {DATA_LABEL[ds]}, {NET_LABEL[net]}, K = {k}"
                out.append(Claim(f"{where}: T_FL / T_PiPar", fl_range, fl / pp, source="Sec. V-B (Fig. 4)", command=CMD,
                                 note="our ResNet-18 keeps CIFAR's 32x32 stem (1.1 GFLOP a sample); the authors' has an ImageNet stem" if model == "resnet18" else ""))
                out.append(Claim(f"{where}: T_SFL / T_PiPar", sfl_range, sfl / pp, source="Sec. V-B (Fig. 4)", command=CMD))
    return out


def batch_claims(bs: dict) -> list:
    """Sec. V-E, Fig. 10 (VGG-5, CIFAR-10): time per epoch falls as the batch grows, and PiPar is
    the fastest at every batch size."""
    out: list = []
    sizes = sorted({b for _, b, _ in bs})
    for net in NETS:
        for b in sizes:
            fl, sfl, pp = (bs[(net, b, s)] for s in ("fl", "sfl", "pipar"))
            out.append(Ordering(f"VGG-5, CIFAR-10, {NET_LABEL[net]}, B = {b}: PiPar the fastest", "PiPar < FL, SFL", f"{pp:.2f} s vs FL {fl:.2f}, SFL {sfl:.2f}", pp < min(fl, sfl), source="Sec. V-E (Fig. 10)"))
        for s in ("fl", "sfl", "pipar"):
            ts = [bs[(net, b, s)] for b in sizes]
            out.append(Ordering(f"VGG-5, CIFAR-10, {NET_LABEL[net]}: {s} epoch falls as B grows ({', '.join(map(str, sizes))})", "decreasing", ", ".join(f"{t:.2f}" for t in ts),
                                all(a > b for a, b in zip(ts, ts[1:])), source="Sec. V-E"))
    return out


def reselection_claims(rs: dict) -> list:
    """Sec. V-F3, Fig. 14: re-selection overhead against the interval between bandwidth changes."""
    out = []
    paper = {60: 8.3, 600: (0.0, 1.0), 3600: (0.10, 0.14)}
    for interval, pct in sorted(rs.items()):
        p = paper.get(interval)
        if p is not None:
            out.append(Claim(f"re-selection overhead, a bandwidth change every {interval // 60} min (%)", p, pct, source="Sec. V-F3 (Fig. 14)", command=CMD,
                             note="the paper: up to 8.3 % at 1 min, < 1 % from 10 min, 0.10-0.14 % at 60 min"))
    ivs = sorted(rs)
    out.append(Ordering("re-selection overhead falls as the interval grows", "decreasing", ", ".join(f"{i // 60} min {rs[i]:.2f} %" for i in ivs), all(rs[a] > rs[b] for a, b in zip(ivs, ivs[1:])), source="Sec. V-F3"))
    return out


def not_run() -> list:
    """Claims of the notes this study does not check, and why."""
    why_large = "VGG-16, ResNet-101 and MobileNetV3-Large are not among this framework's models (the paper times them on CIFAR-100 and Tiny ImageNet)"
    return [
        NotRun("large DNNs: T_SFL / T_PiPar", "1.12-2.2", why_large, source="Sec. V-B (Fig. 5)"),
        NotRun("large DNNs: server idle SFL / PiPar, the largest", "2.3", why_large, source="Fig. 7"),
        NotRun("large DNNs: device idle SFL / PiPar, the largest", "2.5", why_large, source="Fig. 7"),
        NotRun("Table VIII: selection on the large DNNs", "score >= 0.96", why_large, source="Table VIII"),
        NotRun("Table VI: accuracy of the large DNNs", "-0.2..+2.07 points", why_large, source="Table VI"),
        NotRun("PixelDP overhead per epoch", "up to 0.3 s, comparable across methods", "PixelDP (a noise layer on the input) is not implemented; classic DP is", source="Sec. V-F2"),
        NotRun("Table V on MNIST and CIFAR-10", "VGG-5: 97.94 / 81.31 % (PiPar)", "MNIST and CIFAR-10 are not available offline: the accuracy part trains on real Fashion-MNIST", source="Table V"),
    ]
