"""Re-predict a committed validation run with the current model. Prints figures.

A model change should be scored on fresh runs, but a fresh run also brings a fresh calibration and
fresh machine spells, so its figures mix the change with the run-to-run scatter (launch medians move
by 15-53 % on the project's CPU host). This holds the measurements and the profiles fixed: it reads
a benchmark's CSV (`reports/validation_cpu.csv` from `bench_validation.py`, or
`reports/validation_pipelines_cpu.csv` from `bench_pipeline_validation.py`), predicts every case
again with the current code and the profiles under `reports/profiles/` as that benchmark built them,
and prints the old and new errors side by side. The profiles must be the run's own (the benchmarks
commit them with their CSV); nothing is fitted to the measurements.

With `--write` the CSV's prediction columns (predicted_s, predicted_jitter_s, predicted_p10_s,
predicted_p90_s, error_pct, jitter_error_pct) are replaced by the new ones, its measurements kept,
and a `repredicted` column says with what; the speed-anchored and interleaved columns stay as run.
Used for `reports/validation_cuda.csv` (profiles `<model>_ws<N>_cuda.json`), whose predictions a
test reproduces, when a model change moves them and no GPU is at hand to rerun.

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
from validator.validate import predictions

ROOT = Path(__file__).resolve().parent.parent


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
                        help="replace the CSV's prediction columns by the new ones (see the module)")
    parser.add_argument("--profiles", default=str(ROOT / "reports" / "profiles"),
                        help="folder of the run's profiles (e.g. copies with a section removed, to score "
                             "what that section changes on the same measurements)")
    args = parser.parse_args()
    if not Path(args.profiles).is_dir():
        print(f"--profiles: no such folder: {args.profiles}", file=sys.stderr)
        return 2
    frame = pd.read_csv(args.csv)
    pipelines = frame["kind"].str.contains(":").any()
    suffix = "_cuda" if Path(args.csv).stem.endswith("_cuda") else ""
    out = []
    for scenario, profile, specs, rows in cases(frame, pipelines, suffix, Path(args.profiles)):
        figures = predictions(scenario, str(profile), specs, RunOptions(optimizer=scenario.training.optimizer))
        for row in rows.itertuples():
            figure = figures[row.strategy]
            if args.write:
                for column in ("predicted_s", "predicted_jitter_s", "predicted_p10_s", "predicted_p90_s"):
                    if column in figure and column in frame.columns:
                        frame.loc[row.Index, column] = figure[column]
                frame.loc[row.Index, "error_pct"] = error_pct(figure["predicted_s"], row)
                frame.loc[row.Index, "jitter_error_pct"] = error_pct(figure["predicted_jitter_s"], row)
            out.append({"model": row.model, "ranks": row.world_size, "strategy": row.strategy,
                        "measured_ms": 1e3 * row.measured_s,
                        "old_pct": row.jitter_error_pct, "new_pct": error_pct(figure["predicted_jitter_s"], row),
                        "old_nominal_pct": row.error_pct, "new_nominal_pct": error_pct(figure["predicted_s"], row)})
    table = pd.DataFrame(out)
    print(table.round(1).to_string(index=False))
    for column in ("old_pct", "new_pct", "old_nominal_pct", "new_nominal_pct"):
        print(f"{column:16s} MAPE {table[column].abs().mean():5.1f} %  worst {table[column].abs().max():5.1f} %  "
              f"mean signed {table[column].mean():+5.1f} %")
    if not pipelines:
        groups = table.groupby(["model", "ranks"])
        for column in ("old_pct", "new_pct"):
            hits = sum(group.loc[(group["measured_ms"] * (1 + group[column] / 100)).idxmin(), "strategy"]
                       == group.loc[group["measured_ms"].idxmin(), "strategy"] for _, group in groups)
            print(f"fastest strategy predicted right ({column}, jittered): {hits} of {groups.ngroups}")
    if args.write:
        frame["repredicted"] = args.write
        write_text_atomic(Path(args.csv), frame.to_csv(index=False))
        print(f"wrote {args.csv}")
    return 0


def error_pct(predicted_s: float, row) -> float:
    return 100.0 * (predicted_s - row.measured_s) / row.measured_s


if __name__ == "__main__":
    sys.exit(main())
