"""Validation accuracy benchmark on this CPU machine (issue: validator). Prints figures.

For each model (an MLP, a narrow ResNet-20, a small transformer) and world size (2, 4):
calibrate a profile from microbenchmarks at that world size, then run dp, mp (and ghp G=2 at 4
ranks) for real and in simulation, each `--launches` times in rounds (the measured figure is the
median over all their steps; the spread between the launches' medians is the run-to-run noise of
this shared machine: one launch's median scatters by 13-22 % on this host, so 8 launches by
default). Prints predicted, measured and error per case; MAPE, worst and mean signed error; and
whether the strategy predicted fastest is the one measured fastest. The validated runs are never
used to fit a profile. Writes reports/validation_cpu.csv (after every model and world size, so an
interrupted run keeps what it measured); `--json` prints the rows and the summary as JSON.
On a GPU machine `--device cuda --backend gloo` calibrates and runs there with the ranks sharing
one GPU (benchmarks/gpu_validation.sh wraps it; `--profiles` and `--profile-suffix` place the profiles).
Run: python benchmarks/bench_validation.py [--steps 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.profile import load_profile
from simulator.scenario import load_scenario
from validator.calibrate import calibrate_quietly
from validator.comm_device import default_backend, device_problem
from validator.measure import RunOptions
from validator.report import error_summary, summary_line
from validator.validate import validate

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp_cpu", "resnet_cpu", "transformer_cpu")


def device_refusal(device: str, backend: str | None, world_sizes: str) -> str | None:
    """The one-line error for a `--device` / `--backend` this machine cannot run at the largest of
    `world_sizes` (comma-separated), or None (`validator.comm_device.device_problem`)."""
    backend = backend or default_backend(device)
    problem = device_problem(device, backend, max(int(n) for n in world_sizes.split(",")))
    return f"--device {device} / --backend {backend}: {problem}" if problem else None


def validation_specs(world_size: int) -> list[tuple[str, int | None]]:
    """The strategies validated at `world_size`: dp, mp, and from 4 ranks ghp with G = 2 groups."""
    return [("dp", None), ("mp", None)] + ([("ghp", 2)] if world_size >= 4 else [])


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both validation benchmarks take (`bench_pipeline_validation.py` too)."""
    parser.add_argument("--launches", type=int, default=8,
                        help="launches of each case, in rounds; its figure is the median over all their steps")
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="use the profiles already in --profiles (fitted by an earlier run of this benchmark)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="calibrate and run on this device (cuda: on a GPU machine)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default gloo on cpu, nccl on cuda; gloo on cuda shares one GPU among the ranks")
    parser.add_argument("--calibration-attempts", type=int, default=3,
                        help="calibrate again while the machine looks disturbed, up to this many times in all")
    parser.add_argument("--profiles", default=str(ROOT / "reports" / "profiles"),
                        help="folder of the profiles written (and read with --reuse-profiles)")
    parser.add_argument("--profile-suffix", default="", help="appended to each profile's name, e.g. _cuda")
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON at the end")


def ensure_profile(profile: Path, scenario, world_size: int, args, optimizer: str, say) -> None:
    """Calibrate `profile` unless `--reuse-profiles` finds it; say how its layer sweeps agreed."""
    if not (args.reuse_profiles and profile.exists()):
        workload = resolve_workload(scenario.model, scenario.base_dir)
        calibrate_quietly(workload, dict(scenario.model.params), profile, world_size=world_size, optimizer=optimizer,
                          verbose=False, device=args.device, backend=args.backend, attempts=args.calibration_attempts,
                          say=say)
    passes = load_profile(profile).provenance.get("layer_passes")
    if passes:
        say(f"{profile.name}: {passes['passes']} layer passes, totals "
            + " / ".join(f"{r:.2f}" for r in passes["relative_totals"])
            + f" of their median (spread {passes['spread_pct']:.0f} %)")


def case_text(row: dict) -> str:
    return (f"{row['model']:16s} ws={row['world_size']} {row['strategy']:30s} predicted "
            f"{row['predicted_s'] * 1e3:8.2f} ms measured {row['measured_s'] * 1e3:8.2f} ms error "
            f"{row['error_pct']:+7.1f} % (launches spread {row['launch_spread_pct']:.0f} %)")


def finish(rows: list[dict], as_json: bool, extra_lines: list[str] = ()) -> None:
    """The summary: printed, or with the rows as JSON."""
    summary = error_summary(rows)
    if as_json:
        print(json.dumps({"summary": summary, "rows": rows}, indent=1, default=float))
        return
    print("\n" + summary_line(summary))
    for line in extra_lines:
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=str(ROOT / "reports" / "validation_cpu.csv"))
    add_common_arguments(parser)
    args = parser.parse_args()
    refusal = device_refusal(args.device, args.backend, args.world_sizes)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    say = (lambda message: print(message, file=sys.stderr, flush=True)) if args.json else \
        (lambda message: print(message, flush=True))
    rows = []
    for name in args.models.split(","):
        for world_size in (int(w) for w in args.world_sizes.split(",")):
            scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml",
                                     [f"cluster.gpus_per_node={world_size}"])
            profile = Path(args.profiles) / f"{name}_ws{world_size}{args.profile_suffix}.json"
            ensure_profile(profile, scenario, world_size, args, scenario.training.optimizer, say)
            options = RunOptions(steps=args.steps, warmup=3, optimizer=scenario.training.optimizer)
            result = validate(scenario, str(profile), validation_specs(world_size), options, repeats=args.launches)
            for row in result["rows"]:
                rows.append({**row, "model": name})
                say(case_text(rows[-1]))
            write_text_atomic(args.out, pd.DataFrame(rows).to_csv(index=False))  # kept if a later case fails
    frame = pd.DataFrame(rows)
    fastest = []
    for (model, world_size), group in frame.groupby(["model", "world_size"]):
        predicted = group.loc[group["predicted_s"].idxmin(), "strategy"]
        measured = group.loc[group["measured_s"].idxmin(), "strategy"]
        fastest.append(f"{model:16s} ws={world_size}: predicted fastest {predicted}, measured fastest {measured} "
                       f"-> {'match' if predicted == measured else 'MISMATCH'}")
    finish(rows, args.json, fastest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
