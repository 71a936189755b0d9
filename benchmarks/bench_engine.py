"""Engine speed benchmark (issue: core simulator). Prints wall seconds (median of repeats),
simulated events per second and peak memory; not a timed test.

(a) DP, ResNet-50, 1024 GPUs (128 nodes x 8 A100, NVLink + HDR InfiniBand), every rank simulated
    (strategy.symmetry off: the engine's speed). Target < 5 s.
(b) GHP, ResNet-1001, 64 GPUs (8 x 8 V100, 10 GbE), every (G, M) with G x M = 64. Target < 2 s
    for all (G, M) together.
(c) DP, ResNet-50, 1024 GPUs as (a) but one HDR NIC per GPU on a k=16 fat-tree (issue: scale,
    network): max-min sharing over 4,352 duplex links. No target; reported next to (a).
(d) DP, ResNet-50 as (a) on 2,048 to 16,384 GPUs as a user runs it (symmetry auto: rank 0 stands
    for every replica, simulator/grid_symmetry.py) (issue 73): target <= 5 s at 16,384, memory at
    most linear in the GPU count (peak resident memory per GPU printed, each size in a fresh process).
Run: python benchmarks/bench_engine.py [--repeats 3] [--skip-scaling]
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import time
import tracemalloc

from simulator import load_scenario, simulate
from simulator.model_source import resolve_workload


def scenario(nodes, gpus_per_node, gpu, intra, inter, model, kind, groups, batch, placement="group_per_node",
             symmetry="auto", **fabric):
    return load_scenario({
        "name": f"{model}-{kind}-{nodes * gpus_per_node}",
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus_per_node, "gpu": gpu,
                    "intra_node_link": intra, "inter_node_link": inter, **fabric},
        "model": {"name": model},
        "strategy": {"kind": kind, "num_groups": groups, "placement": placement, "symmetry": symmetry},
        "training": {"global_batch_size": batch, "optimizer": "momentum"},
    })


def case_a():
    sc = scenario(128, 8, "A100-80GB", "nvlink3-a100", "ib-hdr", "resnet50", "dp", None, 32 * 1024, symmetry="off")
    result = simulate(sc)
    return result.summary["num_events"], f"step {result.step_time_s * 1e3:.2f} ms"


def case_c():
    sc = scenario(128, 8, "A100-80GB", "nvlink3-a100", "ib-hdr", "resnet50", "dp", None, 32 * 1024,
                  symmetry="off", topology="fat_tree", nics_per_node=8)
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


def dp_run(nodes: int) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS bytes) of ResNet-50 DP on `nodes` x 8 A100 in this (fresh) process."""
    sc = scenario(nodes, 8, "A100-80GB", "nvlink3-a100", "ib-hdr", "resnet50", "dp", None, 32 * 8 * nodes)
    wall, cpu = time.perf_counter(), time.process_time()
    simulate(sc)
    return (time.perf_counter() - wall, time.process_time() - cpu,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0)


def dp_scaling(repeats: int) -> None:
    for nodes in (256, 512, 1024, 2048):
        with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
            runs = [pool.apply(dp_run, (nodes,)) for _ in range(repeats)]
        wall, cpu, rss = (statistics.median(run[i] for run in runs) for i in range(3))
        target = " (target <= 5 s)" if nodes == 2048 else ""
        print(f"(d) DP ResNet-50 {nodes * 8:,} GPUs: median wall {wall:.2f} s{target}, CPU {cpu:.2f} s | peak RSS "
              f"{rss / 2**20:.0f} MiB, {rss / (nodes * 8) / 2**10:.1f} KiB per GPU")


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
    parser.add_argument("--skip-scaling", action="store_true", help="skip (d)")
    args = parser.parse_args()
    for label, function, target_s in (("(a) DP ResNet-50 1024 GPUs", case_a, 5.0),
                                      ("(b) GHP ResNet-1001 64 GPUs, all 7 (G, M)", case_b, 2.0),
                                      ("(c) DP ResNet-50 1024 GPUs, k=16 fat-tree", case_c, 5.0)):
        wall, events, note, peak = measure(function, args.repeats)
        print(f"{label}: median wall {wall:.3f} s (target < {target_s:g} s, ratio {wall / target_s:.2f}) | "
              f"{events:,} events, {events / wall:,.0f} events/s | peak traced memory {peak / 2**20:.1f} MiB | {note}")
    if not args.skip_scaling:
        dp_scaling(args.repeats)


if __name__ == "__main__":
    main()
