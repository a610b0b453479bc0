"""`python -m framework`: the Hydra app.

    python -m framework                                   # the embedded defaults
    python -m framework scheduler=1f1b cluster=uniform    # pick components by config group
    python -m framework -m scheduler=gpipe,1f1b           # a sweep: one MLflow parent run
    python -m framework --plugins                         # registered names per group
"""

from __future__ import annotations

import gc
import os
import re
import sys
from pathlib import Path

import hydra
from hydra._internal.hydra import Hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from framework import registry
from framework.config import input_errors, knob_help, preflight
from framework.config.dirs import CONF_DIR
from framework.config.group_options import check_group_overrides, group_choices
from framework.config.schemas import task_overrides
from framework.errors import PipelabError, one_line
from framework.tracking import faults, objective, ui_links
from framework.tracking import recorder as tracking_process
from framework.tracking.multirun import parent_run_id, sweep_keys


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def app(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir
    try:
        # a resumed run's own config, else this one validated: config errors before torch is
        # imported (the Job validates again: the API's way in); `--cfg` checks the same (preflight)
        cfg = preflight.run_config(cfg, task_overrides())
        if cfg.train.resume:  # the stopped run's own folder
            out_dir = cfg.train.resume
        from framework.job import Job  # torch: start-up (config errors come before torch)

        job = Job(cfg, out_dir, overrides=task_overrides(), parent_run_id=parent_run_id(), sweep_keys=sweep_keys())
        _collect_from_here()
        if job.resumed_epoch is not None:
            print(f"resuming {out_dir} after epoch {job.resumed_epoch} of {cfg.train.epochs}", file=sys.stderr)
        summary = job.run()
    except PipelabError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(e.exit_status)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (framework.tracking.faults)
        from framework.checkpoints import state as checkpoint  # torch: start-up (Ctrl-C may come before torch)

        hint = f"; continue it with train.resume={out_dir}" if checkpoint.exists(out_dir) else ""
        tracked = "the MLflow run is marked FAILED; " if cfg.tracking.name == "mlflow" else ""
        what = "terminated" if isinstance(stop, faults.Terminated) else "interrupted"
        print(f"{what}: {tracked}outputs so far are in {out_dir}{hint}", file=sys.stderr)
        sys.exit(faults.exit_code(stop))
    m = summary["metrics"]
    parts = [f"{summary.get('clock', 'virtual')} time {summary['virtual_time_s']:.4g}s"]
    if summary.get("pipeline", True):  # collaborative schedules have no pipeline flushes: no bubble
        parts.append(f"bubble {summary['bubble_frac']:.3f}")
    pred = summary.get("prediction") or {}
    if pred.get("epoch_over_predicted") is not None:
        parts.append(f"epoch {pred['epoch_s']:.4g}s / predicted {pred['predicted_epoch_s']:.4g}s = {pred['epoch_over_predicted']:.3f}")
    for k in ("val/acc", "test/acc"):
        if k in m:
            parts.append(f"{k} {m[k]:.4f}")
    metrics = objective.run_metrics(summary)
    try:
        objective.require_floor_metric(metrics, cfg.tracking)
    except PipelabError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    if not objective.feasible(metrics, cfg.tracking):
        parts.append(f"below the floor {objective.describe_floor(cfg.tracking)}")
    print(f"{cfg.scheduler.name}: " + ", ".join(parts) + f"  ->  {out_dir}")
    if summary.get("mlflow_run_id") and summary.get("mlflow_experiment_id"):
        print("MLflow: " + ui_links.describe(cfg.tracking.uri, ui_links.run_url(ui_links.ui_base(cfg.tracking.uri)[0], summary["mlflow_experiment_id"], summary["mlflow_run_id"])))
    # the value a Hydra sweeper (Optuna) optimises: tracking.optimized_metric, the worst value
    # for a run below tracking.metric_floor (the same rule picks the parent run's best child)
    return objective.score(metrics, cfg.tracking)


def _skip_hydra_group_listing() -> None:
    """Hydra's --help formats every config group's options ($APP_CONFIG_GROUPS,
    $HYDRA_CONFIG_GROUPS) whether the template uses them or not, deep-copying the whole config
    store once per group: 5-14 s on 2 cores. Our template lists the groups itself
    (`${pipelab_groups:}`), so that listing is skipped (`--hydra-help` keeps Hydra's)."""
    Hydra.format_config_groups = lambda self, predicate, compact=True: ""


def _collect_from_here() -> None:
    """Start-up runs with the cyclic garbage collector off (`main`): importing torch, MLflow and
    Hydra allocates ~200,000 long-lived objects, and the collections that set off traverse them
    again and again (0.5 s of a 10-device run's CPU on 2 cores). Once the run is built, those
    objects are frozen (later collections skip them: the run's own full collections stay cheap)
    and collection starts. Start-up left ~22,000 unreachable objects, a few MB (measured with
    gc.collect at this point, the same at K = 10 and 1,000): they stay, frozen, rather than
    spending 0.25 s on a full collection to free them. Once per process: a sweep's later jobs
    run with collection on, so nothing a job leaves is frozen."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


MODE_KEY = re.compile(r"^\s*mode\s*:\s*(RUN|MULTIRUN)\b", re.MULTILINE)
OTHER_CONFIGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")


def _skip_hydra_mode_compose(args: list[str]) -> None:
    """Hydra composes the whole config twice per command: once only to read `hydra.mode` (which
    may turn a plain command into a sweep), then for real; 0.65 s each on 2 cores. Nothing in
    conf/ sets `hydra.mode` (checked here, so a preset that starts to keeps working), so unless
    the command line sets it or brings other config folders, the first compose is skipped: Hydra
    then takes the mode from `-m`, as the composed `hydra.mode: null` would have it do."""
    if any(a.startswith(OTHER_CONFIGS) or "hydra.mode" in a or "hydra.searchpath" in a for a in args):
        return
    if any(MODE_KEY.search(f.read_text()) for f in Path(CONF_DIR).rglob("*.yaml")):
        return
    Hydra.get_mode = lambda self, config_name, overrides: None


def main() -> None:
    gc.disable()  # until the run is built (_collect_from_here)
    try:
        _main()
    finally:
        # the interpreter's last collections would traverse every object torch and the run made,
        # for nothing (0.7-1 s at exit, measured): frozen objects are skipped; atexit still runs
        gc.freeze()


def _main() -> None:
    # a run's MLflow work starts now, in a forked recorder, beside the run (framework.tracking.recorder)
    tracking_process.start(sys.argv[1:])
    try:
        # plugin schemas must be in the ConfigStore before Hydra composes, and their names known
        # before the overrides are checked (an installed plugin may bring options with no YAML)
        registry.load_plugins()
    except PipelabError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    if "--plugins" in sys.argv[1:]:
        print(registry.describe())
        print("\nconfig options (pick with group=name): <group>/*.yaml presets of conf/ (and of --config-dir, hydra.searchpath), and plugins registered with a schema and no YAML")
        for group in registry.GROUPS + ("experiment",):
            print(f"  {group:<11} {', '.join(group_choices(group, sys.argv[1:])) or '-'}")
        return
    # malformed overrides and unknown options: one line, before Hydra starts (framework.config.input_errors)
    problem = input_errors.override_problem(sys.argv[1:]) or check_group_overrides(sys.argv[1:])
    if problem:
        print(f"error: {one_line(problem)}", file=sys.stderr)
        sys.exit(2)
    # --help lists the user-facing groups (not the schema/* groups the YAML files extend)
    OmegaConf.register_new_resolver("pipelab_groups", lambda: "\n".join(f"{g}: {', '.join(group_choices(g, sys.argv[1:]))}" for g in registry.GROUPS + ("experiment",)), replace=True)
    # ... and the config with every knob's meaning and range (framework.config.knob_help); `$` doubled:
    # Hydra fills the template's $CONFIG-style placeholders after this
    OmegaConf.register_new_resolver("pipelab_knobs", lambda _root_: knob_help.annotated_config(_root_, "--resolve" in sys.argv[1:]).replace("$", "$$"), replace=True)
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        _skip_hydra_group_listing()
    _skip_hydra_mode_compose(sys.argv[1:])
    preflight.check_shown_configs()  # `--cfg` prints only a config a run would start with
    faults.handle_sigterm()
    try:
        input_errors.run_app(app, sys.argv[1:])  # Hydra's errors composing the config: one line
    except KeyboardInterrupt as stop:  # between a sweep's jobs, or in a launcher (joblib): one line
        print("interrupted: the sweep stopped; its MLflow runs still open are marked FAILED", file=sys.stderr)
        sys.exit(faults.exit_code(stop))


if __name__ == "__main__":
    main()
