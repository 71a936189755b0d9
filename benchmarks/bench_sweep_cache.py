"""A layer's pass inside a stage sweep against the same pass in a tight loop, the way the
calibration times it (`validator.microbench.measure_layers`: one layer, forward then backward,
repeated back to back).

A pipeline stage runs its layers' forwards in order, then their backwards in reverse: by the time a
layer's backward runs, the other layers of the stage have run through the caches since its forward.
The calibration's tight loop finds the layer's weights, gradient buffers and activations where its
previous repetition left them. This benchmark times both in one process, alternating them in
trials so that both meet the same spells of the machine's speed, and prints per model, micro-batch
size and stage: the median over trials of (stage's summed passes in the sweep) / (the same passes
in tight loops), forward and backward apart, and each layer's backward ratio.

    python benchmarks/bench_sweep_cache.py                  # MLP / ResNet / transformer, micro-batches 8, 16, 32
    python benchmarks/bench_sweep_cache.py --models mlp_cpu --microbatches 8 --trials 20

Measured on the project's 2-core CPU VM, one process (no other rank computing): see
reports/ACCURACY.md (the entry naming `bench_sweep_cache.py`). The calibration now measures the
same ratio for every layer (`validator.sweep_bench`, the profile's `layer_sweep`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from validator.sweep_bench import SweepModel  # noqa: E402

PASSES = 10
"""Passes per layer in a tight loop, and sweeps per trial; the first two of each are not counted
(`validator.sweep_bench.DROPPED_PASSES`)."""


def model_layers(name: str, microbatch: int) -> SweepModel:
    """The validation model's layers at `microbatch`, a fixed output gradient on every layer (no loss:
    the halves timed here leave the last layer out)."""
    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml")
    workload = resolve_workload(scenario.model, scenario.base_dir)
    return SweepModel(workload, microbatch, models=None, seed=0, device=torch.device("cpu"), include_loss=False)


def two_stages(num_layers: int) -> list[list[int]]:
    """The layers split into two contiguous halves (the last layer, with the loss, excluded: the
    tight loop here backpropagates a fixed gradient, not a loss)."""
    layers = list(range(num_layers - 1))
    half = len(layers) // 2
    return [layers[:half], layers[half:]]


def measure(name: str, microbatch: int, trials: int) -> list[dict]:
    layers = model_layers(name, microbatch)
    rows = []
    for stage in two_stages(len(layers.modules)):
        forward_ratios, backward_ratios = [], []
        layer_ratios = {layer: [] for layer in stage}
        tight_backward_s = []
        for trial in range(trials):
            if trial % 2 == 0:  # alternate which runs first
                sweep = layers.sweeps_s(PASSES, stage)
                tight = layers.tight_s(PASSES, stage)
            else:
                tight = layers.tight_s(PASSES, stage)
                sweep = layers.sweeps_s(PASSES, stage)
            (sweep_forward, sweep_backward), (tight_forward, tight_backward) = sweep, tight
            forward_ratios.append(sum(sweep_forward) / sum(tight_forward))
            backward_ratios.append(sum(sweep_backward) / sum(tight_backward))
            tight_backward_s.append(sum(tight_backward))
            for position, layer in enumerate(stage):
                layer_ratios[layer].append(sweep_backward[position] / tight_backward[position])
        rows.append({"model": name, "microbatch": microbatch, "stage": f"L{stage[0]}-{stage[-1]}",
                     "forward_ratio": statistics.median(forward_ratios),
                     "backward_ratio": statistics.median(backward_ratios),
                     "backward_ratio_p10_p90": (sorted(backward_ratios)[len(backward_ratios) // 10],
                                                sorted(backward_ratios)[(9 * len(backward_ratios)) // 10]),
                     "tight_backward_ms": 1e3 * statistics.median(tight_backward_s),
                     "layer_backward_ratios": {layer: statistics.median(values) for layer, values in layer_ratios.items()}})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp_cpu,resnet_cpu,transformer_cpu")
    parser.add_argument("--microbatches", default="8,16,32")
    parser.add_argument("--trials", type=int, default=12)
    args = parser.parse_args()
    if args.trials < 2:
        print(f"bench_sweep_cache: --trials: {args.trials} must be at least 2", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print("sweep / tight: a stage's summed passes timed inside the stage's sweep over the same passes "
          "timed one layer at a time back to back (median over trials; one process)")
    for name in args.models.split(","):
        for microbatch in (int(size) for size in args.microbatches.split(",")):
            for row in measure(name, microbatch, args.trials):
                p10, p90 = row["backward_ratio_p10_p90"]
                per_layer = " ".join(f"{layer}:{ratio:.2f}" for layer, ratio in row["layer_backward_ratios"].items())
                print(f"{row['model']:16s} mb {row['microbatch']:3d} {row['stage']:8s} forward {row['forward_ratio']:.3f}  "
                      f"backward {row['backward_ratio']:.3f} (p10-p90 {p10:.2f}-{p90:.2f}, tight {row['tight_backward_ms']:.2f} ms)  "
                      f"per layer {per_layer}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
