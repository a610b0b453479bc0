"""What the reproduction studies share: one run of the framework from overrides, in this process."""

from __future__ import annotations

from pathlib import Path


def build_job(overrides: list[str], out: Path, edit=None):
    """The Job `python -m framework <overrides>` would run into `out`, built but not run.
    `edit(cfg)`, if given, changes the composed config first (keys an override cannot spell,
    such as a device glob)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from framework import registry
    from framework.cli import CONF_DIR
    from framework.job import Job

    registry.load_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    if edit is not None:
        with open_dict(cfg):
            edit(cfg)
    return Job(cfg, out)


def run_job(overrides: list[str], out: Path) -> dict:
    """Compose the config as `python -m framework <overrides>` would, run it into `out`; returns its
    summary (summary.json's contents) with the scheduler's plan under "plan"."""
    job = build_job(overrides, out)
    summary = job.run()
    summary["plan"] = job.scheduler.plan()
    return summary
