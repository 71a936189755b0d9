"""Back-to-back calibrations of one profile (twenty-sixth session): is a calibration's level set by
the host's speed over time, or by the launch (the set of rank processes) that measured it?

Each calibration already sweeps the layers three times, at its start, middle and end
(`validator.layer_passes`); `method.layer_passes` records how far the sweeps' totals disagree. If
the host's speed over minutes set the level, the sweeps of one calibration would disagree about as
much as calibrations minutes apart. If the launch set it, the sweeps of one calibration agree and
the calibrations do not.

Calibrates `MODEL` at `--ranks` (default resnet_cpu at 2, the profile whose level moved most over
the runs, `../calibration_spread/run_levels.log`) `--count` times in a row, each in its own launch
with the benchmark's settings (`benchmarks/bench_pipeline_validation.py`), into `OUT/cal_<i>/`.
Prints, per calibration: its duration, the sum of the layers' forward and backward medians over
layers and batch sizes (ms, the profile's figures), each sweep's total relative to the median sweep,
and the mean predicted step of the held-out run `--run`'s cases of that profile (synchronous and
asynchronous kinds apart; `../ws4_async_gap/whatif_variants.py`'s runs); then the coefficient of
variation over the calibrations of each figure, beside the sweeps' own spread.

Run: python reports/diagnostics/calibration_launches/back_to_back.py OUT [--count 5] [--run s23_fresh]
     python reports/diagnostics/calibration_launches/back_to_back.py OUT --score-only   (no calibration)
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(HERE.parent / "ws4_async_gap"))

import json  # noqa: E402

import pandas as pd  # noqa: E402

import whatif_variants  # noqa: E402


def layer_total_ms(document: dict) -> float:
    """Sum over layers and batch sizes of the forward and backward medians (all ranks at once), ms."""
    return 1e3 * sum(sum(layer["forward_medians_s"]) + sum(layer["backward_medians_s"])
                     for layer in document["layers"])


def calibrate_one(model: str, ranks: int, out: Path) -> float:
    from bench_pipeline_validation import pipeline_overrides, pipeline_profile

    from simulator.model_source import resolve_workload
    from simulator.scenario import load_scenario
    from validator.calibrate import calibrate_quietly

    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{model}.yaml", pipeline_overrides(ranks))
    workload = resolve_workload(scenario.model, scenario.base_dir)
    started = time.perf_counter()
    calibrate_quietly(workload, dict(scenario.model.params), pipeline_profile(model, ranks, out),
                      world_size=ranks, optimizer="momentum", verbose=False)
    return time.perf_counter() - started


def predicted_means_ms(run: str, model: str, ranks: int, profiles: Path) -> dict:
    csv, _ = whatif_variants.RUNS[run]
    whatif_variants.RUNS["_probe"] = (csv, str(profiles.relative_to(ROOT)) if profiles.is_relative_to(ROOT)
                                      else str(profiles))
    table = whatif_variants.case_errors("_probe", model, ranks)
    asynchronous = table["kind"].str.startswith(("pipedream", "spectrain"))
    return {"sync_ms": 1e3 * table[~asynchronous]["predicted_jitter_s"].mean(),
            "async_ms": 1e3 * table[asynchronous]["predicted_jitter_s"].mean(),
            "measured_sync_ms": 1e3 * table[~asynchronous]["measured_s"].mean(),
            "measured_async_ms": 1e3 * table[asynchronous]["measured_s"].mean()}


def cv_pct(values) -> float:
    values = list(values)
    return 100 * statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="resnet_cpu")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--run", default="s23_fresh")
    parser.add_argument("--score-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    from bench_pipeline_validation import pipeline_profile

    durations = {}
    if not args.score_only:
        for i in range(args.count):
            durations[i] = calibrate_one(args.model, args.ranks, out / f"cal_{i}")
            print(f"[calibration {i}] {durations[i]:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for folder in sorted(out.glob("cal_*"), key=lambda path: int(path.name.split("_")[1])):
        document = json.loads(pipeline_profile(args.model, args.ranks, folder).read_text())
        sweeps = document["method"]["layer_passes"]
        row = {"calibration": folder.name, "created_utc": document["created_utc"][11:19],
               "total_s": round(document["method"]["total_s"]), "layers_ms": layer_total_ms(document),
               "sweeps_relative": " ".join(f"{value:.3f}" for value in sweeps["relative_totals"]),
               "sweeps_spread_pct": sweeps["spread_pct"]}
        row.update(predicted_means_ms(args.run, args.model, args.ranks, folder))
        rows.append(row)
    table = pd.DataFrame(rows).set_index("calibration")
    pd.set_option("display.width", 250)
    print(f"# {args.model} at {args.ranks} ranks, {len(table)} calibrations back to back; predictions of "
          f"run {args.run}'s cases of that profile (measured there: synchronous "
          f"{table['measured_sync_ms'].iloc[0]:.2f} ms, asynchronous {table['measured_async_ms'].iloc[0]:.2f} ms)")
    print(table.drop(columns=["measured_sync_ms", "measured_async_ms"]).round(2).to_string())
    print(f"# over the calibrations, CV %: layers {cv_pct(table['layers_ms']):.1f}, predicted synchronous "
          f"{cv_pct(table['sync_ms']):.1f}, asynchronous {cv_pct(table['async_ms']):.1f}; within a calibration, "
          f"the sweeps' spread (max - min) / min: median {table['sweeps_spread_pct'].median():.1f} %, "
          f"max {table['sweeps_spread_pct'].max():.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
