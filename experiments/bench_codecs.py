"""Codec throughput: encode+decode MB/s of float32 input, beside the library baselines.

For a 4 MiB activation-like tensor (128x32x16x16, post-ReLU) on one thread, in one run:
- `torch copy` (x.clone(): the memory-bandwidth ceiling of touching the data once),
- `torch.quantize_per_tensor` + dequantize (quint8: what a PyTorch user would reach for),
- each pipelab codec at the bit widths the papers use, through its own encode and decode
  (steady state: the stream is warm, as after the first batch of an epoch).

    python experiments/bench_codecs.py [--threads 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    registry.load_plugins()
    g = torch.Generator().manual_seed(0)
    x = torch.relu(torch.randn(128, 32, 16, 16, generator=g))
    mb = x.numel() * 4 / 2**20

    rows = []
    rows.append(("torch copy (x.clone)", "-", timed(lambda: x.clone(), args.repeats), 1.0))

    def qpt():
        scale = float(x.max()) / 255
        torch.quantize_per_tensor(x, scale, 0, torch.quint8).dequantize()

    rows.append(("torch.quantize_per_tensor quint8", "8", timed(qpt, args.repeats), 4.0))
    for name, bits in [("fp16", 16), ("mbq", 2), ("mbq", 3), ("mbq", 4), ("mbq_unpacked", 2), ("stochastic_uniform", 8), ("stochastic_uniform", 4), ("minmax", 8), ("minmax", 2), ("onebit", 1)]:
        codec = codec_class(name)(bits=bits)
        stream: dict = {}
        codec.encode(x, stream)  # warm the stream (MBQ: past its epoch initialisation)

        def roundtrip(codec=codec, stream=stream):
            enc = codec.encode(x, stream)
            type(codec).decode(enc.meta, memoryview(enc.payload), enc.shape, enc.dtype)

        enc = codec.encode(x, stream)
        ratio = x.numel() * 4 / (len(enc.meta) + len(enc.payload))
        rows.append((name, str(bits), timed(roundtrip, args.repeats), ratio))

    print(f"encode+decode of a {mb:.0f} MiB float32 tensor {tuple(x.shape)}, {args.threads} thread(s), median of {args.repeats}")
    print(f"{'codec':<34}{'bits':>5}{'ms':>9}{'MB/s':>9}{'payload ratio':>15}")
    for name, bits, t, ratio in rows:
        print(f"{name:<34}{bits:>5}{t * 1e3:>9.2f}{mb / t:>9.0f}{ratio:>15.2f}")


if __name__ == "__main__":
    main()
