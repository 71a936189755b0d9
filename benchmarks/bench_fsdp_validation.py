"""Sharded data parallelism validated on this CPU machine: step time and peak memory of real FSDP2 /
DDP runs against the prediction, as the median of several fresh runs.

The model is the validation transformer (`scenarios/validation/transformer_cpu.yaml`: a 4-block
GPT, hidden 128) on 2 ranks, as a megatron plan with tp = pp = 1 (`validator/fsdp_runtime.py`):
zero_stage 0 (DDP), 2 (FSDP2 `reshard_after_forward=False`, SHARD_GRAD_OP) and 3 (FSDP2
`fully_shard`, FULL_SHARD). Each fresh run calibrates its own profile (`ghpsim calibrate`, as
`bench_validation.py` does) and launches every case `--launches` times in rounds; a case's measured
step is the median over all steps of its launches, its peak memory the ranks' largest in its last
launch (`validator.fsdp_runtime.measure_step_memory`). The profiles go to
reports/profiles/transformer_cpu_fsdp_ws2_run<N>.json. Prints each run's errors, then
per case the median over the runs of the step-time and memory errors, and MAPE and worst of those
medians. Targets as the other CPU validation cases: step MAPE <= 10 %, worst <= 20 %.

Writes reports/validation_fsdp_cpu.csv (every run's rows, rewritten after each run, so an
interrupted benchmark keeps what it measured); `--json` prints the rows and the summary.
`--repredict-memory` runs nothing: it predicts each case's peak memory again with the current
model, rewrites the CSV's predicted peaks and memory errors and keeps its measurements (the memory
model orders a rank's allocations by its actions, not by their durations, so no profile is needed).

    python benchmarks/bench_fsdp_validation.py [--runs 3] [--launches 3] [--steps 20] [--reuse-profiles] [--json]
                                               [--repredict-memory]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pandas as pd

from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.calibrate import calibrate_quietly
from validator.measure import RunOptions
from validator.models import as_built
from validator.validate import validate

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "validation" / "transformer_cpu.yaml"
WORLD_SIZE = 2
ZERO_STAGES = {0: "DDP", 2: "FSDP2 shard grad op", 3: "FSDP2 full shard"}


def case_scenario(zero_stage: int):
    """The validation transformer as a megatron plan with tp = pp = 1 at `zero_stage` on 2 ranks."""
    return load_scenario(SCENARIO, [f"cluster.gpus_per_node={WORLD_SIZE}", "strategy.kind=megatron",
                                    "strategy.num_groups=null", f"strategy.zero_stage={zero_stage}"])


def one_run(run_index: int, profile: Path, args, say) -> list[dict]:
    """Calibrate (unless --reuse-profiles finds `profile`), then validate every case; its rows."""
    if not (args.reuse_profiles and profile.exists()):
        scenario = case_scenario(0)
        workload = resolve_workload(scenario.model, scenario.base_dir)
        calibrate_quietly(workload, dict(scenario.model.params), profile, world_size=WORLD_SIZE,
                          optimizer=scenario.training.optimizer, verbose=False, say=say, fsdp=True)
    rows = []
    for zero_stage, name in ZERO_STAGES.items():
        scenario = case_scenario(zero_stage)
        options = RunOptions(steps=args.steps, warmup=3, optimizer=scenario.training.optimizer)
        (row,) = validate(scenario, str(profile), [("megatron", None)], options, repeats=args.launches)["rows"]
        rows.append({"run": run_index, "case": name, "zero_stage": zero_stage,
                     "predicted_s": row["predicted_s"], "measured_s": row["measured_s"],
                     "error_pct": row["error_pct"], "launch_spread_pct": row.get("launch_spread_pct"),
                     "predicted_peak_bytes": row.get("predicted_peak_memory_bytes"),
                     "measured_peak_bytes": row.get("measured_peak_memory_bytes"),
                     "memory_error_pct": row.get("memory_error_pct")})
        say(f"run {run_index + 1}: {name:20s} step predicted {row['predicted_s'] * 1e3:7.2f} ms, measured "
            f"{row['measured_s'] * 1e3:7.2f} ms, error {row['error_pct']:+6.1f} %; peak memory error "
            f"{_pct(row.get('memory_error_pct'))}")
    return rows


def predicted_peak_bytes(zero_stage: int) -> float:
    """The current memory model's peak per rank of one case, as `validate` predicts it."""
    from validator.validate import prepare_case
    scenario = case_scenario(zero_stage)
    workload = as_built(resolve_workload(scenario.model, scenario.base_dir))
    case = prepare_case(scenario, workload, None, "megatron", None,
                        RunOptions(steps=1, warmup=0, optimizer=scenario.training.optimizer))
    return max(device["peak_memory_bytes"] for device in case.predicted.summary["devices"])


def repredict_memory(path: Path, say) -> int:
    """Rewrite the committed CSV's predicted peaks and memory errors (`--repredict-memory`)."""
    frame = pd.read_csv(path)
    peaks = {stage: predicted_peak_bytes(stage) for stage in sorted(frame["zero_stage"].unique())}
    frame["predicted_peak_bytes"] = frame["zero_stage"].map(peaks)
    frame["memory_error_pct"] = 100 * (frame["predicted_peak_bytes"] - frame["measured_peak_bytes"]) \
        / frame["measured_peak_bytes"]
    write_text_atomic(path, frame.to_csv(index=False))
    for name, group in frame.groupby("case", sort=False):
        say(f"{name:20s} peak memory predicted {group['predicted_peak_bytes'].iloc[0] / 2**20:.2f} MiB, error "
            f"median {statistics.median(group['memory_error_pct']):+.1f} % "
            f"({', '.join(f'{e:+.1f}' for e in group['memory_error_pct'])})")
    return 0


def _pct(value) -> str:
    return "n/a" if value is None or value != value else f"{value:+.1f} %"


def summarise(rows: list[dict]) -> dict:
    """Per case the median over the runs of the step-time and memory errors; MAPE and worst of the
    step-time medians."""
    frame = pd.DataFrame(rows)
    cases = {}
    for name in ZERO_STAGES.values():
        group = frame[frame["case"] == name]
        if group.empty:
            continue
        memory = group["memory_error_pct"].dropna()
        cases[name] = {"runs": len(group), "median_error_pct": float(statistics.median(group["error_pct"])),
                       "errors_pct": [float(e) for e in group["error_pct"]],
                       "median_memory_error_pct": float(statistics.median(memory)) if len(memory) else None}
    medians = [abs(case["median_error_pct"]) for case in cases.values()]
    return {"cases": cases, "mape_pct": statistics.fmean(medians) if medians else None,
            "worst_pct": max(medians) if medians else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--runs", type=int, default=3, help="fresh runs (each calibrates its own profile)")
    parser.add_argument("--launches", type=int, default=3, help="launches of each case per run, in rounds")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per launch")
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="each run uses its profile in --profiles if there (no fresh calibration)")
    parser.add_argument("--profiles", default=str(ROOT / "reports" / "profiles"),
                        help="folder of the profiles written, transformer_cpu_fsdp_ws2_run<N>.json")
    parser.add_argument("--out", default=str(ROOT / "reports" / "validation_fsdp_cpu.csv"))
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON at the end")
    parser.add_argument("--repredict-memory", action="store_true",
                        help="run nothing: re-predict the --out CSV's peak memory with the current model")
    args = parser.parse_args(argv)
    for field in ("runs", "launches", "steps"):
        if getattr(args, field) < 1:
            print(f"bench_fsdp_validation: error: --{field}: {getattr(args, field)} must be at least 1", file=sys.stderr)
            return 2
    say = (lambda message: print(message, file=sys.stderr, flush=True)) if args.json else \
        (lambda message: print(message, flush=True))
    if args.repredict_memory:
        if not Path(args.out).is_file():
            print(f"bench_fsdp_validation: error: --out {args.out}: no such file to re-predict", file=sys.stderr)
            return 2
        return repredict_memory(Path(args.out), say)
    rows: list[dict] = []
    for run_index in range(args.runs):
        profile = Path(args.profiles) / f"transformer_cpu_fsdp_ws2_run{run_index}.json"
        rows += one_run(run_index, profile, args, say)
        write_text_atomic(args.out, pd.DataFrame(rows).to_csv(index=False))
    summary = summarise(rows)
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows}, indent=1, default=float))
        return 0
    print()
    for name, case in summary["cases"].items():
        print(f"{name:20s} step error, median of {case['runs']} runs: {case['median_error_pct']:+6.1f} % "
              f"({', '.join(f'{e:+.1f}' for e in case['errors_pct'])}); peak memory "
              f"{_pct(case['median_memory_error_pct'])}")
    print(f"step time: MAPE {summary['mape_pct']:.1f} % (target <= 10), worst {summary['worst_pct']:.1f} % "
          f"(target <= 20), medians of {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
