"""Pipeline schedules, predicted vs measured on this CPU machine (issue: pipelines). Prints figures.

For each model (MLP, narrow ResNet-20, small transformer) and pipeline depth p in (2, 4): calibrate
a profile from microbenchmarks at world size p (optimizer momentum, which SpecTrain needs), then
run gpipe, 1f1b, interleaved_1f1b (v = 2), pipedream (weight stashing) and spectrain with m
micro-batches for real and in simulation, all kinds in the same rounds of launches (so that they
meet the same spells of the machine's speed). Synchronous kinds: median step makespan; asynchronous
kinds: the steady-state window (see validator/measure.py). The validated runs never enter the
profile. Writes reports/validation_pipelines_cpu.csv. Each case is launched 8 times
(one launch's median scatters by 13-22 % on this host; the summary prints the standard error
that leaves on a case's figure and the MAPE that noise alone would give a perfect model). With
the speed anchor (default on, `--speed-anchor 0` off; `validator.speed_anchor`) each launch also
times the calibration's whole-model passes and the prediction rescaled to the machine's speed then
is printed beside the calibration's own. With `--interleave N` a one-sweep calibration runs after
every N-th round and the prediction from all of them pooled is printed beside the first's
(`validator.interleave`).
Run: python benchmarks/bench_pipeline_validation.py [--steps 12] [--reuse-profiles] [--pipeline-runtime torch]
(torch: gpipe and 1f1b through torch.distributed.pipelining, validator/torch_pipelining.py).
On a GPU machine `--device cuda --backend gloo` calibrates and runs there with the stages sharing one
GPU (benchmarks/gpu_pipeline_validation.sh wraps it; `--profiles` and `--profile-suffix` place the
profiles).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from bench_validation import device_refusal
from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.bracket import bracketing_profile
from validator.calibrate import calibrate_quietly
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
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "pipedream", "spectrain")


VIRTUAL_STAGES = "strategy.num_virtual_stages=2"
"""The override every case runs with (interleaved_1f1b's v = 2 chunks; the other kinds ignore it)."""


def pipeline_overrides(stages: int) -> list[str]:
    """The validation scenario's overrides for p = `stages`: p ranks on one host, momentum (which
    SpecTrain needs), 16 samples per stage."""
    return [f"cluster.gpus_per_node={stages}", "training.optimizer=momentum",
            f"training.global_batch_size={16 * stages}"]


def pipeline_profile(name: str, stages: int, folder: Path = ROOT / "reports" / "profiles", suffix: str = "") -> Path:
    """The profile the benchmark calibrates (and commits) for model `name` at p = `stages`."""
    return Path(folder) / f"{name}_ws{stages}_momentum{suffix}.json"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--reuse-profiles", action="store_true", help="use existing momentum profiles")
    parser.add_argument("--pipeline-runtime", choices=("own", "torch"), default="own",
                        help="torch: gpipe / 1f1b through torch.distributed.pipelining (other schedules skipped)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "validation_pipelines_cpu.csv"))
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
                        help="default gloo on cpu, nccl on cuda; gloo on cuda shares one GPU among the stages")
    parser.add_argument("--calibration-attempts", type=int, default=3,
                        help="calibrate again while the machine looks disturbed, up to this many times in all")
    parser.add_argument("--profiles", default=str(ROOT / "reports" / "profiles"),
                        help="folder of the profiles written (and read with --reuse-profiles)")
    parser.add_argument("--profile-suffix", default="", help="appended to each profile's name, e.g. _cuda")
    args = parser.parse_args()
    refusal = device_refusal(args.device, args.backend, args.stages)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    rows = []
    slice_folder = Path(tempfile.mkdtemp(prefix="ghpsim-pipeline-slices-"))
    for name in args.models.split(","):
        for stages in (int(p) for p in args.stages.split(",")):
            overrides = pipeline_overrides(stages)
            scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml", overrides)
            workload = resolve_workload(scenario.model, scenario.base_dir)
            profile = pipeline_profile(name, stages, Path(args.profiles), args.profile_suffix)
            probe_before_s = reference_kernel_s()
            if not (args.reuse_profiles and profile.exists()):
                calibrate_quietly(workload, dict(scenario.model.params), profile, world_size=stages,
                                  optimizer="momentum", verbose=False, device=args.device, backend=args.backend,
                                  attempts=args.calibration_attempts)
            kinds = args.schedules.split(",")
            if args.pipeline_runtime == "torch":
                kinds = [kind for kind in kinds if kind in ("gpipe", "1f1b")]
            if "interleaved_1f1b" in kinds and 2 * stages > workload.num_layers:
                kinds = [kind for kind in kinds if kind != "interleaved_1f1b"]  # v = 2 chunks need 2p layers
            # one scenario for all kinds (with_strategy keeps v = 2 for interleaved_1f1b only), so every
            # kind is launched in the same rounds and meets the same spells of the machine's speed
            variant = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml",
                                    overrides + [VIRTUAL_STAGES])
            specs = [(f"{kind}:{args.microbatches}", None) for kind in kinds]
            options = RunOptions(steps=args.steps, warmup=2, optimizer="momentum",
                                 pipeline_runtime=args.pipeline_runtime, anchor_passes=args.speed_anchor)
            slices = (CalibrationSlices(profile, workload, dict(scenario.model.params), args.interleave, slice_folder)
                      if args.interleave else None)
            result_rows = validate(variant, str(profile), specs, options, repeats=args.launches,
                                   after_round=slices.after_round if slices else None)["rows"]
            drift = reference_kernel_s() / probe_before_s  # > 1: the machine got slower meanwhile
            print(f"{name:16s} p={stages} machine drift (reference kernel after / before): {drift:.2f}")
            if args.bracket:
                pooled = bracketing_profile(profile, workload, dict(scenario.model.params), args.reuse_profiles)
                with_second_prediction(result_rows, predictions(variant, str(pooled), specs, options), "bracketed")
            if slices:
                for problem in slices.disturbed:
                    print(f"{name:16s} p={stages} disturbed slice: {problem}")
                with_second_prediction(result_rows, predictions(variant, str(slices.pooled()), specs, options),
                                       "interleaved")
            for row in result_rows:
                row["model"] = name
                row["machine_drift"] = drift
                row["pipeline_runtime"] = args.pipeline_runtime
                rows.append(row)
                print(f"{name:16s} p={stages} {row['strategy']:30s} predicted {row['predicted_s'] * 1e3:8.2f} ms "
                      f"(jitter {row.get('predicted_jitter_s', float('nan')) * 1e3:6.2f}) "
                      f"measured {row['measured_s'] * 1e3:8.2f} ms error {row['error_pct']:+7.1f} % "
                      f"(launches spread {row['launch_spread_pct']:.0f} %, "
                      f"standard error {row['launch_noise_pct']:.1f} %)"
                      + other_predictions_text(row), flush=True)
            write_text_atomic(args.out, pd.DataFrame(rows).to_csv(index=False))  # kept if a later case fails
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
        for (model, stages), group in frame.groupby(["model", "world_size"]):
            print(f"  {model:16s} p={stages} mean signed error: calibration alone {group['error_pct'].mean():+6.1f} %, "
                  f"anchored {group['anchored_error_pct'].mean():+6.1f} % (speed x{group['speed_ratio'].median():.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
