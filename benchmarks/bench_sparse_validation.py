"""Top-k sparse DP, predicted vs measured on this CPU machine (issue 6). Prints figures.

For each world size (2, 4): calibrate the MLP of scenarios/validation/mlp_cpu.yaml at that world
size (layers, optimizer, allreduce, and the top-k selection and allgather fits at the density
run), then run DP dense and DP with top-k (error feedback, allgather of k values + k indices) for
real and in simulation. Prints predicted, measured and error per case, plus the selection
(`topk` spans) and exchange (`allreduce` / `allgather` spans) times per step of rank 0, predicted
and measured. The validated runs never feed the profile. Writes reports/sparse_validation_cpu.csv
and the profiles to reports/profiles/mlp_cpu_topk_ws{N}.json.
Run: python benchmarks/bench_sparse_validation.py [--steps 20] [--density 0.01] [--world-sizes 2,4]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.calibrate import DEFAULT_REPEATS, calibrate_quietly
from validator.measure import RunOptions
from validator.report import error_summary, summary_line
from validator.validate import validate

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "validation" / "mlp_cpu.yaml"


def _kind_s(spans, kinds: tuple[str, ...]) -> float:
    """Seconds of rank 0's spans of these kinds in one step (spans: tuples or a DataFrame)."""
    if isinstance(spans, pd.DataFrame):
        spans = spans.itertuples(index=False)
    return sum(s[5] - s[4] for s in spans if s[0] == 0 and s[3] in kinds)


def run_world_size(world_size: int, density: float, args) -> list[dict]:
    overrides = [f"cluster.gpus_per_node={world_size}"]
    scenario = load_scenario(SCENARIO, overrides)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    profile = ROOT / "reports" / "profiles" / f"mlp_cpu_topk_ws{world_size}.json"
    if not (args.reuse_profiles and profile.is_file()):
        calibrate_quietly(workload, dict(scenario.model.params), profile, world_size=world_size,
                  optimizer=scenario.training.optimizer, repeats=args.repeats, topk_densities=(density,),
                  verbose=False)
    options = RunOptions(steps=args.steps, warmup=args.warmup, optimizer=scenario.training.optimizer)
    sparse = load_scenario(SCENARIO, overrides + ["strategy.gradient_compression=topk",
                                                  f"strategy.compression_density={density}"])
    rows = []
    for label, variant in (("dense", scenario), (f"topk {density:g}", sparse)):
        result = validate(variant, str(profile), [("dp", None)], options, repeats=args.launches)
        row = result["rows"][0]
        measured, simulated = result["measured_spans"][row["strategy"]], result["simulated"][row["strategy"]]
        row.update(variant=label, predicted_topk_s=_kind_s(simulated.spans, ("topk",)),
                   measured_topk_s=_kind_s(measured, ("topk",)),
                   predicted_exchange_s=_kind_s(simulated.spans, ("allreduce", "allgather")),
                   measured_exchange_s=_kind_s(measured, ("allreduce", "allgather")))
        rows.append(row)
        print(f"ws={world_size} dp {label:11s} predicted {row['predicted_s'] * 1e3:8.2f} ms  measured "
              f"{row['measured_s'] * 1e3:8.2f} ms  error {row['error_pct']:+7.1f} %  | selection "
              f"{row['predicted_topk_s'] * 1e3:6.2f} / {row['measured_topk_s'] * 1e3:6.2f} ms  exchange spans "
              f"{row['predicted_exchange_s'] * 1e3:7.2f} / {row['measured_exchange_s'] * 1e3:7.2f} ms "
              f"(predicted / measured, rank 0)", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="calibration repeats")
    parser.add_argument("--reuse-profiles", action="store_true", help="skip calibration where a profile exists")
    parser.add_argument("--out", default=str(ROOT / "reports" / "sparse_validation_cpu.csv"))
    parser.add_argument("--launches", type=int, default=3,
                        help="launches of each case, in rounds; its figure is the median over all their steps")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = []
    for world_size in (int(w) for w in args.world_sizes.split(",")):
        rows += run_world_size(world_size, args.density, args)
    frame = pd.DataFrame(rows)
    write_text_atomic(args.out, frame.to_csv(index=False))
    print(f"\n{summary_line(error_summary(rows))} | 1-min load average at start {load:.2f} on {os.cpu_count()} CPUs")
    for world_size, group in frame.groupby("world_size"):
        dense, sparse = group.iloc[0], group.iloc[1]
        predicted = "topk" if sparse["predicted_s"] < dense["predicted_s"] else "dense"
        measured = "topk" if sparse["measured_s"] < dense["measured_s"] else "dense"
        print(f"ws={world_size}: predicted faster {predicted}, measured faster {measured} "
              f"-> {'match' if predicted == measured else 'MISMATCH'}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
