"""K replicas' training steps, one at a time against one vmapped call: the kernels' own ratio.

The ceiling over `bench_replicas.py`'s batched variants, without the simulator: K copies of one
architecture (default VGG-5, CIFAR-shaped, batch 32), each with its own parameters, one forward,
backward and SGD step each, timed per step (medians of `--steps` after warm-up):

- `one at a time`: K modules, one after another (the kernels `runtime.batch_replicas=false` launches);
- `vmap`: `torch.func.vmap` of `functional_call` over stacked parameters and buffers (vmap
  turns each per-replica convolution into one grouped convolution: `runtime.replica_conv=grouped`);
- `vmap, convolutions as matmul`: the same with each convolution a batched matrix product
  (framework/replicas/conv.py), as `framework.replicas.batched` runs a batched call on a GPU.

Each runs with TF32 off (the run's default) and on (`runtime.tf32=true`); beside each is the
largest difference of the parameters after one step from the one-at-a-time run (rounding, not
a check). This is issue 14's anchor measurement (one model at a time against vmap of grad over
stacked parameters).

On an H100 (26 November, torch 2.11, 16 threads) it also timed convolutions written as unfold +
one batched matrix product under vmap: 50.0 ms a step against 17.8 ms for the grouped
convolution (TF32 off), because CUDA's im2col launches one kernel per sample (49,152 in one FL
epoch of 64 replicas); that variant was dropped.

    python experiments/bench_replica_step.py                   # K = 64, VGG-5, batch 32, on cuda if present
    python experiments/bench_replica_step.py --devices 8 --model lenet --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hydra import compose, initialize_config_dir  # noqa: E402

from framework import registry  # noqa: E402
from framework.cli import CONF_DIR  # noqa: E402
from framework.models import build_model  # noqa: E402
from framework.replicas.conv import ConvAsMatmul  # noqa: E402

SHAPES = {"vgg5": (3, 32, 32), "lenet": (1, 28, 28)}


def _sync(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def one_at_a_time(models, xs, ys, lr):
    for m, x, y in zip(models, xs, ys):
        loss = nn.functional.cross_entropy(m(x), y, reduction="sum")
        params = list(m.parameters())
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, grads, alpha=-lr)


def batched(base, names, buffer_names, params, buffers, xs, ys, lr):
    def one(ps, bs, xi):
        return torch.func.functional_call(base, {**dict(zip(names, ps)), **dict(zip(buffer_names, bs))}, (xi,))

    leaves = [p.detach().requires_grad_(True) for p in params]
    out = torch.func.vmap(one)(leaves, buffers, xs)
    loss = nn.functional.cross_entropy(out.flatten(0, 1), ys.flatten(), reduction="sum")
    grads = torch.autograd.grad(loss, leaves)
    with torch.no_grad():
        torch._foreach_add_(params, grads, alpha=-lr)


def setup(variant, model_cfg, shape, base, init, xs, ys, lr, dev):
    """(one step of `variant` from the shared initial weights, the parameters it updates as K-stacked tensors)."""
    k = xs.shape[0]
    if variant == "one at a time":
        models = [build_model(model_cfg, shape, 10).to(dev) for _ in range(k)]
        with torch.no_grad():
            for m in models:
                for p, q in zip(m.parameters(), init):
                    p.copy_(q)

        def state():
            return [torch.stack([list(m.parameters())[i].detach() for m in models]) for i in range(len(init))]

        return (lambda: one_at_a_time(models, xs, ys, lr)), state
    names = [n for n, _ in base.named_parameters()]
    buffer_names = [n for n, _ in base.named_buffers()]
    params = [torch.stack([q] * k).clone() for q in init]
    buffers = [torch.stack([bf.detach().clone() for _ in range(k)]) for bf in base.buffers()]
    mode = nullcontext if variant == "vmap" else ConvAsMatmul

    def step():
        with mode():
            batched(base, names, buffer_names, params, buffers, xs, ys, lr)

    return step, (lambda: params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", default="vgg5", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed: the default thrashes on small machines)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    registry.load_plugins()
    dev = torch.device(args.device)
    k, b, lr = args.devices, args.batch_size, 0.01
    shape = SHAPES[args.model]
    torch.manual_seed(0)  # the initial weights
    g = torch.Generator().manual_seed(0)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        model_cfg = compose(config_name="config", overrides=[f"model={args.model}"]).model
    base = build_model(model_cfg, shape, 10).to(dev)
    init = [p.detach().clone() for p in base.parameters()]
    xs = torch.randn(k, b, *shape, generator=g).to(dev)
    ys = torch.randint(0, 10, (k, b), generator=g).to(dev)
    print(f"K = {k} replicas of {args.model}, batch {b}, one forward, backward and SGD step each; "
          f"{dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else f'{args.threads} thread(s)'}); torch {torch.__version__}")
    print("| variant | TF32 | ms per step (median) | samples/s | vs one at a time | max abs diff of the step's parameters |")
    print("|---|---|---|---|---|---|")
    for tf32 in (False, True):
        if dev.type != "cuda" and tf32:
            continue
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
        results, reference = {}, None
        for variant in ("one at a time", "vmap", "vmap, convolutions as matmul"):
            step, state = setup(variant, model_cfg, shape, base, init, xs, ys, lr, dev)
            step()  # one step from the shared start: what the difference column compares
            after_one = [t.detach().clone() for t in state()]
            if reference is None:
                reference = after_one
            diff = max((a - r).abs().max().item() for a, r in zip(after_one, reference))
            for _ in range(2):
                step()
            times = []
            for _ in range(args.steps):
                t0 = _sync(dev)
                step()
                times.append(_sync(dev) - t0)
            results[variant] = statistics.median(times)
            base_t = results["one at a time"]
            s = results[variant]
            print(f"| {variant} | {'on' if tf32 else 'off'} | {s * 1e3:.2f} | {k * b / s:,.0f} | {base_t / s:.2f}x | {diff:.2e} |")


if __name__ == "__main__":
    main()
