"""The figures and quoted outputs of the README and docs/, regenerated from the commands shown
beside them, or checked against them.

    python experiments/docs_figures.py            # run every command; rewrite the figures, their data and the quoted lines
    python experiments/docs_figures.py --check    # run every command; exit 1 naming each figure or quote that differs
    python experiments/docs_figures.py --list     # what is covered, by which command; the studies' figures
    python experiments/docs_figures.py --check --studies   # the studies' timing figures: their parts run again (about 11 min of one core)
    python experiments/docs_figures.py --studies  # run those parts; rewrite their figures and data in docs/reproductions/

Each figure's data is committed beside it (`docs/report_epoch_time.json` beside
`docs/report_epoch_time.png`): the values it plots, at 6 significant digits, written by the
command that draws it. `--check` compares that file, not pixels, with what the command gives now.
Every number here runs on the virtual clock, which is deterministic: the comparison is exact.
A quoted output (the README's default run) is compared line by line, the run folder aside, run
with `runtime.threads=2`: its val/acc comes from training, whose last digits depend on torch's
thread count (the docs' numbers are torch's default on 2 cores); its times are virtual.

The commands run as the docs show them, with only where they write added (`hydra.run.dir` or
`hydra.sweep.dir` in a temporary folder, `tracking=none`, `runtime.progress=false`): none of these
changes a number. Each command must appear verbatim in its page (tests/test_docs_figures.py).
The reproduction studies' figures (docs/reproductions/<study>/, experiments/docs_study_figures.py)
have their data beside them too, written by the study. With `--studies` this script runs, for
every figure whose numbers are timing on the virtual clock, the part of its study that draws it
(a command `--list` shows, into a temporary `--out`) and compares or copies its data; the figures drawn
from training keep the data of the full run that drew them (`--list` says which, why, and how
long their study takes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from experiments.docs_study_figures import STUDY_FIGURES, StudyFigure, parts  # noqa: E402

DOCS = REPO / "docs"
WHERE = ("tracking=none", "runtime.progress=false")  # where a run writes and what it shows: no number changes
# torch's sums, and with them the last digits of a trained model's val/acc, depend on its thread
# count; the quoted run's numbers are those of torch's default on the 2 cores the docs were run on
QUOTE_THREADS = "runtime.threads=2"


@dataclass(frozen=True)
class Figure:
    name: str
    png: str  # under the repository root
    page: str  # the page that shows it, beside its commands
    commands: tuple[str, ...]  # as the page writes them
    produce: Callable[["Figure", Path], tuple[Path, dict]]  # (the PNG drawn, its data) from a scratch folder

    @property
    def data(self) -> Path:
        return REPO / Path(self.png).with_suffix(".json")


@dataclass(frozen=True)
class Quote:
    name: str
    pages: tuple[str, ...]  # pages quoting the output
    command: str
    prefixes: tuple[str, ...]  # the quoted lines start so


def run(argv: list[str], cwd: Path = REPO) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    res = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {res.returncode}:\n{res.stderr[-3000:]}")
    return res.stdout


def python_args(command: str) -> list[str]:
    """`python -m framework a=b` -> ["-m", "framework", "a=b"] (the docs' commands quote nothing)."""
    words = command.split("#", 1)[0].split()
    assert words[0] in ("python", "python3"), command
    return words[1:]


# ---- the figures --------------------------------------------------------------------------------


def report_epoch_time(fig: Figure, tmp: Path) -> tuple[Path, dict]:
    """The sweep, then its report: epoch_time.png and the epoch_time.json the report writes beside it."""
    sweep, report = fig.commands
    run(python_args(sweep) + [*WHERE, f"hydra.sweep.dir={tmp / 'sweep'}"])
    run(python_args(report.replace("outputs/multirun/<date>/<time>", str(tmp / "sweep"))) + ["--out", str(tmp / "report")])
    return tmp / "report" / "epoch_time.png", json.loads((tmp / "report" / "epoch_time.json").read_text())


def timeline_data(run_dir: Path) -> dict:
    """What timeline.png draws: per row (role or link), its bars (kind, start s, end s) in the first
    `tracking.gantt_iterations` iterations, and the bubble its title gives; from the run's
    timeline.json (a Chrome trace in microseconds) and summary.json."""
    import yaml

    iterations = yaml.safe_load((run_dir / "config.yaml").read_text())["tracking"].get("gantt_iterations", 3)
    events = json.loads((run_dir / "timeline.json").read_text())["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    bars: dict[str, list] = {name: [] for name in rows.values()}
    value = lambda us: float(f"{us / 1e6:.6g}")  # noqa: E731
    for e in events:
        if e["ph"] == "X" and 0 <= e.get("args", {}).get("iteration", -1) < iterations and e["dur"] > 0:
            bars[rows[e["tid"]]].append([e["cat"], value(e["ts"]), value(e["ts"] + e["dur"])])
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"figure": "timeline", "iterations": iterations, "bubble": float(f"{summary['bubble_frac']:.6g}"), "rows": {r: sorted(b, key=lambda x: (x[1], x[2], x[0])) for r, b in bars.items() if b}}


def timeline(fig: Figure, tmp: Path) -> tuple[Path, dict]:
    (command,) = fig.commands
    run(python_args(command) + [*WHERE, f"hydra.run.dir={tmp / 'run'}"])
    return tmp / "run" / "timeline.png", timeline_data(tmp / "run")


FIGURES = (
    Figure(
        "report_epoch_time",
        "docs/report_epoch_time.png",
        "docs/sweeps.md",
        (
            "python -m framework -m cluster.link.bandwidth_bps=1e6,1e7,1e8 compressor=none,fp16,mbq runtime.numerics=false train.epochs=1 train.iterations_per_epoch=2",
            "python -m framework.report outputs/multirun/<date>/<time>",
        ),
        report_epoch_time,
    ),
    Figure(
        "timeline_1f1b_vgg5",
        "docs/timeline_1f1b_vgg5.png",
        "docs/runs.md",
        ("python -m framework experiment=vgg5_pi4_wifi scheduler=1f1b train.epochs=1 train.iterations_per_epoch=2",),
        timeline,
    ),
)

QUOTES = (Quote("default_run", ("README.md", "docs/index.md"), "python -m framework", ("epoch ", "gpipe: virtual time ")),)



def quoted_lines(q: Quote, tmp: Path) -> list[str]:
    """The lines the quote shows, as the command prints them now (the run folder as the docs write it)."""
    out = run(python_args(q.command) + ["tracking=none", QUOTE_THREADS, f"hydra.run.dir={tmp / 'run'}"])  # progress on: it prints the epoch lines
    lines = [line.rstrip() for line in out.splitlines() if line.startswith(q.prefixes)]
    return [line.replace(str(tmp / "run"), "outputs/runs/<date>/<time>") for line in lines]


def quoted_indexes(text: list[str], prefixes: tuple[str, ...]) -> list[int]:
    """The lines inside fenced code blocks that start with one of `prefixes`."""
    out, fenced = [], False
    for i, line in enumerate(text):
        if line.startswith(("```", "~~~")):
            fenced = not fenced
        elif fenced and line.startswith(prefixes):
            out.append(i)
    return out


def page_lines(page: str, prefixes: tuple[str, ...]) -> list[str]:
    text = (REPO / page).read_text().splitlines()
    return [text[i].rstrip() for i in quoted_indexes(text, prefixes)]


# ---- comparing ----------------------------------------------------------------------------------


def differences(committed, now, path: str = "") -> list[str]:
    """Where two figures' data differ, one line each (at most a few per figure)."""
    if isinstance(committed, dict) and isinstance(now, dict):
        out = [f"{path}/{k}: only in the committed data" for k in committed if k not in now]
        out += [f"{path}/{k}: only in the command's data" for k in now if k not in committed]
        return out + [d for k in committed if k in now for d in differences(committed[k], now[k], f"{path}/{k}")]
    if isinstance(committed, list) and isinstance(now, list):
        if len(committed) != len(now):
            return [f"{path}: {len(committed)} entries committed, {len(now)} now"]
        return [d for i, (a, b) in enumerate(zip(committed, now)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if committed == now else [f"{path}: committed {committed!r}, now {now!r}"]


def check_figure(fig: Figure, tmp: Path) -> list[str]:
    if not fig.data.is_file():
        return [f"{fig.png}: no committed data ({fig.data.relative_to(REPO)}); run experiments/docs_figures.py"]
    _, now = fig.produce(fig, tmp)
    diffs = differences(json.loads(fig.data.read_text()), now)
    return [f"{fig.png}: {d}" for d in diffs[:8]] + ([f"{fig.png}: ... and {len(diffs) - 8} more"] if len(diffs) > 8 else [])


def check_quote(q: Quote, tmp: Path) -> list[str]:
    now = quoted_lines(q, tmp)
    out = []
    for page in q.pages:
        shown = page_lines(page, q.prefixes)
        if shown != now:
            out.append(f"{page}: `{q.command}` prints\n    " + "\n    ".join(now) + "\n  the page shows\n    " + "\n    ".join(shown))
    return out


def regenerate_figure(fig: Figure, tmp: Path) -> None:
    png, data = fig.produce(fig, tmp)
    shutil.copyfile(png, REPO / fig.png)
    fig.data.write_text(json.dumps(data, indent=1) + "\n")


def study_part(part: str, figures: list[StudyFigure], tmp: Path, check: bool) -> list[str]:
    """Run one study part into `tmp`; compare the data of the figures it draws with the committed
    ones (check) or copy each figure and its data into docs/reproductions/."""
    t0 = time.perf_counter()
    try:
        run(python_args(part) + ["--out", str(tmp)])
    except RuntimeError as e:
        return [f"{', '.join(f.png for f in figures)}: {e}"]
    problems = []
    for f in figures:
        drawn, data = tmp / f.file, (tmp / f.file).with_suffix(".json")
        if not data.is_file():
            problems.append(f"{f.png}: `{part}` drew no {data.name}")
        elif check:
            committed = REPO / Path(f.png).with_suffix(".json")
            if not committed.is_file():
                problems.append(f"{f.png}: no committed data ({committed.relative_to(REPO)}); run experiments/docs_figures.py --studies")
                continue
            diffs = differences(json.loads(committed.read_text()), json.loads(data.read_text()))
            problems += [f"{f.png}: {d}" for d in diffs[:8]] + ([f"{f.png}: ... and {len(diffs) - 8} more"] if len(diffs) > 8 else [])
        else:
            shutil.copyfile(drawn, REPO / f.png)
            shutil.copyfile(data, REPO / Path(f.png).with_suffix(".json"))
    print(f"{part}: {'checked' if check else 'regenerated'} {', '.join(f.name for f in figures)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return problems


def studies(figures: list[StudyFigure], check: bool, jobs: int) -> list[str]:
    """Every part that draws one of `figures`, `jobs` at a time."""
    todo = parts(figures)
    with tempfile.TemporaryDirectory(prefix="docs_study_figures_") as tmp, ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = [pool.submit(study_part, part, figs, Path(tmp) / str(i), check) for i, (part, figs) in enumerate(todo.items())]
        return [p for r in runs for p in r.result()]


def list_studies() -> None:
    for f in STUDY_FIGURES:
        how = f"checked by --studies: `{f.part}` (about {f.minutes:g} min of one core{'; ' + f.note if f.note else ''})" if f.part else f"not checked, its data are the full run's: {f.note}"
        print(f"{f.png} (data {Path(f.png).with_suffix('.json').name}), drawn by `{f.command}`:\n  {how}")


def regenerate_quote(q: Quote, tmp: Path) -> None:
    lines = quoted_lines(q, tmp)  # one run serves every page
    for page in q.pages:
        path = REPO / page
        text = path.read_text().splitlines(keepends=True)
        shown = quoted_indexes(text, q.prefixes)
        if len(shown) != len(lines):
            raise RuntimeError(f"{page}: shows {len(shown)} lines of `{q.command}`, which prints {len(lines)} now: edit the block by hand")
        for i, line in zip(shown, lines):
            text[i] = line + "\n"
        path.write_text("".join(text))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the committed data and quotes; change nothing")
    ap.add_argument("--list", action="store_true", help="list the figures and quotes, their commands, and the studies' figures")
    ap.add_argument("--studies", action="store_true", help="the reproduction studies' timing figures instead: run the parts that draw them")
    ap.add_argument("--jobs", type=int, default=1, help="with --studies: parts run at once (each takes one core)")
    ap.add_argument("--only", action="append", choices=[f.name for f in FIGURES] + [q.name for q in QUOTES] + [f.name for f in STUDY_FIGURES if f.part])
    args = ap.parse_args(argv)
    if args.list:
        for f in FIGURES:
            print(f"{f.png} (data {f.data.relative_to(REPO)}), shown in {f.page}:\n  " + "\n  ".join(f.commands))
        for q in QUOTES:
            print(f"the output of `{q.command}` quoted in {', '.join(q.pages)}")
        list_studies()
        return 0
    if args.studies or any(f.name in (args.only or []) for f in STUDY_FIGURES):
        chosen = [f for f in STUDY_FIGURES if f.part and (not args.only or f.name in args.only)]
        problems = studies(chosen, args.check, args.jobs)
        if problems:
            print("the studies' figures differ from what their parts draw now (python experiments/docs_figures.py --studies redraws them):")
            print("\n".join(f"  {p}" for p in problems))
            return 1
        print(f"{len(chosen)} study figure(s) {'match their studies' if args.check else 'regenerated'}")
        return 0
    figures = [f for f in FIGURES if not args.only or f.name in args.only]
    quotes = [q for q in QUOTES if not args.only or q.name in args.only]
    problems = []
    with tempfile.TemporaryDirectory(prefix="docs_figures_") as tmp:
        for i, item in enumerate([*figures, *quotes]):
            scratch = Path(tmp) / str(i)
            scratch.mkdir()
            if isinstance(item, Figure):
                problems += check_figure(item, scratch) if args.check else (regenerate_figure(item, scratch) or [])
            else:
                problems += check_quote(item, scratch) if args.check else (regenerate_quote(item, scratch) or [])
            print(f"{item.name}: {'checked' if args.check else 'regenerated'}", file=sys.stderr)
    if problems:
        print("the docs differ from what their commands produce now (python experiments/docs_figures.py redraws them):")
        print("\n".join(f"  {p}" for p in problems))
        return 1
    print(f"{len(figures)} figure(s) and {len(quotes)} quoted output(s) {'match their commands' if args.check else 'regenerated'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
