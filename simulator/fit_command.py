"""`ghpsim fit RUNS.csv --out PROFILE.json [--plot FILE.png] [--json]`: the command around
`simulator.fit` (its module docstring says what is fitted and how): the options and every row checked,
the runs fitted, then the profile and the figure written."""

from __future__ import annotations

import math
import os
from pathlib import Path

from simulator import fit
from simulator.errors import ScenarioError
from simulator.fit_csv import MEASURED_COLUMN
from simulator.limits import MAX_INT


def run(args) -> int:
    """`ghpsim fit`: the input is checked and the runs fitted before anything is written; the figure
    is drawn beside --plot and takes its place only once --out is written, so a failed command leaves
    neither new file and an existing --plot as it was."""
    import sys

    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from simulator.errors import one_line
    from simulator.output import check_output_file, figure_format, same_file, write_text_atomic
    from simulator.profile import profile_from_dict
    from simulator.progress import stderr_progress
    check_output_file(args.out, "--out")
    _check_not_an_input(args.out, "--out", args)
    if args.plot is not None:  # an empty --plot is refused, not taken as "no figure"
        from simulator.output import check_figure_file
        if args.plot == "":
            raise ScenarioError("--plot: needs a file name (got '')")
        check_figure_file(args.plot, "--plot")
        if same_file(args.plot, args.out):
            raise ScenarioError(f"--plot {args.plot}: the same file as --out")
        _check_not_an_input(args.plot, "--plot", args)
    if args.folds < 2:
        raise ScenarioError(f"--folds: {args.folds} must be at least 2")
    if abs(args.seed) > MAX_INT:  # the profile records it, and a profile's integers are exact floats
        raise ScenarioError(f"--seed: {args.seed} is beyond +-{MAX_INT} (2^53)")
    runs, base_used = fit._read_runs(args.runs, args.base)
    for base_file in dict.fromkeys(run.base_file for run in runs):
        for path, option in ((args.out, "--out"), (args.plot, "--plot")):
            if path and base_file and same_file(path, base_file):
                raise ScenarioError(f"{option} {path}: the same file as the base scenario {base_file} of the runs; "
                                    "it would be overwritten")
    if args.base is not None and not base_used:
        print(one_line(f"ghpsim: note: --base {args.base} is not used: every row names its own base scenario"),
              file=sys.stderr)
    with stderr_progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                         TextColumn("eta"), TimeRemainingColumn(), enabled=not args.json) as bar:
        progress = fit.FitProgress(bar, f"fitting {len(runs)} runs: simulations")
        result, document = fit.fit_runs(runs, args.folds, args.seed, progress=progress)
    for row, predicted in zip(runs, result.held_out):
        if not (math.isfinite(predicted) and predicted > 0):
            raise ScenarioError(f"{row.where}: simulated step time {predicted!r}, not a positive finite number")
    profile_from_dict(document, args.out)  # the document validates before it is written
    errors_pct = [100 * (p - row.measured_s) / row.measured_s for p, row in zip(result.held_out, runs)]
    worst = max(range(len(runs)), key=lambda i: abs(errors_pct[i]))
    profile_text = _json_text(document, f"--out {args.out}", indent=1) + "\n"
    if args.json:
        predictions = [{"run": row.where, MEASURED_COLUMN: row.measured_s, "held_out_step_s": p,
                        "error_pct": e} for row, p, e in zip(runs, result.held_out, errors_pct)]
        printed = _json_text(document["fit"] | {"parameters": result.best, "predictions": predictions,
                                                "out": str(args.out), "plot": args.plot}, "--json", 2)
    drawn = None
    try:
        if args.plot:  # drawn beside --plot, renamed onto it once --out is written: nothing lost on a failure
            from simulator.fit_plot import write_fit_plot
            plot = Path(args.plot)
            drawn = plot.with_name(f".{plot.stem}.{os.getpid()}.partial.{figure_format(plot)}")  # the format of --plot
            write_fit_plot([row.measured_s for row in runs], result.held_out, drawn,
                           f"{len(runs)} runs, {args.folds}-fold held out: MAPE {result.held_out_mape_pct:.1f} %\n"
                           f"worst {errors_pct[worst]:+.1f} % ({Path(runs[worst].where).name})")
        write_text_atomic(args.out, profile_text)
        if drawn is not None:
            os.replace(drawn, plot)
            drawn = None
    finally:
        if drawn is not None:
            drawn.unlink(missing_ok=True)
    for bound in document["fit"]["at_grid_bound"]:  # after the writes: a failure stays the only line
        print(fit.bound_warning(bound), file=sys.stderr)
    if args.json:
        print(printed)
        return 0
    print(f"{len(runs)} runs, {args.folds}-fold held-out MAPE {result.held_out_mape_pct:.1f} % "
          f"(in sample {result.in_sample_mape_pct:.1f} %), worst {errors_pct[worst]:+.1f} % ({runs[worst].where})")
    for name, value in result.best.items():
        print(f"  {name} = {value:.4g} +- {result.spread[name]:.2g} (spread over the folds)")
    print(f"kernel profile written to {args.out}: use it with `ghpsim simulate SCENARIO --profile {args.out}`")
    if args.plot:
        print(f"held-out predictions against the measurements drawn in {args.plot}")
    return 0


def _check_not_an_input(path: str, option: str, args) -> None:
    """ScenarioError naming `option` when `path` is the runs CSV or the --base scenario: the
    written file would replace the user's input (`simulator.output.same_file`)."""
    from simulator.output import same_file
    for what, given in (("the runs CSV", args.runs), ("the --base scenario", args.base)):
        if given and same_file(path, given):
            raise ScenarioError(f"{option} {path}: the same file as {what} {given}; it would be overwritten")


def _json_text(document: dict, what: str, indent: int) -> str:
    """JSON text of `document`; ScenarioError, before anything is written, for a NaN or infinity."""
    import json
    try:
        return json.dumps(document, indent=indent, allow_nan=False)
    except ValueError:
        raise ScenarioError(f"{what}: the fit gave a number that is not finite (NaN or infinity); nothing written") from None
