"""How far two measurements of the same cases are apart: the floor under any prediction's error.

A validation run measures each case minutes after its calibration. A second run of the same cases
on the same host (another calibration, other launches) measures them again. Taking one run's
measured step times as the "prediction" of another's gives the error of a predictor that knows
each case exactly as one earlier run measured it: what the host's run-to-run scatter alone costs.
A model can beat it only by luck, so a target tighter than it cannot be met run after run.

Cases are matched on (`model`, `strategy`) (the benchmarks' CSVs, `validator.report.write_rows_csv`);
errors are percent, signed as the validator's: 100 x (predictor - measured) / measured.
"""

from __future__ import annotations

import itertools

import pandas as pd

CASE_KEY = ("model", "strategy")


def _measured_by_case(frame: pd.DataFrame) -> pd.Series:
    missing = [column for column in (*CASE_KEY, "measured_s") if column not in frame]
    if missing:
        raise ValueError(f"a validation CSV lacks the column(s) {', '.join(missing)}")
    keyed = frame.set_index(list(CASE_KEY))["measured_s"]
    if keyed.index.duplicated().any():
        twice = keyed.index[keyed.index.duplicated()][0]
        raise ValueError(f"case {twice} appears twice in one run")
    return keyed[keyed > 0]     # a case that measured nothing (NaN) is no figure to compare


def error_figures(errors_pct: pd.Series) -> dict:
    """MAPE, worst |error| and mean signed error (percent) of one run's errors, and its case count."""
    return {"cases": int(errors_pct.size), "mape_pct": float(errors_pct.abs().mean()),
            "worst_pct": float(errors_pct.abs().max()), "mean_signed_pct": float(errors_pct.mean())}


def measured_against_measured(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per ordered pair of runs (A, B): the errors of A's measured step times taken as the
    prediction of B's, over the cases both measured (`error_figures`). Needs two runs or more."""
    if len(runs) < 2:
        raise ValueError("measured_against_measured needs at least two runs")
    measured = {name: _measured_by_case(frame) for name, frame in runs.items()}
    rows = []
    for predictor, target in itertools.permutations(measured, 2):
        common = measured[predictor].index.intersection(measured[target].index)
        if common.empty:
            continue
        errors = 100.0 * (measured[predictor][common] / measured[target][common] - 1.0)
        rows.append({"predictor_run": predictor, "measured_run": target, **error_figures(errors)})
    if not rows:
        raise ValueError(f"the runs {', '.join(runs)} measured no case in common")
    return pd.DataFrame(rows)


def headline_error_column(frame: pd.DataFrame) -> str:
    """The column of a run's headline error: `error_pct`, or in CSVs written before format 2
    profiles (which predicted the median step under the calibration's pass jitter too, when every
    row had one) `jitter_error_pct`."""
    if "predicted_jitter_s" in frame and not frame["predicted_jitter_s"].isna().any():
        return "jitter_error_pct"
    return "error_pct"


def model_figures(runs: dict[str, pd.DataFrame], error_column: str) -> pd.DataFrame:
    """The model's own errors on each run (`error_column`, e.g. `jitter_error_pct`): one row per run."""
    for name, frame in runs.items():
        if error_column not in frame:
            raise ValueError(f"run {name} has no column {error_column}")
    return pd.DataFrame([{"run": name, **error_figures(frame[error_column])}
                         for name, frame in runs.items()])


def share_within(figures: pd.DataFrame, mape_target_pct: float, worst_target_pct: float) -> dict:
    """Of the rows of `figures` (runs or pairs): the share meeting each target, and the medians."""
    return {"rows": int(len(figures)),
            "mape_met_share": float((figures["mape_pct"] <= mape_target_pct).mean()),
            "worst_met_share": float((figures["worst_pct"] <= worst_target_pct).mean()),
            "median_mape_pct": float(figures["mape_pct"].median()),
            "median_worst_pct": float(figures["worst_pct"].median())}
