"""Each run's mean predicted and measured step per profile, synchronous and asynchronous kinds apart
(twenty-fifth session): how far the calibrations move from run to run against the runs themselves.

Re-predicts the runs of `section_spread.RUNS` with the model as it stands (`prefix_sets`, which is the
model itself on profiles without `layer_ranges`) from their own profiles; prints the mean predicted
and measured step (ms) of each profile's synchronous (gpipe, 1f1b, interleaved) and asynchronous
(pipedream, spectrain) cases, run by run, and the coefficient of variation over the runs. Writes nothing.

Run: python reports/diagnostics/calibration_spread/run_levels.py
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ws4_async_gap"))
sys.path.insert(0, str(HERE))

import pandas as pd  # noqa: E402

import whatif_variants  # noqa: E402
from section_spread import RUNS, spread_pct  # noqa: E402


def main() -> int:
    whatif_variants.patch("prefix_sets")
    frames = []
    for run in RUNS:
        errors = whatif_variants.case_errors(run)
        errors["run"] = run
        frames.append(errors)
    table = pd.concat(frames, ignore_index=True)
    table["measured_ms"] = table["measured_s"] * 1e3
    table["predicted_ms"] = table["predicted_jitter_s"] * 1e3
    table["asynchronous"] = table["kind"].str.startswith(("pipedream", "spectrain"))
    means = table.groupby(["model", "world_size", "asynchronous", "run"])[["predicted_ms", "measured_ms"]].mean()
    for column in ("predicted_ms", "measured_ms"):
        by_run = means[column].unstack("run")[list(RUNS)]
        by_run["cv_pct"] = by_run.apply(spread_pct, axis=1)
        pd.set_option("display.width", 250)
        print(f"# {column}: mean over the profile's cases, by run; cv_pct over the runs")
        print(by_run.round(2).to_string())
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
