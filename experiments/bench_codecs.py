"""Codec throughput: encode+decode MB/s of float32 input, beside the library baselines.

For two 4 MiB tensors of shape 128x32x16x16 on one thread, in one run: an activation (post-ReLU,
half zeros: what MBQ and min-max see) and a gradient (signed, Gaussian: what stochastic uniform
and 1-bit see), each through
- `torch copy` (x.clone(): the memory-bandwidth ceiling of touching the data once),
- `torch.quantize_per_tensor` + dequantize (quint8: what a PyTorch user would reach for),
- each pipelab codec at the bit widths the papers use, through its own encode and decode
  (steady state: the stream is warm, as after the first batch of an epoch).
The last column is the slower of the two tensors against quantize_per_tensor on the same tensor.
Issue 14's goal: mbq 2-bit, stochastic_uniform 8-bit and onebit at least 1,000 MB/s.

    python experiments/bench_codecs.py [--threads 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from framework import registry  # noqa: E402
from framework.codec import codec_class  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


GOAL = {("mbq", 2), ("stochastic_uniform", 8), ("onebit", 1)}  # issue 14: >= 1,000 MB/s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")  # still the baseline PyTorch users know
    registry.load_plugins()
    g = torch.Generator().manual_seed(0)
    inputs = {"activation": torch.relu(torch.randn(128, 32, 16, 16, generator=g)), "gradient": torch.randn(128, 32, 16, 16, generator=g) * 1e-3}
    mb = 128 * 32 * 16 * 16 * 4 / 2**20
    codecs = [("fp16", 16), ("mbq", 2), ("mbq", 3), ("mbq", 4), ("mbq_unpacked", 2), ("stochastic_uniform", 8), ("stochastic_uniform", 4), ("minmax", 8), ("minmax", 2), ("onebit", 1)]
    for name, _ in codecs:
        codec_class(name).prepare()  # compiled kernels loaded before timing

    def qpt(x):
        scale = float(x.abs().max()) / 127
        torch.quantize_per_tensor(x, scale, 128, torch.quint8).dequantize()

    rows = [("torch copy (x.clone)", "-", {k: timed(lambda x=x: x.clone(), args.repeats) for k, x in inputs.items()}, 1.0)]
    rows.append(("torch.quantize_per_tensor quint8", "8", {k: timed(lambda x=x: qpt(x), args.repeats) for k, x in inputs.items()}, 4.0))
    base = rows[-1][2]
    for name, bits in codecs:
        times = {}
        for key, x in inputs.items():
            codec = codec_class(name)(bits=bits)
            stream: dict = {}
            codec.encode(x, stream)  # warm the stream (MBQ: past its epoch initialisation)

            def roundtrip(codec=codec, stream=stream, x=x):
                enc = codec.encode(x, stream)
                type(codec).decode(enc.meta, memoryview(enc.payload), enc.shape, enc.dtype)

            times[key] = timed(roundtrip, args.repeats)
            enc = codec.encode(x, stream)
            ratio = x.numel() * 4 / (len(enc.meta) + len(enc.payload))
        rows.append((name, str(bits), times, ratio))

    print(f"encode+decode of a {mb:.0f} MiB float32 tensor (128, 32, 16, 16), {args.threads} thread(s), median of {args.repeats}")
    print(f"{'codec':<34}{'bits':>5}{'act ms':>8}{'act MB/s':>10}{'grad ms':>9}{'grad MB/s':>11}{'ratio':>7}{'vs qpt':>8}  goal")
    for name, bits, t, ratio in rows:
        slowest = max(t[k] / base[k] for k in t)
        goal = ""
        if (name, int(bits) if bits.isdigit() else 0) in GOAL:
            goal = "ok" if mb / max(t.values()) >= 1000 else "MISSED"
        print(f"{name:<34}{bits:>5}{t['activation'] * 1e3:>8.2f}{mb / t['activation']:>10.0f}{t['gradient'] * 1e3:>9.2f}{mb / t['gradient']:>11.0f}{ratio:>7.2f}{1 / slowest:>8.2f}  {goal}")


if __name__ == "__main__":
    main()
