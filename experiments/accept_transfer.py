"""AccEPT's Fig. 9 as ratios: how much MBQ shortens one feature transfer, over 1-50 Mbit/s.

    python experiments/accept_transfer.py            # about 1 minute
    python experiments/accept_transfer.py --latency 0.02 --bandwidths 1 10 50

For MobileNetV2 at batch 128 on 3x32x32 inputs (the paper's setting), the largest and the
smallest unit output of a real forward pass (synthetic CIFAR-shaped batch), sent from one stage
to the next uncompressed and with MBQ at k = 2, 3 and 4 forward bits. A transfer's latency is
encode (timed here, one torch thread) + the link's time for the packet's wire bytes at the given
bandwidth plus a per-message latency (the cluster link model, `framework.cluster.Link`, the same
one `runtime.emulate_links` sleeps on real processes) + decode (timed). Prints and writes
<out>/report.md and results.json: latencies, speed-ups over uncompressed and the notes' gates
(A2: the 2-bit speed-up of the largest feature >= 10 at 50 Mbit/s with 20 ms latency, >= 14 at
1 Mbit/s, approaching its compression ratio of about 16). Paper (real WiFi): about 1300 ms to
100 ms at 50 Mbit/s for the largest, "up to 1/13".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def compose(overrides):
    from hydra import compose as hc, initialize_config_dir

    from framework.cli import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hc(config_name="config", overrides=overrides)


def features(cfg):
    """The largest and the smallest unit output of MobileNetV2 on one batch of 128."""
    from framework import registry
    from framework.models import build_model

    data = registry.build("dataset", cfg.dataset)
    torch.manual_seed(0)
    model = build_model(cfg.model, data.input_shape, data.num_classes).eval()
    x, outs = data.x_train[:128], []
    with torch.no_grad():
        for unit in model.units[:-1]:  # the classifier's logits are not sent on
            x = unit(x)
            outs.append(x)
    sizes = [o.numel() for o in outs]
    big, small = sizes.index(max(sizes)), sizes.index(min(sizes))
    feats = {f"largest (unit {big}, {tuple(outs[big].shape)})": outs[big].contiguous(), f"smallest (unit {small}, {tuple(outs[small].shape)})": outs[small].contiguous()}
    return feats, model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bandwidths", type=float, nargs="+", default=[1, 2, 5, 10, 20, 50], help="Mbit/s")
    ap.add_argument("--latency", type=float, default=0.02, help="seconds per message")
    ap.add_argument("--repeats", type=int, default=5, help="codec timings per case (median)")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "accept_transfer")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from framework import registry
    from framework.cluster import Cluster

    registry.load_plugins()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cfg = compose(["experiment=accept"])
    feats, model = features(cfg)
    codecs = {"none": compose(["experiment=accept", "compressor=none"]).compressor}
    for k in (2, 3, 4):
        codecs[f"MBQ {k}-bit"] = compose(["experiment=accept", f"compressor.forward.bits={k}", "compressor.forward.schedule=[]"]).compressor
    rows = {}
    for fname, x in feats.items():
        for cname, ccfg in codecs.items():
            comp = registry.build("compressor", ccfg)
            comp.set_seed(0)
            comp.set_epoch(0)
            enc, dec, nbytes = [], [], 0
            for r in range(args.repeats + 1):  # the first warms the kernels up
                a = time.perf_counter()
                data, nbytes, _ = comp.encode({"x": x}, src="stage0", dst="stage1", tag=comp.forward_tag, iteration=r)
                b = time.perf_counter()
                comp.decode(data, src="stage0", dst="stage1", tag=comp.forward_tag)
                c = time.perf_counter()
                if r:
                    enc.append(b - a)
                    dec.append(c - b)
            rows[(fname, cname)] = {"wire_bytes": nbytes, "encode_s": statistics.median(enc), "decode_s": statistics.median(dec)}
    latency: dict = {}
    for bw in args.bandwidths:
        ccfg = compose(["experiment=accept", f"cluster.link.bandwidth_bps={bw * 1e6}", f"cluster.link.latency_s={args.latency}"]).cluster
        for key, r in rows.items():
            link = Cluster(ccfg, model, batch_size=128, seed=0).link("dev0", "dev1")  # each message alone on a fresh link
            _, arrival = link.schedule(r["wire_bytes"], 0.0)
            latency[(bw, *key)] = r["encode_s"] + arrival + r["decode_s"]
    raw = {f: rows[(f, "none")]["wire_bytes"] for f in feats}
    lines = ["# AccEPT, Fig. 9 as ratios: one feature transfer, uncompressed and with MBQ", "",
             f"MobileNetV2, batch 128, 3x32x32; link latency {args.latency * 1e3:g} ms per message; codec times measured on this host, one thread "
             f"(median of {args.repeats}); `python experiments/accept_transfer.py` ({time.perf_counter() - t0:.0f} s).", ""]
    for f in feats:
        lines += [f"## {f}: {raw[f] / 1024:.0f} KiB uncompressed", "", "| codec | wire KiB | ratio | encode ms | decode ms |" , "|---|---|---|---|---|"]
        for c in codecs:
            r = rows[(f, c)]
            lines.append(f"| {c} | {r['wire_bytes'] / 1024:.1f} | {raw[f] / r['wire_bytes']:.2f} | {r['encode_s'] * 1e3:.2f} | {r['decode_s'] * 1e3:.2f} |")
        lines += ["", "| Mbit/s | " + " | ".join(f"{c} ms" for c in codecs) + " | " + " | ".join(f"{c} speed-up" for c in codecs if c != "none") + " |",
                  "|---|" + "---|" * (2 * len(codecs) - 1)]
        for bw in args.bandwidths:
            base = latency[(bw, f, "none")]
            lines.append(f"| {bw:g} | " + " | ".join(f"{latency[(bw, f, c)] * 1e3:.1f}" for c in codecs) + " | "
                         + " | ".join(f"{base / latency[(bw, f, c)]:.2f}" for c in codecs if c != "none") + " |")
        lines.append("")
    big = next(iter(feats))
    gates = []
    if 50 in args.bandwidths:
        s = latency[(50, big, "none")] / latency[(50, big, "MBQ 2-bit")]
        gates.append(("2-bit speed-up of the largest feature >= 10 at 50 Mbit/s (paper ~13)", s >= 10, f"{s:.2f}"))
    if 1 in args.bandwidths:
        s = latency[(1, big, "none")] / latency[(1, big, "MBQ 2-bit")]
        gates.append(("2-bit speed-up of the largest feature >= 14 at 1 Mbit/s", s >= 14, f"{s:.2f}"))
    lines += ["## Gates", "", "| gate | result | measured |", "|---|---|---|"] + [f"| {g} | {'pass' if ok else 'FAIL'} | {m} |" for g, ok, m in gates]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({"codec": {f"{f} | {c}": r for (f, c), r in rows.items()},
                                                       "latency_s": {f"{bw:g} | {f} | {c}": v for (bw, f, c), v in latency.items()}}, indent=1))
    print("\n".join(lines))
    return 0 if all(ok for _, ok, _ in gates) else 1


if __name__ == "__main__":
    sys.exit(main())
