"""The `ghpsim report INPUT --out DIR` command. A report into a DIR that holds an earlier one
replaces it: the earlier report's files (those its report.md links to in figures/, traces/ and
data/) that the new one does not write are removed; no other file is touched."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simulator.output import check_output_file, check_output_folder


def run(args) -> int:
    from simulator.report.build import build_report  # matplotlib: imported only when a report is made
    from simulator.report.inputs import load_report_input
    from simulator.report.render import (FIGURE_FOLDER, HTML_NAME, MARKDOWN_NAME, TRACE_FOLDER,
                                         earlier_report_files, remove_stale_files, write_report)

    check_output_folder(args.out, "--out")
    for name in (HTML_NAME, MARKDOWN_NAME):  # before the progress line: an error is the only line
        check_output_file(Path(args.out) / name, "--out")
    for folder in (FIGURE_FOLDER, TRACE_FOLDER):
        check_output_folder(Path(args.out) / folder, "--out")
    data = load_report_input(args.input, args.overrides, args.strategies, args.profile)
    if not args.json and sys.stderr.isatty():  # a terminal only, as the progress bars: an error stays the only line
        print(f"building the report of {args.input} ...", file=sys.stderr)
    report = build_report(data, args.title)
    earlier = earlier_report_files(args.out)
    paths = write_report(report, args.out)
    removed = remove_stale_files(earlier, paths)  # after the write: a failed report leaves DIR as it was
    html = next(path for path in paths if path.name == HTML_NAME)
    markdown = next(path for path in paths if path.name == MARKDOWN_NAME)
    figures = [section_figure.id for section in report.sections for section_figure in section.figures]
    if args.json:
        print(json.dumps({"kind": data.kind, "html": str(html), "markdown": str(markdown),
                          "figures": figures, "files": [str(path) for path in paths],
                          "removed": [str(path) for path in removed]}, indent=1, allow_nan=False))
    else:
        stale = f"; removed {len(removed)} files of an earlier report" if removed else ""
        print(f"report written to {html} and {markdown} ({len(figures)} figures, {len(paths)} files{stale})")
    return 0
