"""`runtime=local` and `runtime=remote`: one OS process per role, real clock, real transport.

The same role programs as on the simulator run here, each in its own process (`local` starts
them on this machine; `remote` waits for `python -m framework.worker role=<name> ...` started
anywhere that reaches the broker). The coordinator, the `python -m framework` process:

1. opens the network (`transport=mqtt`: a private mosquitto unless told otherwise);
2. waits for every role to say `ready` (`runtime.join_timeout_s`; the message names the
   missing roles), then sends each its `setup` (the resolved config as JSON, and a hash of
   the plan, which the role recomputes and checks) and its initial weights (wire format);
3. relays progress to the job (metrics, progress bar), runs the epoch barrier (every role
   sends its weights, the coordinator evaluates, then says `go`), and collects each role's
   final weights, timeline and counters into the one MLflow run and summary.json;
4. fails fast when a role dies (its process exits, or its MQTT last will arrives) or
   reports an error, naming the role; every role process is stopped on success, failure or
   Ctrl-C, and a worker stops by itself if the coordinator disappears.

Inside a role, compute runs in a worker thread so the event loop keeps the connection alive.
Optional emulation: `emulate_compute` stretches each computation to what the device's time
model says; `emulate_links` sends every message through the cluster's link model (token
bucket at the link's bandwidth, its latency, its loss with retransmission) before the
transport. Control messages are JSON or wire-format tensors, never pickles.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional

import torch

from framework import wire
from framework.cluster import Work
from framework.config import RuntimeConfig
from framework.errors import ConfigError, PipelabError, WireError
from framework.runtime.allocator import tune_malloc
from framework.runtime.base import RoleContext, RoleSpec
from framework.timeline import Timeline
from framework.transport import Network

COORDINATOR = "coordinator"
CTL = "ctl"  # role -> coordinator: progress, epoch arrival, result, error
_LEN = struct.Struct("<I")


class RoleFailed(PipelabError):
    """A role process died, or its program raised."""


@dataclass
class LocalConfig(RuntimeConfig):
    """One OS process per role on this machine, over a real transport (transport=mqtt)."""

    name: str = "local"
    progress: bool = True
    run_id: Optional[str] = None  # topics are namespaced by it; null = a fresh id per run
    join_timeout_s: float = 120.0  # every role must say `ready` within this
    emulate_compute: bool = False  # stretch each computation to the device's time model
    emulate_links: bool = False  # price every message with the cluster's link model, in real time
    max_pending_bytes: int = 256 << 20  # a role's unsent data before its next compute waits
    python: Optional[str] = None  # interpreter for role processes; null = this one
    tune_malloc: bool = True  # keep freed megabyte buffers mapped (framework/runtime/allocator.py)


@dataclass
class RemoteConfig(LocalConfig):
    """Roles join from other machines: `python -m framework.worker role=<name> ...`."""

    name: str = "remote"


# ---- control messages: a JSON header and, optionally, a wire-format payload -----------------


def ctl_pack(header: dict, tensors: dict | None = None) -> bytes:
    head = json.dumps(header).encode()
    body = wire.encode(tensors) if tensors is not None else b""
    return b"".join((_LEN.pack(len(head)), head, body))


def ctl_unpack(data) -> tuple[dict, dict | None]:
    """Raises WireError on anything malformed."""
    if len(data) < _LEN.size:
        raise WireError("control message shorter than its header length")
    (n,) = _LEN.unpack_from(data)
    if _LEN.size + n > len(data):
        raise WireError("control message header runs past its end")
    try:
        header = json.loads(bytes(data[_LEN.size : _LEN.size + n]))
    except ValueError as e:
        raise WireError(f"control message header is not JSON: {e}") from None
    if not isinstance(header, dict) or "kind" not in header:
        raise WireError("control message header has no kind")
    rest = memoryview(data)[_LEN.size + n :]
    return header, (wire.decode(rest).tensors if len(rest) else None)


def plan_digest(plan: dict) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_runtime_support(scheduler, cfg) -> None:
    """Real runtimes move weights between processes through the scheduler's role state."""
    if not (hasattr(scheduler, "role_state") and hasattr(scheduler, "load_role_state")):
        raise ConfigError(
            "runtime.name",
            f"scheduler {cfg.scheduler.name!r} keeps state that its roles share in memory, so it runs on runtime=sim only "
            "(schedulers with role_state/load_role_state run on runtime=local/remote: local, gpipe, 1f1b, pipedream)",
        )


# ---- the coordinator -----------------------------------------------------------------------


class LocalRuntime:
    """The coordinator side of runtime=local/remote."""

    spawn_workers = True

    def __init__(self, cfg, cluster, codec, hooks=None):
        self.cfg = cfg
        self.job = hooks  # the Job: its cluster, compressor, scheduler and metric hooks
        self.timeline = Timeline()
        self.messages_lost = 0
        self.procs: dict[str, subprocess.Popen] = {}
        self.dropped = 0
        network = getattr(self.job, "transport", None)
        if not isinstance(network, Network):
            raise ConfigError("transport.name", f"runtime={cfg.name} needs a network transport between its processes; choices: mqtt (transport=mqtt)")
        self.network: Network = network
        check_runtime_support(self.job.scheduler, self.job.cfg)
        self.run_id = cfg.run_id or f"r{uuid.uuid4().hex[:10]}"

    # the job calls run(roles) and reads timeline/messages_lost afterwards
    def run(self, roles: dict[str, RoleSpec]) -> float:
        if self.cfg.tune_malloc:
            tune_malloc()
        self.network.open()
        try:
            makespan = asyncio.run(self._coordinate(roles))
            self._stop_workers(grace_s=10.0)  # they are saying goodbye: let them
            return makespan
        finally:
            self._stop_workers()
            self.network.close()

    # -- role processes ---------------------------------------------------------------------

    def worker_command(self, role: str) -> list[str]:
        extra = [] if self.cfg.tune_malloc else ["runtime.tune_malloc=false"]
        return [self.cfg.python or sys.executable, "-m", "framework.worker", f"role={role}", f"runtime.run_id={self.run_id}", *extra, *self.network.worker_args()]

    def _spawn(self, roles) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        threads = self.job.cfg.runtime.threads
        if threads:
            env.setdefault("OMP_NUM_THREADS", str(threads))
        for role in roles:
            self.procs[role] = subprocess.Popen(self.worker_command(role), env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def _stop_workers(self, grace_s: float = 0.0) -> None:
        """Wait `grace_s` for role processes to end by themselves, then SIGTERM, then SIGKILL."""
        deadline = time.monotonic() + grace_s
        while grace_s and time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        procs = [p for p in self.procs.values() if p.poll() is None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # -- the protocol -------------------------------------------------------------------------

    async def _coordinate(self, roles: dict[str, RoleSpec]) -> float:
        job = self.job
        t = self.network.endpoint()
        await t.start(self.run_id, COORDINATOR)
        failure: asyncio.Future = asyncio.get_running_loop().create_future()
        ready: set[str] = set()
        ready_event = asyncio.Event()

        def fail(msg: str) -> None:
            if not failure.done():
                failure.set_exception(RoleFailed(msg))

        def on_status(role: str, state: str) -> None:
            if role not in roles:
                return
            if state == "ready":
                ready.add(role)
                if len(ready) == len(roles):
                    ready_event.set()
            elif state == "lost":
                fail(f"role {role} was lost (its connection to the broker dropped without a goodbye: the process died or the machine is unreachable)")

        t.on_status(on_status)
        try:
            if self.spawn_workers:
                self._spawn(roles)
                print(f"runtime={self.cfg.name}: {len(roles)} role processes over {self.network.describe()}, run id {self.run_id}", file=sys.stderr)
            else:
                print(f"runtime=remote: run id {self.run_id}, over {self.network.describe()}. Start one worker per role:", file=sys.stderr)
                for role in roles:
                    print("  " + " ".join(self.worker_command(role)[1:]).replace("-m framework.worker", "python -m framework.worker"), file=sys.stderr)
            watchdog = asyncio.create_task(self._watch(fail))
            try:
                await self._race(asyncio.wait_for(ready_event.wait(), self.cfg.join_timeout_s), failure)
            except asyncio.TimeoutError:
                missing = sorted(set(roles) - ready)
                raise RoleFailed(f"roles did not join within runtime.join_timeout_s={self.cfg.join_timeout_s:g}s: missing {', '.join(missing)}") from None
            t_ref = time.time()
            setup = {"config": _plain(job.cfg), "plan_digest": plan_digest(job.scheduler.plan()), "t_ref": t_ref, "run_id": self.run_id}
            for role in roles:
                await t.send(role, "setup", ctl_pack({"kind": "setup", **setup}, job.scheduler.role_state(role)))
            result = await self._race(self._serve(t, roles, t_ref), failure)
            watchdog.cancel()
            return result
        finally:
            await t.close()

    async def _race(self, coro, failure: asyncio.Future):
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task, failure}, return_when=asyncio.FIRST_COMPLETED)
        if failure in done:
            task.cancel()
            failure.result()  # raises RoleFailed
        return task.result()

    async def _watch(self, fail: Callable[[str], None]) -> None:
        while True:
            for role, p in self.procs.items():
                code = p.poll()
                if code is not None and code != 0:
                    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                    fail(f"role {role} (pid {p.pid}) {how}")
            await asyncio.sleep(0.1)

    async def _serve(self, t, roles, t_ref: float) -> float:
        job = self.job
        sched = job.scheduler
        epochs: dict[int, dict[str, dict]] = {}
        results: dict[str, dict] = {}
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(role):
            while True:
                data = await t.recv(role, CTL)
                try:
                    header, tensors = ctl_unpack(data)
                except WireError:
                    self.dropped += 1
                    continue
                await queue.put((role, header, tensors))
                if header["kind"] in ("result", "error"):
                    return

        pumps = [asyncio.create_task(pump(r)) for r in roles]
        try:
            while len(results) < len(roles):
                role, h, tensors = await queue.get()
                kind = h["kind"]
                if kind == "it":
                    job.on_iteration(h["epoch"], h["iteration"], h["samples"], h["now"])
                elif kind == "train":
                    job.on_train(h["loss_sum"], h["correct"], h["n"])
                elif kind == "epoch":
                    arrived = epochs.setdefault(h["epoch"], {})
                    arrived[role] = {"now": h["now"], "state": tensors}
                    if len(arrived) == len(roles):
                        for r, a in arrived.items():
                            sched.load_role_state(r, a["state"])
                        job.on_epoch_end(h["epoch"], max(a["now"] for a in arrived.values()))
                        del epochs[h["epoch"]]
                        for r in roles:
                            await t.send(r, "go", ctl_pack({"kind": "go", "epoch": h["epoch"]}))
                elif kind == "result":
                    sched.load_role_state(role, tensors)
                    results[role] = h
                elif kind == "error":
                    raise RoleFailed(f"role {role} failed:\n{h['traceback'].rstrip()}")
        finally:
            for p in pumps:
                p.cancel()
        for role, h in results.items():
            self.timeline.add_role(role)
            for iv in h["timeline"]:
                if iv[0] == "c":
                    self.timeline.compute(*iv[1:])
                else:
                    self.timeline.transfer(*iv[1:])
            self.messages_lost += h["stats"].get("lost", 0)
            self.dropped += h["stats"].get("dropped", 0)
        return max((h["end"] for h in results.values()), default=time.time() - t_ref)


class RemoteRuntime(LocalRuntime):
    spawn_workers = False


def _libc_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # resolved now: a preexec_fn must not import or take locks


def die_with_parent() -> None:
    """preexec_fn of child processes (Linux): be sent SIGTERM when the parent dies, even by
    SIGKILL, so a killed coordinator leaves no role processes or broker behind. Elsewhere the
    roles notice the coordinator's MQTT last will instead."""
    if _PRCTL is not None:
        _PRCTL(1, 15)  # PR_SET_PDEATHSIG, SIGTERM


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


# ---- inside a role process -----------------------------------------------------------------


class LocalContext(RoleContext):
    """A role's view of the world in its own process: real clock, real messages."""

    def __init__(self, role: str, role_devices: dict[str, str], job, transport, t_ref: float, rt_cfg):
        self.role = role
        self.role_devices = role_devices  # every role's device: which link a message takes
        self.device_name = role_devices[role]
        self.job = job
        self.device = job.cluster.device(self.device_name)
        self.codec = job.compressor
        self.t = transport
        self.t_ref = t_ref
        self.cfg = rt_cfg
        self.timeline: list[list] = []
        self.stats = {"dropped": 0, "lost": 0}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"compute-{role}")
        self._outboxes: dict[str, _Outbox] = {}
        self._pending_bytes = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self.error: BaseException | None = None

    @property
    def now(self) -> float:
        return time.time() - self.t_ref

    async def compute(self, work: Work, fn: Callable | None = None, *args, iteration=-1, microbatch=-1, group=-1, **kwargs) -> Any:
        while self._pending_bytes > self.cfg.max_pending_bytes:  # back-pressure from the network
            self._drained.clear()
            await self._drained.wait()
        self._raise()
        start = self.now
        t0 = time.perf_counter()
        result = await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args, **kwargs)) if fn is not None else None
        wall = time.perf_counter() - t0
        if self.cfg.emulate_compute:
            extra = self.device.time(work, wall) - wall
            if extra > 0:
                await asyncio.sleep(extra)
        self.timeline.append(["c", self.role, work.kind, start, self.now, iteration, microbatch, group])
        return result

    def send(self, dst: str, tag: str, tensor, *, iteration=0, microbatch=0, reliable=True) -> None:
        self._raise()
        tensors = tensor if isinstance(tensor, dict) else {"x": tensor}
        data, nbytes, raw = self.codec.encode(tensors, src=self.role, dst=dst, tag=tag, iteration=iteration, microbatch=microbatch)
        self._enqueue(dst, (self.now, tag, data, nbytes, raw, iteration, microbatch, reliable))

    def _enqueue(self, dst: str, item: tuple, emulate: bool | None = None) -> None:
        """Hand one message to `dst`'s outbox (made on first use); it counts as pending until sent."""
        box = self._outboxes.get(dst)
        if box is None:
            box = self._outboxes[dst] = _Outbox(self, dst, emulate)
        self._pending_bytes += len(item[2])
        box.put(item)

    def _sent(self, n: int) -> None:
        self._pending_bytes -= n
        if self._pending_bytes <= self.cfg.max_pending_bytes:
            self._drained.set()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    async def recv(self, src: str, tag: str, timeout: float | None = None):
        while True:
            try:
                data = await self.t.recv(src, tag, timeout)
            except asyncio.TimeoutError:
                return None
            try:
                packet = self.codec.decode(data, src=src, dst=self.role, tag=tag, copy=False)
            except WireError:
                self.stats["dropped"] += 1  # never executed, only counted
                continue
            t = packet.tensors
            return t["x"] if set(t) == {"x"} else t

    async def _ctl(self, header: dict, tensors: dict | None = None) -> None:
        await self.t.send(COORDINATOR, CTL, ctl_pack(header, tensors))

    async def end_epoch(self, epoch: int) -> None:
        await self.flush()
        await self._ctl({"kind": "epoch", "epoch": epoch, "now": self.now}, self.job.scheduler.role_state(self.role))
        while True:
            h, _ = ctl_unpack(await self.t.recv(COORDINATOR, "go"))
            if h.get("epoch") == epoch:
                return

    def iteration_done(self, epoch: int, iteration: int, samples: int) -> None:
        self._spawn_ctl({"kind": "it", "epoch": epoch, "iteration": iteration, "samples": samples, "now": self.now})

    def report_train(self, loss_sum: float, correct: int, n: int) -> None:
        self._spawn_ctl({"kind": "train", "loss_sum": float(loss_sum), "correct": int(correct), "n": int(n)})

    def _spawn_ctl(self, header: dict) -> None:
        # progress goes out in call order, through the coordinator's outbox (never link-emulated)
        data = ctl_pack(header)
        self._enqueue(COORDINATOR, (self.now, CTL, data, len(data), len(data), -1, -1, True), emulate=False)

    async def flush(self) -> None:
        for box in list(self._outboxes.values()):
            await box.drain()
        await self.t.flush()
        self._raise()

    def close(self) -> None:
        for box in self._outboxes.values():
            box.task.cancel()
        self._pool.shutdown(wait=False)


class _Outbox:
    """Messages from one role to one destination, in order. With link emulation each message
    is released when the cluster's link model says it arrives (the sim's FIFO channel, run on
    the real clock: bandwidth, latency, loss and retransmission)."""

    def __init__(self, ctx: LocalContext, dst: str, emulate: bool | None = None):
        self.ctx, self.dst = ctx, dst
        emulate = ctx.cfg.emulate_links if emulate is None else emulate
        dst_device = ctx.role_devices.get(dst)  # None for the coordinator
        self.link = ctx.job.cluster.link(ctx.device_name, dst_device) if emulate and dst_device else None
        self.name = f"{ctx.device_name}->{dst_device or dst}"
        self.queue: asyncio.Queue = asyncio.Queue()
        self.idle = asyncio.Event()
        self.idle.set()
        self.task = asyncio.create_task(self._run())

    def put(self, item) -> None:
        self.idle.clear()
        self.queue.put_nowait(item)

    async def drain(self) -> None:
        await self.idle.wait()

    async def _run(self) -> None:
        ctx = self.ctx
        try:
            while True:
                t_sent, tag, data, nbytes, raw, it, mb, reliable = await self.queue.get()
                if self.link is not None:
                    attempts, arrival = self.link.schedule(nbytes, max(t_sent, ctx.now), reliable)
                    wait = (arrival if arrival is not None else attempts[-1][1]) - ctx.now
                    if wait > 0:
                        await asyncio.sleep(wait)
                    for i, (s, e) in enumerate(attempts):
                        lost = i < len(attempts) - 1 or arrival is None
                        ctx.timeline.append(["t", self.name, s, e, nbytes, it, mb, "lost" if lost else "send", raw])
                    if arrival is None:
                        ctx.stats["lost"] += 1
                    else:
                        await ctx.t.send(self.dst, tag, data)
                else:
                    start = ctx.now
                    await ctx.t.send(self.dst, tag, data)
                    if tag != CTL:
                        ctx.timeline.append(["t", self.name, start, ctx.now, nbytes, it, mb, "send", raw])
                ctx._sent(len(data))
                if self.queue.empty():
                    self.idle.set()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the role sees it at its next send or compute
            ctx.error = e
            ctx._drained.set()
            self.idle.set()


async def run_role(transport, run_id: str, role: str, build_job: Callable[[dict], Any]) -> int:
    """A role process: join, get the setup, run the role program, report. Returns an exit code."""
    coordinator_lost = asyncio.Event()
    transport.on_status(lambda r, s: coordinator_lost.set() if r == COORDINATOR and s == "lost" else None)
    await transport.start(run_id, role)
    ctx = None
    try:
        await transport.publish_status("ready")
        header, weights = ctl_unpack(await _or_lost(transport.recv(COORDINATOR, "setup"), coordinator_lost))
        job = build_job(header["config"])
        digest = plan_digest(job.scheduler.plan())
        if digest != header["plan_digest"]:
            raise RoleFailed(f"role {role} computed a different plan than the coordinator (digest {digest} vs {header['plan_digest']}): are both on the same pipelab version and config?")
        roles = job.scheduler.roles()
        if role not in roles:
            raise RoleFailed(f"no role {role!r} in this run; roles: {', '.join(roles)}")
        job.scheduler.load_role_state(role, weights)
        ctx = LocalContext(role, {r: s.device for r, s in roles.items()}, job, transport, header["t_ref"], job.cfg.runtime)
        await _or_lost(roles[role].program(ctx), coordinator_lost)
        await ctx.flush()
        await ctx._ctl({"kind": "result", "timeline": ctx.timeline, "stats": ctx.stats, "end": ctx.now}, job.scheduler.role_state(role))
        await transport.close()
        return 0
    except _CoordinatorLost:
        print(f"role {role}: the coordinator is gone; stopping", file=sys.stderr)
        return 3
    except BaseException as e:
        tb = "".join(traceback.format_exception(e))
        print(f"role {role} failed:\n{tb}", file=sys.stderr)
        try:
            await asyncio.wait_for(transport.send(COORDINATOR, CTL, ctl_pack({"kind": "error", "traceback": tb[-4000:]})), 5)
            await asyncio.wait_for(transport.close(), 5)
        except BaseException:
            pass
        return 1
    finally:
        if ctx is not None:
            ctx.close()


class _CoordinatorLost(Exception):
    pass


async def _or_lost(coro, lost: asyncio.Event):
    task = asyncio.ensure_future(coro)
    waiter = asyncio.ensure_future(lost.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        return task.result()
    task.cancel()
    raise _CoordinatorLost()
