"""Engine speed benchmark (issue: core simulator). Prints wall seconds (median of repeats),
simulated events per second and peak memory; not a timed test.

(a) DP, ResNet-50, 1024 GPUs (128 nodes x 8 A100, NVLink + HDR InfiniBand). Target < 5 s.
(b) GHP, ResNet-1001, 64 GPUs (8 x 8 V100, 10 GbE), every (G, M) with G x M = 64. Target < 2 s
    for all (G, M) together.
(c) DP, ResNet-50, 1024 GPUs as (a) but one HDR NIC per GPU on a k=16 fat-tree (issue: scale,
    network): max-min sharing over 4,352 duplex links. No target; reported next to (a).
Run: python benchmarks/bench_engine.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

from simulator import load_scenario, simulate
from simulator.model_source import resolve_workload


def scenario(nodes, gpus_per_node, gpu, intra, inter, model, kind, groups, batch, placement="group_per_node",
             **fabric):
    return load_scenario({
        "name": f"{model}-{kind}-{nodes * gpus_per_node}",
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus_per_node, "gpu": gpu,
                    "intra_node_link": intra, "inter_node_link": inter, **fabric},
        "model": {"name": model},
        "strategy": {"kind": kind, "num_groups": groups, "placement": placement},
        "training": {"global_batch_size": batch, "optimizer": "momentum"},
    })


def case_a():
    sc = scenario(128, 8, "A100-80GB", "nvlink3-a100", "ib-hdr", "resnet50", "dp", None, 32 * 1024)
    result = simulate(sc)
    return result.summary["num_events"], f"step {result.step_time_s * 1e3:.2f} ms"


def case_c():
    sc = scenario(128, 8, "A100-80GB", "nvlink3-a100", "ib-hdr", "resnet50", "dp", None, 32 * 1024,
                  topology="fat_tree", nics_per_node=8)
    result = simulate(sc)
    return result.summary["num_events"], f"step {result.step_time_s * 1e3:.2f} ms"


def case_b():
    base = scenario(8, 8, "V100", "nvlink2-v100", "10gbe", "resnet1001", "dp", None, 1024)
    workload = resolve_workload(base.model)
    events, best = 0, None
    for groups in (1, 2, 4, 8, 16, 32, 64):
        sc = scenario(8, 8, "V100", "nvlink2-v100", "10gbe", "resnet1001", "ghp", groups, 1024)
        result = simulate(sc, workload=workload)
        events += result.summary["num_events"]
        if best is None or result.step_time_s < best[1]:
            best = (groups, result.step_time_s)
    return events, f"best G={best[0]} x M={64 // best[0]}: step {best[1] * 1e3:.1f} ms"


def measure(function, repeats):
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        events, note = function()
        walls.append(time.perf_counter() - started)
    tracemalloc.start()
    function()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(walls), events, note, peak


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for label, function, target_s in (("(a) DP ResNet-50 1024 GPUs", case_a, 5.0),
                                      ("(b) GHP ResNet-1001 64 GPUs, all 7 (G, M)", case_b, 2.0),
                                      ("(c) DP ResNet-50 1024 GPUs, k=16 fat-tree", case_c, 5.0)):
        wall, events, note, peak = measure(function, args.repeats)
        print(f"{label}: median wall {wall:.3f} s (target < {target_s:g} s, ratio {wall / target_s:.2f}) | "
              f"{events:,} events, {events / wall:,.0f} events/s | peak traced memory {peak / 2**20:.1f} MiB | {note}")


if __name__ == "__main__":
    main()
