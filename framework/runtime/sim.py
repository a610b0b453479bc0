"""`runtime=sim`: every role in one process, on a virtual clock.

Real tensors flow (so accuracy is real) while time is what the device and link models say,
so a run is deterministic and immune to this machine's load. Each device serves its
computations FIFO, `slots` at a time; each link carries its messages FIFO (see
framework.cluster). Messages cross a link as wire-format bytes, so byte counts are real
packet lengths. What a role sees of it (its context) is framework/runtime/sim_context.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Callable

import torch

from framework import torch_device
from framework.checkpoints import state as ck
from framework.cluster import Cluster
from framework.errors import ConfigError, listing
from framework.long_lived import long_lived
from framework.runtime.base import Runtime, RuntimeHooks, check_retries
from framework.runtime.clock import VirtualClockLoop, run_virtual
from framework.runtime.deferred import DeferredCompute
from framework.runtime.placeholders import DeferredHooks, Pending, pending_in, resolve
from framework.runtime.shared_processor import SharedProcessor
from framework.runtime.sim_context import DeviceQueue, Mailbox, SimContext


def batches_replicas(cfg, cluster: Cluster, device: torch.device) -> bool:
    """Whether identical replicas' tensor work runs batched (framework/runtime/deferred.py):
    `runtime.batch_replicas`, by default on where tensor work runs on a GPU (`device`)."""
    if cfg is None:  # a bare runtime (tests, tools): the defaults
        return False
    on = cfg.get("batch_replicas")
    if on is None:
        on = device.type == "cuda"
    if not on or not cfg.numerics:
        return False
    measured = [n for n, d in cluster.devices.items() if d.cfg.time_model == "measured"]
    if measured:
        raise ConfigError("runtime.batch_replicas", f"needs time models that do not time the call itself; device(s) {listing(measured)} use time_model=measured (set runtime.batch_replicas=false)")
    return True


def convs_as_matmul(cfg, device: torch.device) -> bool:
    """Whether batched replicas' convolutions run as matrix products (framework/replicas/conv.py):
    `runtime.replica_conv=matmul`, by default where tensor work runs on a GPU."""
    choice = cfg.get("replica_conv") if cfg is not None else None
    return device.type == "cuda" if choice is None else choice == "matmul"


class SimRuntime(Runtime):
    """Runs role programs on the virtual clock."""

    def __init__(self, cfg, cluster: Cluster, codec, hooks: RuntimeHooks | None = None, **kwargs):
        super().__init__(cfg, cluster, codec, hooks, **kwargs)  # codec: encode(tensors, ...) -> bytes; decode(bytes) -> Packet
        self.loop: VirtualClockLoop | None = None
        self.contexts: dict[str, SimContext] = {}
        self.roles: dict = {}
        # FIFO slots, or cores shared among whatever runs (framework/runtime/shared_processor.py)
        self.device_queues = {name: SharedProcessor(dev.cfg.cores) if dev.cfg.cores else DeviceQueue(dev.slots) for name, dev in cluster.devices.items()}
        self._mailboxes: dict = defaultdict(Mailbox)
        self._barriers: dict = {}
        self._resume_order: list[str] = []
        self._resume: tuple | None = None  # (bag, desc, epoch) of a checkpoint to continue from
        # tensor work may run on a GPU; codecs and their state work on the CPU: messages cross there
        device = torch_device.of(cfg)
        self.torch_device = None if device.type == "cpu" else device
        self.deferred = DeferredCompute(conv_as_matmul=convs_as_matmul(cfg, device)) if batches_replicas(cfg, cluster, device) else None
        if self.deferred is not None:  # hooks given deferred numbers wait for them
            self.hooks = DeferredHooks(self.hooks, self.deferred.flush)
            self.deferred.on_flushed = self.hooks.release

    def states(self) -> dict[str, dict]:
        """Every role's state now (they all live in this process; no copies are made)."""
        return {r: st for r, role in self.roles.items() if (st := role.state())}

    def mailbox(self, src: str, dst: str, tag: str) -> Mailbox:
        return self._mailboxes[(src, dst, tag)]

    def send(self, src, dst, tag, payload, iteration, microbatch, reliable, retries=0, moved=False) -> None:
        if dst not in self.contexts:
            raise ConfigError("scheduler", f"role {src!r} sends to unknown role {dst!r}; roles: {listing(self.contexts)}")
        check_retries(reliable, retries)
        tensors = payload if isinstance(payload, dict) else {"x": payload}
        box = self.mailbox(src, dst, tag)
        a, b = self.contexts[src].device_name, self.contexts[dst].device_name
        link = self.cluster.link(a, b)
        now = self.loop.time()
        if link is None:  # same device: no bytes cross a link
            fut = self.loop.sleep_until(now)
            fut.add_done_callback(lambda _: box.put(payload))
            return
        t0 = time.perf_counter()
        if self.deferred is not None and pending_in(tensors):
            tensors, carried = self._carry_deferred(tensors, tag)
        else:
            carried = self.codec.carry(tensors, tag=tag, copy=not moved)  # raw tensors skip the wire bytes in-process,
            # and stay where they are: a GPU's activations are not copied to the CPU and back
        if carried is None:
            if self.torch_device is not None:
                tensors = {k: v if v.device.type in ("cpu", "meta") else v.cpu() for k, v in tensors.items()}
            data, nbytes, raw_bytes = self.codec.encode(tensors, src=src, dst=dst, tag=tag, iteration=iteration, microbatch=microbatch)
        else:
            data, nbytes = carried
            raw_bytes = nbytes
        enc_s = self.codec.codec_seconds("encode", tag, tensors, time.perf_counter() - t0)

        ack_loss = self.cluster.link(b, a).cfg.loss if retries else 0.0  # ACKs cross the reverse link

        def transmit(t_ready: float) -> None:
            attempts, arrival = link.schedule(nbytes, t_ready, reliable, retries, ack_loss)
            for s, e, outcome in attempts:
                self.timeline.transfer(link.name, s, e, nbytes, iteration, microbatch, outcome, raw_bytes)
            if arrival is None:
                self.messages_lost += 1
                return
            self.loop.sleep_until(arrival).add_done_callback(lambda _: receive())

        def receive() -> None:
            t1 = time.perf_counter()
            if carried is None:
                t = self.codec.decode(data, src=src, dst=dst, tag=tag, copy=False).tensors  # the buffer is this message's alone
            else:
                t = self.codec.received(data, src=src, dst=dst, tag=tag, iteration=iteration, microbatch=microbatch)
            dec_s = self.codec.codec_seconds("decode", tag, tensors, time.perf_counter() - t1)
            if self.torch_device is not None:  # a no-op for what stayed on the GPU
                t = {k: v if isinstance(v, Pending) or v.device.type == "meta" else v.to(self.torch_device) for k, v in t.items()}
            item = t["x"] if set(t) == {"x"} else t
            if dec_s > 0:
                self.occupy(dst, "decode", dec_s, iteration, microbatch, lambda _: box.put(item))
            else:
                box.put(item)

        if enc_s > 0:
            self.occupy(src, "encode", enc_s, iteration, microbatch, transmit)
        else:
            transmit(now)

    def _carry_deferred(self, tensors: dict, tag: str) -> tuple[dict, tuple | None]:
        """`codec.carry` for a message holding placeholders: where no codec codes anything, the
        byte count comes from their shapes and the receiver gets placeholders of their copies;
        otherwise the values are computed now and the message takes the usual way.
        Returns (the tensors as the codec should see them, what `codec.carry` returns)."""
        if self.codec.codes_nothing:
            shapes = {k: v.spec if isinstance(v, Pending) else v for k, v in tensors.items()}
            size = self.codec.carried_size(shapes, tag=tag)
            if size is not None:
                copies = {k: v.copied() if isinstance(v, Pending) else v.detach().clone(memory_format=torch.contiguous_format) for k, v in tensors.items()}
                return shapes, (copies, size)
        tensors = resolve(tensors)
        return tensors, self.codec.carry(tensors, tag=tag)

    def occupy(self, role: str, kind: str, seconds: float, iteration: int, microbatch: int, then: Callable[[float], None]) -> None:
        """Run `kind` work of `seconds` on `role`'s device without blocking the caller: the
        device slot is claimed now (so the role's next computation queues behind it), and
        `then(end_time)` runs when it is done."""
        ctx = self.contexts[role]
        queue = self.device_queues[ctx.device_name]
        waiter = queue.try_acquire(self.loop)

        async def work():
            if waiter is not None:
                await waiter
            start = self.loop.time()
            end = await queue.hold(self.loop, seconds)
            self.timeline.compute(role, kind, start, end, iteration, microbatch, -1)
            queue.release()
            then(end)

        self.loop.create_task(work())

    async def barrier(self, key, role: str, on_complete: Callable[[], None]) -> None:
        state = self._barriers.setdefault(key, {"arrived": [], "fut": self.loop.create_future()})
        state["arrived"].append(role)
        if len(state["arrived"]) == len(self.contexts):
            # the last to arrive goes on first, then the others in the order they came (the
            # futures' callbacks): a run resumed from here starts its roles in this order
            self._resume_order = state["arrived"][-1:] + state["arrived"][:-1]
            on_complete()
            state["fut"].set_result(None)
            del self._barriers[key]
            return
        await state["fut"]

    @staticmethod
    def _describe_wait(ctx: SimContext) -> str:
        what = ctx.waiting_on  # a tuple on the hot path; words only when a deadlock is reported
        return {
            "device": lambda: f"device {ctx.device_name} for {what[-1]}",
            "compute": lambda: f"{what[-1]} on {ctx.device_name}",
            "recv": lambda: f"recv {what[1]!r} from {what[2]}",
            "epoch": lambda: f"the end of epoch {what[1]}",
            "sleep": lambda: f"sleep until {what[1]:.6f}s",
        }.get(what[0], lambda: what[0])()

    def describe_pending(self) -> str:
        waits = "; ".join(f"{r} waits on {self._describe_wait(c)}" for r, c in self.contexts.items() if c.waiting_on != ("done",))
        return f"deadlock at virtual time {self.loop.time():.6f}s: {waits}"

    # ---- checkpoints ------------------------------------------------------------------------

    checkpoints = True

    def checkpoint(self, bag, prefix: str) -> dict:
        """Every role's state, the clock, the links' channels and loss generators, the timeline
        and torch's generator (the roles' dropout draws). Nothing may be in flight."""
        busy = [n for n, q in self.device_queues.items() if not q.idle]
        pending = sorted({f"{src}->{dst} {tag}" for (src, dst, tag), box in self._mailboxes.items() if box.items})
        now = self.loop.time()
        sending = [ch.name for ch in self.cluster.channels if ch.free_at > now]
        if busy or pending or sending:
            raise ck.CheckpointError(f"roles left work in flight at the epoch end (devices busy {busy}, undelivered {pending}, links sending {sending})")
        return {
            "now": now,
            "order": self._resume_order,
            "channels": {ch.name: ch.free_at for ch in self.cluster.channels},
            # the links used so far (a link is built on first use); a loss-free link draws only ACK losses
            "links": {link.name: ck.random_state(link.rng) if link.cfg.loss > 0 or link.drew_acks else None for link in self.cluster.links.values()},
            "messages_lost": self.messages_lost,
            "timeline": self.timeline.checkpoint(bag, f"{prefix}.timeline"),
            "torch_rng": bag.put(f"{prefix}.rng", {"torch": torch.get_rng_state()}),
            "roles": {r: role.checkpoint(bag, f"{prefix}.role.{r}") for r, role in self.roles.items()},
        }

    def resume(self, bag, desc: dict, epoch: int) -> None:
        self._resume = (bag, desc, epoch)

    def _restore(self, roles: dict) -> float:
        """Put the checkpoint's state back into freshly built `roles`; returns the clock."""
        bag, desc, epoch = self._resume
        differ = set(roles) ^ set(desc["roles"])
        if differ:
            raise ck.CheckpointError(f"the checkpoint's roles differ from this run's: {sorted(differ)}")
        for r, role in roles.items():
            role.restore(bag, desc["roles"][r])
            role.first_epoch = epoch + 1
        for name, state in desc["links"].items():  # build the links the run had used
            link = self.cluster.link(*name.split("->"))
            if state is not None:
                ck.set_random_state(link.rng, state)
                link.drew_acks = True
        channels = {ch.name: ch for ch in self.cluster.channels}
        for name, free_at in desc["channels"].items():
            channels[name].free_at = free_at
        self.messages_lost = int(desc["messages_lost"])
        self.timeline.restore(bag, desc["timeline"])
        torch.set_rng_state(bag.take(desc["torch_rng"])["torch"])
        return float(desc["now"])

    def run(self, scheduler) -> float:
        """Build every role of `scheduler` and run them to the end; returns the virtual makespan."""
        with long_lived():  # building 128 model replicas had set off collections worth 0.15 s
            roles = {r: scheduler.build_role(r) for r in scheduler.role_devices()}
            start = 0.0
            if self._resume is not None:
                start = self._restore(roles)
                order = self._resume[1]["order"]
                roles = {r: roles[r] for r in order + [r for r in roles if r not in order]}
            try:
                return self.run_roles(roles, start=start)
            finally:
                self.final_states = self.states()
                self.role_stats = {r: role.stats() for r, role in roles.items()}

    def run_roles(self, roles: dict, start: float = 0.0) -> float:
        """Run these roles (name -> framework.scheduler.Role) to the end from virtual time
        `start`; returns the virtual makespan."""
        self.roles = roles
        for name, role in roles.items():
            self.contexts[name] = SimContext(self, name, role.device)
            self.timeline.add_role(name)

        async def main():
            self.loop = asyncio.get_running_loop()

            async def wrap(name, role):
                ctx = self.contexts[name]
                await role.run(ctx)
                ctx.waiting_on = ("done",)

            await asyncio.gather(*(wrap(n, r) for n, r in roles.items()))
            return self.loop.time()

        with long_lived(roles=len(roles)):  # the roles just built, too
            return run_virtual(main(), describe_pending=self.describe_pending, start=start)
