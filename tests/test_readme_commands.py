"""Every `python -m framework ...` line in the code blocks of README.md and of the documentation
pages (docs/, in mkdocs.yml's nav order: the README's sections moved there) works as written.

- Fast (default suite): each command's config composes (Hydra's compose API, as the CLI composes
  it; a sweep's every combination) and passes the CLI's checks and `validate`; a `$ ...` line
  shown with its error fails with that error, word for word.
- Slow (`-m slow`): each command runs through the CLI, in reading order in one temporary folder
  (as a reader would run them: a resume finds the run it continues), cut short (one epoch of two
  iterations, small dataset splits, MLflow in the folder; sweeps keep every value), and exits 0
  with no traceback; a `$ ...` line exits non-zero printing the error the README shows. A line
  whose comment says Ctrl-C is interrupted after its first checkpoint and must stop cleanly; a
  `train.resume=` line sets only what a resume may (MLflow's place, no progress bar). MQTT lines
  are skipped without mosquitto; `runtime=remote` lines, which wait for other machines to join,
  only compose.

Lines added to the README or a page later are picked up the same way.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import compose_cfg
from tests.test_docs import DOCS, nav_pages

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def documented_pages() -> list[Path]:
    """README.md, then every page of the site in its nav order: a reader's order, in which a resume
    comes after the run it continues."""
    import yaml

    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    return [README, *(DOCS / page for page in nav)]

NO_RUN_FLAGS = ("--help", "-h", "--plugins", "--cfg", "--info", "--hydra-help", "--resolve", "--package")
SHORT = {"train.epochs": "1", "train.iterations_per_epoch": "2", "runtime.progress": "false"}
SMALL_DATA = {"dataset.n_train": "1024", "dataset.n_val": "64", "dataset.n_test": "64"}


@dataclass
class Command:
    line: str  # as the README writes it (continuations joined)
    args: list[str]  # after `python -m framework`
    expected_error: str | None = None  # a `$ ...` transcript line: the error line shown below it
    comment: str = ""  # the line's shell comment

    @property
    def interrupted(self) -> bool:
        """The README says to stop this run part-way (`# Ctrl-C during epoch 2`)."""
        return "ctrl-c" in self.comment.lower()

    @property
    def resumes(self) -> str | None:
        """The run directory a `train.resume=` line continues."""
        return next((o.split("=", 1)[1] for o in self.overrides if o.split("=", 1)[0] == "train.resume"), None)

    @property
    def id(self) -> str:
        return " ".join(self.args)[:120] or "(defaults)"

    @property
    def multirun(self) -> bool:
        return "-m" in self.args or "--multirun" in self.args

    @property
    def overrides(self) -> list[str]:
        return [a for a in self.args if "=" in a and not a.startswith("-")]

    @property
    def makes_no_run(self) -> bool:
        return any(a in NO_RUN_FLAGS for a in self.args)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block."""
    return [(m.group(1).strip(), m.group(2)) for m in re.finditer(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", text, flags=re.S | re.M)]


def logical_lines(body: str) -> list[str]:
    """Lines with shell continuations (a trailing backslash) joined."""
    out, cur = [], ""
    for raw in body.splitlines():
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        out.append(cur + raw)
        cur = ""
    if cur:
        out.append(cur)
    return out


def readme_commands(text: str | None = None) -> list[Command]:
    text = "\n".join(p.read_text() for p in documented_pages()) if text is None else text
    out: list[Command] = []
    for info, body in code_blocks(text):
        if info.split(" ")[0] in ("python", "py", "toml", "yaml", "yml", "json"):
            continue  # source code, not shell lines
        lines = logical_lines(body)
        for i, line in enumerate(lines):
            transcript = line.startswith("$ ")
            try:
                tokens = shlex.split(line[2:] if transcript else line, comments=True)
            except ValueError:  # program output, not a shell line
                continue
            segment: list[str] = []
            for tok in tokens + ["&&"]:
                if tok not in ("&&", "||", ";", "|"):
                    segment.append(tok)
                    continue
                if len(segment) >= 3 and re.fullmatch(r"python(3(\.\d+)?)?", segment[0]) and segment[1:3] == ["-m", "framework"]:
                    expected = None
                    if transcript:  # the output shown below it, up to the next prompt
                        shown = list(itertools.takewhile(lambda l: not l.startswith("$ "), lines[i + 1 :]))
                        expected = next((l.strip() for l in shown if l.strip()), None)
                    comment = re.search(r"(?:^|\s)#(.*)$", line)
                    out.append(Command(line.strip(), segment[3:], expected, comment.group(1).strip() if comment else ""))
                segment = []
    return out


COMMANDS = readme_commands()


def has_mosquitto() -> bool:
    return shutil.which("mosquitto") is not None or Path("/usr/sbin/mosquitto").exists()


def sweep_combinations(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic sweeper: `key=a,b` (commas outside brackets) gives one job per value."""
    choices = []
    for o in overrides:
        key, value = o.split("=", 1)
        parts, depth, cur = [], 0, ""
        for ch in value:
            depth += ch in "[({"
            depth -= ch in "])}"
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        choices.append([f"{key}={p}" for p in parts])
    return [list(c) for c in itertools.product(*choices)]


def compose_error(overrides: list[str]) -> str | None:
    """What the CLI would say before running anything (None: it would run)."""
    from framework.config.group_options import check_group_overrides
    from framework.config.validate import validate
    from framework.errors import PipelabError

    problem = check_group_overrides(overrides)
    if problem:
        return problem
    try:
        validate(compose_cfg(overrides, fast=False))
    except PipelabError as e:
        return str(e)
    return None


def test_the_readme_has_framework_commands():
    lines = [c.line for c in COMMANDS]
    assert len(COMMANDS) >= 5, lines  # the parser finds the README's commands
    readme = readme_commands(README.read_text())
    assert readme and all(c in COMMANDS for c in readme), [c.line for c in readme]  # the README's own lines are among them
    assert any(c.interrupted for c in COMMANDS) and any(c.resumes for c in COMMANDS), lines  # docs/runs.md: Ctrl-C, then resume
    # and is not fooled by other modules (`python -m framework.worker role=...`) or comments
    assert not any(a.startswith("role=") or "#" in a for c in COMMANDS for a in c.args), lines


def test_the_parser_on_a_made_up_readme():
    text = "\n".join([
        "```bash",
        "bash setup.sh && python -m framework       # comment",
        "python -m framework -m a=1,2 \\",
        "    b=[1,2]   # continued",
        "python -m framework.worker role=x",
        "python -m framework train.epochs=3 hydra.run.dir=out/long   # Ctrl-C during epoch 2",
        "python -m framework train.resume=out/long",
        "```",
        "```",
        "$ python -m framework scheduler=nope",
        "error: scheduler=nope: no such scheduler",
        "$ python -m framework --help",
        "== Config ==",
        "```",
        "```python",
        "python -m framework never=parsed",
        "```",
    ])
    cmds = readme_commands(text)
    assert [(c.args, c.expected_error) for c in cmds] == [
        ([], None),
        (["-m", "a=1,2", "b=[1,2]"], None),
        (["train.epochs=3", "hydra.run.dir=out/long"], None),
        (["train.resume=out/long"], None),
        (["scheduler=nope"], "error: scheduler=nope: no such scheduler"),
        (["--help"], "== Config =="),
    ]
    assert [c.multirun for c in cmds] == [False, True, False, False, False, False]
    assert [c.interrupted for c in cmds] == [False, False, True, False, False, False]
    assert [c.resumes for c in cmds] == [None, None, None, "out/long", None, None]
    assert [c.makes_no_run for c in cmds] == [False, False, False, False, False, True]
    assert sweep_combinations(["a=1,2", "b=[1,2]", "c=x,y"]) == [["a=1", "b=[1,2]", "c=x"], ["a=1", "b=[1,2]", "c=y"], ["a=2", "b=[1,2]", "c=x"], ["a=2", "b=[1,2]", "c=y"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_each_readme_command_composes(cmd):
    """Every combination a command makes composes and passes the CLI's checks; a transcript's
    command fails with the error the README shows below it."""
    if cmd.expected_error:
        assert cmd.expected_error.startswith("error: "), cmd.expected_error
        assert compose_error(cmd.overrides) == cmd.expected_error[len("error: ") :]
        return
    combos = sweep_combinations(cmd.overrides) if cmd.multirun else [cmd.overrides]
    for overrides in combos:
        assert compose_error(overrides) is None, (cmd.line, overrides)


# ---------------------------------------------------------------------------------------------
# running them, in README order, in one folder (as a reader would: a resume finds its run)


def shortened(cmd: Command, folder: Path) -> list[str]:
    """The command's own arguments, then what cuts it short and keeps its records in `folder`,
    for keys it does not set itself. A resume may set only a few keys (the rest is the stopped
    run's), a run to be interrupted keeps its length (it must still be running at Ctrl-C), and a
    line shown failing must fail as it is."""
    extra = {"tracking.uri": f"sqlite:///{folder / 'mlflow.db'}", "tracking.artifact_root": str(folder / "mlartifacts"), "runtime.progress": "false"}
    if not (cmd.resumes or cmd.interrupted or cmd.expected_error):
        extra.update(SHORT)
        cfg = compose_cfg(sweep_combinations(cmd.overrides)[0] if cmd.multirun else cmd.overrides, fast=False)
        for key, value in SMALL_DATA.items():  # where the command's dataset has that knob
            if key.split(".")[1] in cfg.dataset:
                extra[key] = value
    own = {o.split("=", 1)[0].lstrip("+~") for o in cmd.overrides}
    return cmd.args + [f"{k}={v}" for k, v in extra.items() if k not in own]


def cli(args: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.Popen([sys.executable, "-m", "framework", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def interrupt_after_first_checkpoint(proc: subprocess.Popen, folder: Path) -> tuple[str, str]:
    """Ctrl-C (SIGINT) once the run has written its first checkpoint, as the README's reader does."""
    from framework.checkpoints import state as checkpoint

    before = set(folder.glob(f"**/{checkpoint.DIR}/meta.json"))
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        if set(folder.glob(f"**/{checkpoint.DIR}/meta.json")) - before:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.05)
    return proc.communicate(timeout=300)


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory, mlflow_template) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    shutil.copy(mlflow_template, folder / "mlflow.db")  # migrated once per session
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_each_readme_command_runs(cmd, reader_folder):
    if "runtime=remote" in cmd.args and not cmd.expected_error:
        pytest.skip("runtime=remote waits for role processes on other machines to join (it composes: see the fast test)")
    if any(a.startswith(("tracking.uri=http://", "tracking.uri=https://")) for a in cmd.args):
        pytest.skip("logs into a running `mlflow server` (tests/test_parallel_sweeps.py runs such a sweep against a real one)")
    if "transport=mqtt" in cmd.args and not has_mosquitto():
        pytest.skip("needs mosquitto (apt-get install mosquitto)")
    if cmd.resumes and not (reader_folder / cmd.resumes / "config.yaml").exists():
        pytest.skip(f"the run it resumes ({cmd.resumes}, an earlier README line) did not run in this session")
    if cmd.makes_no_run:
        proc = cli(cmd.args, reader_folder)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
        return
    started = time.time()
    proc = cli(shortened(cmd, reader_folder), reader_folder)
    try:
        out, err = interrupt_after_first_checkpoint(proc, reader_folder) if cmd.interrupted else proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out + err, (out + err)[-4000:]
    if cmd.expected_error:
        assert proc.returncode != 0 and cmd.expected_error in err, err[-3000:]
        return
    if cmd.interrupted:
        assert proc.returncode == 130 and "interrupted" in err and "train.resume=" in err, (proc.returncode, (out + err)[-3000:])
        return
    assert proc.returncode == 0, (out + err)[-4000:]
    if any(a.startswith("hydra/launcher=submitit") for a in cmd.args):  # its jobs print into their own logs, in submitit's folder
        out += "".join(p.read_text() for p in reader_folder.glob("outputs/multirun/**/.submitit/*/*_log.out") if p.stat().st_mtime >= started)
    # a run happened and said where its outputs are
    assert re.search(r"^\S+: (virtual|wall) time .*->", out, flags=re.M), out[-3000:]
