"""Re-predict a committed validation run with the current model. Prints figures.

A model change should be scored on fresh runs, but a fresh run also brings a fresh calibration and
fresh machine spells, so its figures mix the change with the run-to-run scatter (launch medians move
by 15-53 % on the project's CPU host). This holds the measurements and the profiles fixed: it reads
a benchmark's CSV (`reports/validation_cpu.csv` from `bench_validation.py`, or
`reports/validation_pipelines_cpu.csv` from `bench_pipeline_validation.py`), predicts every case
again with the current code and the run's own profiles (as that benchmark named them), and prints
the old and new errors side by side. Nothing is fitted to the measurements.

With `--write` the CSV's `predicted_s` and `error_pct` are replaced by the new ones, its
measurements kept, the columns of predictions the validator no longer makes (`STALE_COLUMNS`)
dropped, and a `repredicted` column says with what. Used for the committed GPU runs, whose
predictions `tests/test_gpu_report.py` reproduces, when a model change moves them and no GPU is at
hand to rerun.

Run: python benchmarks/repredict.py [reports/validation_cpu.csv | reports/validation_pipelines_cpu.csv
     | reports/validation_cuda.csv] [--write "what changed"] [--profiles DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from bench_pipeline_validation import VIRTUAL_STAGES, pipeline_overrides, pipeline_profile
from bench_validation import validation_specs
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.measure import RunOptions
from validator.report import error_summary, summary_line
from validator.reproducibility import headline_error_column
from validator.validate import predicted_as_run, predictions

ROOT = Path(__file__).resolve().parent.parent
STALE_COLUMNS = ("predicted_jitter_s", "predicted_p10_s", "predicted_p90_s", "jitter_ranks_at_once",
                 "jitter_error_pct", "speed_ratio", "speed_ratio_min", "speed_ratio_max", "anchored_predicted_s",
                 "anchored_error_pct", "machine_drift")
"""Columns of earlier validators' predictions (pass jitter, speed anchors) and probes."""


def cases(frame: pd.DataFrame, pipelines: bool, profile_suffix: str = "",
          profiles: Path = ROOT / "reports" / "profiles"):
    """(scenario, profile path, specs, rows) per (model, world size), as the benchmark built them."""
    for (model, world_size), rows in frame.groupby(["model", "world_size"], sort=False):
        if pipelines:
            overrides = pipeline_overrides(world_size) + [VIRTUAL_STAGES]
            profile = pipeline_profile(model, world_size, profiles, suffix=profile_suffix)
            specs = [(kind, None) for kind in rows["kind"]]
        else:
            overrides = [f"cluster.gpus_per_node={world_size}"]
            profile = profiles / f"{model}_ws{world_size}{profile_suffix}.json"
            specs = validation_specs(world_size)
        scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{model}.yaml", overrides)
        yield scenario, profile, specs, rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv", nargs="?", default=str(ROOT / "reports" / "validation_cpu.csv"))
    parser.add_argument("--write", metavar="WHAT_CHANGED",
                        help="replace the CSV's predictions by the new ones (see the module)")
    parser.add_argument("--profiles", default=str(ROOT / "reports" / "profiles"), help="folder of the run's profiles")
    args = parser.parse_args()
    if not Path(args.profiles).is_dir():
        print(f"--profiles: no such folder: {args.profiles}", file=sys.stderr)
        return 2
    frame = pd.read_csv(args.csv)
    old_column = headline_error_column(frame)
    pipelines = frame["kind"].str.contains(":").any()
    suffix = "_cuda" if Path(args.csv).stem.endswith("_cuda") else ""
    old, new = [], []
    for scenario, profile, specs, rows in cases(frame, pipelines, suffix, Path(args.profiles)):
        figures = predictions(scenario, str(profile), specs, RunOptions(optimizer=scenario.training.optimizer))
        for row in rows.itertuples():
            predicted_s = figures[row.strategy]
            if isinstance(getattr(row, "partition", None), str):  # the split the run played
                spec = (row.kind, row.num_groups if row.kind == "ghp" else None)
                predicted_s = predicted_as_run(scenario, str(profile), spec, row.partition,
                                               RunOptions(optimizer=scenario.training.optimizer))
            error_pct = 100.0 * (predicted_s - row.measured_s) / row.measured_s
            frame.loc[row.Index, ["predicted_s", "error_pct"]] = predicted_s, error_pct
            old.append({"error_pct": getattr(row, old_column)})
            new.append({"error_pct": error_pct})
            print(f"{row.model:16s} ws={row.world_size} {row.strategy:30s} measured {row.measured_s * 1e3:8.2f} ms "
                  f"error was {getattr(row, old_column):+7.1f} %, now {error_pct:+7.1f} %")
    print(f"\nwas ({old_column}): {summary_line(error_summary(old))}\nnow (error_pct): {summary_line(error_summary(new))}")
    if args.write:
        frame = frame.drop(columns=[column for column in STALE_COLUMNS if column in frame])
        frame["repredicted"] = args.write
        write_text_atomic(Path(args.csv), frame.to_csv(index=False))
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
