"""Collaborative learning over one server and K devices: PiPar and its baselines FL, SFL, SL.

PiPar (Zhang et al., JPDC 2024) splits each device's copy of the model after unit P^k: the
device runs units 1..P^k, the server runs P^k+1..Q on a per-device replica. One iteration on
device k (Table I):

    device :  f^c_1 .. f^c_N                    b^c_1 .. b^c_N   step
    uplink :       u_1 .. u_N                                         (FIFO, as each f^c_n ends)
    server :            f^s_1 b^s_1 .. f^s_N b^s_N   step             (as each u_n arrives)
    downlink:                 d_1  ..  d_N                            (FIFO, as each b^s_n ends)

with N micro-batches of B' = floor(B/N) samples and the loss scaled by 1/(N B'), so one
iteration is one step of mini-batch SGD on N B' samples (Eq. 25-27). After every epoch (or
every `aggregate_every` epochs) the K complete models are averaged (FedAvg weighted by the
samples each device trained on this round, Alg. 2) and split again per device.

The baselines are the same role programs with other settings:
- `fl`  (FedAvg): P = Q, N = 1. The device trains the whole model; the server only averages.
- `sfl` (SplitFed): N = 1 at the split point with the shortest estimated epoch (Scission-style
  benchmarking), one server replica per device (default) or one shared server model.
- `sl`  (vanilla split learning): N = 1, one shared server model, devices train in turn and
  hand the device-side model on through the server.

Roles: `dev<k>` on device `dev<k>`; on device `server`: `srv<k>` (one replica per device,
computing in parallel: `server_mode=parallel`, Fig. 3c), or one `server` role that serves the
devices in turn (`server_mode=sequential`, Fig. 3b; also SFL's shared model and SL); and `fed`,
which averages. Decisions left open by the paper are in `pipar.notes.md` section 8 and in the
docstrings below (disconnects, DP noise, re-selection on bandwidth changes).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from framework import registry
from framework.cluster import Work
from framework.config import SchedulerConfig
from framework.data import batches, shard_indices, split_microbatches
from framework.errors import ConfigError
from framework.runtime.base import RoleSpec
from framework.stage import Stage
from plugins.schedulers import pipar_plan as plan_mod

SERVER = "server"
SELECT = ("auto", "exhaustive")
SERVER_MODES = ("parallel", "sequential")
SHARDS = ("contiguous", "dirichlet")
RESELECT_MODES = ("full_profile", "reestimate_only")


@dataclass
class CollabConfig(SchedulerConfig):
    name: str = "pipar"
    P: Optional[int] = None  # split point: units 1..P on the device; null = chosen by `select`
    N: Optional[int] = None  # micro-batches per iteration; null = chosen by `select`
    select: str = "auto"  # auto (profile + Table I estimate) | exhaustive (one trial iteration per (P, N))
    max_device_units: Optional[int] = None  # Q': most units a device may hold; null = Q - 1
    n_clamp: bool = True  # N <= min(B/2, 100), snapped to B // (B // N) (the authors' code)
    estimator: str = "table1"  # table1 (the paper, corrected) | code_legacy (the authors' code's DAG)
    server_mode: str = "parallel"  # parallel: K replicas at once (Fig. 3c) | sequential (Fig. 3b)
    aggregate_every: int = 1  # epochs between FedAvg rounds
    shard: str = "contiguous"  # contiguous | dirichlet (non-IID, outside the paper)
    dirichlet_alpha: float = 0.5
    failures: List[List[int]] = field(default_factory=list)  # [[device, epoch], ...] or [[device, epoch, after_iterations]]
    dp_sigma: float = 0.0  # Gaussian noise (std dp_sigma x clip) on uploaded device models; 0 = off
    dp_clip: Optional[float] = None  # clip the uploaded parameter vector to this L2 norm first; null = no clipping
    reselect: bool = True  # re-select (P, N) at an epoch boundary when a device's link bandwidth changed
    reselect_mode: str = "full_profile"  # full_profile (pays a profiling iteration, as the paper) | reestimate_only


@dataclass
class FLConfig(CollabConfig):
    name: str = "fl"


@dataclass
class SFLConfig(CollabConfig):
    name: str = "sfl"
    server_model: str = "per_device"  # per_device (replicas, FedAvg'd) | shared (one server model)


@dataclass
class SLConfig(CollabConfig):
    name: str = "sl"


@dataclass
class DevicePlan:
    P: int
    N: int
    micro_batch: int
    predicted_iter_s: float
    predicted_epoch_s: float
    shortlist: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# flat parameter vectors: what crosses the link when models are exchanged


class UnitLayout:
    """Offsets of each unit's float parameters and buffers in a flat vector over all units, so a
    device part [0, P) and a server part [P, Q) concatenate into the complete model's vector."""

    def __init__(self, model):
        self.p_off, self.b_off = [0], [0]
        for u in model.units:
            self.p_off.append(self.p_off[-1] + sum(p.numel() for p in u.parameters()))
            self.b_off.append(self.b_off[-1] + sum(b.numel() for b in u.buffers() if b.is_floating_point()))

    @staticmethod
    def tensors(model, a: int, b: int, what: str):
        for u in model.units[a:b]:
            if what == "p":
                yield from u.parameters()
            else:
                yield from (x for x in u.buffers() if x.is_floating_point())

    def flat(self, model, a: int, b: int, dtype, numerics: bool) -> dict:
        if not numerics:
            return {
                "p": torch.empty(self.p_off[b] - self.p_off[a], dtype=dtype, device="meta"),
                "b": torch.empty(self.b_off[b] - self.b_off[a], dtype=dtype, device="meta"),
            }
        out = {}
        for what in ("p", "b"):
            ts = [t.detach().reshape(-1) for t in self.tensors(model, a, b, what)]
            out[what] = torch.cat(ts) if ts else torch.empty(0, dtype=dtype)
        return out

    def load(self, model, a: int, b: int, flat: dict) -> None:
        with torch.no_grad():
            for what in ("p", "b"):
                vec, i = flat[what], 0
                for t in self.tensors(model, a, b, what):
                    n = t.numel()
                    t.copy_(vec[i : i + n].view_as(t))
                    i += n


# ---------------------------------------------------------------------------------------------
# one PiPar iteration, both sides (also run alone by the exhaustive search's trials)


async def split_iteration(ctx, st: Stage, server_role: str, it: int, xs, ys, numerics: bool) -> None:
    """Alg. 1, one iteration on the device: N forwards, each activation uploaded with its labels
    as soon as it exists; then the N backwards in order as the gradients come back; one step."""
    for n, (x, y) in enumerate(zip(xs, ys)):
        a = await ctx.compute(st.fwd_work(len(x)), st.forward, x, n, iteration=it, microbatch=n)
        y = y if numerics else torch.empty(y.shape, dtype=y.dtype, device="meta")
        ctx.send(server_role, "act", {"x": a, "y": y}, iteration=it, microbatch=n)
    for n, x in enumerate(xs):
        g = await ctx.recv(server_role, "grad")
        await ctx.compute(st.bwd_work(len(x)), st.backward, n, g, iteration=it, microbatch=n)
    await ctx.compute(st.step_work(), st.step, iteration=it)


async def serve_iteration(ctx, st: Stage, device_role: str, n_mb: int, loss_scale: float, it: int, numerics: bool) -> None:
    """Alg. 2, one iteration on the server: per micro-batch as it arrives, forward, loss (scaled
    by 1/(N B'), so the N gradients sum to the mini-batch mean), backward, gradient back; one
    step after the N-th."""
    for n in range(n_mb):
        msg = await ctx.recv(device_role, "act")
        a, y = msg["x"], msg["y"]
        out = await ctx.compute(st.fwd_work(a.shape[0]), st.forward, a, n, y, loss_scale, iteration=it, microbatch=n)
        if numerics:
            ctx.report_train(*out)
        g = await ctx.compute(st.bwd_work(a.shape[0]), st.backward, n, iteration=it, microbatch=n)
        ctx.send(device_role, "grad", g, iteration=it, microbatch=n)
    await ctx.compute(st.step_work(), st.step, iteration=it)


# ---------------------------------------------------------------------------------------------


class Collaborative:
    """One server, K devices, split models, FedAvg. Subclasses fix what varies (P, N, roles)."""

    kind = "pipar"

    def __init__(self, cfg, job):
        self.cfg = cfg
        self.job = job
        self._check_config()
        cl = job.cluster
        if SERVER not in cl.devices:
            raise ConfigError("cluster", f"scheduler={cfg.name} needs a device named '{SERVER}' (the cluster has {', '.join(cl.devices)}); use cluster=pipar_4g, pipar_4gplus, pipar_wifi or pipar_4g_hetero, or add cluster.devices.server")
        self.K = int(cl.cfg.num_devices)
        self.devices = [f"dev{k}" for k in range(self.K)]
        self.Q = len(job.model)
        self.B = int(job.cfg.train.batch_size)
        self.numerics = job.numerics
        self.dtype = job.dtype
        mode = cfg.shard
        self.shards = shard_indices(job.dataset.y_train, self.K, mode, alpha=cfg.dirichlet_alpha, seed=job.cfg.seed)
        for k, s in enumerate(self.shards):
            if len(s) == 0:
                raise ConfigError("scheduler.shard", f"device dev{k} got no training samples ({mode} sharding of {len(job.dataset.y_train)} samples over {self.K} devices)")
        self.failures = self._parse_failures()
        self.layout = UnitLayout(job.model)
        # an estimation-only compressor: pricing packets must not touch the run's codec state
        self._est_compressor = registry.build("compressor", job.cfg.compressor)
        self._packet_cache: dict = {}

        t0 = time.perf_counter()
        self.plans = self.choose_plans()
        self.search_wall_s = time.perf_counter() - t0
        self.search_virtual_s = self._search_cost()

        # models: one complete copy per device (device part + its server replica); one global
        if self.numerics:
            self.models = [copy.deepcopy(job.model) for _ in range(self.K)]
        else:
            self.models = [job.model] * self.K  # timing only: no tensor math touches them
        self.global_model = job.model
        self.shared_server = None
        self.dev_stage: list[Stage] = [None] * self.K
        self.srv_stage: list[Stage | None] = [None] * self.K
        for k in range(self.K):
            self._build_stages(k)
        self.server_roles = self._server_roles()
        self._it = 0  # device iterations done, all devices (metric steps)
        self._dev_it = [0] * self.K  # per device (timeline labels)
        self._srv_it = [0] * self.K  # iterations served per device (the server runs ahead of the device's count)
        self.reselections: list[dict] = []
        self._bw_at_plan = [self._bandwidths(k, 0.0) for k in range(self.K)]
        self.iterations_per_epoch = sum(self._num_iterations(k) for k in range(self.K))
        self.samples_per_epoch = sum(self._num_iterations(k) * self.plans[k].micro_batch * self.plans[k].N for k in range(self.K))
        self._epoch_windows: list[tuple[float, float]] = []
        # devices told to re-select at this round (the flag also rides in the "global" message,
        # but timing-only packets carry shapes, not values, so the roles read it here)
        self._reselecting: set[int] = set()

    # ---- configuration ---------------------------------------------------------------------

    def _check_config(self) -> None:
        c = self.cfg
        for key, value, choices in (("select", c.select, SELECT), ("server_mode", c.server_mode, SERVER_MODES), ("shard", c.shard, SHARDS), ("estimator", c.estimator, plan_mod.ESTIMATORS), ("reselect_mode", c.reselect_mode, RESELECT_MODES)):
            if value not in choices:
                raise ConfigError(f"scheduler.{key}", f"{value!r} is not an option; choices: {', '.join(choices)}")
        if int(c.microbatches) != 1:
            raise ConfigError("scheduler.microbatches", f"scheduler={c.name} sets its micro-batches with scheduler.N (PiPar's parallel batch number); leave microbatches at 1")
        if c.aggregate_every < 1:
            raise ConfigError("scheduler.aggregate_every", f"must be >= 1 epoch, got {c.aggregate_every}")
        if c.dp_sigma < 0:
            raise ConfigError("scheduler.dp_sigma", f"must be >= 0, got {c.dp_sigma}")
        if c.dp_clip is not None and c.dp_clip <= 0:
            raise ConfigError("scheduler.dp_clip", f"must be > 0 (or null), got {c.dp_clip}")
        if c.N is not None and not 1 <= c.N <= self.job.cfg.train.batch_size:
            raise ConfigError("scheduler.N", f"must be in 1..train.batch_size={self.job.cfg.train.batch_size}, got {c.N}")
        q = len(self.job.model)
        if c.P is not None and not 1 <= c.P <= q:
            raise ConfigError("scheduler.P", f"must be in 1..{q} (model {self.job.model.name} has {q} units; P = {q} is FL), got {c.P}")
        if c.max_device_units is not None and not 1 <= c.max_device_units <= q:
            raise ConfigError("scheduler.max_device_units", f"must be in 1..{q}, got {c.max_device_units}")

    def _parse_failures(self) -> dict:
        out = {}
        for i, f in enumerate(self.cfg.failures or []):
            f = list(f)
            if len(f) not in (2, 3) or not 0 <= f[0] < self.K or f[1] < 0:
                raise ConfigError(f"scheduler.failures[{i}]", f"{f} is not [device, epoch] or [device, epoch, after_iterations] with device in 0..{self.K - 1}")
            out[(int(f[0]), int(f[1]))] = int(f[2]) if len(f) == 3 else 0
        return out

    # ---- plans ------------------------------------------------------------------------------

    def p_range(self) -> range:
        qmax = self.cfg.max_device_units if self.cfg.max_device_units is not None else self.Q - 1
        return range(1, min(qmax, self.Q - 1) + 1) if self.Q > 1 else range(1, 2)

    def fixed_plan(self, k: int) -> tuple[int | None, int | None]:
        """(P, N) this scheduler pins for device k (None = choose)."""
        return self.cfg.P, self.cfg.N

    def packet_bytes(self, tag: str, P: int, b: int) -> int:
        """Bytes on the link of one micro-batch of b samples cut after unit P."""
        key = (tag, P, b)
        if key not in self._packet_cache:
            shape = (b, *self.job.model.infos[P - 1].out_shape)
            tensors = {"x": torch.empty(shape, dtype=self.dtype, device="meta")}
            if tag == "act":
                tensors["y"] = torch.empty((b,), dtype=torch.int64, device="meta")
            _, size, _ = self._est_compressor.encode(tensors, src="est", dst="est", tag=tag)
            self._packet_cache[key] = size
        return self._packet_cache[key]

    def codec_seconds(self, kind: str, tag: str, P: int, b: int) -> float:
        shape = (b, *self.job.model.infos[P - 1].out_shape)
        return self._est_compressor.codec_seconds(kind, tag, {"x": torch.empty(shape, dtype=self.dtype, device="meta")}, 0.0)

    def pair_model(self, k: int, now: float = 0.0) -> plan_mod.PairModel:
        cl, pred = self.job.cluster, self.job.predictor
        dev = plan_mod.profile_side(pred, cl.device(self.devices[k]), self.Q, self.B)
        srv = self._server_profile()
        up, down = cl.link(self.devices[k], SERVER), cl.link(SERVER, self.devices[k])
        return plan_mod.PairModel(dev, srv, self.Q, up.bandwidth_at(now), down.bandwidth_at(now), up.cfg.latency_s, down.cfg.latency_s, self.packet_bytes, self.codec_seconds)

    def _server_profile(self) -> plan_mod.SideProfile:
        if not hasattr(self, "_srv_prof"):
            self._srv_prof = plan_mod.profile_side(self.job.predictor, self.job.cluster.device(SERVER), self.Q, self.B)
        return self._srv_prof

    def _signature(self, k: int):
        """Devices with equal compute, links and shard size get equal plans (one search each)."""
        cl = self.job.cluster
        up, down = cl.link(self.devices[k], SERVER), cl.link(SERVER, self.devices[k])
        return (repr(cl.device(self.devices[k]).cfg), repr(up.cfg), repr(down.cfg), len(self.shards[k]))

    def choose_plans(self) -> list[DevicePlan]:
        plans, memo = [], {}
        for k in range(self.K):
            sig = self._signature(k)
            if sig not in memo:
                memo[sig] = self.choose_plan(k)
            plans.append(memo[sig])
        return plans

    def choose_plan(self, k: int, now: float = 0.0, method: str | None = None) -> DevicePlan:
        P, N = self.fixed_plan(k)
        pair = self.pair_model(k, now)
        n = len(self.shards[k])
        est = self.cfg.estimator
        method = method or self.cfg.select
        if P is not None and N is not None:
            c = plan_mod.candidate(pair, P, N, self.B, n, est)
            return DevicePlan(P, N, c.micro_batch, c.iter_s, c.epoch_s, [c.as_dict()])
        p_range = [P] if P is not None else list(self.p_range())
        if method == "exhaustive":
            from plugins.schedulers.pipar_search import exhaustive

            best, trials = exhaustive(self, k, p_range, [N] if N is not None else None)
            self._exhaustive_cost = getattr(self, "_exhaustive_cost", 0.0) + sum(t["iter_s"] for t in trials)
            return DevicePlan(best["P"], best["N"], best["micro_batch"], best["iter_s"], best["epoch_s"], trials)
        best, shortlist = plan_mod.select_auto(pair, self.B, n, p_range, fixed_n=N, clamp=self.cfg.n_clamp, estimator=est)
        return DevicePlan(best.P, best.N, best.micro_batch, best.iter_s, best.epoch_s, [c.as_dict() for c in shortlist])

    def _search_cost(self) -> float:
        """Virtual seconds the selection costs before training: auto profiles one iteration on
        every device and the server at once, then ships the profile up and the plan down;
        exhaustive trains one iteration per candidate, one after another."""
        if self.cfg.P is not None and self.cfg.N is not None or self.kind == "fl":
            return 0.0
        if self.cfg.select == "exhaustive":
            return getattr(self, "_exhaustive_cost", 0.0)
        return max(self.profile_cost(k) for k in range(self.K))

    def profile_cost(self, k: int, now: float = 0.0) -> float:
        pair = self.pair_model(k, now)
        qmax = max(self.p_range())
        dev_s = pair.dev.iteration_s(qmax)
        srv_s = pair.srv.iteration_s(self.Q)
        prof_bytes = 8 * 3 * self.Q + 64  # three float64 per unit and a header
        up = 0.0 if math.isinf(pair.up_bps) else 8 * prof_bytes / pair.up_bps
        down = 0.0 if math.isinf(pair.down_bps) else 8 * 64 / pair.down_bps
        return max(dev_s, srv_s) + up + pair.lat_up + down + pair.lat_down

    # ---- stages and roles ----------------------------------------------------------------------

    def _build_stages(self, k: int) -> None:
        P = self.plans[k].P
        train = self.job.cfg.train
        model = self.models[k]
        self.dev_stage[k] = Stage(model, 0, P, train, numerics=self.numerics)
        if P < self.Q:
            self.srv_stage[k] = self._server_stage(k, P, model, train)
        else:
            self.srv_stage[k] = None

    def _server_stage(self, k: int, P: int, model, train) -> Stage:
        return Stage(model, P, self.Q, train, numerics=self.numerics)

    def _server_roles(self) -> dict[str, list[int]]:
        """Server-side training roles -> the devices each serves."""
        if all(self.srv_stage[k] is None for k in range(self.K)):
            return {}
        if self.cfg.server_mode == "sequential":
            return {"server": list(range(self.K))}
        return {f"srv{k}": [k] for k in range(self.K)}

    def server_role_of(self, k: int) -> str:
        for r, ks in self.server_roles.items():
            if k in ks:
                return r
        raise KeyError(k)

    def roles(self) -> dict[str, RoleSpec]:
        out = {f"dev{k}": RoleSpec(self.devices[k], self._device_program(k)) for k in range(self.K)}
        for r, ks in self.server_roles.items():
            out[r] = RoleSpec(SERVER, self._server_program(r, ks))
        out["fed"] = RoleSpec(SERVER, self._fed_program())
        return out

    # ---- data ---------------------------------------------------------------------------------

    def _num_iterations(self, k: int) -> int:
        p = self.plans[k]
        n = len(self.shards[k]) // (p.micro_batch * p.N)
        cap = self.job.cfg.train.iterations_per_epoch
        return min(n, int(cap)) if cap else n

    def iteration_batches(self, k: int, epoch: int) -> list:
        """Device k's iterations in `epoch`: N micro-batches of B' samples each, from its own
        shard in a seeded order; the epoch's tail that fills no iteration is skipped (Alg. 1)."""
        p = self.plans[k]
        size = p.micro_batch * p.N
        out = []
        seed = self.job.cfg.seed * 7919 + k
        for i, (x, y) in enumerate(batches(self.job.dataset.x_train, self.job.dataset.y_train, size, seed, epoch, indices=self.shards[k], drop_last=True)):
            if i >= self._num_iterations(k):
                break
            out.append((split_microbatches(x, p.N), split_microbatches(y, p.N)))
        return out

    def active_iterations(self, k: int, epoch: int) -> tuple[int, bool]:
        """(iterations device k trains in `epoch`, whether it is connected at the epoch's end)."""
        n = self._num_iterations(k)
        if (k, epoch) in self.failures:
            return min(n, self.failures[(k, epoch)]), False
        return n, True

    def aggregates(self, epoch: int) -> bool:
        return (epoch + 1) % int(self.cfg.aggregate_every) == 0 or epoch == self.job.cfg.train.epochs - 1

    # ---- the device ---------------------------------------------------------------------------

    def _device_program(self, k: int):
        job = self.job

        async def program(ctx):
            for epoch in range(job.cfg.train.epochs):
                n_it, connected = self.active_iterations(k, epoch)
                its = self.iteration_batches(k, epoch)[:n_it]
                for xs, ys in its:
                    if self.srv_stage[k] is None:
                        await self._local_iteration(ctx, k, xs, ys)
                    else:
                        await self._split_iteration(ctx, k, xs, ys)
                    self._dev_it[k] += 1
                    self._it += 1
                    ctx.iteration_done(epoch, self._it, sum(len(y) for y in ys))
                if self.aggregates(epoch):
                    if connected:
                        await self._upload_model(ctx, k, n_samples=sum(len(y) for _, ys in its for y in ys))
                    msg = await ctx.recv("fed", "global")
                    P = self.plans[k].P
                    if self.numerics:
                        self.layout.load(self.models[k], 0, P, msg)
                    if k in self._reselecting:
                        await self._device_reselect(ctx, k)
                await ctx.end_epoch(epoch)

        return program

    async def _local_iteration(self, ctx, k: int, xs, ys) -> None:
        """FL: forward, loss, backward and step of the whole model on the device."""
        st = self.dev_stage[k]
        it = self._dev_it[k]
        total = sum(len(y) for y in ys)
        for n, (x, y) in enumerate(zip(xs, ys)):
            out = await ctx.compute(st.fwd_work(len(x)), st.forward, x, n, y, 1.0 / total, iteration=it, microbatch=n)
            if self.numerics:
                ctx.report_train(*out)
            await ctx.compute(st.bwd_work(len(x)), st.backward, n, iteration=it, microbatch=n)
        await ctx.compute(st.step_work(), st.step, iteration=it)

    async def _split_iteration(self, ctx, k: int, xs, ys) -> None:
        await split_iteration(ctx, self.dev_stage[k], self.server_role_of(k), self._dev_it[k], xs, ys, self.numerics)

    async def _upload_model(self, ctx, k: int, n_samples: int) -> None:
        """The device part of the model goes to the averaging role, with optional DP noise."""
        P = self.plans[k].P
        flat = self.layout.flat(self.models[k], 0, P, self.dtype, self.numerics)
        if self.cfg.dp_sigma > 0:
            # noise generation costs about one pass over the parameters: priced as an optimizer step
            flat = await ctx.compute(Work("dp_noise", seconds=self.job.cluster.device(self.devices[k]).time(Work("step", 0, P))), self._dp_noise, flat, k)
        flat["n"] = torch.tensor([float(n_samples)], dtype=torch.float64)
        ctx.send("fed", "model", flat, iteration=self._dev_it[k])  # labelled after the device's last iteration

    def _dp_noise(self, flat: dict, k: int) -> dict:
        """Classic DP on the uploaded device model (the notes' decision 15): clip the parameter
        vector to `dp_clip` (if set), then add N(0, (dp_sigma * C)^2), C = dp_clip or 1. An
        overhead study; no privacy accounting is claimed."""
        if not self.numerics:
            return flat
        p = flat["p"]
        clip = self.cfg.dp_clip
        if clip is not None:
            norm = float(p.norm())
            if norm > clip:
                p = p * (clip / norm)
        g = torch.Generator().manual_seed(self.job.cfg.seed * 1_000_003 + 7 * k + self._it)
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
        return {**flat, "p": p + noise * (self.cfg.dp_sigma * (clip or 1.0))}

    # ---- the server ---------------------------------------------------------------------------

    def _server_program(self, role: str, ks: list[int]):
        job = self.job

        async def program(ctx):
            for epoch in range(job.cfg.train.epochs):
                counts = {k: self.active_iterations(k, epoch)[0] for k in ks}
                for it in range(max(counts.values(), default=0)):
                    for k in ks:  # one device at a time (a role serves its devices in turn)
                        if it < counts[k]:
                            await self._serve_iteration(ctx, k)
                if self.aggregates(epoch):
                    for k in ks:
                        if self.active_iterations(k, epoch)[1] and self.srv_stage[k] is not None:
                            st = self.srv_stage[k]
                            ctx.send("fed", "model", self.layout.flat(st.model, st.start, self.Q, self.dtype, self.numerics))
                    for k in ks:
                        msg = await ctx.recv("fed", "global")
                        st = self.srv_stage[k]
                        if self.numerics and st is not None:
                            self.layout.load(st.model, st.start, self.Q, msg)
                        if k in self._reselecting:
                            await self._server_reselect(ctx, k)
                await ctx.end_epoch(epoch)

        return program

    async def _serve_iteration(self, ctx, k: int) -> None:
        p = self.plans[k]
        await serve_iteration(ctx, self.srv_stage[k], f"dev{k}", p.N, 1.0 / (p.N * p.micro_batch), self._srv_it[k], self.numerics)
        self._srv_it[k] += 1

    # ---- FedAvg -------------------------------------------------------------------------------

    def _fed_program(self):
        job = self.job

        async def program(ctx):
            for epoch in range(job.cfg.train.epochs):
                if self.aggregates(epoch):
                    await self._aggregate(ctx, epoch)
                await ctx.end_epoch(epoch)

        return program

    async def _aggregate(self, ctx, epoch: int) -> None:
        """Eq. 3: M = sum_k |D_k| / sum |D_k| M_k over the devices connected at the round's end
        (a device that dropped out is left out); each device then gets its slice of M back."""
        present = [k for k in range(self.K) if self.active_iterations(k, epoch)[1]]
        parts = {}
        for k in present:
            dev = await ctx.recv(f"dev{k}", "model")
            srv = await ctx.recv(self.server_role_of(k), "model") if self.srv_stage[k] is not None else None
            parts[k] = (dev, srv)
        server = self.job.cluster.device(SERVER)
        seconds = len(present) * server.time(Work("step", 0, self.Q))  # one weighted add per model
        await ctx.compute(Work("aggregate", seconds=seconds), self._average, parts)
        reselect = self._reselecting = self._check_bandwidth(ctx.now)
        for k in range(self.K):
            P = self.plans[k].P
            flag = torch.tensor([1.0 if k in reselect else 0.0])
            ctx.send(f"dev{k}", "global", {**self.layout.flat(self.global_model, 0, P, self.dtype, self.numerics), "reselect": flag}, iteration=self._dev_it[k])
            if self.srv_stage[k] is not None:
                ctx.send(self.server_role_of(k), "global", {**self.layout.flat(self.global_model, P, self.Q, self.dtype, self.numerics), "reselect": flag})

    def _average(self, parts: dict) -> None:
        if not self.numerics or not parts:
            return
        weights, vecs = [], {"p": [], "b": []}
        for k, (dev, srv) in parts.items():
            weights.append(float(dev["n"][0]))
            for what in ("p", "b"):
                vecs[what].append(torch.cat([dev[what], srv[what]]) if srv is not None else dev[what])
        total = sum(weights)
        if total <= 0:
            return  # nobody trained: the global model stays
        avg = {}
        for what in ("p", "b"):
            acc = torch.zeros_like(vecs[what][0], dtype=torch.float64)
            for w, v in zip(weights, vecs[what]):
                acc += (w / total) * v.to(torch.float64)
            avg[what] = acc.to(self.dtype)
        self.layout.load(self.global_model, 0, self.Q, avg)

    # ---- re-selection when bandwidth changes -----------------------------------------------------

    def _bandwidths(self, k: int, t: float) -> tuple[float, float]:
        cl = self.job.cluster
        return cl.link(self.devices[k], SERVER).bandwidth_at(t), cl.link(SERVER, self.devices[k]).bandwidth_at(t)

    def _check_bandwidth(self, now: float) -> set[int]:
        """Devices whose links changed bandwidth since their plan was made (the emulator tells
        the framework, the notes' decision 16): they re-select at this epoch boundary."""
        if not self.cfg.reselect or self.kind == "fl":
            return set()
        out = set()
        for k in range(self.K):
            bw = self._bandwidths(k, now)
            if bw != self._bw_at_plan[k]:
                out.add(k)
                self._bw_at_plan[k] = bw
        if out:
            self._reselect_at = now
        return out

    async def _device_reselect(self, ctx, k: int) -> None:
        """Full profile (the paper's accounting): one profiling iteration of the device's units at
        batch B, profile up, plan down. Training pauses meanwhile."""
        if self.cfg.reselect_mode == "full_profile":
            qmax = max(self.p_range())
            await ctx.compute(Work("profile", seconds=self.pair_model(k, ctx.now).dev.iteration_s(qmax)), iteration=self._it)
            ctx.send(self.server_role_of(k), "profile", torch.zeros(3 * self.Q, dtype=torch.float64), iteration=self._dev_it[k])
        await ctx.recv(self.server_role_of(k), "plan")  # the plan is shared state here; the message carries its bytes and timing

    async def _server_reselect(self, ctx, k: int) -> None:
        if self.cfg.reselect_mode == "full_profile":
            await ctx.compute(Work("profile", seconds=self._server_profile().iteration_s(self.Q)), iteration=self._it)
            await ctx.recv(f"dev{k}", "profile")
        old = self.plans[k]
        new = self.choose_plan(k, ctx.now, method="auto")
        self.plans[k] = new
        if (new.P, new.N) != (old.P, old.N):
            if new.P != old.P:
                self._build_stages(k)  # the complete model is whole here: only the cut moves
        self.reselections.append({"device": k, "time_s": ctx.now, "old": [old.P, old.N], "new": [new.P, new.N], "bandwidth_bps": list(self._bw_at_plan[k])})
        ctx.send(f"dev{k}", "plan", torch.tensor([new.P, new.N], dtype=torch.int64), iteration=self._dev_it[k])

    # ---- what the job asks of a scheduler ----------------------------------------------------

    def plan(self) -> dict:
        uniform = len({(p.P, p.N) for p in self.plans}) == 1
        first = self.plans[0]
        return {
            "scheduler": self.cfg.name,
            "select": "fixed" if self.cfg.P is not None and self.cfg.N is not None else self.cfg.select,
            "P": first.P if uniform else [p.P for p in self.plans],
            "N": first.N if uniform else [p.N for p in self.plans],
            "micro_batch": first.micro_batch if uniform else [p.micro_batch for p in self.plans],
            "predicted_iter_s": first.predicted_iter_s if uniform else [p.predicted_iter_s for p in self.plans],
            "predicted_epoch_s": max(p.predicted_epoch_s for p in self.plans),
            "search_s": self.search_virtual_s,
            "search_wall_s": self.search_wall_s,
            "num_units": self.Q,
            "devices": [{"device": self.devices[k], "P": p.P, "N": p.N, "micro_batch": p.micro_batch, "iterations_per_epoch": self._num_iterations(k), "shard_size": len(self.shards[k]), "predicted_iter_s": p.predicted_iter_s, "predicted_epoch_s": p.predicted_epoch_s} for k, p in enumerate(self.plans)],
            "server_roles": list(self.server_roles),
            "shortlist_dev0": self.plans[0].shortlist,
        }

    def eval_model(self):
        return self.global_model

    def epoch_metrics(self, epoch: int, start: float, end: float) -> dict[str, float]:
        self._epoch_windows.append((start, end))
        idle = self._idle(start, end)
        return {"idle/server_s": idle["server_s"], "idle/device_mean_s": idle["device_mean_s"], "idle/device_max_s": idle["device_max_s"]}

    def _idle(self, start: float, end: float) -> dict:
        """Idle time in [start, end): the server is idle while no server-side role computes (the
        notes' decision 11); a device is idle while it does not compute; averaged over devices."""
        tl = self.job.runtime.timeline
        server_roles = set(self.server_roles) | {"fed"}
        dev_busy = {f"dev{k}": 0.0 for k in range(self.K)}
        spans = []
        for iv in tl.intervals:
            a, b = max(iv.start, start), min(iv.end, end)
            if b <= a:
                continue
            if iv.resource in dev_busy:
                dev_busy[iv.resource] += b - a
            elif iv.resource in server_roles:
                spans.append((a, b))
        spans.sort()
        busy, cur_a, cur_b = 0.0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    busy += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            busy += cur_b - cur_a
        window = end - start
        dev_idle = [window - v for v in dev_busy.values()]
        return {"server_s": window - busy, "device_mean_s": sum(dev_idle) / len(dev_idle), "device_max_s": max(dev_idle)}

    def report(self, total: float) -> dict:
        """Extra summary sections and final metrics for the job."""
        idle = self._idle(0.0, total)
        epochs = max(1, len(self._epoch_windows))
        pl = self.plan()
        plan = {k: pl[k] for k in ("P", "N", "micro_batch", "predicted_iter_s", "predicted_epoch_s", "search_s", "select")}
        plan["per_device"] = pl["devices"]
        plan["reselections"] = self.reselections
        summary = {
            "plan": plan,
            "idle": {"server_s": idle["server_s"], "device_mean_s": idle["device_mean_s"], "device_max_s": idle["device_max_s"], "server_per_epoch_s": idle["server_s"] / epochs, "device_mean_per_epoch_s": idle["device_mean_s"] / epochs},
        }
        metrics = {"idle/server_s": idle["server_s"], "idle/device_mean_s": idle["device_mean_s"], "plan/search_s": self.search_virtual_s, "plan/predicted_epoch_s": pl["predicted_epoch_s"]}
        if isinstance(pl["P"], int):
            metrics.update({"plan/P": pl["P"], "plan/N": pl["N"], "plan/predicted_iter_s": pl["predicted_iter_s"]})
        return {"summary": summary, "metrics": metrics}


# ---------------------------------------------------------------------------------------------


@registry.register("scheduler", "pipar", schema=CollabConfig, doc="PiPar: split at P, N pipelined micro-batches per device, K server replicas, FedAvg")
class PiPar(Collaborative):
    kind = "pipar"


@registry.register("scheduler", "fl", schema=FLConfig, doc="FedAvg: whole model on every device, average every epoch (PiPar with P = Q, N = 1)")
class FL(Collaborative):
    kind = "fl"

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.P is not None or self.cfg.N is not None:
            raise ConfigError("scheduler.P", "fl trains the whole model on each device (P = Q, N = 1); leave scheduler.P and scheduler.N unset, or use scheduler=pipar")

    def fixed_plan(self, k):
        return self.Q, 1


@registry.register("scheduler", "sfl", schema=SFLConfig, doc="SplitFed: N = 1 at the best split point, server replicas or one shared server model")
class SFL(Collaborative):
    kind = "sfl"

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.N not in (None, 1):
            raise ConfigError("scheduler.N", f"sfl trains one batch at a time (N = 1), got {self.cfg.N}; use scheduler=pipar for N > 1")
        if self.cfg.server_model not in ("per_device", "shared"):
            raise ConfigError("scheduler.server_model", f"{self.cfg.server_model!r} is not an option; choices: per_device, shared")

    def fixed_plan(self, k):
        return self.cfg.P, 1

    def _server_stage(self, k, P, model, train):
        if self.cfg.server_model == "per_device":
            return super()._server_stage(k, P, model, train)
        if self.shared_server is None or self.shared_server.start != P:
            if len({p.P for p in self.plans}) != 1:
                raise ConfigError("scheduler.P", "a shared server model needs one split point for every device; set scheduler.P")
            self.shared_server = Stage(self.global_model if not self.numerics else self._shared_model(), P, self.Q, train, numerics=self.numerics)
        return self.shared_server

    def _shared_model(self):
        if not hasattr(self, "_shared"):
            self._shared = copy.deepcopy(self.job.model)
        return self._shared

    def _server_roles(self):
        if self.cfg.server_model == "shared":
            return {"server": list(range(self.K))}
        return super()._server_roles()


@registry.register("scheduler", "sl", schema=SLConfig, doc="vanilla split learning: N = 1, one server model, devices train in turn")
class SL(Collaborative):
    """Devices train one after another (Gupta & Raskar): device k trains its shard's iterations
    against the one server model, then the device-side model goes through the server to device
    k+1. No averaging; the paper leaves SL out of its experiments as too slow."""

    kind = "sl"

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.N not in (None, 1):
            raise ConfigError("scheduler.N", f"sl trains one batch at a time (N = 1), got {self.cfg.N}")
        if self.cfg.failures:
            raise ConfigError("scheduler.failures", "sl hands one model from device to device; disconnects are modelled for pipar, fl and sfl")
        if self.cfg.dp_sigma > 0:
            raise ConfigError("scheduler.dp_sigma", "DP noise on uploaded models applies to pipar, fl and sfl (sl uploads none)")

    def fixed_plan(self, k):
        return self.cfg.P, 1

    def choose_plans(self):
        plans = super().choose_plans()
        if len({p.P for p in plans}) != 1:  # one device model travels between devices
            plans = [plans[0]] * self.K
        return plans

    def _server_stage(self, k, P, model, train):
        if self.shared_server is None:
            self.shared_server = Stage(self.global_model, P, self.Q, train, numerics=self.numerics)
        return self.shared_server

    def _server_roles(self):
        return {"server": list(range(self.K))}

    def aggregates(self, epoch: int) -> bool:
        return False

    def roles(self):
        out = {f"dev{k}": RoleSpec(self.devices[k], self._sl_device(k)) for k in range(self.K)}
        out["server"] = RoleSpec(SERVER, self._sl_server())
        return out

    def _sl_device(self, k: int):
        job = self.job

        async def program(ctx):
            P = self.plans[k].P
            for epoch in range(job.cfg.train.epochs):
                if epoch or k:
                    msg = await ctx.recv("server", "turn")
                    if self.numerics:
                        self.layout.load(self.models[k], 0, P, msg)
                its = self.iteration_batches(k, epoch)
                for xs, ys in its:
                    await self._split_iteration(ctx, k, xs, ys)
                    self._dev_it[k] += 1
                    self._it += 1
                    ctx.iteration_done(epoch, self._it, sum(len(y) for y in ys))
                ctx.send("server", "handoff", self.layout.flat(self.models[k], 0, P, self.dtype, self.numerics), iteration=self._dev_it[k])
                await ctx.end_epoch(epoch)

        return program

    def _sl_server(self):
        job = self.job

        async def program(ctx):
            P = self.plans[0].P
            latest = None
            for epoch in range(job.cfg.train.epochs):
                for k in range(self.K):
                    if latest is not None:
                        ctx.send(f"dev{k}", "turn", latest, iteration=self._dev_it[k])
                    for _ in range(self._num_iterations(k)):
                        await self._serve_iteration(ctx, k)
                    latest = await ctx.recv(f"dev{k}", "handoff")
                if self.numerics:
                    self.layout.load(self.global_model, 0, P, latest)
                await ctx.end_epoch(epoch)

        return program
