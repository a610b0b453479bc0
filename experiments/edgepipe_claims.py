"""Every claim of the EdgePipe notes (../shared/papers/edgepipe.notes.md sections 4 and 6.2) beside
the study's number, as two-sided verdicts (experiments/verdicts.py).

`res` is the study's results: `runs[name]` the records of a configuration (one per placement,
experiments/edgepipe_runs.py), `plan` the facts measured without training
(experiments/edgepipe_plan_facts.py). Accuracies are means over the placements of each
placement's mean over its lossy test passes; a "spread" over placements is best minus worst.

Where the paper states a quality rather than a number, the claim is an ordering; where the notes
had to turn it into a test (Vertical's "binary" accuracy, "slightly short"), their test is used
and named. Claims whose configurations did not run are left out (the report says which).
"""

from __future__ import annotations

import statistics

from experiments.verdicts import Claim, Ordering
from plugins.schedulers.edgepipe.curve import time_to
from plugins.schedulers.edgepipe.timing import theorem1_slots

# Table III and the paper's text (notes section 4)
TABLE_III = {"vertical": (541.77, 21510, 10750), "hybrid": (311.33, 37431, 9356), "horizontal": (172.86, 67416, 6128), "naive": (441.42, 26400, 2400)}
TABLE_II = {
    "vertical": {"fw_ih": 341.42, "fw_hh": 49.04, "fw_ho": 4.24, "bw_oh": 6.94, "bw_hh": 79.34},
    "hybrid": {"fw_ih": 161.15, "fw_hh": 24.87, "fw_ho": 2.19, "bw_oh": 2.30, "bw_hh": 21.27},
    "horizontal": {"fw_ih": 56.09, "fw_hh": 8.66, "fw_ho": 1.49, "bw_oh": 0.87, "bw_hh": 14.86},
}
COLUMNS = {"fw_ih": "FW I->H", "fw_hh": "FW H->H", "fw_ho": "FW H->O", "bw_oh": "BW O->H", "bw_hh": "BW H->H"}
CMD = "python experiments/edgepipe_study.py"


def pct(name: str, res: dict) -> list[float]:
    """A configuration's accuracy (%) per placement: the lossy test's mean; a run longer than the
    budget (Model) as it stood at the budget."""
    return [100 * (r["at_budget"]["mean"] if "at_budget" in r else r["mean"]) for r in res["runs"][name]]


def pct_on(name: str, res: dict, placements) -> list[float]:
    """pct() on the given placements only (the side groups run on the first few)."""
    at = dict(zip((r["placement"] for r in res["runs"][name]), pct(name, res)))
    return [at[p] for p in placements]


def placements_of(name: str, res: dict) -> list:
    return [r["placement"] for r in res["runs"][name]]


def mean(xs) -> float:
    return statistics.mean(xs) if xs else float("nan")


def spread(xs) -> float:
    return max(xs) - min(xs) if xs else float("nan")


def _span(xs) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"


def plan_claims(res: dict) -> list:
    """Partition, traffic and Table II's components: no training needed."""
    pf, comp = res["plan"]["partition"], res["plan"].get("components", {})
    hy = pf["hybrid"]
    out = [
        Claim("Eq. 1: M_layers, L = 6, N = 6", paper=2, ours=hy["m_layers"], band=0.0, source="Sec. IV-A, Fig. 2(b)"),
        Ordering("Alg. 1: Hybrid's layer groups and devices per group", paper="[[1,2],[3,4],[5,6]]; [2,2,2]", ours=f"{hy['groups']}; {hy['devices']}",
                 holds=hy["groups"] == [[1, 2], [3, 4], [5, 6]] and hy["devices"] == [2, 2, 2], source="Fig. 2(b)"),
    ]
    for cls, want in (("vertical", 784), ("hybrid", 392), ("horizontal", 131)):
        out.append(Claim(f"Eq. 4: widest message, values per sample, {cls}", paper=want, ours=pf[cls]["max_width"], band=0.0, source="Sec. V (M_pkt)"))
    c = hy["counts"]
    out += [Claim("SNNet: passes Dev5 <-> Dev6 per minibatch (the maximum)", paper=3, ours=c[4][5], band=0.0, source="Sec. IV-B",
                  note=f"largest pair: {max(max(r) for r in c)}"),
            Claim("SNNet: passes Dev3 -> Dev4 per minibatch", paper=2, ours=c[2][3], band=0.0, source="Sec. IV-B")]
    for cls, want in (("vertical", 9), ("hybrid", 28), ("horizontal", 300)):
        out.append(Claim(f"messages per minibatch, {cls}", paper=want, ours=pf[cls]["messages"], band=0.0, source="notes 2.6 (the ownership model)"))
    for cls, cols in TABLE_II.items():
        for col, want in cols.items():
            if cls in comp:
                out.append(Claim(f"Table II: {cls} {COLUMNS[col]}, ms", paper=want, ours=comp[cls][col], source="Table II",
                                 note=FITTED_NOTE.get((cls, col), "held out")))
    return out


FITTED_NOTE = {("hybrid", "fw_ih"): "fitted (device.flops_per_s)", ("hybrid", "bw_hh"): "ratio to FW H->H fitted (device.backward_ratio)"}


def timing_claims(res: dict) -> list:
    runs, out = res["runs"], []
    budget = res["settings"]["budget_min"]
    scale = budget / 194.0  # a shorter budget (--quick) compares with Table III scaled to it
    for cls, (slot_ms, slots, minibatches) in TABLE_III.items():
        if cls not in runs:
            continue
        r = runs[cls][0]  # the slot and the budget do not depend on the placement (identical links)
        scaled = "" if scale == 1 else f"; Table III x {scale:g}"
        out += [Claim(f"slot, {cls}, ms", paper=slot_ms, ours=1e3 * r["slot_s"], source="Table III (Eq. 4)"),
                Claim(f"timeslots in {budget:g} min, {cls}", paper=round(slots * scale), ours=r["slots"], source="Table III", note=scaled.lstrip("; ")),
                Claim(f"minibatches in {budget:g} min, {cls}", paper=round(minibatches * scale), ours=r["minibatches"], source="Table III",
                      note="epoch {}, step {}".format(*r["paper_epoch_step"]) + scaled)]
    every = [r for recs in runs.values() for r in recs]
    bad = [f"{r['name']}@{r['placement']}" for r in every if round(r["virtual_s"] / r["slot_s"]) != thm1(r)]
    out.append(Ordering("Theorem 1: every run takes 2L + 2M(N - 1) - 1 slots ((2L - 1)N unpipelined)", paper="exact",
                        ours=f"{len(every) - len(bad)} of {len(every)} runs" + (f"; off: {', '.join(bad)}" if bad else ""), holds=not bad, source="Theorem 1"))
    if "hybrid" in runs:
        from plugins.schedulers.edgepipe import partition as part
        from plugins.schedulers.edgepipe import timing
        from experiments.edgepipe_plan_facts import SIZES

        r = runs["hybrid"][0]
        p = part.partition(SIZES, 6, "hybrid")
        out.append(Claim("Hybrid: minutes to epoch 20 (12 000 minibatches)", paper=249, ours=timing.time_for_s(p, 12000, True, r["slot_s"]) / 60,
                         source="Fig. 6(a) text"))
        out.append(Claim("Hybrid: packets per device per second", paper=3.75, ours=r["messages_per_minibatch"] / 6 / (r["cycle_slots"] * r["slot_s"]),
                         source="Fig. 6(a) text"))
        if "model" in runs:
            out.append(Claim("Theorem 2: steady-state speed-up of pipelining, Hybrid vs Model", paper=2.75,
                             ours=runs["model"][0]["cycle_slots"] / r["cycle_slots"], source="Theorem 2 (notes 2.8: (2L - 1) / 2M)"))
    return out


def thm1(r: dict) -> int:
    """Theorem 1's slots for a run's minibatches (uniform groups)."""
    pt = r["partition"]
    L, n = 6, r["minibatches"]
    if pt["P"] == 1 or "scheduler.pipeline=false" in r["overrides"]:
        return (2 * L - 1) * n
    return theorem1_slots(L, pt["m_layers"], n)


def mapping_claims(res: dict) -> list:
    mf = res["plan"].get("mapping")
    if not mf:
        return []
    rows = list(mf.values())
    n = len(rows)
    eq_v = sum(abs(r["vertical"]["ga"] - r["vertical"]["upper"]) < 1e-9 for r in rows)
    beats = sum(r[c]["ga"] > r[c]["random"] for r in rows for c in ("vertical", "hybrid"))
    ratio = min(r["hybrid"]["ga"] / r["hybrid"]["upper"] for r in rows)
    same = sum(r["horizontal"]["all_equal"] for r in rows)
    return [
        Ordering("Fig. 8: the GA finds Upper's mapping for Vertical", paper="GA = Upper", ours=f"on {eq_v} of {n} placements", holds=eq_v == n, source="Sec. V-C"),
        Ordering("Fig. 8: the GA beats Random (5 trials) for Vertical and Hybrid", paper="on every placement", ours=f"{beats} of {2 * n}", holds=beats == 2 * n, source="Sec. V-C"),
        Ordering("Fig. 8: the GA is similar to Upper for Hybrid (score)", paper="GA ~ Upper", ours=f"GA / Upper >= {ratio:.4f}", holds=ratio >= 0.99,
                 source="Sec. V-C", note="notes 6.2 item 3: >= 0.99"),
        Ordering("Fig. 8: every mapping is alike for Horizontal", paper="all similar", ours=f"all scores equal on {same} of {n}", holds=same == n, source="Sec. V-C"),
    ]


def common(res: dict, *names: str) -> list:
    """The placements every one of `names` ran on (Hybrid and Vertical run on all of them, the
    others on the first few), in order."""
    sets = [set(placements_of(n, res)) for n in names]
    return [p for p in placements_of(names[0], res) if all(p in s for s in sets)]


def recs_on(name: str, res: dict, placements) -> list[dict]:
    at = {r["placement"]: r for r in res["runs"][name]}
    return [at[p] for p in placements]


def accuracy_claims(res: dict) -> list:
    runs, out = res["runs"], []
    have = lambda *names: all(n in runs for n in names)  # noqa: E731
    if "hybrid" in runs:
        prr = [100 * r["mean_prr"] for r in runs["hybrid"]]
        out.append(Claim("average PRR over the placements, %", paper=80.9, ours=mean(prr), source="Sec. V", note=f"per placement {_span(prr)}"))
        h = pct("hybrid", res)
        out.append(Claim(f"Hybrid test accuracy at {res['settings']['budget_min']:g} min, %", paper=80.01, ours=mean(h), source="Fig. 9(f) 'Ours'", note=f"per placement {_span(h)}"))
    if have("hybrid", "vertical"):
        on = common(res, "hybrid", "vertical")
        h, v = pct_on("hybrid", res, on), pct_on("vertical", res, on)
        out += [Claim("Hybrid - Vertical, points", paper=18.05, ours=mean(h) - mean(v), source="Fig. 6(b)", note=f"per placement {_span([a - b for a, b in zip(h, v)])}"),
                Claim("Hybrid / Vertical accuracy", paper=2.13, ours=mean(h) / mean(v), source="abstract", note="the abstract's 2.13x is in no figure (notes 4)")]
        vs = pooled(recs_on("vertical", res, on))
        out.append(Ordering("Vertical's test accuracy is binary", paper="binary CDF (Fig. 6(c))", ours=f"std {vs['std']:.3f}, {100 * vs['below']:.0f} % of passes < 30 %",
                            holds=vs["std"] >= 0.15 and vs["below"] >= 0.10, source="Fig. 6(c)", note="notes 6.2 4b: std >= 0.15 and >= 10 % of passes < 30 %"))
        out += placement_claims(h, v)
    if have("hybrid", "vertical", "horizontal"):
        on = common(res, "hybrid", "vertical", "horizontal")
        h, v, z = (pct_on(n, res, on) for n in ("hybrid", "vertical", "horizontal"))
        where = f"placements {on}"
        out += [Claim("Hybrid - Horizontal, points", paper=67.25, ours=mean(h) - mean(z), source="Fig. 6(b)", note=f"{where}: {_span([a - b for a, b in zip(h, z)])}"),
                Ordering("Hybrid > Vertical > Horizontal", paper="Hybrid best (Fig. 6(b))", ours=f"{mean(h):.1f} > {mean(v):.1f} > {mean(z):.1f} ({where}); on "
                         f"{sum(a > b > c for a, b, c in zip(h, v, z))} of {len(h)}", holds=mean(h) > mean(v) > mean(z), source="Fig. 6(b)")]
        sd = {n: mean([r["std"] for r in recs_on(n, res, on)]) for n in ("hybrid", "vertical", "horizontal")}
        out.append(Ordering("Hybrid is the most stable over test passes", paper="Hybrid most stable (Fig. 6(b))",
                            ours=", ".join(f"{n} {v:.3f}" for n, v in sd.items()), holds=sd["hybrid"] <= min(sd.values()), source="Fig. 6(b)",
                            note=f"std over a model's test passes, mean over {where}"))
        fa = {n: mean([statistics.mean(r["fwd_arrival"].values()) for r in recs_on(n, res, on)]) for n in ("hybrid", "vertical", "horizontal")}
        out.append(Ordering("Vertical has the highest average layer-to-layer propagation success", paper="Vertical highest (Fig. 5(c))",
                            ours=", ".join(f"{n} {v:.3f}" for n, v in fa.items()), holds=fa["vertical"] >= max(fa.values()), source="Fig. 5(c)",
                            note=f"forward messages that arrived in training, mean over layers and {where}"))
    if have("wo_failure", "naive"):
        w, n = pct("wo_failure", res)[0], pct("naive", res)[0]
        out.append(Ordering(f"w/o Failure matches or beats Naive in {res['settings']['budget_min']:g} min", paper="similar to / surpasses Naive (Fig. 5, 11)", ours=f"{w:.2f} vs {n:.2f}",
                            holds=w >= n, source="Fig. 5, 11"))
    if "naive" in runs and "train_loss" in runs["naive"][0]:
        out.append(Claim(f"Naive's train loss at {res['settings']['budget_min']:g} min", paper=0.5, ours=runs["naive"][0]["train_loss"],
                         source="Table III (the budget: Naive's loss < 0.5)", note="cross-entropy of the final model on the training set"))
    if have("wo_failure", "hybrid"):
        d = pct("wo_failure", res)[0] - mean(pct("hybrid", res))
        out.append(Ordering("Hybrid slightly short of w/o Failure", paper="slightly short (Fig. 5, 11)", ours=f"{d:+.2f} points", holds=0 < d <= 8,
                            source="Fig. 5, 11", note="notes 6.2 4e: in (0, 8] points"))
    if have("hybrid", "model"):
        on = common(res, "model", "hybrid")
        h, m = pct_on("hybrid", res, on), pct_on("model", res, on)
        out.append(Ordering(f"Hybrid beats Model at {res['settings']['budget_min']:g} min", paper="EdgePipe > Model (Fig. 7, 11)", ours=f"{mean(h):.2f} vs {mean(m):.2f} (placements {on}); on "
                            f"{sum(a > b for a, b in zip(h, m))} of {len(h)}", holds=mean(h) > mean(m), source="Fig. 7, 11"))
        out += time_to_80(res)
    return out


def pooled(recs: list[dict]) -> dict:
    accs = [a for r in recs for a in r["lossy"]]
    return {"std": mean([r["std"] for r in recs]), "below": sum(a < 0.3 for a in accs) / len(accs)}


def placement_claims(h: list[float], v: list[float]) -> list:
    """Fig. 9(c): the spread over placements."""
    if len(h) < 2:
        return []
    return [Claim("Vertical: best - worst placement, points", paper=28.8, ours=spread(v), source="Fig. 9(c)", note=f"{len(v)} placements; the paper's count is not given"),
            Claim("Hybrid: best - worst placement, points", paper=13.76, ours=spread(h), source="Fig. 9(c)", note=f"{len(h)} placements"),
            Ordering("placement moves Vertical more than Hybrid", paper="28.8 > 13.76 points", ours=f"{spread(v):.1f} vs {spread(h):.1f}", holds=spread(v) > spread(h),
                     source="Fig. 9(c)"),
            Claim("Hybrid / Vertical, the largest over placements", paper=1.58, ours=max(a / b for a, b in zip(h, v)), source="Fig. 9(c)")]


def time_to_80(res: dict) -> list:
    """Fig. 7: time to > 80 % test accuracy, Model over Hybrid, per placement on the lossy curve."""
    on = common(res, "model", "hybrid")
    hy, mo = recs_on("hybrid", res, on), recs_on("model", res, on)
    if not on or "curve" not in hy[0] or "curve" not in mo[0]:
        return []
    ratios, missing = [], []
    for a, b in zip(hy, mo):
        th, tm = time_to(a["curve"], 0.80), time_to(b["curve"], 0.80)
        if th is None or tm is None:
            missing.append(f"placement {a['placement']}: " + ("Hybrid" if th is None else "Model") + " never reached 80 %")
        else:
            ratios.append(tm / th)
    note = f"{len(ratios)} of {len(hy)} placements" + (f"; {'; '.join(missing)}" if missing else "") + (f"; per placement {_span(ratios)}" if ratios else "")
    if not ratios:
        return [Ordering("time to 80 % test accuracy, Model / Hybrid", paper="2.47 (Fig. 7)", ours="80 % not reached", holds=False, source="Fig. 7", note=note)]
    return [Claim("time to 80 % test accuracy, Model / Hybrid", paper=2.47, ours=mean(ratios), source="Fig. 7", note=note)]


def recovery_claims(res: dict) -> list:
    runs, out = res["runs"], []
    for name, acc, factor, key in (("rtx", 84.62, 2.0, "data_per_message"), ("ack", 85.97, 2.16, "packets_per_message")):
        if name not in runs:
            continue
        a = pct(name, res)
        f = mean([r["transmissions"][key] for r in runs[name]])
        out += [Claim(f"{name}: test accuracy, %", paper=acc, ours=mean(a), source="Fig. 9(f)", note=f"placements {placements_of(name, res)}: {_span(a)}"),
                Claim(f"{name}: transmissions per message", paper=factor, ours=f, source="Fig. 9(f)",
                      note="data frames" if key == "data_per_message" else "data + ACK frames (data alone {:.2f})".format(mean([r["transmissions"]["data_per_message"] for r in runs[name]])))]
    if all(n in runs for n in ("hybrid", "rtx", "ack")) and placements_of("rtx", res) == placements_of("ack", res):
        on = placements_of("rtx", res)
        h, r, a = mean(pct_on("hybrid", res, on)), mean(pct("rtx", res)), mean(pct("ack", res))
        out.append(Ordering("recovery helps: Ours < r-TX < ACK", paper="80.01 < 84.62 < 85.97", ours=f"{h:.2f} < {r:.2f} < {a:.2f} (placements {on})",
                            holds=h < r < a, source="Fig. 9(f)"))
    return out


def exponent_claims(res: dict) -> list:
    """Fig. 9(b): trained at exponent 3.1, tested at 2.9-3.7."""
    runs = res["runs"]
    if not all(n in runs and "fig9b" in runs[n][0] for n in ("hybrid", "vertical", "horizontal")):
        return []
    on = common(res, "hybrid", "vertical", "horizontal")
    ns = list(runs["hybrid"][0]["fig9b"])
    acc = {c: {n: 100 * mean([r["fig9b"][n]["mean"] for r in recs_on(c, res, on)]) for n in ns} for c in ("hybrid", "vertical", "horizontal")}
    best = sum(acc["hybrid"][n] >= max(acc[c][n] for c in acc) for n in ns)
    dh, dv = acc["hybrid"][ns[0]] - acc["hybrid"][ns[-1]], acc["vertical"][ns[0]] - acc["vertical"][ns[-1]]
    return [Ordering("tested at other path-loss exponents: Hybrid the best in most cases", paper="Hybrid highest in most cases (Fig. 9(b))",
                     ours=f"best at {best} of {len(ns)} exponents ({ns[0]}-{ns[-1]}; placements {on})", holds=best > len(ns) / 2, source="Fig. 9(b)"),
            Ordering("Vertical is damaged more than Hybrid as the channel worsens", paper="Hybrid not seriously affected, Vertical severely (Fig. 9(b))",
                     ours=f"exponent {ns[0]} -> {ns[-1]}: Hybrid -{dh:.1f}, Vertical -{dv:.1f} points", holds=dv > dh, source="Fig. 9(b)")]


def devices4_claims(res: dict) -> list:
    runs = res["runs"]
    if not all(n in runs for n in ("hybrid_n4", "vertical_n4", "horizontal_n4")):
        return []
    h, v, z = pct("hybrid_n4", res), pct("vertical_n4", res), pct("horizontal_n4", res)
    return [Claim("4 devices: Hybrid - Vertical, points", paper=25.98, ours=mean(h) - mean(v), source="Fig. 9(e)",
                  note=f"placements {placements_of('hybrid_n4', res)}: {_span([a - b for a, b in zip(h, v)])}"),
            Claim("4 devices: Hybrid - Horizontal, points", paper=64.02, ours=mean(h) - mean(z), source="Fig. 9(e)", note=f"per placement {_span([a - b for a, b in zip(h, z)])}")]


def all_claims(res: dict) -> list:
    claims = plan_claims(res) + timing_claims(res) + mapping_claims(res) + accuracy_claims(res) + recovery_claims(res) + exponent_claims(res) + devices4_claims(res)
    for c in claims:
        c.command = CMD
    return claims


def planner_rows(res: dict) -> list[tuple[str, float, float, float]]:
    """(configuration, predicted epoch s, simulated epoch s, simulated / predicted), the worst
    placement of each configuration (the issue's acceptance: within 10 %)."""
    out = []
    for name, recs in res["runs"].items():
        worst = max(recs, key=lambda r: abs(r["prediction"]["epoch_over_predicted"] - 1))
        p = worst["prediction"]
        out.append((name, p["predicted_epoch_s"], p["epoch_s"], p["epoch_over_predicted"]))
    return out
