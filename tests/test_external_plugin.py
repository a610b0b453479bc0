"""A plugin from outside this repo: an installed package declares a `pipelab.plugins` entry point,
registers a scheduler with its dataclass schema and ships no YAML; `scheduler=<name>` selects it
from the command line, with its options typed and checked like a built-in's.

The package is "installed" without pip: a package directory and a `.dist-info` with its entry
points, side by side on the subprocess's PYTHONPATH, which is all `importlib.metadata` looks for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from framework import plugin_discovery, registry

REPO = Path(__file__).resolve().parent.parent

PLUGIN = '''
"""pipelab_ext_demo: a scheduler from outside the pipelab repo."""

from dataclasses import dataclass

from framework.config.schemas import SchedulerConfig
from framework.pipeline.scheduler import STEP, B, F, PipelineScheduler
from framework.registry import register


@dataclass
class DemoGPipeConfig(SchedulerConfig):
    """Demo GPipe from an out-of-tree package."""

    name: str = "demo_gpipe"
    microbatches: int = 2
    warmup_note: str = "x"
    rounds: int = 1


@register("scheduler", "demo_gpipe", schema=DemoGPipeConfig)
class DemoGPipe(PipelineScheduler):
    def actions(self, stage, num_stages, num_mb):
        return [F(m) for m in range(num_mb)] + [B(m) for m in range(num_mb)] + [STEP]


# the same scheduler under a second name, with the base schema (whose `name` has no default)
register("scheduler", "demo_plain", schema=SchedulerConfig)(DemoGPipe)

'''

RUN = ["cluster=uniform", "model=mlp", "train.epochs=1", "train.iterations_per_epoch=2", "tracking=none", "runtime.progress=false"]


def install_plugin(root: Path, package: str, source: str, entry: str, value: str | None = None) -> Path:
    """`root`, which put on PYTHONPATH has `package` (one module, `source`) installed with the
    `pipelab.plugins` entry point `entry = value` (by default the package: a module to import):
    a package directory and its `.dist-info`, all that `importlib.metadata` looks for."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text(source)
    info = root / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[pipelab.plugins]\n{entry} = {value or package}\n")
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A directory that, put on PYTHONPATH, has `pipelab_ext_demo` installed."""
    return install_plugin(tmp_path_factory.mktemp("site"), "pipelab_ext_demo", PLUGIN, "demo")


def cli(args, site: Path | None):
    """`python -m framework args` from the repo root, with `site` (if any) installed."""
    return clis([args], site)[0]


def clis(commands: list[list[str]], site: Path | None) -> list[subprocess.CompletedProcess]:
    """Several `cli` commands at once (each one's start-up is most of its time)."""
    path = [str(site)] if site else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path + [str(REPO)]), OMP_NUM_THREADS="1")
    env[plugin_discovery.ONLY_PLUGINS_ENV] = ",".join(installed(site))  # the suite loads no other outside plugin (tests/conftest.py)
    env.pop("HYDRA_FULL_ERROR", None)
    procs = [subprocess.Popen([sys.executable, "-m", "framework", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for args in commands]
    out = []
    for args, proc in zip(commands, procs):
        stdout, stderr = proc.communicate(timeout=300)
        out.append(subprocess.CompletedProcess([sys.executable, "-m", "framework", *args], proc.returncode, stdout, stderr))
    return out


def installed(site: Path | None) -> list[str]:
    """The distributions `install_plugin` put in `site`."""
    return sorted(p.name.split("-")[0] for p in site.glob("*.dist-info")) if site else []


def builtin_schedulers() -> list[str]:
    """The schedulers a process without the out-of-tree package knows."""
    return registry.names("scheduler")



def test_schema_only_plugin_composes_with_its_defaults(site, tmp_path):
    res, plain = clis([["scheduler=demo_gpipe", *RUN, "scheduler.rounds=3", "--cfg", "job"], ["scheduler=demo_plain", *RUN, "--cfg", "job"]], site)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    sched = text[text.index("scheduler:"):]
    for line in ("name: demo_gpipe", "microbatches: 2", "warmup_note: x", "rounds: 3", "partition: dp"):  # dp: the schema default it inherits
        assert line in sched, (line, text)
    # a schema whose `name` has no default gets the registered name
    res = plain
    assert res.returncode == 0, res.stderr
    assert "scheduler:\n  name: demo_plain\n  microbatches: 1\n" in res.stdout, res.stdout


def test_schema_only_plugin_runs_from_the_cli(site, tmp_path):
    out = tmp_path / "run"
    res = cli(["scheduler=demo_gpipe", *RUN, f"hydra.run.dir={out}"], site)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scheduler"] == "demo_gpipe"
    assert summary["iterations"] == 2
    assert "demo_gpipe:" in res.stdout


@pytest.mark.parametrize(
    "override,needles",
    [
        ("scheduler.microbatchez=2", ["microbatchez", "scheduler=demo_gpipe", "did you mean scheduler.microbatches"]),
        ("scheduler.rounds=many", ["scheduler.rounds", "many"]),
        ("scheduler.microbatches=abc", ["scheduler.microbatches", "abc"]),
    ],
)
def test_schema_only_plugin_options_are_checked(site, tmp_path, override, needles):
    res = cli(["scheduler=demo_gpipe", *RUN, override, f"hydra.run.dir={tmp_path / 'run'}"], site)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, (n, res.stderr)
    assert len(res.stderr.strip().splitlines()) <= 12, res.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_plugins_and_help_list_the_schema_only_option(site, tmp_path):
    res, helped, wrong = clis([["--plugins"], ["--help"], ["scheduler=nope"]], site)
    assert res.returncode == 0, res.stderr
    assert "Demo GPipe from an out-of-tree package." in res.stdout  # the registry listing
    presets = res.stdout.split("config options")[1]
    line = next(x for x in presets.splitlines() if x.strip().startswith("scheduler"))
    assert "demo_gpipe" in line and "gpipe" in line.replace("demo_gpipe", ""), line
    res = helped
    assert res.returncode == 0, res.stderr
    with_demo = ", ".join(sorted(builtin_schedulers() + ["demo_gpipe", "demo_plain"]))  # the built-ins and the plugin's
    assert f"scheduler: {with_demo}" in res.stdout
    res = wrong
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: scheduler=nope: no such scheduler; choices: {with_demo}"


def test_unknown_option_without_the_plugin_is_one_line(tmp_path):
    res = cli(["scheduler=nope"], None)
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: scheduler=nope: no such scheduler; choices: {', '.join(builtin_schedulers())}"
    res = cli(["scheduler=demo_gpipe"], None)
    assert res.returncode == 2
    assert "scheduler=demo_gpipe: no such scheduler" in res.stderr


def test_builtin_presets_keep_their_yaml(tmp_path):
    """A built-in's schema is not stored as a group option: its YAML is the option (a ConfigStore
    entry of the same name would make Hydra merge the two, with a deprecation warning)."""
    from hydra.core.config_store import ConfigStore

    from framework import registry

    registry.load_plugins()
    assert registry.schema_options("scheduler") == []
    repo = ConfigStore.instance().repo
    assert "gpipe.yaml" in repo["schema"]["scheduler"]
    assert "gpipe.yaml" not in repo.get("scheduler", {})


def test_a_plugin_that_fails_to_load_is_one_line(tmp_path):
    bad = tmp_path / "site"
    (bad / "pipelab_ext_bad").mkdir(parents=True)
    (bad / "pipelab_ext_bad" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from framework.registry import register

            @register("scheduler", "gpipe")  # the built-in's name, another factory
            class NotGPipe:
                pass
            """
        )
    )
    info = bad / "pipelab_ext_bad-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pipelab_ext_bad\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pipelab.plugins]\nbad = pipelab_ext_bad\n")
    res = cli(["--cfg", "job"], bad)
    assert res.returncode == 2
    err = res.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "pipelab_ext_bad" in err and "gpipe" in err and "registered twice" in err, err


# ---- a plugin that imports torch at its top (issue 46): declared from metadata, imported when used

HEAVY = '''
"""pipelab_ext_heavy: a scheduler whose module imports torch at its top, as model code does."""

from dataclasses import dataclass

import torch  # noqa: F401  (what --help must not pay for)

from framework.config.schemas import SchedulerConfig
from framework.pipeline.scheduler import STEP, B, F, PipelineScheduler
from framework.registry import register


@dataclass
class HeavyGPipeConfig(SchedulerConfig):
    """GPipe from a package that imports torch on import."""

    name: str = "heavy_gpipe"
    microbatches: int = 2
    rounds: int = 1


@register("scheduler", "heavy_gpipe", schema=HeavyGPipeConfig)
class HeavyGPipe(PipelineScheduler):
    def actions(self, stage, num_stages, num_mb):
        return [F(m) for m in range(num_mb)] + [B(m) for m in range(num_mb)] + [STEP]
'''


def probe(args: list[str], site: Path, only: str | None) -> subprocess.Popen:
    """tests.test_startup.PROBE (the command, then which heavy modules it imported) with `site`
    installed and `PIPELAB_PLUGINS=only` (None: unset, as on a user's machine)."""
    from tests.test_startup import PROBE

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), OMP_NUM_THREADS="1")
    env.pop(plugin_discovery.ONLY_PLUGINS_ENV)
    if only is not None:
        env[plugin_discovery.ONLY_PLUGINS_ENV] = only
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, "-c", PROBE, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def heavy_of(proc: subprocess.Popen) -> tuple[str, str, list[str]]:
    out, err = proc.communicate(timeout=300)
    return out, err, [line for line in err.splitlines() if line.startswith("HEAVY:")]


def test_a_plugin_that_imports_torch_is_declared_without_importing_it(tmp_path):
    """An entry point named `scheduler.heavy_gpipe` declares that plugin from the package's
    metadata: `--help` and a bad override list it and import no torch (nor the package); selecting
    it imports it, and its schema types its options as a built-in's; a run builds and runs it."""
    site = install_plugin(tmp_path / "site", "pipelab_ext_heavy", HEAVY, "scheduler.heavy_gpipe", "pipelab_ext_heavy:HeavyGPipe")
    install_plugin(site, "pipelab_ext_broken", "import pipelab_no_such_module\n", "scheduler.broken", "pipelab_ext_broken:Broken")
    out = tmp_path / "run"
    procs = [probe(["--help"], site, None), probe(["scheduler=heavy_gpip"], site, None), probe(["--cfg", "job", "scheduler=heavy_gpipe", "scheduler.rounds=3"], site, None),
             probe(["scheduler=heavy_gpipe", "scheduler.rounds=many"], site, None), probe(["scheduler=heavy_gpipe", *RUN, f"hydra.run.dir={out}"], site, None),
             probe(["scheduler=broken", *RUN], site, None)]
    (helped, help_err, help_heavy), (_, wrong, wrong_heavy), (shown, shown_err, _), (_, typed, _), (ran, ran_err, _), (_, broken, _) = map(heavy_of, procs)
    with_heavy = ", ".join(sorted(builtin_schedulers() + ["broken", "heavy_gpipe"]))
    assert help_heavy == ["HEAVY:"] and f"scheduler: {with_heavy}" in helped, help_err[-2000:]
    assert wrong_heavy == ["HEAVY:"] and wrong.splitlines()[0] == f"error: scheduler=heavy_gpip: no such scheduler (did you mean scheduler=heavy_gpipe?); choices: {with_heavy}", wrong
    assert "scheduler:\n  name: heavy_gpipe\n  microbatches: 2\n" in shown and "rounds: 3" in shown, shown_err[-2000:]  # the schema, not the placeholder
    assert typed.splitlines()[0].startswith("error: scheduler.rounds: 'many' is not an integer"), typed
    assert "heavy_gpipe:" in ran and json.loads((out / "summary.json").read_text())["scheduler"] == "heavy_gpipe", ran_err[-3000:]
    # a declared plugin whose module fails to import when Hydra loads its option: one line, exit 2 (PROBE prints its HEAVY line after)
    assert broken.splitlines()[0] == "error: plugin scheduler.broken = pipelab_ext_broken:Broken ('pipelab.plugins' entry point) failed to load: ModuleNotFoundError: No module named 'pipelab_no_such_module'", broken


def test_the_suite_sees_only_this_repos_plugins_and_its_own(tmp_path):
    """`PIPELAB_PLUGINS` (set empty for the whole suite by tests/conftest.py) keeps an installed
    plugin that imports torch on import (an entry point naming its module, imported at start-up)
    out: `--help` imports no torch and lists the built-ins alone. Named there, the plugin loads."""
    site = install_plugin(tmp_path / "site", "pipelab_ext_eager", HEAVY.replace("heavy_gpipe", "eager_gpipe"), "eager")
    assert os.environ[plugin_discovery.ONLY_PLUGINS_ENV] == ""
    procs = [probe(["--help"], site, ""), probe(["--help"], site, "pipelab-ext-eager"), probe(["--help"], site, None)]
    (isolated, err, heavy), (named, named_err, named_heavy), (unset, _, unset_heavy) = map(heavy_of, procs)
    assert heavy == ["HEAVY:"] and f"scheduler: {', '.join(builtin_schedulers())}\n" in isolated, err[-2000:]
    imported_torch = ["torch" in line.removeprefix("HEAVY:").split(",") for line in named_heavy + unset_heavy]
    assert "eager_gpipe" in named and "eager_gpipe" in unset and imported_torch == [True, True], named_err[-2000:]  # its own choice: a module imported at start-up
