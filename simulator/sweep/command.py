"""`ghpsim sweep SWEEP.yaml --out DIR [--scheduler ADDRESS] [--workers N] [--json]`."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from simulator.sweep.export import CSV_NAME, PARQUET_NAME, parquet_engine
from simulator.sweep.runner import run_sweep
from simulator.sweep.spec import load_sweep
from simulator.sweep.store import STORE_NAME

COMMAND = "sweep"


def add_parser(commands) -> None:
    engine = parquet_engine()
    parquet = (f"and {PARQUET_NAME} (engine: {engine})" if engine else
               f"({PARQUET_NAME} too when pyarrow or fastparquet is installed; neither is now)")
    parser = commands.add_parser(
        COMMAND, help="simulate every point of a sweep file, in parallel, into a crash-safe store",
        description=f"Simulate the points of a sweep (a base scenario and axes; see scenarios/README.md, "
                    f"'Sweeps'). Finished points are committed one by one to DIR/{STORE_NAME}; a re-run "
                    f"skips them. Results go to DIR/{CSV_NAME} {parquet}.",
    )
    parser.add_argument("sweep", help="sweep YAML file")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the store and the results")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="run on an existing dask.distributed cluster, e.g. tcp://host:8786 "
                             "(default: a local process pool)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="local worker processes (default: the number of CPUs; 1 = in this process)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (drawn only when stderr is a terminal)")
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary")


def run(args) -> int:
    sweep = load_sweep(args.sweep)
    report = run_sweep(sweep, args.out, workers=args.workers, scheduler=args.scheduler,
                       progress=not args.no_progress)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return 1 if report.counts()["error"] else 0
    from simulator.tables import make_console
    document = report.to_dict()
    counts = ", ".join(f"{document[status]} {status}" for status in ("ok", "failed", "error", "invalid", "pending")
                       if document[status] or status == "ok")
    rate = f" ({document['points_per_s']:.1f} points/s)" if document["points_per_s"] else ""
    console = make_console()
    console.print(f"sweep {report.name}: {document['points']} points: {counts}; computed {report.computed} "
                  f"in {report.wall_s:.1f} s{rate}, {report.skipped} already in the store")
    if document["problems"]:
        table = Table(title="points that did not run (first 20)")
        for column in ("point", "status", "error"):
            table.add_column(column)
        for problem in document["problems"]:
            table.add_row(str(problem["point"]), problem["status"], str(problem["error"]))
        console.print(table)
    for name, path in report.files.items():
        if path:
            console.print(f"{name}: {path}")
    return 1 if document["error"] else 0
