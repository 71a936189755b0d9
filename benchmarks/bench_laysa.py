"""LaySA reproduction (issue 6, PAPERS.md 3): memory reuse, sparse communication, and both.

Simulates scenarios/laysa_resnet_10gbe.yaml (DP of ResNet-1001 on a 10 GbE cluster) in four
variants: baseline, reuse (layer-centric reuse), sparse (top-k, density 0.01), laysa (both,
with the mirror weight update), and reuse / laysa with activations offloaded to host memory, and prints step time, throughput, peak memory per
GPU and whether it fits, against the baseline and against each optimisation alone. A density
sweep shows where top-k becomes slower than the dense allreduce (rho x N >= 1 with fp32).
Run: python benchmarks/bench_laysa.py [--set key=value ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.report.gallery_laysa import VARIANTS
from simulator.scenario import load_scenario
from simulator.simulate import simulate

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "laysa_resnet_10gbe.yaml"


def simulate_summary(scenario) -> dict:
    return simulate(scenario).summary


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    summaries = {name: simulate_summary(load_scenario(SCENARIO, [*args.overrides, *extra]))
                 for name, extra in VARIANTS.items()}
    base = summaries["baseline"]
    capacity = base["memory"]["capacity_bytes"]
    print(f"{base['scenario']}: {base['model']}, {base['num_gpus']} GPUs, batch {base['global_batch_size']}, "
          f"GPU memory {capacity / 2**30:.1f} GiB")
    print(f"{'variant':14s} {'step (ms)':>10s} {'samples/s':>10s} {'vs base':>8s} {'peak GiB':>9s} "
          f"{'mem vs base':>11s} {'fits':>5s} {'offload exposed (ms)':>21s}")
    for name, summary in summaries.items():
        peak = summary["memory"]["peak_memory_bytes"]
        print(f"{name:14s} {summary['step_time_s'] * 1e3:10.1f} {summary['throughput_samples_per_s']:10.1f} "
              f"{summary['throughput_samples_per_s'] / base['throughput_samples_per_s']:7.2f}x "
              f"{peak / 2**30:9.2f} {100 * (peak / base['memory']['peak_memory_bytes'] - 1):+10.1f}% "
              f"{'yes' if summary['fits_in_memory'] else 'NO':>5s} {summary['memory']['offload_exposed_s'] * 1e3:21.1f}")
    laysa, reuse, sparse = summaries["laysa"], summaries["reuse"], summaries["sparse"]
    print(f"\nlaysa vs reuse alone:  throughput {_gain(laysa, reuse):+.1f}%, "
          f"peak memory {_mem(laysa, reuse):+.1f}%")
    print(f"laysa vs sparse alone: throughput {_gain(laysa, sparse):+.1f}%, "
          f"peak memory {_mem(laysa, sparse):+.1f}%")
    print("\ntop-k density sweep (sparse exchange vs dense allreduce, worst rank, uncontended):")
    for density in (0.001, 0.01, 0.05, 0.125, 0.25, 0.5):
        summary = simulate_summary(load_scenario(SCENARIO, [*args.overrides, *VARIANTS["sparse"],
                                                                 f"strategy.compression_density={density}"]))
        compression = summary["gradient_compression"]
        print(f"  rho {density:6.3f}: sparse {compression['sparse_s'] * 1e3:8.1f} ms "
              f"(selection {compression['selection_s'] * 1e3:5.1f}) vs dense {compression['dense_s'] * 1e3:8.1f} ms "
              f"-> {'sparse faster' if compression['sparse_faster'] else 'DENSE faster'}; "
              f"step {summary['step_time_s'] * 1e3:8.1f} ms")
    return 0


def _gain(a: dict, b: dict) -> float:
    return 100 * (a["throughput_samples_per_s"] / b["throughput_samples_per_s"] - 1)


def _mem(a: dict, b: dict) -> float:
    return 100 * (a["memory"]["peak_memory_bytes"] / b["memory"]["peak_memory_bytes"] - 1)


if __name__ == "__main__":
    raise SystemExit(main())
