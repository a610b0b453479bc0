"""The feature-replay study's plots (PNG), from the parts' results; returns the files it wrote."""

from __future__ import annotations

from pathlib import Path

from experiments import figure_data

COLORS = {"block": "#4c72b0", "fixed": "#dd8452", "group": "#55a868", "discard": "#c44e52"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def staleness_sensitivity(results: dict, out: Path) -> str | None:
    """The headline (serial / K) against the staleness bound K, Pi 8-bit, block policy: simulated
    with the replay charged and without, and what the paper's Eq. 12 predicts."""
    pl = results.get("planner")
    if not pl:
        return None
    plt = _plt()
    case = pl["rows"][0]["case"]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    data = {"figure": f"feature replay speed-up over serial (K = 0) against the staleness bound K, {case}, block policy (group barrier: charged only)", "notes_4_3": 2.59}
    for charged, style in ((True, "-"), (False, "--")):
        rows = [r for r in pl["rows"] if r["case"] == case and r["policy"] == "block" and r["replay_charged"] == charged]
        serial = next(r for r in rows if r["K"] == 0)
        ks = [r for r in rows if r["K"] is not None]
        x = [r["K"] for r in ks]
        lines = data["replay charged" if charged else "replay free"] = {"K": x, "simulated": [serial["virtual_s"] / r["virtual_s"] for r in ks], "eq12": [serial["eq12_s"] / r["eq12_s"] for r in ks]}
        ax.plot(x, lines["simulated"], style, marker="o", color="#4c72b0", label=f"simulated, replay {'charged' if charged else 'free'}")
        ax.plot(x, lines["eq12"], style, marker="x", color="#8c8c8c", label=f"Eq. 12, replay {'charged' if charged else 'free'}")
        group = [r for r in pl["rows"] if r["case"] == case and r["policy"] == "group" and r["replay_charged"] == charged and r["K"] is not None]
        if charged:
            lines["group_K"], lines["group_simulated"] = [r["K"] for r in group], [serial["virtual_s"] / r["virtual_s"] for r in group]
            ax.plot(lines["group_K"], lines["group_simulated"], ":", marker="s", color=COLORS["group"], label="simulated, group barrier")
    ax.axhline(2.59, color="#c44e52", lw=0.8, label="notes 4.3: 2.59x")
    ax.set_xlabel("staleness bound K")
    ax.set_ylabel("speed-up over serial (K = 0)")
    ax.set_title("Pi 4B, ResNet-50, cut 1, 8-bit, 5/10 MB/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    figure_data.save(fig, out / "sensitivity_k.png", data, dpi=120)
    plt.close(fig)
    return "sensitivity_k.png"


def bandwidth_sensitivity(results: dict, out: Path) -> str | None:
    bw = results.get("bandwidth")
    if not bw:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    data = {"figure": "feature replay s per 100 iterations against the uplink MB/s (downlink twice): K = 5 at the engine's cut (labelled), JointDNN, edge-only", "devices": {}}
    for ax, (dev, r) in zip(axes, bw.items()):
        x = [p["up_MiBps"] for p in r["points"]]
        data["devices"][dev] = {"uplink_MBps": x, "feature_replay_s": [p["fr"]["virtual_s"] for p in r["points"]], "cut": [p["fr"]["cut"] for p in r["points"]],
                                "jointdnn_s": [p["jointdnn"]["virtual_s"] for p in r["points"]], "edge_only_s": r["edge_only_s"]}
        ax.plot(x, [p["fr"]["virtual_s"] for p in r["points"]], marker="o", label="feature replay (K = 5, engine's cut)")
        ax.plot(x, [p["jointdnn"]["virtual_s"] for p in r["points"]], marker="s", label="JointDNN (serial, best cut)")
        ax.axhline(r["edge_only_s"], color="#8c8c8c", ls="--", label="edge-only")
        for p in r["points"]:
            ax.annotate(str(p["fr"]["cut"]), (p["up_MiBps"], p["fr"]["virtual_s"]), fontsize=7, textcoords="offset points", xytext=(0, 5))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("uplink MB/s (downlink twice)")
        ax.set_ylabel("s per 100 iterations")
        ax.set_title(f"{dev}, ResNet-50 (labels: the engine's cut)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    figure_data.save(fig, out / "sensitivity_bandwidth.png", data, dpi=120)
    plt.close(fig)
    return "sensitivity_bandwidth.png"


def planner(results: dict, out: Path) -> str | None:
    """Simulated / predicted epoch for every run of the planner grid: the policy-aware plan and Eq. 12."""
    pl = results.get("planner")
    if not pl:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    data = {"figure": "feature replay simulated / predicted epoch of every planner run, per staleness policy (band 0.9-1.1)", "band": [0.9, 1.1]}
    for ax, key, title in ((axes[0], "over_planned", "plan (policy-aware, default)"), (axes[1], "eq12", "the paper's Eq. 12")):
        for i, policy in enumerate(COLORS):
            rows = [r for r in pl["rows"] if r["policy"] == policy]
            ys = [r["over_planned"] if key == "over_planned" else r["virtual_s"] / r["eq12_s"] for r in rows]
            data.setdefault(title, {})[policy] = ys
            ax.scatter([i + 0.15 * (j % 5 - 2) / 2 for j in range(len(ys))], ys, s=10, color=COLORS[policy])
        ax.axhspan(0.9, 1.1, color="#dddddd", zorder=0)
        ax.set_xticks(range(len(COLORS)), list(COLORS))
        ax.set_title(title)
    axes[0].set_ylabel("simulated / predicted epoch")
    fig.tight_layout()
    figure_data.save(fig, out / "planner.png", data, dpi=120)
    plt.close(fig)
    return "planner.png"


def accuracy(results: dict, out: Path) -> str | None:
    if "accuracy" not in results and "compression" not in results:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    data = {"figure": "feature replay test accuracy (%), mean and std over seeds: staleness (VGG-5, cut 2), uplink codec (cut 3)"}
    for ax, part, names in ((axes[0], "accuracy", ["K0", "K5", "unbounded"]), (axes[1], "compression", ["K0_fp32", "fp32", "8bit_ef", "8bit_no_ef"])):
        r = results.get(part)
        if not r:
            ax.axis("off")
            continue
        data[part] = {n: {"mean": 100 * r[n]["mean"], "std": 100 * r[n]["std"], "per_seed": [100 * a for a in r[n]["test_acc"]]} for n in names}
        ax.bar(names, [100 * r[n]["mean"] for n in names], yerr=[100 * r[n]["std"] for n in names], color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][:len(names)])
        lo = min(100 * min(r[n]["test_acc"]) for n in names)
        ax.set_ylim(max(0, lo - 5), 100)
        ax.set_ylabel("test accuracy (%)")
        ax.set_title({"accuracy": "staleness (VGG-5, cut 2)", "compression": "uplink codec (cut 3; K = 5 unless K0)"}[part])
    fig.tight_layout()
    figure_data.save(fig, out / "accuracy.png", data, dpi=120)
    plt.close(fig)
    return "accuracy.png"


def drift(results: dict, out: Path) -> str | None:
    if "drift" not in results:
        return None
    plt = _plt()
    d = results["drift"]["std"]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    data = {"figure": "feature replay edge weight drift std(w^t - w^(t-K)) per epoch (Fig. 4)", "std": {f"K = {k}": d[k] for k in sorted(d, key=int)}}
    for k in sorted(d, key=int):
        ax.plot(range(len(d[k])), d[k], marker="o", label=f"K = {k}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("std(w^t - w^(t-K))")
    ax.set_title("edge weight drift (Fig. 4)")
    ax.legend()
    fig.tight_layout()
    figure_data.save(fig, out / "drift.png", data, dpi=120)
    plt.close(fig)
    return "drift.png"


def adaptivity(results: dict, out: Path) -> str | None:
    if "adaptivity" not in results:
        return None
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(7, 4.2), sharex=True)
    data = {"figure": "feature replay adaptivity: the cut (steps at (time s, cut)) and the uplink MB/s over virtual time, per trace", "traces": {}}
    for ax, (name, r) in zip(axes, results["adaptivity"].items()):
        a, b = r["drop_s"]
        end = r["virtual_s"]
        cut_t, cut_v = [0.0], [1]
        for m in r["migrations"]:
            cut_t += [m["time_s"], m["done_s"]]
            cut_v += [cut_v[-1], m["to"]]
        cut_t.append(end)
        cut_v.append(cut_v[-1])
        data["traces"][name] = {"cut_steps": [[t, v] for t, v in zip(cut_t, cut_v)], "uplink_steps": [[0, 12.5], [a, 0.5], [b, 12.5], [end, 12.5]]}
        ax.step(cut_t, cut_v, where="post", color="#c44e52", label="cut (units on the edge)")
        ax.set_ylabel("cut")
        ax.set_ylim(0, 20)
        bw = ax.twinx()
        bw.step([0, a, b, end], [12.5, 0.5, 12.5, 12.5], where="post", color="#4c72b0", alpha=0.6, label="uplink MB/s")
        bw.set_ylabel("uplink MB/s")
        ax.set_title(f"{name}: drop to 0.5/1 MB/s during [{a:g}, {b:g}) s")
    axes[-1].set_xlabel("virtual time (s)")
    fig.tight_layout()
    figure_data.save(fig, out / "adaptivity.png", data, dpi=120)
    plt.close(fig)
    return "adaptivity.png"


def all_plots(results: dict, out: Path) -> list[str]:
    made = [f(results, out) for f in (staleness_sensitivity, bandwidth_sensitivity, planner, accuracy, drift, adaptivity)]
    return [m for m in made if m]
