"""Validation accuracy benchmark on this CPU machine (issue: validator). Prints figures.

For each model (an MLP, a narrow ResNet-20, a small transformer) and world size (2, 4):
calibrate a profile from microbenchmarks at that world size, then run dp, mp (and ghp G=2 at 4
ranks) for real and in simulation, each `--launches` times in rounds (the measured figure is the
median over all their steps; the spread between the launches' medians is the run-to-run noise of
this shared machine; by default 8 launches: one launch's median scatters by 13-22 % on this
host, so a case's figure keeps a standard error, printed with the MAPE that noise alone would
give a perfect model). Prints predicted, measured and error per case, MAPE, the worst case, the
noise, and whether the strategy predicted fastest is the one measured fastest. With the speed
anchor (default on, `--speed-anchor 0` off; `validator.speed_anchor`) every launch also times the
calibration's whole-model passes, and the prediction rescaled to the machine's speed then is
printed beside the calibration's own. With `--interleave N` a short calibration runs after every
N-th round and the prediction from all of them pooled is printed beside the first's
(`validator.interleave`). The validated runs are never used to fit a profile. Writes reports/validation_cpu.csv
(after every model and world size, so an interrupted run keeps what it measured).
On a GPU machine `--device cuda --backend gloo` calibrates and runs there with the ranks sharing
one GPU (benchmarks/gpu_validation.sh wraps it; `--profiles` and `--profile-suffix` place the profiles).
Run: python benchmarks/bench_validation.py [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.bracket import bracketing_profile
from validator.calibrate import calibrate_quietly
from validator.comm_device import default_backend, device_problem
from validator.interleave import CalibrationSlices
from validator.measure import RunOptions
from validator.report import (anchored_summary, bracketed_summary, calibration_level_summary, headline_column,
                              headline_summary, interleaved_level_summary, interleaved_summary, jitter_summary,
                              launch_spread_summary, other_predictions_text)
from validator.speed_anchor import DEFAULT_ANCHOR_PASSES
from validator.speed_probe import reference_kernel_s
from validator.validate import predictions, validate, with_second_prediction

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--out", default=str(ROOT / "reports" / "validation_cpu.csv"))
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="use the profiles already in reports/profiles (fitted by an earlier run of this benchmark)")
    parser.add_argument("--launches", type=int, default=8,
                        help="launches of each case, in rounds; its figure is the median over all their steps")
    parser.add_argument("--speed-anchor", type=int, default=DEFAULT_ANCHOR_PASSES,
                        help="whole-model passes each launch times before and after its steps, for the "
                             "speed-anchored prediction printed beside the calibration's (0: off)")
    parser.add_argument("--bracket", action="store_true",
                        help="calibrate again after the runs and print the prediction from both calibrations "
                             "pooled (validator.bracket) beside the first's; measured and not kept as the default")
    parser.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                        help="calibrate a one-sweep slice after every ROUNDS launch rounds and print the "
                             "prediction from the calibration and its slices pooled (validator.interleave; 0: off)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="calibrate and run on this device (cuda: on a GPU machine)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default gloo on cpu, nccl on cuda; gloo on cuda shares one GPU among the ranks")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--calibration-attempts", type=int, default=3,
                        help="calibrate again while the machine looks disturbed, up to this many times in all")
    parser.add_argument("--profiles", default=str(ROOT / "reports" / "profiles"),
                        help="folder of the profiles written (and read with --reuse-profiles)")
    parser.add_argument("--profile-suffix", default="", help="appended to each profile's name, e.g. _cuda")
    args = parser.parse_args()
    refusal = device_refusal(args.device, args.backend, args.world_sizes)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    rows = []
    slice_folder = Path(tempfile.mkdtemp(prefix="ghpsim-slices-"))
    for name in args.models.split(","):
        for world_size in (int(w) for w in args.world_sizes.split(",")):
            scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml",
                                     [f"cluster.gpus_per_node={world_size}"])
            workload = resolve_workload(scenario.model, scenario.base_dir)
            profile = Path(args.profiles) / f"{name}_ws{world_size}{args.profile_suffix}.json"
            probe_before_s = reference_kernel_s()
            if not (args.reuse_profiles and profile.exists()):
                calibrate_quietly(workload, dict(scenario.model.params), profile, world_size=world_size,
                          optimizer=scenario.training.optimizer, verbose=False, device=args.device,
                          backend=args.backend, attempts=args.calibration_attempts)
            passes = json.loads(profile.read_text())["method"].get("layer_passes")
            if passes:
                print(f"{name:16s} ws={world_size} calibration: {passes['passes']} layer passes, totals "
                      + " / ".join(f"{r:.2f}" for r in passes["relative_totals"])
                      + f" of their median (spread {passes['spread_pct']:.0f} %)", flush=True)
            specs = validation_specs(world_size)
            options = RunOptions(steps=args.steps, warmup=3, optimizer=scenario.training.optimizer,
                                 anchor_passes=args.speed_anchor)
            slices = (CalibrationSlices(profile, workload, dict(scenario.model.params), args.interleave, slice_folder)
                      if args.interleave else None)
            result = validate(scenario, str(profile), specs, options, repeats=args.launches,
                              after_round=slices.after_round if slices else None)
            drift = reference_kernel_s() / probe_before_s  # > 1: the machine got slower meanwhile
            print(f"{name:16s} ws={world_size} machine drift (reference kernel after / before): {drift:.2f}")
            if args.bracket:
                pooled = bracketing_profile(profile, workload, dict(scenario.model.params), args.reuse_profiles)
                with_second_prediction(result["rows"], predictions(scenario, str(pooled), specs, options), "bracketed")
            if slices:
                for problem in slices.disturbed:
                    print(f"{name:16s} ws={world_size} disturbed slice: {problem}")
                with_second_prediction(result["rows"], predictions(scenario, str(slices.pooled()), specs, options),
                                       "interleaved")
            for row in result["rows"]:
                row["model"] = name
                row["machine_drift"] = drift
                rows.append(row)
            write_text_atomic(args.out, pd.DataFrame(rows).to_csv(index=False))  # kept if a later case fails
            for row in result["rows"]:
                print(f"{name:16s} ws={world_size} {row['strategy']:16s} predicted {row['predicted_s'] * 1e3:8.2f} ms "
                      f"(jitter {row.get('predicted_jitter_s', float('nan')) * 1e3:6.2f}) "
                      f"measured {row['measured_s'] * 1e3:8.2f} ms error {row['error_pct']:+7.1f} % "
                      f"(launches spread {row['launch_spread_pct']:.0f} %, "
                      f"standard error {row['launch_noise_pct']:.1f} %)"
                      + other_predictions_text(row), flush=True)
    frame = pd.DataFrame(rows)
    write_text_atomic(args.out, frame.to_csv(index=False))
    print("\n" + headline_summary(frame))
    print(launch_spread_summary(frame))
    if calibration_level_summary(frame):
        print(calibration_level_summary(frame))
    if jitter_summary(frame):
        print(jitter_summary(frame))
    if bracketed_summary(frame):
        print(bracketed_summary(frame))
    if interleaved_summary(frame):
        print(interleaved_summary(frame))
        print(interleaved_level_summary(frame))
    if anchored_summary(frame):
        print(anchored_summary(frame))
        for model, group in frame.groupby("model"):
            print(f"  {model:16s} anchored MAPE {group['anchored_error_pct'].abs().mean():.1f} % "
                  f"(calibration alone {group['error_pct'].abs().mean():.1f} %)")
    columns = list(dict.fromkeys([headline_column(frame), "predicted_s"]))
    columns += ["anchored_predicted_s"] if "anchored_predicted_s" in frame else []
    columns += [column for column in ("interleaved_predicted_jitter_s", "interleaved_predicted_s") if column in frame]
    for (model, world_size), group in frame.groupby(["model", "world_size"]):
        measured = group.loc[group["measured_s"].idxmin(), "strategy"]
        for column in columns:
            predicted = group.loc[group[column].idxmin(), "strategy"]
            print(f"{model:16s} ws={world_size}: {column.removesuffix('_s').replace('_', ' ')} fastest "
                  f"{predicted}, measured fastest {measured} -> {'match' if predicted == measured else 'MISMATCH'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
