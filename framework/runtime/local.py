"""`runtime=local` and `runtime=remote`: one OS process per role, real clock, real transport.

The same role programs as on the simulator run here, each in its own process (`local` starts
them on this machine; `remote` waits for `python -m framework.worker role=<name> ...` started
anywhere that reaches the broker). The coordinator, the `python -m framework` process:

1. opens the network (`transport=mqtt`: a private mosquitto unless told otherwise);
2. waits for every role to say `ready` (`runtime.join_timeout_s`; the message names the
   missing roles), then sends each its `setup`: the resolved config as JSON, the plan the
   coordinator made (so no role searches or builds another role's state) and the initial
   model (wire format); once every role has built itself it says `start` with the reference
   time, so the run's clock (and its makespan and idle times) counts training, not start-up;
3. relays progress to the job (metrics, progress bar), runs the epoch barrier (every role
   sends its state and its timeline so far, the coordinator evaluates, then says `go`), and
   collects each role's final state, timeline and counters into the one MLflow run and
   summary.json;
4. fails fast when a role dies (its process exits, or its MQTT last will arrives) or
   reports an error, naming the role; every role process is stopped on success, failure or
   Ctrl-C, and a worker stops by itself if the coordinator disappears. A role the scheduler
   declares optional (a PiPar/FL device) may die: the run goes on without it, the survivors
   see `PeerLost` when they wait on it, and the loss is recorded as a dropout.

The role side is framework.runtime.role_process. Optional emulation: `emulate_compute`
stretches each computation to what the device's time model (and speed trace) says; `emulate_links` sends every message through the cluster's link model (token
bucket at the link's bandwidth, its latency, its loss with retransmission) before the
transport. Control messages are JSON or wire-format tensors, never pickles.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Callable

from omegaconf import OmegaConf

from framework.errors import ConfigError, PipelabError, WireError, listing
from framework.nonfinite import NonFiniteError
from framework.runtime import secret_pipe
from framework.runtime.allocator import tune_malloc
from framework.runtime.base import Runtime
from framework.runtime.configs import LocalConfig, RemoteConfig  # noqa: F401  (the schemas live in a light module: registry.declare)
from framework.runtime.control import COORDINATOR, CTL, TO_COORDINATOR, ctl_pack, ctl_unpack
from framework.runtime.parent_death import die_with_parent
from framework.runtime.role_process import TRANSPORT_FAILED_EXIT, RoleFailed
from framework.runtime.transport import FAULTS, Network

# ---- the coordinator -----------------------------------------------------------------------

# Roles start together, and leave each epoch barrier together, at a time the coordinator names
# this far ahead: far enough that every role has the message by then (local MQTT delivers in a
# few ms), so programs on a global slot clock (EdgePipe) see the same clock origin everywhere.
LEAD_S = 0.1


class LocalRuntime(Runtime):
    """The coordinator side of runtime=local/remote."""

    spawn_workers = True

    def __init__(self, cfg, cluster, codec, hooks=None, **kwargs):
        super().__init__(cfg, cluster, codec, hooks, **kwargs)
        self.procs: dict[str, subprocess.Popen] = {}
        self.dropped = 0
        self.rejected_control = 0  # malformed control messages: counted and skipped, never fatal
        if not isinstance(self.network, Network):
            raise ConfigError("transport.name", f"runtime={cfg.name} needs a network transport between its processes; choices: mqtt (transport=mqtt)")
        self.run_id = cfg.run_id or f"r{uuid.uuid4().hex[:10]}"

    def run(self, scheduler) -> float:
        if self.cfg.tune_malloc:
            tune_malloc()
        self.network.open(self.run_id, [*scheduler.role_devices(), COORDINATOR])  # a private broker admits these, no one else
        try:
            makespan = asyncio.run(self._coordinate(scheduler))
            self._stop_workers(grace_s=10.0)  # they are saying goodbye: let them
            return makespan
        finally:
            self._stop_workers()
            self.network.close()
            self._report_transport_faults()

    def _report_transport_faults(self) -> None:
        """One line when any endpoint dropped or refused frames (summary.json has them per role)."""
        parts = []
        back = {role: (st.get("transport") or {}).get("reconnects", 0) for role, st in sorted(self.process_stats.items())}
        if any(back.values()):
            print(f"runtime={self.cfg.name}: the broker connection dropped and came back ({', '.join(f'{r} {n}' for r, n in back.items() if n)} reconnects); "
                  "every message is acknowledged end to end and sent again when needed; the copies count as replayed", file=sys.stderr)
        for role, st in sorted(self.process_stats.items()):
            counts = st.get("transport") or {}
            bad = ", ".join(f"{k.replace('_', ' ')} {counts[k]}" for k in FAULTS if counts.get(k))
            if bad:
                parts.append(f"{role}: {bad}")
        if parts:
            print(f"runtime={self.cfg.name}: transport rejected frames ({'; '.join(parts)}); per role in summary.json processes.<role>.transport", file=sys.stderr)

    # -- role processes ---------------------------------------------------------------------

    def worker_command(self, role: str) -> list[str]:
        extra = [] if self.cfg.tune_malloc else ["runtime.tune_malloc=false"]
        return [self.cfg.python or sys.executable, "-m", "framework.worker", f"role={role}", f"runtime.run_id={self.run_id}", *extra, *self.network.worker_args()]

    def _spawn(self, roles) -> None:
        env = {k: v for k, v in os.environ.items() if k not in self.network.secret_env}
        env["PYTHONUNBUFFERED"] = "1"
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        threads = self.cfg.threads
        if threads:
            env.setdefault("OMP_NUM_THREADS", str(threads))
        for role in roles:  # each role's secrets through a pipe: never in its environment or on its command line
            self.procs[role] = secret_pipe.popen(self.worker_command(role), self.network.worker_secret(role), env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

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

    async def _coordinate(self, scheduler) -> float:
        roles = scheduler.role_devices()
        optional = scheduler.optional_roles()
        t = self.network.endpoint(COORDINATOR)
        await t.start(self.run_id, COORDINATOR)
        failure: asyncio.Future = asyncio.get_running_loop().create_future()
        ready: set[str] = set()
        ready_event = asyncio.Event()
        self._events: asyncio.Queue = asyncio.Queue()  # (role, header, tensors) from the roles, and losses
        self._live = set(roles)
        self._ended: set[str] = set()  # roles whose result arrived
        goodbyes: set[str] = set()  # roles that closed their transport (status `done`)
        blamed: set[str] = set()  # roles whose transport failed, waiting for this one's verdict
        self._epochs_done = 0
        self._t_ref = time.time()

        def fail(msg: str) -> None:
            if not failure.done():
                failure.set_exception(RoleFailed(msg))

        def lose(role: str, how: str, transport_failed: bool = False) -> None:
            if role not in self._live or role in self._ended:
                return  # a role that reported its result and said goodbye may drop its connection as it likes
            if transport_failed and role not in blamed:
                # the broker went away for good: this process's own connection gives up about
                # as soon, with the message that names the broker. Blame the role only if that
                # does not come (its connection alone failed)
                blamed.add(role)
                asyncio.get_running_loop().call_later(self.network.give_up_s() + 5.0, lose, role, how)
                return
            if role not in optional:
                fail(f"role {role} {how}")
                return
            self._live.discard(role)
            self.dropouts.append({"role": role, "epoch": self._epochs_done, "time_s": time.time() - self._t_ref, "cause": how})
            print(f"runtime={self.cfg.name}: role {role} {how}; the run goes on without it (a dropout)", file=sys.stderr)
            self._events.put_nowait((role, {"kind": "lost"}, None))

        def on_status(role: str, state: str) -> None:
            if role not in roles:
                return
            if state == "ready":
                ready.add(role)
                if len(ready) == len(roles):
                    ready_event.set()
            elif state == "done":
                self._ended.add(role)  # a clean goodbye: whatever happens to its connection next is no loss
                goodbyes.add(role)
            elif state == "lost":
                lose(role, "was lost (its connection to the broker dropped without a goodbye: the process died or the machine is unreachable)")

        t.on_status(on_status)
        try:
            if self.spawn_workers:
                self._spawn(roles)
                print(f"runtime={self.cfg.name}: {len(roles)} role processes over {self.network.describe()}, run id {self.run_id}", file=sys.stderr)
            else:
                print(f"runtime=remote: run id {self.run_id}, over {self.network.describe()}. Start one worker per role:", file=sys.stderr)
                for role in roles:
                    cmd = [*self.worker_command(role)[1:], *self.network.worker_secret_args(role)]  # a 0600 file: copy it to the device
                    print("  " + " ".join(cmd).replace("-m framework.worker", "python -m framework.worker"), file=sys.stderr)
            watchdog = asyncio.create_task(self._watch(lose))
            try:
                await self._race(asyncio.wait_for(ready_event.wait(), self.cfg.join_timeout_s), failure)
            except asyncio.TimeoutError:
                missing = sorted(set(roles) - ready)
                raise RoleFailed(f"roles did not join within runtime.join_timeout_s={self.cfg.join_timeout_s:g}s: missing {listing(missing)}") from None
            # one packet for all: each role reads its own spec (framework.specs), the plan rides along for
            # the scheduler every role process builds (its role_devices and eval need it)
            specs = {role: scheduler.role_spec(role).to_json() for role in roles}
            setup = {"kind": "setup", "config": _plain(self.run_config), "plan": scheduler.plan(), "specs": specs, "run_id": self.run_id}
            packet = ctl_pack(setup, {k: v.detach() for k, v in scheduler.ctx.model.state_dict().items()})
            for role in roles:
                await t.send(role, "setup", packet)
            result = await self._race(self._serve(t, roles), failure)
            watchdog.cancel()
            if not self.spawn_workers:  # remote roles say goodbye through the broker: keep it up until they have
                deadline = time.monotonic() + 10.0
                while not goodbyes >= set(roles) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            return result
        finally:
            await t.close()
            self.process_stats.setdefault(COORDINATOR, {})["transport"] = dict(t.stats)  # every Transport counts

    async def _race(self, coro, failure: asyncio.Future):
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task, failure}, return_when=asyncio.FIRST_COMPLETED)
        if task in done and task.exception() is not None:
            raise task.exception()  # what a role said went wrong, before the watchdog's "it exited"
        if failure in done:
            task.cancel()
            failure.result()  # raises RoleFailed
        return task.result()

    async def _watch(self, lose: Callable[[str, str], None]) -> None:
        while True:
            for role, p in self.procs.items():
                code = p.poll()
                if code is not None and code != 0:
                    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                    if code == TRANSPORT_FAILED_EXIT:
                        how = f"lost its connection to {self.network.describe()} for good"
                    lose(role, f"(pid {p.pid}) {how}", code == TRANSPORT_FAILED_EXIT)
            await asyncio.sleep(0.1)

    def _add_intervals(self, intervals: list) -> None:
        for iv in intervals:
            if iv[0] == "c":
                self.timeline.compute(*iv[1:])
            else:
                self.timeline.transfer(*iv[1:])

    async def _serve(self, t, roles: dict[str, str]) -> float:
        hooks = self.hooks
        epochs: dict[int, dict[str, dict]] = {}
        results: dict[str, dict] = {}
        events = self._events
        for role in roles:
            self.timeline.add_role(role)

        async def pump(role):
            while True:
                try:
                    data = await t.recv(role, CTL)
                except PipelabError as e:  # this process's transport failed (the broker lost for good)
                    await events.put((role, {"kind": "fault", "error": e}, None))
                    return
                try:
                    header, tensors = ctl_unpack(data, TO_COORDINATOR)
                except WireError as e:  # anyone on the broker can publish one: count it, go on
                    self.rejected_control += 1
                    if self.rejected_control == 1:
                        print(f"runtime={self.cfg.name}: rejected a malformed control message on role {role}'s topic ({e}); counted in summary.json processes.{COORDINATOR}.rejected_control", file=sys.stderr)
                    continue
                if header["kind"] == "result":
                    self._ended.add(role)
                await events.put((role, header, tensors))
                if header["kind"] in ("result", "error"):
                    return

        async def close_epochs() -> None:
            """Every epoch all live roles have reached: evaluate, then let them go on."""
            for e in sorted(epochs):
                arrived = epochs[e]
                if not self._live <= set(arrived):
                    return
                states = {r: a["state"] for r, a in arrived.items() if a["state"]}
                # evaluation may take seconds: off the event loop, which keeps the connection alive
                # (no other hook runs meanwhile: this loop waits for it)
                await asyncio.to_thread(hooks.on_epoch_end, e, max(a["now"] for a in arrived.values()), lambda: states)
                del epochs[e]
                self._epochs_done = e + 1
                resume = time.time() - self._t_ref + LEAD_S  # every role leaves the barrier then
                for r in sorted(self._live):
                    await t.send(r, "go", ctl_pack({"kind": "go", "epoch": e, "t": resume}))

        async def start_when_built() -> None:
            """The clock starts once every live role has built itself (start-up is not training)."""
            nonlocal started
            if not started and self._live <= built:
                started = True
                self._t_ref = time.time() + LEAD_S  # every role starts its program then
                for r in sorted(self._live):
                    await t.send(r, "start", ctl_pack({"kind": "start", "t_ref": self._t_ref}))

        built: set[str] = set()
        started = False
        pumps = [asyncio.create_task(pump(r)) for r in roles]
        try:
            while not self._live <= set(results):
                role, h, tensors = await events.get()
                kind = h["kind"]
                if kind == "built":
                    built.add(role)
                    await start_when_built()
                elif kind == "it":
                    hooks.on_iteration(h["epoch"], h["iteration"], h["samples"], h["now"])
                elif kind == "train":
                    hooks.on_train(float(h["loss_sum"]), h["correct"], h["n"], role)  # a non-finite loss comes as its name
                elif kind == "epoch":
                    self._add_intervals(h["timeline"])
                    epochs.setdefault(h["epoch"], {})[role] = {"now": h["now"], "state": tensors}
                    await close_epochs()
                elif kind == "lost":
                    await start_when_built()
                    await close_epochs()
                elif kind == "result":
                    self._add_intervals(h["timeline"])
                    results[role] = h
                    if tensors:
                        self.final_states[role] = tensors
                    self.role_stats[role] = h["role_stats"]
                    self.process_stats[role] = h.get("process", {})
                elif kind == "error":
                    raise role_error(role, h)
                elif kind == "fault":
                    raise h["error"]
        finally:
            for p in pumps:
                p.cancel()
            self.process_stats.setdefault(COORDINATOR, {})["rejected_control"] = self.rejected_control
        for h in results.values():
            self.messages_lost += h["stats"].get("lost", 0)
            self.dropped += h["stats"].get("dropped", 0)
        return max((h["end"] for h in results.values()), default=time.time() - self._t_ref)


def role_error(role: str, h: dict) -> Exception:
    """What a role's `error` message means: its own one line for an error raised on purpose (a
    non-finite number, a config or data error), else the role's traceback (a bug)."""
    found = h.get("nonfinite")
    if type(found) is dict and type(found.get("what")) is str:
        it = found.get("iteration")
        return NonFiniteError(found["what"][:300], role=role, iteration=it if type(it) is int else None)
    if type(h.get("message")) is str:
        return RoleFailed(f"role {role}: {h['message'][:300]}")
    return RoleFailed(f"role {role} failed:\n{h['traceback'].rstrip()}")


class RemoteRuntime(LocalRuntime):
    spawn_workers = False


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


