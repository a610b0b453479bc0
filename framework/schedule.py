"""`python -m framework.schedule`: write a built-in pipeline schedule in torch's CSV format, or
check a schedule written in it.

    python -m framework.schedule export zbv --stages 8 --microbatches 8 -o zbv.csv
    python -m framework.schedule export interleaved_1f1b --stages 8 --stages-per-device 2 --microbatches 8
    python -m framework.schedule check zbv.csv

`export` writes one row per device (S / V devices for S stages, V per device), compute actions
only, as `torch.distributed.pipelining`'s `_dump_csv` does (framework.pipeline.schedule_csv).
`check` reads such a file (or one with sends and receives), lowers it and runs the validator
(framework.pipeline.validate): a bad schedule is one `error:` line naming its first problem and
exit code 2; a good one prints its shape, its peak in-flight micro-batches per device and its
bubble on unit durations. Neither imports torch.
"""

from __future__ import annotations

import argparse
import sys

from framework.errors import PipelabError, ScheduleError, one_line
from framework.pipeline.bubble import Durations, simulate
from framework.pipeline.schedule_csv import dump_csv, dumps, loads
from framework.pipeline.schedules import build
from framework.pipeline.validate import check


def _export(args) -> str:
    order = build(args.name, args.stages, args.microbatches, args.stages_per_device, args.in_flight)
    check(order)  # every built-in passes (tested); a schedule is never written unchecked
    if args.output is None:
        return dumps(order).rstrip("\n")
    dump_csv(order, args.output)
    return f"{args.name}: {order.num_stages} stages on {order.num_devices} devices, {order.microbatches} micro-batches -> {args.output}"


def _check(args) -> str:
    try:
        with open(args.file) as f:
            text = f.read()
    except OSError as e:
        raise ScheduleError(f"{args.file}: cannot be read: {e.strerror or e}") from None
    try:
        order = loads(text, args.microbatches)
        sim = simulate(order, Durations(1.0, 1.0, 1.0), args.max_in_flight)
    except ScheduleError as e:
        raise ScheduleError(f"{args.file}: {e.message}") from None
    return (f"{args.file}: ok: {order.num_stages} stages on {order.num_devices} devices, {order.microbatches} micro-batches; "
            f"peak in flight per device {list(sim.peak_in_flight_device)}; bubble {sim.bubble_frac:.3f} with F = I = W = 1 (B = 2), free links")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m framework.schedule", description="Write a built-in pipeline schedule as torch's CSV, or check one.")
    sub = p.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write a built-in schedule in torch's CSV format (one row per device)")
    ex.add_argument("name", help="gpipe, 1f1b, pipedream, looped_bfs, interleaved_1f1b, zero_bubble, zbv or dualpipev")
    ex.add_argument("--stages", type=int, required=True, help="S: stages in the pipeline (on S / V devices)")
    ex.add_argument("--microbatches", type=int, required=True, help="M: micro-batches per flush")
    ex.add_argument("--stages-per-device", type=int, default=None, help="V (default: the schedule's own: 1, or 2 for looped_bfs, interleaved_1f1b, zbv and dualpipev)")
    ex.add_argument("--in-flight", type=int, default=None, help="pipedream: items stage 0 admits before its first backward (default: one per stage)")
    ex.add_argument("-o", "--output", help="the CSV file to write (default: standard output)")
    ck = sub.add_parser("check", help="validate a schedule in torch's CSV format")
    ck.add_argument("file", help="one row per device, actions such as 0F0, 1B0, 2I0, 0W0")
    ck.add_argument("--microbatches", type=int, default=None, help="M (default: the largest micro-batch index plus one)")
    ck.add_argument("--max-in-flight", type=int, default=None, help="the most micro-batches a stage may hold in flight")
    args = p.parse_args(argv)
    try:
        print(_export(args) if args.command == "export" else _check(args))
    except (PipelabError, OSError) as e:  # OSError: an --output that cannot be written
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
