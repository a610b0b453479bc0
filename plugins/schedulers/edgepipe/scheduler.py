"""EdgePipe (Yoon et al., IEEE IoT-J 2022): `scheduler=super_neuron`, one role per super neuron.

The planning layer (edgepipe.partition / .channel / .mapping / .timing, put together by
edgepipe.plan) makes the plan:

- the partition of the MLP's neurons into super neurons (Alg. 1; `partition_class` hybrid,
  vertical or horizontal; vertical on one device is the Naive baseline);
- the links' packet reception ratios (PRR): from the path-loss channel model with a seed, a given
  matrix, or the cluster's configured link loss; the true PRR becomes each link's loss (1 - PRR),
  so every message a role sends with `reliable=False` is dropped by the link with that probability;
- the mapping of super neurons to devices (Alg. 2's GA, random, brute force, identity) on the PRR
  the coordinator measures with probe packets;
- the slot length: the worst op of any super neuron priced by its device's time model (a neuron
  chunk costs its share of the layer's work), plus the slowest message on its link, plus a margin
  (Eq. 4's structure on the cluster's models), or `slot_s` as given; with recovery (r-TX, ACK:
  edgepipe.recovery) the slot holds every copy or retry of the slowest message;
- with `budget_min`, the minibatches that fit in that many minutes of this slot clock
  (edgepipe.budget; Table III's 194 min), trained as one pipeline across data epochs.

The roles (plugins.schedulers.edgepipe.roles) run Eq. 2's schedule on that slot clock, on the
simulator or as processes (`runtime=local`, which needs `runtime.emulate_links=true`: each role's
process applies the plan's PRR to its own copy of the links, whose loss generators are seeded by
the link's name, so a message is lost on the wall clock exactly when it is lost on the simulator;
the slot clock starts when the runtime starts every role together). The lossy test runs where the
job evaluates, on the final states the roles sent.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from framework.errors import ConfigError, listing
from framework.scheduler import Role, Scheduler
from plugins.schedulers.edgepipe import budget, curve, mapping, recovery
from plugins.schedulers.edgepipe import partition as part
from plugins.schedulers.edgepipe import plan as plan_mod
from plugins.schedulers.edgepipe.dense import glorot_init, linear_of, mlp_sizes, op_works
from plugins.schedulers.edgepipe.lossy_eval import lossy_test
from plugins.schedulers.edgepipe.roles import Recovery, SuperNeuronRole, SuperNeuronSpec


class SuperNeuron(Scheduler):
    runtimes = ("sim", "local")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self._check_config()
        if ctx.cfg.model.name != "mlp":
            raise ConfigError("model.name", f"super_neuron partitions an MLP's neurons; got model={ctx.cfg.model.name} (use model=mlp)")
        self.sizes = mlp_sizes(ctx.model)
        if cfg.init == "glorot":
            glorot_init(ctx.model, int(ctx.cfg.seed))
        self.devices = self._devices()
        try:
            self.partition = part.partition(self.sizes, len(self.devices), str(cfg.partition_class),
                                            m_layers=None if cfg.m_layers is None else int(cfg.m_layers), rounding=str(cfg.rounding))
        except ValueError as e:
            raise ConfigError("scheduler.partition_class", f"{cfg.partition_class} over {len(self.devices)} devices: {e}") from None
        self._plan = plan_mod.EdgePipePlan.from_json(ctx.plan) if ctx.plan is not None else plan_mod.make_plan(self)
        self.perm = tuple(self._plan.mapping.perm)
        self.slot_s = float(self._plan.slot_s)
        self._apply_prr(np.array(self._plan.prr.true, dtype=float))
        self._apply_ack_wait()
        self.eval_copy = None
        self.final_states: dict[str, dict] | None = None  # the states `eval_model` last saw: the lossy test's weights

    @property
    def copies(self) -> int:
        """Copies sent of every message: r-TX's, else 1 (ACK retransmits only what it must)."""
        return int(self.cfg.rtx_copies) if self.cfg.recovery == "rtx" else 1

    def iterations_per_epoch(self) -> int:
        """With a time budget the framework's one epoch is the whole budget (edgepipe.budget)."""
        b = self._plan.budget
        return b.minibatches if b else self.ctx.iterations_per_epoch()

    # ---- configuration -----------------------------------------------------------------------

    def _check_config(self) -> None:
        """What the schema's ranges and choices cannot say (those are checked when the scheduler
        is built: framework.registry.build)."""
        cfg = self.cfg
        budget.check(cfg, self.ctx.cfg)
        if cfg.prr.source == "given" and not cfg.prr.matrix:
            raise ConfigError("scheduler.prr.matrix", "prr.source=given needs the N x N matrix PRR[i][j] from device i to j")
        if str(self.ctx.cfg.train.optimizer) != "sgd":
            raise ConfigError("train.optimizer", f"super_neuron trains with SGD (the paper's plain gradient descent); got {self.ctx.cfg.train.optimizer}")
        if not self.ctx.numerics:
            raise ConfigError("runtime.numerics", "super_neuron runs with numerics only (a timing-only run is edgepipe.timing's closed forms)")
        rt = self.ctx.cfg.runtime
        if rt.name != "sim" and not rt.get("emulate_links", False):
            raise ConfigError("runtime.emulate_links", f"super_neuron on runtime={rt.name} takes its losses and slot deadlines from the links' model: set runtime.emulate_links=true")

    def _devices(self) -> list[str]:
        cl = self.ctx.cluster
        names = [n for n in cl.names if n.startswith("dev") and n[3:].isdigit()]
        n = len(names) if self.cfg.n_devices is None else int(self.cfg.n_devices)
        if not 1 <= n <= len(names):
            raise ConfigError("scheduler.n_devices", f"the cluster has {len(names)} devices dev0..dev{len(names) - 1}; got n_devices={self.cfg.n_devices}")
        for name in names[:n]:
            if cl.device(name).cfg.time_model == "measured":
                raise ConfigError(f"cluster.devices.{name}.time_model", "super_neuron prices neuron chunks as a share of the layer's modelled time; use analytic, profile or table")
        return names[:n]

    # ---- the plan ----------------------------------------------------------------------------

    def _apply_prr(self, true: np.ndarray) -> None:
        """Every link between the run's devices drops a message with probability 1 - PRR."""
        if self.cfg.prr.source == "cluster":
            return
        for i, a in enumerate(self.devices):
            for j, b in enumerate(self.devices):
                if i != j:
                    self.ctx.cluster.link(a, b).set_loss(1.0 - float(true[i, j]))

    def _apply_ack_wait(self) -> None:
        """recovery=ack: the links' ARQ sends again once the ACK is overdue (802.15.4's ACK wait),
        not after a TCP-like timeout that would push every retry out of its slot."""
        if self.cfg.recovery != "ack":
            return
        cl = self.ctx.cluster
        for a in self.devices:
            for b in self.devices:
                if a != b:
                    cl.link(a, b).set_retransmit_timeout(recovery.ack_wait_s(cl, a, b))

    def op_works(self, s: int) -> dict:
        """{(op, layer): [Work, ...]} of super neuron s (edgepipe.dense.op_works)."""
        return op_works(self.partition.super_neurons[s].chunks, self.sizes, int(self.ctx.cfg.train.batch_size))

    def op_seconds(self, s: int, perm) -> dict:
        """{(op, layer): seconds} of super neuron s's ops on its device under `perm`, by the predictor."""
        dev = self.ctx.cluster.device(self.devices[perm[s]])
        return {k: sum(self.ctx.predictor.predict(dev, w) for w in works) for k, works in self.op_works(s).items()}

    def typed_plan(self) -> plan_mod.EdgePipePlan:
        return self._plan

    def plan(self) -> dict:
        return self._plan.to_json()

    def planned_epoch_s(self) -> float:
        return float(self._plan.predicted_epoch_s)

    # ---- roles -------------------------------------------------------------------------------

    def role_devices(self) -> dict[str, str]:
        return {f"sn{s}": self.devices[d] for s, d in enumerate(self.perm)}

    def role_spec(self, role: str) -> SuperNeuronSpec:
        cfg, pl = self.cfg, self._plan
        return SuperNeuronSpec(
            role, self.role_devices()[role], int(role[2:]), self.partition, bool(cfg.pipeline), self.slot_s,
            bool(cfg.weight_stashing), str(cfg.bwd_mode), str(cfg.share_missing),
            Recovery(self.copies, int(cfg.ack_max_retries) if cfg.recovery == "ack" else 0),
            budget_minibatches=pl.budget.minibatches if pl.budget else None,
            snapshot_slots=pl.eval.at_slots if pl.eval else None)

    def role_from_spec(self, role: str, spec: dict) -> Role:
        names = self.role_devices()
        if role not in names:
            raise KeyError(f"no role {role!r}; roles: {listing(names)}")
        return SuperNeuronRole(SuperNeuronSpec.from_json(spec), self.ctx)

    def eval_model(self, states: dict[str, dict]):
        """The whole MLP from the chunks (a lossless forward; a lossy test pass is not this)."""
        if self.eval_copy is None:
            self.eval_copy = copy.deepcopy(self.ctx.model)
        self.final_states = states  # the job evaluates the final states last, before it reports
        with torch.no_grad():
            for role, state in states.items():
                for layer, lo, hi in self.partition.super_neurons[int(role[2:])].chunks:
                    if layer >= 2:
                        lin = linear_of(self.eval_copy.units[layer - 2])
                        lin.weight[lo:hi] = state[f"w{layer}"]
                        lin.bias[lo:hi] = state[f"b{layer}"]
        return self.eval_copy

    def report(self, total: float, timeline, role_stats: dict[str, dict], dropouts: list[dict]) -> dict:
        out = super().report(total, timeline, role_stats, dropouts)
        pl, L = self._plan, self.partition.L
        fw = {l: [0, 0] for l in range(1, L)}
        bw = {l: [0, 0] for l in range(2, L + 1)}
        sent = np.zeros((len(self.perm),) * 2, dtype=np.int64)
        for role, st in role_stats.items():
            for key, acc in (("fw", fw), ("bw", bw)):
                for l, (ok, n) in st.get(key, {}).items():
                    acc[int(l)][0] += ok
                    acc[int(l)][1] += n
            for dst, n in st.get("sent", {}).items():
                sent[int(role[2:]), int(dst[2:])] += n
        rate = {k: {str(l): (ok / n if n else 1.0) for l, (ok, n) in acc.items()} for k, acc in (("fwd_arrival", fw), ("bwd_applied", bw))}
        out["summary"]["plan"] = {k: getattr(pl, k) for k in ("messages_per_minibatch", "max_message_width", "slot_s", "coordinator", "pipeline")}
        out["summary"]["plan"].update(partition_class=pl.partition.kind, mapping=dict(pl.mapping.devices), mean_prr=pl.prr.mean_true)
        links = {f"{a}->{b}" for a in self.devices for b in self.devices if a != b}
        over_links = sum(int(sent[s, t]) for s in range(len(self.perm)) for t in range(len(self.perm)) if self.perm[s] != self.perm[t])
        tx = recovery.summarize({l: st for l, st in timeline.link_stats().items() if l in links}, over_links, str(self.cfg.recovery))
        out["summary"]["edgepipe"] = {"messages_sent_per_sn_pair": sent.tolist(), "messages_sent": int(sent.sum()), **rate, "transmissions": tx,
                                      "reporter": min(s for s, _, _ in self.partition.holders(L))}
        if pl.budget:
            out["summary"]["edgepipe"]["budget"] = pl.budget.to_json()
        out["metrics"].update({"net/data_per_message": tx["data_per_message"], "net/packets_per_message": tx["packets_per_message"]})
        out["metrics"].update({"plan/messages_per_minibatch": pl.messages_per_minibatch, "plan/predicted_iter_s": pl.predicted_iter_s,
                               "plan/slot_s": pl.slot_s, "plan/mean_prr": pl.prr.mean_true, "net/messages_sent": int(sent.sum())})
        lossy = self._lossy_test()
        if pl.eval and self.final_states:
            out["summary"]["edgepipe"]["curve"] = self._curve()
        if lossy is not None:
            out["summary"]["edgepipe"]["lossy_test"] = lossy
            for k in ("mean", "std", "min", "frac_below_0.3"):
                if isinstance(lossy.get(k), float):
                    out["metrics"][f"test/lossy_acc_{k}"] = lossy[k]
        for k, by_layer in rate.items():
            for l, v in by_layer.items():
                out["metrics"][f"edgepipe/{k}/{l}"] = v
        return out

    def test_prr(self, true: np.ndarray | None = None) -> np.ndarray:
        """PRR between super neurons that a test message sees: the links' true PRR (or `true`, a
        device-space matrix: the study's Fig. 9(b) tests at other path-loss exponents) under the
        run's mapping, through the run's recovery."""
        true = np.array(self._plan.prr.true, dtype=float) if true is None else np.asarray(true, dtype=float)
        return recovery.delivery_prr(mapping.device_prr_for_super_neurons(true, self.perm), recovery.max_transmissions(self.cfg))

    def trained_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(W_l, b_l) of the trained model, whole, from the final states."""
        model = self.eval_model(self.final_states)
        return [(linear_of(u).weight.detach(), linear_of(u).bias.detach()) for u in model.units]

    def _lossy_test(self) -> dict | None:
        """The trained chunks' lossy test passes (edgepipe.lossy_eval); None when off or nothing trained."""
        passes = int(self.cfg.lossy_test_passes)
        if not passes or self.final_states is None:  # (a role holding only the input layer has no state)
            return None

        try:
            x, y = self.ctx.dataset.split("test")
            return lossy_test(self.partition, self.trained_layers(), x, y, self.test_prr(), passes, int(self.cfg.lossy_test_seed))
        except Exception as e:  # a failed run's report must not hide its own error
            return {"error": f"{type(e).__name__}: {e}"}

    def _curve(self) -> dict:
        """Test accuracy over the slot clock from the roles' snapshots (edgepipe.curve)."""
        try:
            x, y = self.ctx.dataset.split("test")
            states = {r: st for r, st in self.final_states.items() if curve.SNAP_SLOTS in st}
            return curve.curve(self.partition, states, self.trained_layers(), self._plan.eval, self.slot_s, x, y, self.test_prr(),
                               int(self.cfg.lossy_test_seed))
        except Exception as e:  # as the lossy test: the run's report comes first
            return {"error": f"{type(e).__name__}: {e}"}
