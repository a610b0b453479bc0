"""Transport benchmark: our MQTT transport against the limits a user could reach instead.

    python experiments/bench_transport.py            # ~4 min on 2 cores
    python experiments/bench_transport.py --quick    # fewer repetitions (~1 min)

Part 1, round-trip throughput (A sends a tensor to B, B sends it back; two processes) for
64 KiB, 1 MiB and 16 MiB tensors over:
  (a) ours: transport=mqtt (framing, chunking, ordering, checksums) through mosquitto, without
      authentication, and (a') the same with authentication (every frame's MAC computed by
      the sender and checked by the receiver, as in every runtime=local/remote run) with each
      MAC of `--macs` (default: transport.mac's default, gmac): one endpoint of each kind in
      the same two processes, alternating in blocks, so both see the same machine;
  (b) a plain TCP socket on loopback: the hardware/OS limit;
  (c) torch.distributed gloo send/recv: what a torch.distributed.pipelining user gets;
  (d) bare aiomqtt publish/subscribe through the same mosquitto, one message per tensor, no
      framing: the floor of any MQTT design.
Throughput = 2 x size x round trips / seconds. Ratios ours/bare-aiomqtt and authenticated/
unauthenticated (at least 0.9 at 1 MiB and 16 MiB) are the targets. `--auth-only` measures (a)
and (a') alone (no bare aiomqtt, TCP, gloo or GPipe).

Part 2, step time of GPipe with S = 2 stages, M = 4 micro-batches, VGG-5 on CIFAR-shaped
batches of 64: ours (`runtime=local transport=mqtt`, one process per stage) against
`torch.distributed.pipelining.ScheduleGPipe` over gloo with the same model split and
micro-batches. Median seconds per training step after warm-up.

Every process of every variant (bare aiomqtt, TCP, gloo and torch.distributed.pipelining
included) runs with the glibc malloc settings our role processes use (runtime.tune_malloc,
framework/runtime/allocator.py), so the ratios compare transports, not allocators;
`--no-tune-malloc` runs everything with glibc's defaults instead.

Everything runs side by side in this one invocation on this machine; results go to
outputs/bench_transport/results.json and are printed as a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {"64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20}
TUNE_ENV = "PIPELAB_BENCH_TUNE_MALLOC"  # inherited by every process this benchmark starts


def tuned() -> bool:
    return os.environ.get(TUNE_ENV, "1") == "1"


def apply_malloc_setting() -> None:
    if tuned():
        from framework.runtime.allocator import tune_malloc

        tune_malloc()


def reps_for(n: int, quick: bool) -> int:
    base = {64 << 10: 400, 1 << 20: 60, 16 << 20: 8}[n]
    return max(3, base // 4) if quick else base


# ---- the echo side of each variant (run as a subprocess) ----------------------------------


def echo_mqtt(port: int, n_msgs: int, framed: bool) -> None:
    import aiomqtt
    from omegaconf import OmegaConf

    from plugins.transports.broker import BrokerAddress
    from plugins.transports.mqtt import MqttConfig, MqttTransport

    async def main():
        if framed:
            t = MqttTransport(OmegaConf.structured(MqttConfig()), BrokerAddress("127.0.0.1", port))
            await t.start("bench", "b")
            await t.publish_status("ready")
            for _ in range(n_msgs):
                await t.send("a", "x", await t.recv("a", "x"))
            await t.close()
        else:
            async with aiomqtt.Client("127.0.0.1", port, max_queued_incoming_messages=0) as c:
                await c.subscribe("bare/b", qos=1)
                await c.publish("bare/ready", b"1", qos=1)
                k = 0
                async for m in c.messages:
                    await c.publish("bare/a", m.payload, qos=1, timeout=600)
                    k += 1
                    if k == n_msgs:
                        break

    asyncio.run(main())


def echo_auth_ab(port: int, n_msgs: int) -> None:
    """B of the authentication comparison: echoes on an unauthenticated and an authenticated
    endpoint at once (its credentials from a pipe, as a role process gets them)."""
    from omegaconf import OmegaConf

    from plugins.transports import mqtt_credentials
    from plugins.transports.broker import BrokerAddress
    from plugins.transports.mqtt import MqttConfig, MqttTransport

    async def echo(creds, run):
        t = MqttTransport(OmegaConf.structured(MqttConfig()), BrokerAddress("127.0.0.1", port), creds)
        await t.start(run, "b")
        await t.publish_status("ready")
        for _ in range(n_msgs):
            await t.send("a", "x", await t.recv("a", "x"))
        await t.close()

    async def main():
        await asyncio.gather(echo(None, "bench-plain"), echo(mqtt_credentials.load(None), "bench-auth"))

    asyncio.run(main())


def echo_tcp(port: int, n_msgs: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n_msgs):
            n = struct.unpack("<Q", _read(s, 8))[0]
            buf = _read(s, n)
            s.sendall(struct.pack("<Q", n))
            s.sendall(buf)


def _read(s, n: int) -> bytearray:
    buf = bytearray(n)
    mv, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(mv[got:])
        if not k:
            raise ConnectionError("peer closed")
        got += k
    return buf


def gloo_worker(rank: int, port: int, sizes: list[int], reps: list[int], out: str | None) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    res = {}
    for n, r in zip(sizes, reps):
        x = torch.zeros(n // 4)
        for i in range(r + 1):
            if i == 1:
                t0 = time.perf_counter()
            if rank == 0:
                dist.send(x, 1)
                dist.recv(x, 1)
            else:
                dist.recv(x, 0)
                dist.send(x, 0)
        res[n] = 2 * n * r / (time.perf_counter() - t0)
    if out:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


# ---- the sending side ---------------------------------------------------------------------


def spawn(*args, secret: bytes | None = None) -> subprocess.Popen:
    """This script with `args`; `secret` in a pipe, as runtime=local hands a role its credentials."""
    from framework.runtime import secret_pipe

    return secret_pipe.popen([sys.executable, __file__, *map(str, args)], secret, env=dict(os.environ), cwd=ROOT)


AB_BLOCKS = 8  # the authentication comparison alternates its two endpoints this many times per size


def bench_auth_ab(port: int, mac: str, sizes, reps) -> dict:
    """Ours without and with authentication, side by side in the same two processes: for each
    size the round trips alternate between the two endpoints in AB_BLOCKS blocks (ABBA order),
    so both see the same machine. Returns {size: (plain bytes/s, authenticated bytes/s)}."""
    from omegaconf import OmegaConf

    from plugins.transports import mqtt_credentials
    from plugins.transports.broker import BrokerAddress
    from plugins.transports.mqtt import MqttConfig, MqttTransport

    secrets = mqtt_credentials.RunSecrets("bench-auth", ["a", "b"], mac, broker_users=False)
    per_block = [max(1, r // AB_BLOCKS) for r in reps]
    peer = spawn("--echo", "auth-ab", port, sum(1 + AB_BLOCKS * k for k in per_block), secret=secrets.for_role("b").token().encode())
    res = {}

    async def main():
        ends = {}
        ready: set[str] = set()
        for name, run, creds in (("plain", "bench-plain", None), ("auth", "bench-auth", secrets.for_role("a"))):
            t = ends[name] = MqttTransport(OmegaConf.structured(MqttConfig()), BrokerAddress("127.0.0.1", port), creds)
            t.on_status(lambda r, s, name=name: ready.add(name) if (r, s) == ("b", "ready") else None)
            await t.start(run, "a")
        deadline = time.monotonic() + 120
        while len(ready) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for n, k in zip(sizes, per_block):
            data = os.urandom(n)
            spent = {"plain": 0.0, "auth": 0.0}
            for t in ends.values():  # warm-up
                await t.send("b", "x", data)
                await t.recv("b", "x")
            for blk in range(AB_BLOCKS):
                for name in (("plain", "auth") if blk % 2 == 0 else ("auth", "plain")):
                    t = ends[name]
                    t0 = time.perf_counter()
                    for _ in range(k):
                        await t.send("b", "x", data)
                        back = await t.recv("b", "x")
                    spent[name] += time.perf_counter() - t0
                    assert len(back) == n
            res[n] = tuple(2 * n * k * AB_BLOCKS / spent[name] for name in ("plain", "auth"))
        for t in ends.values():
            await t.close()

    try:
        asyncio.run(main())
    finally:
        peer.wait(60)
    return res


def bench_mqtt(port: int, framed: bool, sizes, reps) -> dict:
    import aiomqtt
    from omegaconf import OmegaConf

    from plugins.transports.broker import BrokerAddress
    from plugins.transports.mqtt import MqttConfig, MqttTransport

    total = sum(r + 1 for r in reps)
    peer = spawn("--echo", "mqtt" if framed else "bare", port, total)
    res = {}

    async def main():
        if framed:
            t = MqttTransport(OmegaConf.structured(MqttConfig()), BrokerAddress("127.0.0.1", port))
            ready = asyncio.Event()
            t.on_status(lambda r, s: ready.set() if (r, s) == ("b", "ready") else None)
            await t.start("bench", "a")
            await asyncio.wait_for(ready.wait(), 120)
            for n, r in zip(sizes, reps):
                data = os.urandom(n)
                for i in range(r + 1):
                    if i == 1:
                        t0 = time.perf_counter()
                    await t.send("b", "x", data)
                    back = await t.recv("b", "x")
                assert len(back) == n
                res[n] = 2 * n * r / (time.perf_counter() - t0)
            await t.close()
        else:
            async with aiomqtt.Client("127.0.0.1", port, max_queued_incoming_messages=0) as c:
                await c.subscribe("bare/a", qos=1)
                await c.subscribe("bare/ready", qos=1)
                it = c.messages.__aiter__()
                while str((await it.__anext__()).topic) != "bare/ready":
                    pass
                for n, r in zip(sizes, reps):
                    data = os.urandom(n)
                    for i in range(r + 1):
                        if i == 1:
                            t0 = time.perf_counter()
                        await c.publish("bare/b", data, qos=1, timeout=600)
                        back = (await it.__anext__()).payload
                    assert len(back) == n
                    res[n] = 2 * n * r / (time.perf_counter() - t0)

    try:
        asyncio.run(main())
    finally:
        peer.wait(60)
    return res


def bench_tcp(sizes, reps) -> dict:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    peer = spawn("--echo", "tcp", srv.getsockname()[1], sum(r + 1 for r in reps))
    s, _ = srv.accept()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    res = {}
    for n, r in zip(sizes, reps):
        data = os.urandom(n)
        for i in range(r + 1):
            if i == 1:
                t0 = time.perf_counter()
            s.sendall(struct.pack("<Q", n))
            s.sendall(data)
            k = struct.unpack("<Q", _read(s, 8))[0]
            _read(s, k)
        res[n] = 2 * n * r / (time.perf_counter() - t0)
    s.close()
    srv.close()
    peer.wait(60)
    return res


def bench_gloo(sizes, reps, out_dir: Path) -> dict:
    from plugins.transports.broker import free_port

    port = free_port()
    out = out_dir / "gloo.json"
    peers = [spawn("--gloo", rank, port, json.dumps(sizes), json.dumps(reps), str(out) if rank == 0 else "") for rank in (0, 1)]
    for p in peers:
        p.wait(600)
    return {int(k): v for k, v in json.loads(out.read_text()).items()}


# ---- part 2: GPipe step time --------------------------------------------------------------

BATCH, MICRO, STEPS = 64, 4, 12


def gpipe_ours(steps: int, out_dir: Path) -> float:
    from hydra import compose, initialize_config_dir

    from framework import registry
    from framework.cli import CONF_DIR
    from framework.job import Job

    registry.load_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["tracking=none", "runtime.progress=false", "runtime=local", f"runtime.tune_malloc={tuned()}", "transport=mqtt", "scheduler=gpipe",
                                                       f"scheduler.microbatches={MICRO}", "cluster=uniform", "cluster.num_devices=2", "model=vgg5",
                                                       "dataset=synthetic_cifar10", f"train.batch_size={BATCH}", "train.epochs=1", f"train.iterations_per_epoch={steps}"])
    job = Job(cfg, out_dir / "gpipe_ours")
    marks = []
    orig = job.on_iteration
    job.on_iteration = lambda e, i, s, now: (marks.append(now), orig(e, i, s, now))
    job.train()
    d = sorted(b - a for a, b in zip(marks[2:], marks[3:]))  # after two warm-up steps
    return d[len(d) // 2]


def gpipe_torch_worker(rank: int, port: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from framework.models import build_model
    from framework.pipeline.partition import partition

    torch.manual_seed(0)
    model = build_model(OmegaConf.load(ROOT / "conf/model/vgg5.yaml"), (3, 32, 32), 10)
    # the same split our gpipe uses: balanced by predicted cost over two identical devices
    cut = _our_cut()
    lo, hi = (0, cut) if rank == 0 else (cut, len(model))
    sub = nn.Sequential(*[model.units[i] for i in range(lo, hi)])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    stage = PipelineStage(sub, rank, 2, torch.device("cpu"))
    loss = nn.CrossEntropyLoss()
    sched = ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=loss)
    opt = torch.optim.SGD(sub.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    marks = []
    for _ in range(steps):
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y)
        opt.step()
        dist.barrier()
        marks.append(time.perf_counter())
    if out:
        d = sorted(b - a for a, b in zip(marks[2:], marks[3:]))
        Path(out).write_text(json.dumps(d[len(d) // 2]))
    dist.destroy_process_group()


def _our_cut() -> int:
    from hydra import compose, initialize_config_dir

    from framework import registry
    from framework.cli import CONF_DIR
    from framework.job import Job

    registry.load_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["tracking=none", "runtime.progress=false", "scheduler=gpipe", f"scheduler.microbatches={MICRO}", "cluster=uniform",
                                                       "cluster.num_devices=2", "model=vgg5", "dataset=synthetic_cifar10", f"train.batch_size={BATCH}", "dataset.n_train=256"])
    return Job(cfg, "/tmp/pipelab-cut").scheduler.bounds[0][1]


def gpipe_torch(steps: int, out_dir: Path) -> float:
    from plugins.transports.broker import free_port

    port = free_port()
    out = out_dir / "gpipe_torch.json"
    peers = [spawn("--gpipe-torch", rank, port, steps, str(out) if rank == 0 else "") for rank in (0, 1)]
    for p in peers:
        if p.wait(600):
            raise RuntimeError("torch.distributed.pipelining run failed")
    return json.loads(out.read_text())


# ---- main ---------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="outputs/bench_transport")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per variant (medians are reported)")
    ap.add_argument("--no-tune-malloc", action="store_true", help="glibc's default malloc settings in every process")
    ap.add_argument("--macs", default="gmac", help="comma-separated transport.mac values to measure authenticated (poly1305, gmac, hmac-sha256)")
    ap.add_argument("--auth-only", action="store_true", help="only ours without and with authentication (no bare aiomqtt, TCP, gloo, GPipe)")
    args = ap.parse_args()
    os.environ[TUNE_ENV] = "0" if args.no_tune_malloc else "1"
    apply_malloc_setting()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from plugins.transports.broker import Broker

    macs = [m for m in args.macs.split(",") if m]
    sizes = list(SIZES.values())
    reps = [reps_for(n, args.quick) for n in sizes]
    others = [] if args.auth_only else ["ours_mqtt", "bare_aiomqtt", "tcp", "gloo"]
    # this machine's timing noise is +-20% between identical runs: alternate the variants over
    # several rounds and keep each one's median round
    rounds: dict[str, list[dict]] = {k: [] for k in (*others, *(f"auth_ab_{m}" for m in macs))}
    with Broker() as b:
        for r in range(args.rounds):
            print(f"round trips, round {r + 1}/{args.rounds}: {', '.join(rounds)} ...", flush=True)
            if not args.auth_only:
                rounds["ours_mqtt"].append(bench_mqtt(b.port, True, sizes, reps))
                rounds["bare_aiomqtt"].append(bench_mqtt(b.port, False, sizes, reps))
                rounds["tcp"].append(bench_tcp(sizes, reps))
                rounds["gloo"].append(bench_gloo(sizes, reps, out))
            for m in macs:
                rounds[f"auth_ab_{m}"].append(bench_auth_ab(b.port, m, sizes, reps))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    res = {k: {n: med([rd[n] for rd in v]) for n in sizes} for k, v in rounds.items() if not k.startswith("auth_ab_")}
    res_rounds = {k: [{str(n): x for n, x in rd.items()} for rd in v] for k, v in rounds.items()}

    def paired(a: str, b: str, n: int) -> float:
        # a and b run back to back in each round: the median of the rounds' ratios cancels the
        # machine's drift between rounds
        return med([x[n] / y[n] for x, y in zip(rounds[a], rounds[b])])

    malloc = "glibc defaults (--no-tune-malloc)" if args.no_tune_malloc else "runtime.tune_malloc settings in every process"
    lines = ["", f"round-trip throughput, MB/s (2 x size x round trips / s; median of {args.rounds} alternating rounds; malloc: {malloc})"]
    if not args.auth_only:
        lines += ["", f"{'size':>7} | {'ours MQTT':>10} | {'bare aiomqtt':>12} | {'TCP socket':>10} | {'gloo':>8} | ours/bare | paired | bare/gloo | ours/gloo"]
        res["paired_ours_over_bare"] = {}
        for label, n in SIZES.items():
            o, a, t, g = (res[k][n] / 1e6 for k in ("ours_mqtt", "bare_aiomqtt", "tcp", "gloo"))
            res["paired_ours_over_bare"][n] = pr = paired("ours_mqtt", "bare_aiomqtt", n)
            lines.append(f"{label:>7} | {o:10.1f} | {a:12.1f} | {t:10.1f} | {g:8.1f} | {o / a:9.2f} | {pr:6.2f} | {a / g:9.2f} | {o / g:9.2f}")
        lines.append("(ours/bare: ratio of the medians; paired: median over rounds of that round's ratio)")
    lines += ["", f"authentication: ours with every frame MAC'd and checked against ours without, alternating in {AB_BLOCKS} blocks per size",
              "in the same two processes (median over rounds of each round's authenticated/unauthenticated ratio; min-max over rounds)", "",
              f"{'size':>7} | " + " | ".join(f"{'no auth':>8} | {m:>11} | {'ratio':>5} | {'min-max':>9}" for m in macs)]
    for label, n in SIZES.items():
        cells = []
        for m in macs:
            rd = rounds[f"auth_ab_{m}"]
            ratios = [x[n][1] / x[n][0] for x in rd]
            res.setdefault(f"auth_over_plain_{m}", {})[n] = med(ratios)
            cells.append(f"{med([x[n][0] for x in rd]) / 1e6:8.1f} | {med([x[n][1] for x in rd]) / 1e6:11.1f} | {med(ratios):5.2f} | {min(ratios):4.2f}-{max(ratios):4.2f}")
        lines.append(f"{label:>7} | " + " | ".join(cells))
    if not args.auth_only:
        steps = 6 if args.quick else STEPS
        print("gpipe S=2 M=4 vgg5: ours (runtime=local transport=mqtt) ...", flush=True)
        step_ours = gpipe_ours(steps, out)
        print("gpipe S=2 M=4 vgg5: torch.distributed.pipelining ScheduleGPipe over gloo ...", flush=True)
        step_torch = gpipe_torch(steps, out)
        lines += ["", f"gpipe step (S=2, M=4, VGG-5, batch {BATCH}): ours {step_ours * 1e3:.1f} ms, torch.distributed.pipelining {step_torch * 1e3:.1f} ms, ratio {step_ours / step_torch:.2f}x"]
        res["gpipe_step_s"] = {"ours": step_ours, "torch_pipelining": step_torch}
    print("\n".join(lines))
    res["tune_malloc"] = not args.no_tune_malloc
    res["rounds"] = res_rounds
    (out / "results.json").write_text(json.dumps({k: ({str(kk): vv for kk, vv in v.items()} if isinstance(v, dict) else v) for k, v in res.items()}, indent=1))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("--echo", "--gloo", "--gpipe-torch"):
        apply_malloc_setting()
    if len(sys.argv) > 1 and sys.argv[1] == "--echo":
        kind, port, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        if kind == "tcp":
            echo_tcp(port, n)
        elif kind == "auth-ab":
            echo_auth_ab(port, n)
        else:
            echo_mqtt(port, n, framed=(kind == "mqtt"))
    elif len(sys.argv) > 1 and sys.argv[1] == "--gloo":
        gloo_worker(int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6] or None)
    elif len(sys.argv) > 1 and sys.argv[1] == "--gpipe-torch":
        gpipe_torch_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] or None)
    else:
        main()
