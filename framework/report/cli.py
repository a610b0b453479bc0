"""`python -m framework.report`: write a report of a sweep, a run or an MLflow experiment.

    python -m framework.report outputs/multirun/2026-01-01/12-00-00        # -> <sweep>/report/
    python -m framework.report pipelab                                     # -> outputs/reports/pipelab/
    python -m framework.report pipelab --parent <sweep run id> --out paper/fig

An experiment name reports its latest sweep (the children of its latest parent run; `--parent`
picks another), or every top-level run when it holds no sweep. Bad input is one `error:` line and
exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from framework.errors import PipelabError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m framework.report", description="Write a report (report.md, runs.csv, PNGs) of a sweep folder, a run folder or an MLflow experiment.")
    p.add_argument("source", help="a sweep folder (outputs/multirun/<date>/<time>), a run folder, or an MLflow experiment name")
    p.add_argument("--out", help="where to write (default: <folder>/report, or outputs/reports/<experiment>)")
    p.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db", help="the MLflow store of an experiment (default: %(default)s)")
    p.add_argument("--parent", metavar="RUN_ID", help="an experiment's sweep to report, by its parent run id (default: the latest sweep)")
    args = p.parse_args(argv)
    from framework.report.sources import load  # start-up: --help and bad arguments answer before Hydra (framework.config.schemas) is imported
    from framework.report.write import console_table, write_report

    try:
        src = load(args.source, args.tracking_uri, args.parent)
        out = Path(args.out) if args.out else src.default_out
        done = write_report(src, out)
    except (PipelabError, OSError) as e:  # OSError: an --out that cannot be written
        print(f"error: {e}", file=sys.stderr)
        return 2
    drawn = [t for t, (path, _) in done["plots"].items() if path]
    print(f"report of {src.title} ({len(src.records)} run{'s' if len(src.records) != 1 else ''}, plots: {', '.join(drawn) or 'none'}) -> {out / 'report.md'}")
    for title, (path, note) in done["plots"].items():
        if not path:
            print(f"  {title}: not drawn: {note}")
    print(console_table(done["result"], done["labels"]))
    return 0
