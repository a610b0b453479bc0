"""One run: build every component from the config, train, evaluate, record.

Everything that can fail on bad input (validation, dataset, model, cluster, scheduler) is
built before the tracking run starts, so a config error never leaves a run behind. Once the
run has started it ends FINISHED or FAILED, and what was recorded so far (timeline, summary)
is written to the run directory either way.
"""

from __future__ import annotations

import functools
import getpass
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file
from tqdm import tqdm

from framework import registry, torch_device
from framework.checkpoints import state as ck
from framework.checkpoints.writer import CheckpointWriter
from framework.cluster import Cluster
from framework.config.validate import validate
from framework.data import build_dataset
from framework.errors import ConfigError
from framework.long_lived import long_lived
from framework.models import build_model
from framework.nonfinite import NonFiniteError
from framework.runtime.base import RuntimeHooks
from framework.runtime.transport import FAULTS, Network
from framework.scheduler import SchedulerContext
from framework.tracking import per_device, relevance, run_names
from framework.tracking.series import EpochSeries
from framework.tracking.store import flatten, mlflow_name
from framework.tracking.tracker import NullTracker

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def build_scheduler(cfg, *, role: str | None = None, plan: dict | None = None):
    """Validate `cfg`, build the run's parts and its scheduler: (SchedulerContext, Scheduler).

    A role process passes its `role` and the coordinator's `plan`, so the scheduler builds only
    that role and searches nothing."""
    registry.load_plugins()
    validate(cfg)
    dtype = DTYPES[cfg.runtime.dtype]
    if cfg.runtime.threads:
        torch.set_num_threads(int(cfg.runtime.threads))
    torch.manual_seed(cfg.seed)
    device = torch_device.resolve(cfg.runtime)
    dataset = build_dataset(cfg.dataset, inputs=bool(cfg.runtime.numerics)).to(dtype, device)  # timing-only: shapes
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_classes).to(device, dtype)
    cluster = Cluster(cfg.cluster, model, batch_size=cfg.train.batch_size, seed=cfg.seed, dtype=dtype)
    predictor = registry.build("predictor", cfg.predictor, cluster)
    compressor = registry.build("compressor", cfg.compressor)
    compressor.set_seed(cfg.seed)
    compressor.set_epoch(0)
    ctx = SchedulerContext(cfg, model, dataset, cluster, compressor, predictor, role=role, plan=plan)
    return ctx, registry.build("scheduler", cfg.scheduler, ctx)


STEP_AXIS = "training iterations done"  # every metric's step, epoch-end and end-of-run ones included


class _StepLogger:
    """Logs at one step (the iterations done at an epoch end) and remembers what it logged; a
    value the same as every epoch's before it is held back (framework.tracking.series)."""

    def __init__(self, tracker, step: int, last_step: dict, series: EpochSeries):
        self.tracker, self.step, self.last_step, self.series = tracker, step, last_step, series

    def log_metric(self, key: str, value: float) -> None:
        self.series.log(self.tracker, key, value, self.step)
        self.last_step[key] = self.step


def run_tags() -> dict[str, str]:
    """Who ran what: MLflow's own tags for the user, the command line and the git commit."""
    tags = {"mlflow.source.name": " ".join(sys.argv)[:5000] or "python", "mlflow.source.type": "LOCAL", "pipelab.step_axis": STEP_AXIS}
    try:
        tags["mlflow.user"] = getpass.getuser()
    except Exception:  # no user name in this environment: leave it out
        pass
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if commit.returncode == 0:
            tags["mlflow.source.git.commit"] = commit.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=5)
            tags["pipelab.git_dirty"] = "true" if dirty.stdout.strip() else "false"
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout (an installed package): no commit to record
    return tags


class Job(RuntimeHooks):
    def __init__(self, cfg, out_dir, *, overrides: list[str] | None = None, parent_run_id: str | None = None, sweep_keys: set[str] | None = None):
        """`sweep_keys`: the config keys a multirun varies (they go into the run's name)."""
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.overrides = overrides or []
        self.parent_run_id = parent_run_id
        self.numerics = bool(cfg.runtime.numerics)
        # what the times mean: the simulator's virtual clock, or real seconds on real runtimes
        # (the metric names keep `virtual` so runs of both kinds compare in one MLflow column)
        self.clock = "virtual" if cfg.runtime.name == "sim" else "wall"
        self.context, self.scheduler = build_scheduler(cfg)
        ctx = self.context
        self.dtype, self.dataset, self.model, self.cluster = ctx.dtype, ctx.dataset, ctx.model, ctx.cluster
        self.predictor, self.compressor = ctx.predictor, ctx.compressor
        self.transport = registry.build("transport", cfg.transport)
        if isinstance(self.transport, Network):  # this process coordinates the run: what only a role reads is a mistake here
            self.transport.check_coordinator(cfg.runtime.name)
        self.runtime = registry.build("runtime", cfg.runtime, self.cluster, self.compressor, self, network=self.transport, run_config=cfg)
        self.runtime.prepare(self.scheduler)
        self.runtime.timeline.clock = self.clock  # the chart's and the trace's time axis say which
        self.iterations_per_epoch = self.scheduler.iterations_per_epoch()
        self._train = [0.0, 0, 0]  # loss_sum, correct, n since the last iteration mark
        self._epoch_train = [0.0, 0, 0]
        self.history: dict[str, list] = {"val/acc": [], "val/loss": [], "train/loss": [], "time/epoch_virtual_s": []}
        self.samples = 0
        self.iterations = 0
        self._epoch_start = 0.0
        self._final: dict[str, float] = {}
        self.failure: dict | None = None  # why the run failed (summary.json `failure`)
        self.tracker = None
        self._progress = None
        self._wall0 = time.perf_counter()
        self._last_step: dict[str, int] = {}  # epoch metrics: the step each was last logged at
        self._series: dict = {}  # per-epoch metrics held while constant (framework.tracking.series)
        self.sweep_keys = sweep_keys or set()
        # checkpoints at epoch ends, where the runtime can take one (framework.checkpoints.state)
        self.checkpointing = bool(cfg.train.checkpoint) and self.runtime.checkpoints
        self.checkpoints = CheckpointWriter()  # a GPU run's files are written while it goes on
        self.resumed_epoch: int | None = None  # the epoch whose checkpoint this run continues from
        self._resume_run_id: str | None = None
        if cfg.train.resume:
            self.out_dir = Path(str(cfg.train.resume))  # a resumed run goes on in its own folder
            self._load_checkpoint()

    # ---- runtime hooks ------------------------------------------------------------------------

    def on_train(self, loss_sum, correct, n, role=None):
        # every loss of either runtime passes here as a number (a deferred one, once made)
        self.runtime.guard.number(loss_sum, "loss", role, self.iterations)
        for acc in (self._train, self._epoch_train):
            acc[0] += loss_sum
            acc[1] += correct
            acc[2] += n

    def on_iteration(self, epoch, iteration, samples, now):
        # the metric step is the run's own count: roles count their own iterations (several
        # devices train side by side in collaborative schedules)
        self.samples += samples
        self.iterations += 1
        step = self.iterations  # the one step axis: training iterations done (see STEP_AXIS)
        loss_sum, correct, n = self._train
        if n:
            self.tracker.log_metric("train/loss", loss_sum / n, step)
            self.tracker.log_metric("train/acc", correct / n, step)
        self._train = [0.0, 0, 0]
        self.tracker.log_metric("time/virtual_s", now, step)
        if self._progress is not None:
            post = {"epoch": epoch, "time": f"{now:.3g}s"}
            if n:
                post["loss"] = f"{loss_sum / n:.4f}"
            self._progress.set_postfix(post, refresh=False)
            self._progress.update(1)

    def on_epoch_end(self, epoch, now, states):
        tr = _StepLogger(self.tracker, self.iterations, self._last_step, EpochSeries(self._series))
        epoch_time = now - self._epoch_start
        self._epoch_start = now
        tr.log_metric("time/epoch_virtual_s", epoch_time)
        tr.log_metric("time/wall_s", time.perf_counter() - self._wall0)
        self.history["time/epoch_virtual_s"].append(epoch_time)
        for k, v in self.scheduler.epoch_metrics(epoch, now - epoch_time, now, self.runtime.timeline).items():
            tr.log_metric(k, v)
            self.history.setdefault(k, []).append(v)
        loss_sum, correct, n = self._epoch_train
        self._epoch_train = [0.0, 0, 0]
        if n:
            tr.log_metric("train/epoch_loss", loss_sum / n)
            self.history["train/loss"].append(loss_sum / n)
            self._final["train/loss"] = loss_sum / n
            self._final["train/acc"] = correct / n
        if epoch_time > 0:
            tr.log_metric("throughput/samples_per_s", self.scheduler.samples_per_epoch() / epoch_time)
        for k, v in self.compressor.epoch_metrics().items():  # bit widths and quantization error
            tr.log_metric(k, v)
        self.compressor.set_epoch(epoch + 1)
        if self.numerics:
            vl, va = self.evaluate("val", self.scheduler.eval_model(states()))
            tr.log_metric("val/loss", vl)
            tr.log_metric("val/acc", va)
            self.history["val/loss"].append(vl)
            self.history["val/acc"].append(va)
            self._final["val/loss"], self._final["val/acc"] = vl, va
            line = f"epoch {epoch}: val/acc {va:.4f}  val/loss {vl:.4f}  epoch {epoch_time:.4g}s {self.clock}"
            if self._progress is not None:
                self._progress.write(line)
            elif self.cfg.runtime.progress:  # not a terminal (a log file): the epoch lines, no bar frames
                print(line, flush=True)
        self.tracker.flush()
        if self.checkpointing:
            self._save_checkpoint(epoch)

    # ---- checkpoints ------------------------------------------------------------------------

    RECORDS = ("history", "samples", "iterations", "_epoch_start", "_final", "_last_step", "_train", "_epoch_train", "_series")
    OPTIONAL_RECORDS = {"_series": dict}  # not in checkpoints written before it existed

    @functools.cached_property
    def _fingerprint(self) -> str:  # the config does not change during a run; digesting it costs 3 ms
        return ck.config_fingerprint(self.cfg)

    def _save_checkpoint(self, epoch: int) -> None:
        """Everything the run needs to go on from this epoch end (framework.checkpoints.state), in the
        run directory and as MLflow artifacts. A role that cannot checkpoint turns them off."""
        bag = ck.Bag()
        try:
            bag.meta["runtime"] = self.runtime.checkpoint(bag, "runtime")
        except NotImplementedError as e:
            print(f"warning: no checkpoints for this run: {e}", file=sys.stderr)
            self.checkpointing = False
            return
        bag.meta["compressor"] = self.compressor.checkpoint(bag, "compressor")
        bag.meta["job"] = {name: getattr(self, name) for name in self.RECORDS}
        # the MLflow run's id if the tracker has it (a recorder may still be starting: the run does
        # not wait for it; `_write_outputs` adds it to the last checkpoint then)
        bag.meta.update(epoch=epoch, config=self._fingerprint, mlflow_run_id=self.tracker.known_run_id)
        tracker = self.tracker
        self.checkpoints.save(self.out_dir, bag, then=lambda path: tracker.log_artifacts(path, ck.DIR))

    def _load_checkpoint(self) -> None:
        run_dir = self.out_dir
        if not self.runtime.checkpoints:
            raise ConfigError("train.resume", f"runtime={self.cfg.runtime.name} cannot resume a run; resume runs on runtime=sim")
        try:
            bag = ck.load(run_dir)
        except ck.CheckpointError as e:
            raise ConfigError("train.resume", str(e)) from None
        epoch = int(bag.meta["epoch"])
        if bag.meta["config"] != ck.config_fingerprint(self.cfg):
            raise ConfigError("train.resume", f"the checkpoint in {run_dir} belongs to another config than {run_dir}/config.yaml; resume with the run's own config")
        if epoch + 1 >= self.cfg.train.epochs:
            raise ConfigError("train.resume", f"{run_dir} has finished all {epoch + 1} epochs of train.epochs={self.cfg.train.epochs}; raise train.epochs to train on")
        for name in self.RECORDS:
            setattr(self, name, bag.meta["job"][name] if name in bag.meta["job"] or name not in self.OPTIONAL_RECORDS else self.OPTIONAL_RECORDS[name]())
        self._last_step = {k: int(v) for k, v in self._last_step.items()}
        self.compressor.restore(bag, bag.meta["compressor"])
        self.runtime.resume(bag, bag.meta["runtime"], epoch)
        self.resumed_epoch = epoch
        self._resume_run_id = bag.meta.get("mlflow_run_id")

    @torch.no_grad()
    def evaluate(self, split: str, model) -> tuple[float, float]:
        was = model.training
        model.eval()
        x, y = self.dataset.split(split)
        loss, correct = 0.0, 0
        bs = self.cfg.train.eval_batch_size
        for i in range(0, len(x), bs):
            out = model(x[i : i + bs])
            loss += float(torch.nn.functional.cross_entropy(out, y[i : i + bs], reduction="sum"))
            correct += int((out.argmax(1) == y[i : i + bs]).sum())
        model.train(was)
        n = max(1, len(x))
        return loss / n, correct / n

    # ---- the run ----------------------------------------------------------------------------

    def params(self) -> dict:
        """Every leaf of the composed config, once, by its dotted name (`scheduler.name`,
        `cluster.link.bandwidth_bps`, `train.lr`, ...): any knob a sweep varies is comparable."""
        return {mlflow_name(k): v for k, v in flatten(OmegaConf.to_container(self.cfg, resolve=True)).items()}

    def run_name(self) -> str:
        """`<scheduler> <model> <cluster>` and what differs from the defaults: the overrides given,
        in a sweep the ones it varies (so siblings differ; framework.tracking.run_names)."""
        cfg = self.cfg
        return run_names.run_name(cfg.scheduler.name, cfg.model.name, cfg.cluster.name, self.overrides, self.sweep_keys)

    def run(self) -> dict:
        """Train, test and write the outputs; returns the summary. What is alive now and what the
        run builds stays out of the cyclic collector's reach until the outputs are written
        (framework/long_lived.py)."""
        with long_lived():
            return self._run()

    def _run(self) -> dict:
        cfg = self.cfg
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run_name = self.run_name()
        tags = {"pipelab.overrides": " ".join(self.overrides) or "(defaults)", "pipelab.iterations_per_epoch": str(self.iterations_per_epoch), **run_tags()}
        if self.resumed_epoch is not None:
            tags["pipelab.resumed"] = f"after epoch {self.resumed_epoch} from {self.out_dir}"
        self.tracker = registry.build("tracking", cfg.tracking, self.parent_run_id, run_name, tags, resume_run_id=self._resume_run_id)
        status = "FAILED"
        self._wall0 = time.perf_counter()
        try:
            (self.out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            self.tracker.log_params(self.params())
            self.tracker.log_dataset(self.dataset)
            self.tracker.log_artifact(self.out_dir / "config.yaml")
            plan = self.scheduler.plan()
            (self.out_dir / "plan.json").write_text(json.dumps(plan, indent=2))
            self.train(progress_desc=run_name)
            self._save_model()
            self.checkpoints.wait()  # the last checkpoint written (a failed write fails the run)
            status = "FINISHED"
        except BaseException as e:
            self.virtual_time = self.runtime.timeline.makespan
            self.failure = failure_record(e, self.iterations)
            raise
        finally:
            if self._progress is not None:
                self._progress.close()
            try:
                self.checkpoints.wait()  # a failed run's last checkpoint, whole, before its outputs
            except BaseException as e:  # the run's own error is the one to see; a second Ctrl-C
                # here must not skip the outputs and the tracker's FAILED
                print(f"warning: the last checkpoint may be incomplete: {type(e).__name__}: {e}", file=sys.stderr)
            try:
                summary = self._write_outputs(status)
            finally:
                self.tracker.end(status)
        return summary

    def train(self, progress_desc: str = "") -> float:
        """Run every role program to the end and test the result; returns the virtual time."""
        if self.tracker is None:
            self.tracker = NullTracker(self.cfg.tracking)
        if self.cfg.runtime.progress and sys.stderr.isatty():  # bar frames only where a person watches
            self._progress = tqdm(total=self.cfg.train.epochs * self.iterations_per_epoch, initial=self.iterations, desc=progress_desc, unit="it", file=sys.stderr, dynamic_ncols=True, leave=False)
        self.virtual_time = self.runtime.run(self.scheduler)
        if self.numerics:
            tl, ta = self.evaluate("test", self.final_model())
            self._final["test/loss"], self._final["test/acc"] = tl, ta
        return self.virtual_time

    def _save_model(self) -> None:
        """The trained model's weights as `model.safetensors` (no pickle: loading it runs no code),
        in the run directory and as an artifact. Timing-only runs have no weights to save."""
        if not self.numerics:
            return
        state = {k: v.detach().cpu().clone().contiguous() for k, v in self.final_model().state_dict().items()}
        path = self.out_dir / "model.safetensors"
        save_file(state, str(path), metadata={"model": self.cfg.model.name, "scheduler": self.cfg.scheduler.name, "dtype": self.cfg.runtime.dtype})

    def _prediction(self) -> dict | None:
        """The plan's predicted epoch beside the epochs this run took (their mean, on the run's
        clock): None when the schedule predicts nothing."""
        predicted = self.scheduler.planned_epoch_s()
        if predicted is None:
            return None
        epochs = self.history["time/epoch_virtual_s"]
        took = sum(epochs) / len(epochs) if epochs else None
        ratio = took / predicted if took is not None and predicted > 0 else None
        return {"predicted_epoch_s": predicted, "epoch_s": took, "epoch_over_predicted": ratio, "clock": self.clock}

    def _log_final_metrics(self, metrics: dict, summary: dict) -> None:
        """The end-of-run metrics MLflow gets (summary.json has them all): those that matter for
        this run's scheduler and compressor (framework.tracking.relevance), a family of per-device
        values over `tracking.per_device_max` as its statistics and `per_device.csv`/`.png`
        (framework.tracking.per_device)."""
        stale = bool((summary.get("staleness") or {}).get("max"))
        shown = relevance.for_mlflow(metrics, coded=self.compressor.coded_directions(), pipeline=bool(summary["pipeline"]), stale=stale)
        shown, tables = per_device.split(shown, int(self.cfg.tracking.per_device_max))
        if tables:
            shown.update(per_device.stats(tables))
            _per_device_artifacts(tables, self.out_dir)
        for k, v in shown.items():
            if isinstance(v, (int, float)) and math.isfinite(v) and self._last_step.get(k) != self.iterations:  # once per step
                self.tracker.log_metric(k, v, self.iterations)

    def final_model(self):
        """The trained model as the coordinator sees it: built from the roles' final states."""
        return self.scheduler.eval_model(self.runtime.final_states)

    def _write_outputs(self, status: str) -> dict:
        tl = self.runtime.timeline
        total = self.virtual_time
        wall = time.perf_counter() - self._wall0
        roles = tl.role_stats(total)
        links = tl.link_stats()
        rt = self.runtime
        extra = self.scheduler.report(total, tl, rt.role_stats, rt.dropouts)
        bubble = tl.bubble_frac()
        metrics = dict(self._final)
        metrics["time/virtual_s"] = total
        metrics["time/wall_s"] = wall
        if total > 0:
            metrics["throughput/samples_per_s"] = self.samples / total
        metrics["pipe/bubble_frac"] = bubble
        metrics["roles/dropouts"] = len(rt.dropouts)
        for r, st in roles.items():
            metrics[f"util/busy_frac/{r}"] = st["busy_s"] / total if total > 0 else 0.0
            metrics[f"util/idle_s/{r}"] = st["idle_s"]
        for r, st in rt.process_stats.items():  # real runtimes: frames each endpoint dropped, and why
            counts = st.get("transport") or {}
            for k in ("dropped", "reconnects", *FAULTS):
                if k in counts:
                    metrics[f"transport/{k}/{r}"] = counts[k]
        for l, st in links.items():
            metrics[f"net/bytes/{mlflow_name(l)}"] = st["bytes"]  # MLflow names allow no '>': the same name in summary.json
            metrics[f"net/raw_bytes/{mlflow_name(l)}"] = st["raw_bytes"]
        wire_total = sum(st["bytes"] for st in links.values())
        if wire_total:
            metrics["net/compression_ratio"] = sum(st["raw_bytes"] for st in links.values()) / wire_total
        compression = self.compressor.summary()
        for k in ("ratio_fwd", "ratio_bwd", "encode_s_fwd", "decode_s_fwd", "encode_s_bwd", "decode_s_bwd"):
            metrics[f"compression/{k}"] = compression[k]
        summary = {
            "status": status,
            "scheduler": self.cfg.scheduler.name,
            "virtual_time_s": total,
            "clock": self.clock,
            "wall_time_s": wall,
            "epochs": int(self.cfg.train.epochs),
            "iterations": self.iterations,
            "samples": self.samples,
            "metrics": metrics,
            "history": self.history,
            "roles": roles,
            "links": links,
            "bubble_frac": bubble,
            "pipeline": tl.has_flushes(),  # whether a bubble means anything here (pipeline flushes)
            "compression": compression,
            "messages_lost": rt.messages_lost,
            "dropouts": rt.dropouts,
            "processes": rt.process_stats,
            "mlflow_run_id": None,  # below, once the tracker has it
            "mlflow_experiment_id": None,
        }
        if self.failure is not None:
            summary["failure"] = self.failure
            self.tracker.set_tag("pipelab.failure", self.failure["message"][:500])
        if self.runtime.guard.warned:  # train.on_nonfinite=warn: what was not finite, how often
            summary["nonfinite"] = self.runtime.guard.summary()
        metrics.update(extra.get("metrics", {}))
        summary.update(extra.get("summary", {}))
        # the per-epoch metrics MLflow holds as one point, their first epoch's (framework.tracking.series):
        # what a sweep's objective reads, so Optuna and the parent run see the same number
        summary["constant_per_epoch"] = {k: held[0][1] for k, held in self._series.get("held", {}).items() if len(held) > 1}
        summary["prediction"] = prediction = self._prediction()
        if prediction:
            metrics["plan/predicted_epoch_s"] = prediction["predicted_epoch_s"]
            if prediction["epoch_over_predicted"] is not None:
                metrics["plan/epoch_over_predicted"] = prediction["epoch_over_predicted"]
        if rt.dropouts:
            self.tracker.set_tag("pipelab.dropouts", ", ".join(f"{d['role']} (epoch {d['epoch']})" for d in rt.dropouts))
        tcfg = self.cfg.tracking
        # the timeline first: a tracker that works in another process gets the time to finish
        # starting the run (framework.tracking.recorder) before the summary asks for its id.
        # (Drawing the chart there instead was measured no faster: that process is as busy.)
        tl.save_chrome_trace(self.out_dir / "timeline.json", tcfg.max_trace_events)
        try:
            title = f"{self.cfg.scheduler.name}: first {tcfg.gantt_iterations} iteration(s)" + (f", bubble {bubble:.3f}" if tl.has_flushes() else "")
            tl.save_gantt(self.out_dir / "timeline.png", tcfg.gantt_iterations, title=title)
        except Exception as e:  # a plot must never hide the run's real outcome
            print(f"warning: could not draw timeline.png: {type(e).__name__}: {e}", file=sys.stderr)
        summary["mlflow_run_id"] = run_id = self.tracker.run_id
        summary["mlflow_experiment_id"] = self.tracker.experiment_id if run_id is not None else None
        if run_id is not None and self.checkpointing and ck.exists(self.out_dir):
            ck.record_run_id(self.out_dir, run_id)  # a checkpoint taken before the id was known
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default))
        self._log_final_metrics(metrics, summary)
        for name in ("plan.json", "summary.json", "timeline.json", "timeline.png", "model.safetensors", *per_device.ARTIFACTS):
            p = self.out_dir / name
            if p.exists():
                self.tracker.log_artifact(p)
        return summary


def _per_device_artifacts(tables: dict, out_dir: Path) -> None:
    per_device.write_csv(tables, out_dir / per_device.ARTIFACTS[0])
    try:
        per_device.plot(tables, out_dir / per_device.ARTIFACTS[1])
    except Exception as e:  # a plot must never hide the run's real outcome
        print(f"warning: could not draw {per_device.ARTIFACTS[1]}: {type(e).__name__}: {e}", file=sys.stderr)


def failure_record(e: BaseException, iterations: int) -> dict:
    """What summary.json and MLflow keep of why a run failed: the kind, the one line and, for a
    non-finite number, where (the role, the iteration: the run's own when the role did not say)."""
    if isinstance(e, NonFiniteError):
        e.locate(iteration=iterations)
        return {**e.where(), "message": str(e)}
    if isinstance(e, KeyboardInterrupt):
        return {"kind": "interrupted", "message": f"{type(e).__name__} after {iterations} iterations"}
    return {"kind": type(e).__name__, "message": str(e)[:2000] or type(e).__name__}


def _json_default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def run(cfg, out_dir, **kwargs) -> dict:
    """Build and run one job; returns its summary."""
    return Job(cfg, out_dir, **kwargs).run()
