"""Inside a role process of `runtime=local`/`remote`: one role, its own state, real messages.

`run_role` joins the run through the transport, receives the setup (the run's config, the
coordinator's plan and the initial weights), builds *only its own role* from the plan (no plan
search, no other role's stage), runs the role program and reports back. Compute runs in a worker
thread so the event loop keeps the connection alive.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable

from framework import nonfinite
from framework.cluster import Work
from framework.errors import PipelabError, WireError, listing
from framework.runtime.base import PeerLost, RoleContext, check_retries
from framework.runtime.control import COORDINATOR, CTL, ctl_pack, ctl_unpack
from framework.runtime.transport import TransportError

# a role's exit status when its transport failed (the broker lost for good): the coordinator then
# waits for its own transport's verdict, which names the broker, rather than blaming the role
TRANSPORT_FAILED_EXIT = 4


class RoleFailed(PipelabError):
    """A role process died, or its program raised."""


class LocalContext(RoleContext):
    """A role's view of the world in its own process: real clock, real messages."""

    def __init__(self, role: str, role_devices: dict[str, str], cluster, codec, transport, t_ref: float, rt_cfg, role_obj=None, guard=None):
        self.role = role
        self.role_obj = role_obj  # the framework.scheduler.Role this process runs (its state goes out at epoch ends)
        self.role_devices = role_devices  # every role's device: which link a message takes
        self.device_name = role_devices[role]
        self.cluster = cluster
        self.device = cluster.device(self.device_name)
        self.codec = codec
        self.t = transport
        self.t_ref = t_ref
        self.cfg = rt_cfg
        self.timeline: list[list] = []
        self.timeline_sent = 0  # intervals already reported at an epoch end
        self.stats = {"dropped": 0, "lost": 0}
        self.counts = {"rejected_control": 0}  # malformed control messages, reported with `process`
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"compute-{role}")
        self._outboxes: dict[str, _Outbox] = {}
        self._pending_bytes = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._lost: dict[str, asyncio.Event] = {}
        self.error: BaseException | None = None
        self.guard = guard or nonfinite.Guard()  # non-finite numbers (framework/nonfinite.py): the run's policy
        transport.on_status(self._on_status)

    def _on_status(self, role: str, state: str) -> None:
        if state == "lost" and role != self.role:
            self._lost_event(role).set()

    def _lost_event(self, role: str) -> asyncio.Event:
        ev = self._lost.get(role)
        if ev is None:
            ev = self._lost[role] = asyncio.Event()
        return ev

    def now(self) -> float:
        return time.time() - self.t_ref

    async def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            await asyncio.sleep(dt)

    async def compute(self, work: Work, fn: Callable | None = None, *args, iteration=-1, microbatch=-1, group=-1, **kwargs) -> Any:
        while self._pending_bytes > self.cfg.max_pending_bytes:  # back-pressure from the network
            self._drained.clear()
            await self._drained.wait()
        self._raise()
        start = self.now()
        t0 = time.perf_counter()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args, **kwargs)) if fn is not None else None
        except nonfinite.NonFiniteError as e:
            raise e.locate(self.role, iteration) from None
        wall = time.perf_counter() - t0
        if self.cfg.emulate_compute:
            extra = self.device.duration(work, start, wall) - wall
            if extra > 0:
                await asyncio.sleep(extra)
        self.compute_s += self.now() - start
        self.timeline.append(["c", self.role, work.kind, start, self.now(), iteration, microbatch, group])
        return result

    def send(self, dst: str, tag: str, tensor, *, iteration=0, microbatch=0, reliable=True, retries=0, moved=False) -> None:  # `moved`: the bytes are copied anyway
        self._raise()
        check_retries(reliable, retries)
        if dst in self._lost and self._lost[dst].is_set():
            return  # nobody will read it
        tensors = tensor if isinstance(tensor, dict) else {"x": tensor}
        data, nbytes, raw = self.codec.encode(tensors, src=self.role, dst=dst, tag=tag, iteration=iteration, microbatch=microbatch)
        self._enqueue(dst, (self.now(), tag, data, nbytes, raw, iteration, microbatch, reliable, retries))

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

    async def _next(self, src: str, tag: str, timeout: float | None):
        """The next raw message from src; PeerLost once src is lost and nothing more is queued."""
        lost = self._lost_event(src)
        if not lost.is_set():
            finished, data = await first_or_event(self.t.recv(src, tag, timeout), lost)
            if finished:
                return data
        try:  # what src sent before it died is still delivered
            return await self.t.recv(src, tag, 0.2)
        except asyncio.TimeoutError:
            raise PeerLost(src) from None

    async def recv(self, src: str, tag: str, timeout: float | None = None):
        while True:
            try:
                data = await self._next(src, tag, timeout)
            except asyncio.TimeoutError:
                return None
            try:
                packet = self.codec.decode(data, src=src, dst=self.role, tag=tag, copy=False)
            except WireError:
                self.stats["dropped"] += 1  # never executed, only counted
                continue
            t = packet.tensors
            msg = t["x"] if set(t) == {"x"} else t
            if self.guard.enabled:  # a poisoned peer must not pass as a finished run
                self.guard.received(msg, f"{tag!r} tensor received from {src}", self.role, packet.iteration)
            return msg

    async def _ctl(self, header: dict, tensors: dict | None = None) -> None:
        await self.t.send(COORDINATOR, CTL, ctl_pack(header, tensors))

    def new_intervals(self) -> list[list]:
        out = self.timeline[self.timeline_sent :]
        self.timeline_sent = len(self.timeline)
        return out

    async def end_epoch(self, epoch: int) -> None:
        await self.flush()
        state = self.role_obj.state() if self.role_obj is not None else {}
        await self._ctl({"kind": "epoch", "epoch": epoch, "now": self.now(), "timeline": self.new_intervals()}, state or None)
        while True:
            h, _ = await recv_ctl(self.t, "go", self.counts, self.role)
            if h["epoch"] == epoch:
                break
        if math.isfinite(h["t"]):  # every role leaves the barrier at the same time (the lead is 0.1 s: a far one is no plan)
            await self.sleep_until(min(h["t"], self.now() + 10.0))
        self.codec.set_epoch(epoch + 1)  # epoch-scheduled bit widths, as the coordinator's

    def iteration_done(self, epoch: int, iteration: int, samples: int) -> None:
        self._spawn_ctl({"kind": "it", "epoch": epoch, "iteration": iteration, "samples": samples, "now": self.now()})

    def report_train(self, loss_sum: float, correct: int, n: int) -> None:
        loss_sum = float(loss_sum)
        # JSON has no NaN or infinity: a non-finite loss goes as its name, and the coordinator's
        # check (the job's, as on the simulator) fails the run or warns, naming this role
        self._spawn_ctl({"kind": "train", "loss_sum": loss_sum if math.isfinite(loss_sum) else str(loss_sum), "correct": int(correct), "n": int(n)})

    def _spawn_ctl(self, header: dict) -> None:
        # progress goes out in call order, through the coordinator's outbox (never link-emulated)
        data = ctl_pack(header)
        self._enqueue(COORDINATOR, (self.now(), CTL, data, len(data), len(data), -1, -1, True, 0), emulate=False)

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
        self.link = ctx.cluster.link(ctx.device_name, dst_device) if emulate and dst_device else None
        self.ack_loss = ctx.cluster.link(dst_device, ctx.device_name).cfg.loss if self.link is not None else 0.0  # ACKs cross the reverse link
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
                t_sent, tag, data, nbytes, raw, it, mb, reliable, retries = await self.queue.get()
                if self.link is not None:
                    attempts, arrival = self.link.schedule(nbytes, max(t_sent, ctx.now()), reliable, retries, self.ack_loss if retries else 0.0)
                    wait = (arrival if arrival is not None else attempts[-1][1]) - ctx.now()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    for s, e, outcome in attempts:
                        ctx.timeline.append(["t", self.name, s, e, nbytes, it, mb, outcome, raw])
                    if arrival is None:
                        ctx.stats["lost"] += 1
                    else:
                        await ctx.t.send(self.dst, tag, data)
                else:
                    start = ctx.now()
                    await ctx.t.send(self.dst, tag, data)
                    if tag != CTL:
                        ctx.timeline.append(["t", self.name, start, ctx.now(), nbytes, it, mb, "send", raw])
                ctx._sent(len(data))
                if self.queue.empty():
                    self.idle.set()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the role sees it at its next send or compute
            ctx.error = e
            ctx._drained.set()
            self.idle.set()


async def run_role(transport, run_id: str, role: str, build: Callable[[dict, dict], Any]) -> int:
    """A role process: join, get the setup, run the role program, report. Returns an exit code.

    `build(config, plan)` returns (SchedulerContext, Scheduler) for this role."""
    coordinator_lost = asyncio.Event()
    transport.on_status(lambda r, s: coordinator_lost.set() if r == COORDINATOR and s == "lost" else None)
    await transport.start(run_id, role)
    joined_s = process_age_s()  # interpreter start, imports and connecting
    ctx = None
    counts = {"rejected_control": 0}
    try:
        await transport.publish_status("ready")
        header, weights = await _or_lost(recv_ctl(transport, "setup", counts, role), coordinator_lost)
        # building takes a while on a small device: off the event loop, which must keep the
        # connection alive (a loop blocked past the keepalive reads as a dead role to the broker)
        t_build = time.perf_counter()
        sctx, sched, role_obj = await _or_lost(asyncio.to_thread(_build_role, build, header, weights, role), coordinator_lost)
        process = {"joined_s": joined_s, "build_s": time.perf_counter() - t_build}
        devices = sched.role_devices()
        await transport.send(COORDINATOR, CTL, ctl_pack({"kind": "built"}))
        start, _ = await _or_lost(recv_ctl(transport, "start", counts, role), coordinator_lost)
        ctx = LocalContext(role, devices, sctx.cluster, sctx.compressor, transport, start["t_ref"], sctx.cfg.runtime, role_obj, sctx.optimizer.guard)
        ctx.counts = counts
        await ctx.sleep_until(0.0)  # the clock's origin: every role starts then
        await _or_lost(role_obj.run(ctx), coordinator_lost)
        await ctx.flush()
        process["peak_rss_mib"] = peak_rss_mib()
        process.update(counts)
        process["transport"] = dict(transport.stats)  # frames dropped and why: summary.json processes.<role>.transport
        result = {"kind": "result", "timeline": ctx.new_intervals(), "stats": ctx.stats, "role_stats": role_obj.stats(), "process": process, "end": ctx.now()}
        await ctx._ctl(result, role_obj.state() or None)
        await transport.close()
        return 0
    except _CoordinatorLost:
        print(f"role {role}: the coordinator is gone; stopping", file=sys.stderr)
        return 3
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C reaches every process of the terminal's group:
        return 130  # the coordinator says what happened, once
    except BaseException as e:
        tb = "".join(traceback.format_exception(e))
        report = {"kind": "error", "traceback": tb[-4000:]}
        if isinstance(e, PipelabError):  # said on purpose: the coordinator prints its one line
            report["message"] = str(e)[:1000]
            if isinstance(e, nonfinite.NonFiniteError):
                report["nonfinite"] = e.where()
        try:
            await asyncio.wait_for(transport.send(COORDINATOR, CTL, ctl_pack(report)), 5)
            await asyncio.wait_for(transport.close(), 5)
            told = True
        except BaseException:
            told = False
        if not told or "message" not in report:  # a bug's traceback, or nobody heard the error
            print(f"role {role} failed:\n{tb}" if "message" not in report else f"role {role}: error: {report['message']}", file=sys.stderr)
        return TRANSPORT_FAILED_EXIT if isinstance(e, TransportError) else 1
    finally:
        if ctx is not None:
            ctx.close()


async def recv_ctl(transport, kind: str, counts: dict, role: str) -> tuple[dict, dict | None]:
    """The next well-formed `kind` message from the coordinator, on the tag of its kind. Anyone on
    the broker can publish there: a malformed message is counted and skipped, never fatal."""
    while True:
        data = await transport.recv(COORDINATOR, kind)
        try:
            return ctl_unpack(data, (kind,))
        except WireError as e:
            counts["rejected_control"] += 1
            if counts["rejected_control"] == 1:
                print(f"role {role}: rejected a malformed {kind!r} control message ({e}); counted as rejected_control", file=sys.stderr)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), None elsewhere."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_mib() -> float:
    import resource  # POSIX only: the module stays importable where resource is missing

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def _build_role(build, header: dict, weights: dict | None, role: str):
    sctx, sched = build(header["config"], header["plan"])
    devices = sched.role_devices()
    if role not in devices:
        raise RoleFailed(f"no role {role!r} in this run; roles: {listing(devices)}")
    if weights:
        sctx.model.load_state_dict(weights)  # the coordinator's initial model, whatever this host's RNG
    if sctx.cfg.runtime.numerics:
        sctx.compressor.prepare()  # compiled codecs load here, not on the event loop mid-run
    spec = header["specs"].get(role)
    if not isinstance(spec, dict):
        raise RoleFailed(f"the coordinator's setup holds no spec for role {role!r}")
    return sctx, sched, sched.role_from_spec(role, spec)


class _CoordinatorLost(Exception):
    pass


async def first_or_event(coro, event: asyncio.Event) -> tuple[bool, Any]:
    """(True, coro's result) if it finishes before `event` is set; else (False, None), cancelled."""
    task = asyncio.ensure_future(coro)
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # Ctrl-C: the role program stops here too, not after its tools are gone
        task.cancel()
        waiter.cancel()
        raise
    if task in done:
        waiter.cancel()
        return True, task.result()
    task.cancel()
    return False, None


async def _or_lost(coro, lost: asyncio.Event):
    finished, result = await first_or_event(coro, lost)
    if not finished:
        raise _CoordinatorLost()
    return result
