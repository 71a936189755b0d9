"""PaSE search benchmark (issue: planner, PaSE search). Prints figures; not a timed test.

(a) Search time for InceptionV3 (torchvision layout, 120 vertices, batch 128) at p = 8 on the
    GTX 1080 Ti / PCIe 3 setting: building the cost tables + GENERATESEQ + the DP. Target < 60 s.
(b) AlexNet, batch 128, p = 4, 8, 16, 32, 64 on both PaSE settings (scenarios/pase_alexnet_*.yaml):
    PaSE's cost F and its speedup over data parallelism and over the expert strategy, the same
    ratios from the engine's simulation of each strategy's plan, and the search time.
Run: python benchmarks/bench_pase.py [--repeats 3] [--no-simulate]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from simulator import load_scenario
from simulator.pase.graphs import inception_v3_graph
from simulator.pase.run import graph_for_scenario, search_point

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ("pase_alexnet_1080ti.yaml", "pase_alexnet_2080ti.yaml")
GPUS = (4, 8, 16, 32, 64)


def case_a(repeats: int) -> None:
    scenario = load_scenario(ROOT / "scenarios" / SETTINGS[0])
    graph = inception_v3_graph(128)
    walls, point = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        point = search_point(scenario, graph, 8, simulate=False)
        walls.append(time.perf_counter() - started)
    rows = {row["strategy"]: row for row in point["results"]}
    print(f"(a) InceptionV3, {graph.num_vertices} vertices / {len(graph.edges)} edges, p = 8: "
          f"search {statistics.median(walls):.2f} s median of {repeats} (target < 60 s); "
          f"max dependent set {point['max_dependent_set']}, largest table {point['largest_table_entries']:,} "
          f"entries, up to {point['configs_per_vertex_max']} configurations per vertex; "
          f"PaSE cost {rows['pase']['cost_flops'] / 1e9:.1f} GFLOP = "
          f"{rows['dp']['cost_flops'] / rows['pase']['cost_flops']:.3f}x "
          f"over DP, {rows['expert']['cost_flops'] / rows['pase']['cost_flops']:.3f}x over expert")


def case_b(simulate: bool) -> None:
    print("(b) AlexNet, batch 128: speedups of PaSE's strategy (cost model; simulated in brackets)")
    print(f"{'setting':22s} {'p':>3s} {'link':>13s} {'PaSE ms':>8s} {'vs DP':>15s} {'vs expert':>15s} "
          f"{'expert vs DP':>15s} {'search s':>9s}")
    for name in SETTINGS:
        scenario = load_scenario(ROOT / "scenarios" / name)
        graph = graph_for_scenario(scenario)
        for p in GPUS:
            point = search_point(scenario, graph, p, simulate=simulate)
            rows = {row["strategy"]: row for row in point["results"]}
            print(f"{scenario.cluster.gpu.name:22s} {p:3d} {point['link']:>13s} "
                  f"{rows['pase']['analytic_s'] * 1e3:8.2f} {_ratio(rows, 'dp', 'pase', simulate):>15s} "
                  f"{_ratio(rows, 'expert', 'pase', simulate):>15s} {_ratio(rows, 'dp', 'expert', simulate):>15s} "
                  f"{rows['pase']['search_s']:9.2f}")


def _ratio(rows: dict, slow: str, fast: str, simulate: bool) -> str:
    text = f"{rows[slow]['cost_flops'] / rows[fast]['cost_flops']:.2f}x"
    if simulate:
        text += f" ({rows[slow]['simulated_step_s'] / rows[fast]['simulated_step_s']:.2f}x)"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-simulate", action="store_true")
    args = parser.parse_args()
    case_a(args.repeats)
    case_b(not args.no_simulate)


if __name__ == "__main__":
    main()
