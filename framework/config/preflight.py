"""What a run checks before it starts, in one place: for the run itself, for `--cfg`, and for
`framework.config.input_errors.check_args` (the tests' way to ask what a command would say).

- `run_config`: the config a run goes on with (a resumed run's own, else the composed one
  validated by `framework.config.validate`: keys, every knob's range and choices, the core's
  cross-field rules). No torch: most bad input is reported in well under a second.
- `check`: that, then the run's components built as a run builds them (`framework.job.Job`:
  every plugin checks what its fields cannot say, e.g. `model.hidden=-5`, a cut beyond the
  model's units), in a scratch folder, with no tracking run and nothing trained.
- `check_shown_configs`: makes Hydra's `--cfg job|hydra|all` run `check` on the config it is
  about to print, so a config `--cfg` prints (exit 0) is one a run starts with, and one a run
  refuses is refused by `--cfg` with the same line and exit status 2 (`+train.epoch=3 --cfg job`
  used to print the config with the unknown key in it). `--info` is left as Hydra has it: it is
  the tool for seeing how a config came to be (its defaults tree, search path), which is most
  useful on a config a run refuses.
"""

from __future__ import annotations

import copy
import sys
import tempfile

from hydra._internal.hydra import Hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict, read_write

from framework.config.validate import validate
from framework.errors import PipelabError, one_line


def run_config(cfg, overrides: list[str]):
    """The config a run goes on with: `train.resume=<dir>`'s stored one (the overrides a resume
    may set applied), else `cfg`, validated; raises `ConfigError` for bad input."""
    if cfg.train.resume:
        from framework.checkpoints.state import resumed_config  # torch: start-up

        return resumed_config(cfg, overrides)
    validate(cfg)  # config errors before torch is imported
    return cfg


def check(cfg, overrides: list[str]) -> None:
    """Everything a run checks before it starts (`run_config`, then its components built, which
    validates again: the API's way in); raises `PipelabError` for bad input."""
    cfg = run_config(cfg, overrides)
    from framework.job import Job  # torch: start-up (config errors come before torch)

    with tempfile.TemporaryDirectory(prefix="pipelab-check-") as scratch:
        Job(cfg, cfg.train.resume or scratch, overrides=overrides)  # writes nothing until it runs


def check_shown_configs() -> None:
    """Hydra's `--cfg` composes the config and prints it without calling the task function; here
    the composed config is checked as a run would check it first (`check`), and bad input is one
    line, `error: ...`, exit 2, with nothing printed on stdout. Only `--cfg` calls `show_cfg`, so
    installing this changes nothing else."""
    show = Hydra.show_cfg
    if getattr(show, "checks_first", False):
        return

    def show_checked(self, config_name, overrides, cfg_type, package, resolve=False):
        compose = self.compose_config

        def compose_and_check(*args, **kwargs):
            composed = compose(*args, **kwargs)
            HydraConfig.instance().set_config(composed)  # `${hydra:...}` in a value resolves as in a run
            task = copy.deepcopy(composed)
            with read_write(task), open_dict(task):
                del task["hydra"]  # what the task function gets
            try:
                check(task, [str(o) for o in overrides])
            except PipelabError as e:
                print(f"error: {one_line(e)}", file=sys.stderr)
                sys.exit(e.exit_status)
            return composed

        self.compose_config = compose_and_check  # this Hydra object's, for this one call
        try:
            return show(self, config_name, overrides, cfg_type, package, resolve)
        finally:
            del self.compose_config

    show_checked.checks_first = True
    Hydra.show_cfg = show_checked
