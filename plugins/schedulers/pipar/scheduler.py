"""Collaborative learning over one server and K devices: PiPar and its baselines FL and SFL.

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

The baselines are the same roles with other settings:
- `fl`  (FedAvg): P = Q, N = 1. The device trains the whole model; the server only averages.
- `sfl` (SplitFed): N = 1 at the split point with the shortest estimated epoch (Scission-style
  benchmarking), one server replica per device (default) or one shared server model.
- `sl`  (vanilla split learning) is in `sl.py`.

Where things are: the plan and each role's spec (`pipar.specs`), the roles (`pipar.roles`,
`pipar.aggregator`), FedAvg (`fedavg`), flat model vectors (`model_vectors`), the (P, N) planner
(`pipar.planner`, math in `pipar.plan`, trials in `pipar.search` and `pipar.refine`). Roles:
`dev<k>` on device `dev<k>`; on device `server`: `srv<k>` (one replica per device, computing in
parallel: `server_mode=parallel`, Fig. 3c), or one `server` role that serves the devices in turn
(`server_mode=sequential`, Fig. 3b; also SFL's shared model); and `fed`, which averages. Each
role is built from its spec (`role_spec`: its slice of the plan and its knobs) and the run's
parts, and holds no reference to the scheduler. Decisions left open by the paper are in
`pipar.notes.md` section 8 and in the docstrings (disconnects, DP noise, re-selection).
"""

from __future__ import annotations

import copy
import time
from functools import cached_property

from framework.data import shard_indices
from framework.errors import ConfigError, listing
from framework.scheduler import Role, Scheduler
from plugins.schedulers.pipar.aggregator import FedRole
from plugins.schedulers.pipar.idle import idle_times
from plugins.schedulers.pipar.iteration import SERVER
from plugins.schedulers.pipar.planner import Planner, split_points
from plugins.schedulers.pipar.roles import DeviceRole, ServerRole
from plugins.schedulers.pipar.specs import CollabPlan, CollabRoleSpec, DevicePlan, DeviceRecord, DeviceSpec, FedSpec, PlannerKnobs, ServerSpec, Shard, aggregates, iterations_per_epoch
from plugins.schedulers.pipar.training import device_batches


class Collaborative(Scheduler):
    """One server, K devices, split models, FedAvg. Subclasses fix what varies (P, N, roles)."""

    kind = "pipar"

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self._check_config()
        cl = ctx.cluster
        if SERVER not in cl.devices:
            raise ConfigError("cluster", f"scheduler={cfg.name} needs a device named '{SERVER}' (the cluster has {listing(cl.devices)}); use cluster=pipar_4g, pipar_4gplus, pipar_wifi or pipar_4g_hetero, or add cluster.devices.server")
        self.K = int(cl.cfg.num_devices)
        self.devices = [f"dev{k}" for k in range(self.K)]
        self.Q = len(ctx.model)
        self.iteration_cap = int(ctx.cfg.train.iterations_per_epoch or 0)  # read once: a config lookup costs 20 us, asked per batch
        self.epochs = int(ctx.cfg.train.epochs)  # likewise, asked by every role every epoch
        self.aggregate_every = int(cfg.aggregate_every)
        self.shards = shard_indices(ctx.dataset.y_train, self.K, cfg.shard, alpha=cfg.dirichlet_alpha, seed=ctx.cfg.seed)
        for k, s in enumerate(self.shards):
            if len(s) == 0:
                raise ConfigError("scheduler.shard", f"device dev{k} got no training samples ({cfg.shard} sharding of {len(ctx.dataset.y_train)} samples over {self.K} devices)")
        self.failures = self._parse_failures()
        self._eval = None
        if ctx.plan is not None:  # a role process: the coordinator's plan, no search
            self._plan, self._plan_json = CollabPlan.from_json(ctx.plan), ctx.plan
            self.plans = self._plan.plans()
            self.search_virtual_s = float(self._plan.search_s)
            self.search_wall_s = 0.0
            self.predicted_epoch = float(self._plan.predicted_epoch_s)
        else:
            self.planner = Planner(self.planner_knobs, ctx, [len(s) for s in self.shards])
            t0 = time.perf_counter()
            self.plans = self.adjust_plans(self.planner.choose_plans())
            self.search_wall_s = time.perf_counter() - t0
            self.search_virtual_s = self.planner.search_cost()
            self._plan, self._plan_json = None, None
            self.predicted_epoch = self.predict_epoch()
        self.server_roles = self._server_roles()
        # device -> its server role, which its spec names (a scan of the sequential server's K
        # devices per device made K = 10,000 quadratic)
        self._server_role_of = {k: r for r, ks in self.server_roles.items() for k in ks}

    # ---- configuration ---------------------------------------------------------------------

    def _check_config(self) -> None:
        """What the schema's ranges and choices cannot say (those are checked when the scheduler
        is built: framework.registry.build)."""
        c = self.cfg
        if int(c.microbatches) != 1:
            raise ConfigError("scheduler.microbatches", f"scheduler={c.name} sets its micro-batches with scheduler.N (PiPar's parallel batch number); leave microbatches at 1")
        batch = self.ctx.cfg.train.batch_size
        if c.N is not None and not 1 <= c.N <= batch:
            raise ConfigError("scheduler.N", f"must be in 1..train.batch_size={batch}, got {c.N}")
        q = len(self.ctx.model)
        if c.P is not None and not 1 <= c.P <= q:
            raise ConfigError("scheduler.P", f"must be in 1..{q} (model {self.ctx.model.name} has {q} units; P = {q} is FL), got {c.P}")
        if c.max_device_units is not None and not 1 <= c.max_device_units <= q:
            raise ConfigError("scheduler.max_device_units", f"must be in 1..{q}, got {c.max_device_units}")

    def _parse_failures(self) -> dict[int, dict[int, int]]:
        """scheduler.failures as device -> epoch -> the iterations it trains before it drops."""
        out: dict[int, dict[int, int]] = {}
        for i, f in enumerate(self.cfg.failures or []):
            f = list(f)
            if len(f) not in (2, 3) or not 0 <= f[0] < self.K or f[1] < 0:
                raise ConfigError(f"scheduler.failures[{i}]", f"{f} is not [device, epoch] or [device, epoch, after_iterations] with device in 0..{self.K - 1}")
            out.setdefault(int(f[0]), {})[int(f[1])] = int(f[2]) if len(f) == 3 else 0
        return out

    @cached_property
    def planner_knobs(self) -> PlannerKnobs:
        """What the planner reads of the config (the server roles re-select with them too)."""
        c = self.cfg
        return PlannerKnobs(self.kind, c.select, c.P, c.N, c.max_device_units, c.n_clamp, c.estimator, c.dp_sigma, self.serial_server())

    def serial_server(self) -> bool:
        """Whether one server role serves the devices in turn (Fig. 3b) instead of one replica
        role per device computing side by side (Fig. 3c)."""
        return self.cfg.server_mode == "sequential"

    def predict_epoch(self) -> float:
        """The epoch the plans are expected to take: devices train side by side, then (in the
        epochs that aggregate) exchange their models."""
        epochs = max(1, self.epochs)
        share = sum(self.aggregates(e) for e in range(epochs)) / epochs
        return self.planner.predicted_epoch_s(self.plans, [self.num_iterations(k, p) for k, p in enumerate(self.plans)], share)

    def adjust_plans(self, plans: list[DevicePlan]) -> list[DevicePlan]:
        """A subclass's constraint across devices (SL, SFL-shared: one split point)."""
        return plans

    def p_range(self) -> range:
        return split_points(self.cfg.max_device_units, self.Q)

    # ---- data, per device and plan (every role computes the same from the config) ---------------

    def num_iterations(self, k: int, plan: DevicePlan) -> int:
        return iterations_per_epoch(len(self.shards[k]), plan, self.iteration_cap)

    def iteration_batches(self, k: int, epoch: int, plan: DevicePlan | None = None) -> list:
        """Device k's iterations in `epoch` (what its role trains: pipar.training.device_batches)."""
        p = plan or self.plans[k]
        return device_batches(self.ctx, k, self.shards[k], p.micro_batch, p.N, epoch, self.num_iterations(k, p))

    def aggregates(self, epoch: int) -> bool:
        return aggregates(epoch, self.aggregate_every, self.epochs)

    # ---- roles ------------------------------------------------------------------------------

    def _server_roles(self) -> dict[str, list[int]]:
        """Server-side training roles -> the devices each serves."""
        if all(p.P >= self.Q for p in self.plans):
            return {}
        if self.cfg.server_mode == "sequential":
            return {"server": list(range(self.K))}
        return {f"srv{k}": [k] for k in range(self.K)}

    def role_devices(self) -> dict[str, str]:
        out = {f"dev{k}": self.devices[k] for k in range(self.K)}
        out.update({r: SERVER for r in self.server_roles})
        out["fed"] = SERVER
        return out

    def device_index(self, role: str) -> int | None:
        """k of role `dev<k>`, None for any other role."""
        if role.startswith("dev") and role[3:].isdigit() and role == f"dev{int(role[3:])}" and int(role[3:]) < self.K:
            return int(role[3:])
        return None

    def role_spec(self, role: str) -> CollabRoleSpec:
        k = self.device_index(role)
        if k is not None:
            return self.device_spec(k)
        if role in self.server_roles:
            return self.server_spec(role)
        if role == "fed":
            return self.fed_spec()
        raise KeyError(f"no role {role!r}; roles: {listing(self.role_devices())}")

    def role_from_spec(self, role: str, spec: dict) -> Role:
        if self.device_index(role) is not None:
            return DeviceRole(DeviceSpec.from_json(spec), self.ctx)
        if role in self.server_roles:
            return ServerRole(ServerSpec.from_json(spec), self.ctx)
        if role == "fed":
            return FedRole(FedSpec.from_json(spec), self.ctx)
        raise KeyError(f"no role {role!r}; roles: {listing(self.role_devices())}")

    # ---- each role's spec: its slice of the plan and the knobs it reads --------------------------

    def _rounds(self) -> dict:
        """What every role's spec holds of the run's epochs."""
        return {"epochs": self.epochs, "aggregate_every": self.aggregate_every, "iteration_cap": self.iteration_cap}

    @cached_property
    def _device_knobs(self) -> dict:
        """What every device's spec holds of the config, read once (a config lookup costs 20 us, and
        K device specs are made)."""
        c = self.cfg
        return {"dp_sigma": c.dp_sigma, "dp_clip": c.dp_clip, "reselect_mode": c.reselect_mode, "profile_units": max(self.p_range())}

    def device_spec(self, k: int) -> DeviceSpec:
        return DeviceSpec(f"dev{k}", self.devices[k], **self._rounds(), k=k, plan=self.plans[k].lean(), shard=Shard.of(self.shards[k]), server=self._server_role_of.get(k),
                          failures=self.failures.get(k, {}), **self._device_knobs)

    def server_spec(self, role: str) -> ServerSpec:
        ks = self.server_roles[role]
        return ServerSpec(role, SERVER, **self._rounds(), devices_served=tuple(ks), shared=self.shared_server(role), plans={k: self.plans[k].lean() for k in ks},
                          shard_sizes={k: len(self.shards[k]) for k in ks}, failures={k: self.failures[k] for k in ks if k in self.failures},
                          reselect_mode=self._device_knobs["reselect_mode"], planner=self.planner_knobs)

    def fed_spec(self) -> FedSpec:
        return FedSpec("fed", SERVER, **self._rounds(), cuts=tuple(p.P for p in self.plans), server_roles={r: tuple(ks) for r, ks in self.server_roles.items()},
                       failures=self.failures, reselect=bool(self.cfg.reselect) and self.kind != "fl")

    def shared_server(self, role: str) -> bool:
        """Whether server role `role` trains one model for all its devices (SFL's shared model)."""
        return False

    def optional_roles(self) -> set[str]:
        """Devices may drop out for good on a real runtime (the paper's disconnect handling)."""
        return {f"dev{k}" for k in range(self.K)}

    def eval_model(self, states: dict[str, dict]):
        if self._eval is None:
            self._eval = copy.deepcopy(self.ctx.model)
        owner = "fed" if "fed" in states else next(iter(states), None)
        if owner is not None:
            self._eval.load_state_dict(states[owner])
        return self._eval

    # ---- the plan and the report -------------------------------------------------------------

    def iterations_per_epoch(self) -> int:
        return sum(self.num_iterations(k, self.plans[k]) for k in range(self.K))

    def samples_per_epoch(self) -> int:
        return sum(self.num_iterations(k, p) * p.micro_batch * p.N for k, p in enumerate(self.plans))

    def typed_plan(self) -> CollabPlan:
        if self._plan is None:
            c = self.cfg
            self._plan = CollabPlan.of(
                scheduler=c.name, select="fixed" if c.P is not None and c.N is not None else c.select, plans=self.plans,
                records=[DeviceRecord.of(self.devices[k], p, self.num_iterations(k, p), len(self.shards[k])) for k, p in enumerate(self.plans)],
                predicted_epoch_s=self.predicted_epoch, server_share=self.planner.server_share(), search_s=self.search_virtual_s, search_wall_s=self.search_wall_s,
                num_units=self.Q, server_roles={r: tuple(ks) for r, ks in self.server_roles.items()})
        return self._plan

    def plan(self) -> dict:
        if self._plan_json is None:
            self._plan_json = self.typed_plan().to_json()
        return self._plan_json

    def planned_epoch_s(self) -> float:
        return float(self.typed_plan().predicted_epoch_s)

    def epoch_metrics(self, epoch: int, start: float, end: float, timeline) -> dict[str, float]:
        idle = self.idle(timeline, start, end)
        return {"idle/server_s": idle["server_s"], "idle/device_mean_s": idle["device_mean_s"], "idle/device_max_s": idle["device_max_s"]}

    def idle(self, timeline, start: float, end: float) -> dict:
        return idle_times(timeline, start, end, [f"dev{k}" for k in range(self.K)], set(self.server_roles) | {"fed", "server"})

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        idle = self.idle(timeline, 0.0, total)
        epochs = max(1, int(self.ctx.cfg.train.epochs))
        pl = self.typed_plan()
        plan = {k: getattr(pl, k) for k in ("P", "N", "micro_batch", "predicted_iter_s", "predicted_epoch_s", "paper_epoch_s", "server_share", "search_s", "select")}
        plan["per_device"] = [{k: v for k, v in d.to_json().items() if k != "plan"} for d in pl.devices]
        plan["reselections"] = sorted((r for st in role_stats.values() for r in st.get("reselections", [])), key=lambda r: (r["time_s"], r["device"]))
        rounds = role_stats.get("fed", {}).get("rounds", [])
        summary = {
            "plan": plan,
            "rounds": rounds,
            "idle": {"server_s": idle["server_s"], "device_mean_s": idle["device_mean_s"], "device_max_s": idle["device_max_s"], "server_per_epoch_s": idle["server_s"] / epochs, "device_mean_per_epoch_s": idle["device_mean_s"] / epochs},
        }
        metrics = {"idle/server_s": idle["server_s"], "idle/device_mean_s": idle["device_mean_s"], "plan/search_s": self.search_virtual_s}
        if isinstance(pl.P, int):
            metrics.update({"plan/P": pl.P, "plan/N": pl.N, "plan/predicted_iter_s": pl.predicted_iter_s})
        return {"summary": summary, "metrics": metrics}


class PiPar(Collaborative):
    kind = "pipar"


class FL(Collaborative):
    kind = "fl"

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.P is not None or self.cfg.N is not None:
            raise ConfigError("scheduler.P", "fl trains the whole model on each device (P = Q, N = 1); leave scheduler.P and scheduler.N unset, or use scheduler=pipar")


class SFL(Collaborative):
    kind = "sfl"

    def _check_config(self) -> None:
        super()._check_config()
        if self.cfg.N not in (None, 1):
            raise ConfigError("scheduler.N", f"sfl trains one batch at a time (N = 1), got {self.cfg.N}; use scheduler=pipar for N > 1")

    def adjust_plans(self, plans):
        if self.cfg.server_model == "shared" and len({p.P for p in plans}) != 1:
            raise ConfigError("scheduler.P", "a shared server model needs one split point for every device; set scheduler.P")
        return plans

    def _server_roles(self):
        if self.cfg.server_model == "shared":
            return {"server": list(range(self.K))}
        return super()._server_roles()

    def serial_server(self) -> bool:
        return self.cfg.server_model == "shared" or super().serial_server()

    def shared_server(self, role: str) -> bool:
        return role == "server" and self.cfg.server_model == "shared"
