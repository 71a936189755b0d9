"""Pipeline schedules, predicted vs measured on this CPU machine (issue: pipelines). Prints figures.

For each model (MLP, narrow ResNet-20, small transformer) and pipeline depth p in (2, 4): calibrate
a profile from microbenchmarks at world size p (optimizer momentum, which SpecTrain needs), then
run gpipe, 1f1b, interleaved_1f1b (v = 2; left out where the model has fewer than 2p layers),
pipedream (weight stashing) and spectrain with m micro-batches (`--microbatches`, default 4) for
real and in simulation, all kinds in the same rounds of launches (so that they
meet the same spells of the machine's speed). Synchronous kinds: median step makespan; asynchronous
kinds: the steady-state window (see validator/measure.py). The validated runs never enter the
profile. Each case is launched 8 times (one launch's median scatters by 13-22 % on this host).
Prints predicted, measured and error per case, and MAPE, worst and mean signed error; writes
reports/validation_pipelines_cpu.csv; `--json` prints the rows and the summary as JSON.
Run: python benchmarks/bench_pipeline_validation.py [--steps 12] [--reuse-profiles] [--pipeline-runtime torch]
(torch: gpipe and 1f1b through torch.distributed.pipelining, validator/torch_pipelining.py).
On a GPU machine `--device cuda --backend gloo` calibrates and runs there with the stages sharing one
GPU (benchmarks/gpu_pipeline_validation.sh wraps it; `--profiles` and `--profile-suffix` place the
profiles).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from bench_validation import add_common_arguments, case_text, device_refusal, ensure_profile, finish
from simulator.model_source import resolve_workload
from simulator.output import write_text_atomic
from simulator.scenario import load_scenario
from validator.measure import RunOptions
from validator.validate import validate

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
    parser.add_argument("--pipeline-runtime", choices=("own", "torch"), default="own",
                        help="torch: gpipe / 1f1b through torch.distributed.pipelining (other schedules skipped)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "validation_pipelines_cpu.csv"))
    add_common_arguments(parser)
    args = parser.parse_args()
    refusal = device_refusal(args.device, args.backend, args.stages)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    say = (lambda message: print(message, file=sys.stderr, flush=True)) if args.json else \
        (lambda message: print(message, flush=True))
    rows = []
    for name in args.models.split(","):
        for stages in (int(p) for p in args.stages.split(",")):
            # one scenario for all kinds (with_strategy keeps v = 2 for interleaved_1f1b only), so every
            # kind is launched in the same rounds and meets the same spells of the machine's speed
            scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml",
                                     pipeline_overrides(stages) + [VIRTUAL_STAGES])
            profile = pipeline_profile(name, stages, Path(args.profiles), args.profile_suffix)
            ensure_profile(profile, scenario, stages, args, "momentum", say)
            kinds = args.schedules.split(",")
            if args.pipeline_runtime == "torch":
                kinds = [kind for kind in kinds if kind in ("gpipe", "1f1b")]
            if "interleaved_1f1b" in kinds and 2 * stages > resolve_workload(scenario.model, scenario.base_dir).num_layers:
                kinds = [kind for kind in kinds if kind != "interleaved_1f1b"]  # v = 2 chunks need 2p layers
            specs = [(f"{kind}:{args.microbatches}", None) for kind in kinds]
            options = RunOptions(steps=args.steps, warmup=2, optimizer="momentum",
                                 pipeline_runtime=args.pipeline_runtime)
            for row in validate(scenario, str(profile), specs, options, repeats=args.launches)["rows"]:
                rows.append({**row, "model": name, "pipeline_runtime": args.pipeline_runtime})
                say(case_text(rows[-1]))
            write_text_atomic(args.out, pd.DataFrame(rows).to_csv(index=False))  # kept if a later case fails
    finish(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
