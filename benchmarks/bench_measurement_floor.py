"""The error floor the host's run-to-run scatter sets, beside the model's own errors. Prints figures.

Reads two or more validation CSVs of the same cases on one host (`bench_pipeline_validation.py` or
`bench_validation.py` runs) and scores every run's measured step times as the prediction of every
other run's (`validator.reproducibility`). For each run it prints the model's own error (the
headline error, `validator.reproducibility.headline_error_column`) beside the median and range of the
other runs' measurements as predictors of it, then the shares of runs and of pairs that meet the
targets. Nothing is fitted; the CSVs are read as committed.

Run on the CSVs of two or more runs (the 13 CPU pipeline runs behind the README's figure were
kept under `reports/diagnostics/confirmation_runs/`, which is in the repository's history only):
    python benchmarks/bench_measurement_floor.py \
        RUN_1/validation_pipelines_cpu.csv RUN_2/validation_pipelines_cpu.csv [...] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from validator.report import MAPE_TARGET_PCT, WORST_TARGET_PCT
from validator.reproducibility import headline_error_column, measured_against_measured, model_figures, share_within


def run_name(path: Path) -> str:
    """A run's name: its folder's (every committed run's CSV sits in a folder of its own)."""
    return path.parent.name


def load_runs(paths: list[Path]) -> dict[str, pd.DataFrame]:
    """Each CSV read as one run, named by its folder; ValueError naming the path for a bad one."""
    runs = {}
    for path in paths:
        if not path.is_file():
            raise ValueError(f"no validation CSV at {path}")
        name = run_name(path)
        if name in runs:
            raise ValueError(f"two CSVs in one folder ({path.parent}); give one per run")
        try:
            runs[name] = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not a readable CSV ({str(error).splitlines()[0]})") from None
    return runs


def floor_report(runs: dict[str, pd.DataFrame]) -> dict:
    """Every figure the benchmark prints: per run, the model's error and the other runs'
    measurements as predictors of it; the pairs; and the shares meeting the targets."""
    pairs = measured_against_measured(runs)
    headline_columns = {headline_error_column(frame) for frame in runs.values()}
    error_column = headline_columns.pop() if len(headline_columns) == 1 else "error_pct"
    model = model_figures(runs, error_column)
    per_run = []
    for row in model.itertuples():
        as_target = pairs[pairs["measured_run"] == row.run]
        per_run.append({"run": row.run, "model_mape_pct": row.mape_pct, "model_worst_pct": row.worst_pct,
                        "model_mean_signed_pct": row.mean_signed_pct,
                        "replay_median_mape_pct": float(as_target["mape_pct"].median()),
                        "replay_median_worst_pct": float(as_target["worst_pct"].median()),
                        "replay_worst_range_pct": [float(as_target["worst_pct"].min()),
                                                   float(as_target["worst_pct"].max())]})
    return {"error_column": error_column, "per_run": per_run,
            "model": share_within(model, MAPE_TARGET_PCT, WORST_TARGET_PCT),
            "replay_pairs": share_within(pairs, MAPE_TARGET_PCT, WORST_TARGET_PCT),
            "pairs": pairs.to_dict(orient="records")}


def print_report(report: dict) -> None:
    print(f"model error column: {report['error_column']}; replay = another run's measured step "
          "times taken as the prediction (median over the other runs; worst: range)")
    print(f"{'run':<14} {'model MAPE':>10} {'worst':>7} {'signed':>7} | {'replay MAPE':>11} "
          f"{'worst':>7} {'worst range':>13}")
    for row in report["per_run"]:
        low, high = row["replay_worst_range_pct"]
        print(f"{row['run']:<14} {row['model_mape_pct']:>9.1f}% {row['model_worst_pct']:>6.1f}% "
              f"{row['model_mean_signed_pct']:>+6.1f}% | {row['replay_median_mape_pct']:>10.1f}% "
              f"{row['replay_median_worst_pct']:>6.1f}% {low:>5.1f}-{high:<5.1f}%")
    for label, key in (("model, per run", "model"), ("replay, per ordered pair", "replay_pairs")):
        share = report[key]
        print(f"{label:<25} ({share['rows']:>3}): MAPE <= {MAPE_TARGET_PCT:.0f} % in "
              f"{100 * share['mape_met_share']:5.1f} %, worst <= {WORST_TARGET_PCT:.0f} % in "
              f"{100 * share['worst_met_share']:5.1f} %; medians {share['median_mape_pct']:.1f} / "
              f"{share['median_worst_pct']:.1f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csvs", nargs="+", type=Path, help="validation CSVs, one per run folder")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if len(args.csvs) < 2:
        parser.error("give at least two runs' CSVs")
    try:
        report = floor_report(load_runs(args.csvs))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
