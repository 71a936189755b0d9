"""Ranking quality on this CPU machine (issue 5, planner): does the planner's order hold for real?

For each scenarios/validation/*.yaml at 4 ranks: calibrate a profile from microbenchmarks
(`validator.calibrate`, as `ghpsim calibrate --world-size 4`; skipped with --reuse-profiles when
reports/profiles/<name>_ws4.json exists), rank every synchronous candidate with that profile, run
the top K and J others for real (`validator.rank_check`), and print Kendall's tau between
predicted and measured step times and the top-1 regret (measured time of the predicted best vs
the measured best). Targets: tau >= 0.8, regret <= 5 %. The runs never feed the profile.
Writes reports/rank_validation_cpu.csv. Takes minutes: run it on a quiet machine.
Run: python benchmarks/bench_rank_validation.py [--steps 8] [--top 3] [--others 2] [--reuse-profiles]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.calibrate import calibrate_quietly
from validator.measure import RunOptions
from validator.rank_check import rank_check

ROOT = Path(__file__).resolve().parent.parent
WORLD_SIZE = 4
TAU_TARGET, REGRET_TARGET_PCT = 0.8, 5.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--others", type=int, default=2)
    parser.add_argument("--scenarios", default=None, help="comma list of names (default: every validation scenario)")
    parser.add_argument("--reuse-profiles", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "reports" / "rank_validation_cpu.csv"))
    args = parser.parse_args()
    paths = sorted((ROOT / "scenarios" / "validation").glob("*.yaml"))
    if args.scenarios:
        paths = [path for path in paths if path.stem in args.scenarios.split(",")]
    rows, results = [], []
    for path in paths:
        scenario = load_scenario(path, [f"cluster.gpus_per_node={WORLD_SIZE}", "cluster.num_nodes=1"])
        profile = ROOT / "reports" / "profiles" / f"{path.stem}_ws{WORLD_SIZE}.json"
        if not (args.reuse_profiles and profile.is_file()):
            workload = resolve_workload(scenario.model, scenario.base_dir)
            calibrate_quietly(workload, dict(scenario.model.params), profile, world_size=WORLD_SIZE,
                      optimizer=scenario.training.optimizer, verbose=False)
        report = rank_check(scenario, str(profile), WORLD_SIZE, args.top, args.others,
                            RunOptions(steps=args.steps, warmup=args.warmup, optimizer=scenario.training.optimizer),
                            progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True))
        for row in report["rows"]:
            rows.append({"scenario": path.stem, **{k: v for k, v in row.items() if not isinstance(v, (dict, list))}})
            print(f"{path.stem:16s} {row['strategy']:52s} predicted #{row['predicted_rank']:<3d} "
                  f"{row['predicted_s'] * 1e3:8.2f} ms  measured #{row['measured_rank']:<3d} "
                  f"{row['measured_s'] * 1e3:8.2f} ms", flush=True)
        results.append((path.stem, report))
        print(f"{path.stem:16s} {report['num_cases']} of {report['num_candidates']} candidates run: "
              f"Kendall tau {report['kendall_tau']:.2f}, top-1 regret {report['top1_regret_pct']:.1f} %\n", flush=True)
    write_text_atomic(args.out, pd.DataFrame(rows).to_csv(index=False))
    taus = [report["kendall_tau"] for _, report in results]
    regrets = [report["top1_regret_pct"] for _, report in results]
    print(f"scenarios {len(results)} at {WORLD_SIZE} ranks | Kendall tau mean {statistics.mean(taus):.2f}, "
          f"min {min(taus):.2f} (target >= {TAU_TARGET}) | top-1 regret mean {statistics.mean(regrets):.1f} %, "
          f"worst {max(regrets):.1f} % (target <= {REGRET_TARGET_PCT:g} %) | {args.out}")
    met = min(taus) >= TAU_TARGET and max(regrets) <= REGRET_TARGET_PCT
    print("targets met" if met else "targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
