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

Where things are: the roles (`pipar.roles`), FedAvg (`fedavg`), flat model vectors
(`model_vectors`), the (P, N) planner (`pipar.planner`, math in `pipar.plan`, trials in
`pipar.search` and `pipar.refine`). Roles: `dev<k>` on device `dev<k>`; on device `server`:
`srv<k>` (one replica per device, computing in parallel: `server_mode=parallel`, Fig. 3c), or one
`server` role that serves the devices in turn (`server_mode=sequential`, Fig. 3b; also SFL's
shared model); and `fed`, which averages. Decisions left open by the paper are in
`pipar.notes.md` section 8 and in the docstrings (disconnects, DP noise, re-selection).
"""

from __future__ import annotations

import copy
import time

from framework.data import batches, shard_indices, split_microbatches
from framework.errors import ConfigError, listing
from framework.scheduler import Scheduler
from framework.specs import RoleSpec
from plugins.schedulers.pipar.idle import idle_times
from plugins.schedulers.pipar.model_vectors import UnitLayout
from plugins.schedulers.pipar.iteration import SERVER
from plugins.schedulers.pipar.planner import DevicePlan, Planner, split_points
from plugins.schedulers.pipar.roles import DeviceRole, FedRole, ServerRole


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
        self.B = int(ctx.cfg.train.batch_size)
        self.iteration_cap = int(ctx.cfg.train.iterations_per_epoch or 0)  # read once: a config lookup costs 20 us, asked per batch
        self.epochs = int(ctx.cfg.train.epochs)  # likewise, asked by every role every epoch
        self.aggregate_every = int(cfg.aggregate_every)
        self.numerics = ctx.numerics
        self.dtype = ctx.dtype
        self.shards = shard_indices(ctx.dataset.y_train, self.K, cfg.shard, alpha=cfg.dirichlet_alpha, seed=ctx.cfg.seed)
        for k, s in enumerate(self.shards):
            if len(s) == 0:
                raise ConfigError("scheduler.shard", f"device dev{k} got no training samples ({cfg.shard} sharding of {len(ctx.dataset.y_train)} samples over {self.K} devices)")
        self.failures = self._parse_failures()
        self.layout = UnitLayout(ctx.model)
        self._eval = None
        if ctx.plan is not None:  # a role process: the coordinator's plan, no search
            self._plan = ctx.plan
            self.plans = [DevicePlan.from_dict(d["plan"]) for d in ctx.plan["devices"]]
            self.search_virtual_s = float(ctx.plan["search_s"])
            self.search_wall_s = 0.0
            self.predicted_epoch = float(ctx.plan["predicted_epoch_s"])
        else:
            self.planner = Planner(cfg, ctx, self.kind, self.shards, self.serial_server())
            t0 = time.perf_counter()
            self.plans = self.adjust_plans(self.planner.choose_plans())
            self.search_wall_s = time.perf_counter() - t0
            self.search_virtual_s = self.planner.search_cost()
            self._plan = None
            self.predicted_epoch = self.predict_epoch()
        self.server_roles = self._server_roles()
        # device -> its server role: every message of a split iteration asks (a scan of the
        # sequential server's K devices per message made K = 10,000 quadratic)
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

    def _parse_failures(self) -> dict:
        out = {}
        for i, f in enumerate(self.cfg.failures or []):
            f = list(f)
            if len(f) not in (2, 3) or not 0 <= f[0] < self.K or f[1] < 0:
                raise ConfigError(f"scheduler.failures[{i}]", f"{f} is not [device, epoch] or [device, epoch, after_iterations] with device in 0..{self.K - 1}")
            out[(int(f[0]), int(f[1]))] = int(f[2]) if len(f) == 3 else 0
        return out

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
        return split_points(self.cfg, self.Q)

    # ---- data, per device and plan (every role computes the same from the config) ---------------

    def num_iterations(self, k: int, plan: DevicePlan) -> int:
        n = len(self.shards[k]) // (plan.micro_batch * plan.N)
        return min(n, self.iteration_cap) if self.iteration_cap else n

    def iteration_batches(self, k: int, epoch: int, plan: DevicePlan | None = None) -> list:
        """Device k's iterations in `epoch`: N micro-batches of B' samples each, from its own
        shard in a seeded order; the epoch's tail that fills no iteration is skipped (Alg. 1)."""
        p = plan or self.plans[k]
        out = []
        seed = self.ctx.cfg.seed * 7919 + k
        ds = self.ctx.dataset
        n = self.num_iterations(k, p)
        for x, y in batches(ds.x_train, ds.y_train, p.micro_batch * p.N, seed, epoch, indices=self.shards[k], drop_last=True, limit=n):
            out.append((split_microbatches(x, p.N), split_microbatches(y, p.N)))
        return out

    def active_iterations(self, k: int, epoch: int, plan: DevicePlan) -> tuple[int, bool]:
        """(iterations device k trains in `epoch`, whether it is connected at the epoch's end),
        from the config's scripted `failures`."""
        n = self.num_iterations(k, plan)
        if (k, epoch) in self.failures:
            return min(n, self.failures[(k, epoch)]), False
        return n, True

    def aggregates(self, epoch: int) -> bool:
        return (epoch + 1) % self.aggregate_every == 0 or epoch == self.epochs - 1

    def bandwidths(self, k: int, t: float) -> tuple[float, float]:
        cl = self.ctx.cluster
        return cl.link(self.devices[k], SERVER).bandwidth_at(t), cl.link(SERVER, self.devices[k]).bandwidth_at(t)

    # ---- roles ------------------------------------------------------------------------------

    def _server_roles(self) -> dict[str, list[int]]:
        """Server-side training roles -> the devices each serves."""
        if all(p.P >= self.Q for p in self.plans):
            return {}
        if self.cfg.server_mode == "sequential":
            return {"server": list(range(self.K))}
        return {f"srv{k}": [k] for k in range(self.K)}

    def server_role_of(self, k: int) -> str:
        return self._server_role_of[k]

    def role_devices(self) -> dict[str, str]:
        out = {f"dev{k}": self.devices[k] for k in range(self.K)}
        out.update({r: SERVER for r in self.server_roles})
        out["fed"] = SERVER
        return out

    def role_spec(self, role: str) -> RoleSpec:
        return RoleSpec(role, self.role_devices()[role])  # issue 45: the role's slice of the plan moves here

    def role_from_spec(self, role: str, spec: dict):
        if role.startswith("dev") and role[3:].isdigit():
            return DeviceRole(self, int(role[3:]))
        if role in self.server_roles:
            return ServerRole(self, role, self.server_roles[role])
        if role == "fed":
            return FedRole(self)
        raise KeyError(f"no role {role!r}; roles: {listing(self.role_devices())}")

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

    def plan(self) -> dict:
        if self._plan is not None:
            return self._plan
        uniform = len({(p.P, p.N) for p in self.plans}) == 1
        first = self.plans[0]
        self._plan = {
            "scheduler": self.cfg.name,
            "select": "fixed" if self.cfg.P is not None and self.cfg.N is not None else self.cfg.select,
            "P": first.P if uniform else [p.P for p in self.plans],
            "N": first.N if uniform else [p.N for p in self.plans],
            "micro_batch": first.micro_batch if uniform else [p.micro_batch for p in self.plans],
            "predicted_iter_s": first.predicted_iter_s if uniform else [p.predicted_iter_s for p in self.plans],
            "predicted_epoch_s": self.predicted_epoch,  # the slowest device's training and the model exchange
            "paper_epoch_s": first.paper_epoch_s if uniform else [p.paper_epoch_s for p in self.plans],
            "server_share": self.planner.server_share(),
            "search_s": self.search_virtual_s,
            "search_wall_s": self.search_wall_s,
            "num_units": self.Q,
            "devices": [
                {"device": self.devices[k], "P": p.P, "N": p.N, "micro_batch": p.micro_batch, "iterations_per_epoch": self.num_iterations(k, p), "shard_size": len(self.shards[k]),
                 "predicted_iter_s": p.predicted_iter_s, "predicted_epoch_s": p.predicted_epoch_s, "plan": p.without_shortlist()}
                for k, p in enumerate(self.plans)
            ],
            "server_roles": self.server_roles,
            "shortlist_dev0": self.plans[0].shortlist,
        }
        return self._plan

    def planned_epoch_s(self) -> float:
        return float(self.plan()["predicted_epoch_s"])

    def epoch_metrics(self, epoch: int, start: float, end: float, timeline) -> dict[str, float]:
        idle = self.idle(timeline, start, end)
        return {"idle/server_s": idle["server_s"], "idle/device_mean_s": idle["device_mean_s"], "idle/device_max_s": idle["device_max_s"]}

    def idle(self, timeline, start: float, end: float) -> dict:
        return idle_times(timeline, start, end, [f"dev{k}" for k in range(self.K)], set(self.server_roles) | {"fed", "server"})

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        idle = self.idle(timeline, 0.0, total)
        epochs = max(1, int(self.ctx.cfg.train.epochs))
        pl = self.plan()
        plan = {k: pl[k] for k in ("P", "N", "micro_batch", "predicted_iter_s", "predicted_epoch_s", "paper_epoch_s", "server_share", "search_s", "select")}
        plan["per_device"] = [{k: v for k, v in d.items() if k != "plan"} for d in pl["devices"]]
        plan["reselections"] = sorted((r for st in role_stats.values() for r in st.get("reselections", [])), key=lambda r: (r["time_s"], r["device"]))
        rounds = role_stats.get("fed", {}).get("rounds", [])
        summary = {
            "plan": plan,
            "rounds": rounds,
            "idle": {"server_s": idle["server_s"], "device_mean_s": idle["device_mean_s"], "device_max_s": idle["device_max_s"], "server_per_epoch_s": idle["server_s"] / epochs, "device_mean_per_epoch_s": idle["device_mean_s"] / epochs},
        }
        metrics = {"idle/server_s": idle["server_s"], "idle/device_mean_s": idle["device_mean_s"], "plan/search_s": self.search_virtual_s}
        if isinstance(pl["P"], int):
            metrics.update({"plan/P": pl["P"], "plan/N": pl["N"], "plan/predicted_iter_s": pl["predicted_iter_s"]})
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

    def role_from_spec(self, role: str, spec: dict):
        if role == "server" and self.cfg.server_model == "shared":
            return ServerRole(self, role, self.server_roles[role], shared=True)
        return super().role_from_spec(role, spec)
