"""`ghpsim sweep SWEEP.yaml --out DIR [--scheduler ADDRESS] [--workers N] [--json]`."""

from __future__ import annotations

import json

from rich.table import Table

from simulator.errors import ScenarioError
from simulator.sweep.runner import run_sweep
from simulator.sweep.spec import load_sweep


def run(args) -> int:
    if str(args.out) == "":  # the runner checks the folder itself; '' would be the current one
        raise ScenarioError("--out: needs a folder name (got '')")
    sweep = load_sweep(args.sweep)
    report = run_sweep(sweep, args.out, workers=args.workers, scheduler=args.scheduler,
                       progress=not args.no_progress)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, allow_nan=False))
        return 1 if report.counts()["error"] else 0
    from simulator.tables import make_console
    document = report.to_dict()
    counts = ", ".join(f"{document[status]} {status}" for status in ("ok", "failed", "error", "invalid", "pending")
                       if document[status] or status == "ok")
    rate = f" ({document['points_per_s']:.1f} points/s)" if document["points_per_s"] else ""
    console = make_console()
    title = "sweep" if report.name == "sweep" else f"sweep {report.name}"  # "sweep": the unnamed default
    console.print(f"{title}: {document['points']} points: {counts}; computed {report.computed} "
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
