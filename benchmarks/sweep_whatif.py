"""What the sweep's cache cost would do to a validated run's predictions: re-simulate the plans of a
`ghpsim validate` CSV with every layer's backward cost scaled by its sweep / tight ratio, measured
now by `bench_sweep_cache.py`'s microbenchmark (one process, not the validated runs), and print the
errors against the CSV's measurements beside the profile's own.

    python benchmarks/sweep_whatif.py reports/diagnostics/mlp_ws2_step_spans --model mlp_cpu --stages 2

FOLDER holds `<model>.csv` (from `ghpsim validate`) and `<model>_ws<stages>_momentum.json` (the
profile it was validated with); the scenario is the pipeline benchmark's (`pipeline_overrides`,
two virtual stages). Two variants: each layer's own ratio, and each half's summed ratio on all its
layers. The loss layer is not timed by the microbenchmark and keeps its cost. Written before the
model measured these ratios itself (the calibration's `layer_sweep` phase, `validator.sweep_bench`,
forwards included); kept for what it showed on profiles without that section, not the model's
prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_pipeline_validation import VIRTUAL_STAGES, pipeline_overrides  # noqa: E402
from bench_sweep_cache import measure  # noqa: E402

from simulator.compare import with_strategy  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.pass_jitter import jittered_prediction  # noqa: E402
from simulator.profile_costs import profile_costs  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.simulate import simulate  # noqa: E402


def backward_scaled(costs, factors: dict[int, float]):
    """`costs` with each layer's backward multiplied by `factors[layer]` (1 where absent)."""
    profiled = costs.compute_s

    def compute_s(layer_index: int, phase: str, batch: float) -> float:
        return profiled(layer_index, phase, batch) * (factors.get(layer_index, 1.0) if phase == "B" else 1.0)

    costs.compute_s = compute_s
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--model", default="mlp_cpu")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--trials", type=int, default=12)
    args = parser.parse_args()
    csv, profile = args.folder / f"{args.model}.csv", args.folder / f"{args.model}_ws{args.stages}_momentum.json"
    for path in (csv, profile):
        if not path.is_file():
            print(f"sweep_whatif: {path}: no such file", file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    scenario = load_scenario(HERE.parent / "scenarios" / "validation" / f"{args.model}.yaml",
                             pipeline_overrides(args.stages) + [VIRTUAL_STAGES])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    microbatch = scenario.training.global_batch_size // args.microbatches
    halves = measure(args.model, microbatch, args.trials)
    per_layer = {layer: ratio for half in halves for layer, ratio in half["layer_backward_ratios"].items()}
    per_half = {layer: half["backward_ratio"] for half in halves for layer in half["layer_backward_ratios"]}
    print(f"{args.model} micro-batch {microbatch}: backward sweep / tight per layer "
          + " ".join(f"{layer}:{ratio:.2f}" for layer, ratio in per_layer.items())
          + "; per half " + " ".join(f"{half['stage']}:{half['backward_ratio']:.2f}" for half in halves))
    measured = pd.read_csv(csv)
    for variant, factors in (("as profiled", {}), ("per-layer ratios", per_layer), ("per-half ratios", per_half)):
        errors = []
        for row in measured.itertuples():
            costs = backward_scaled(profile_costs(str(profile), workload), factors)
            result = simulate(with_strategy(scenario, row.kind, None), costs=costs, workload=workload)
            jitter = jittered_prediction(result, costs)
            predicted_s = jitter["step_time_s"] if jitter else result.step_time_s
            errors.append((row.kind, 100 * (predicted_s - row.measured_s) / row.measured_s))
        mape = sum(abs(error) for _, error in errors) / len(errors)
        print(f"{variant:18s} " + "  ".join(f"{kind} {error:+.1f} %" for kind, error in errors)
              + f"  | MAPE {mape:.1f} %, worst {max(abs(error) for _, error in errors):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
