"""`ghpsim search` without the printing: a scenario's graph, r, the three strategies and their runs.

For p devices (the first p of the scenario's cluster: nodes of `gpus_per_node`, so p must be at
most one node's GPUs or a multiple of them), r = peak FLOP/s of the scenario's GPU at its dtype /
the bandwidth of the slower link tier the p devices span (the intra-node link inside one node;
the slower of it and `nics_per_node` x the inter-node link across nodes). PaSE's cost converted
to seconds is F / peak FLOP/s (compute at peak, communication at that bandwidth). Each strategy
is also compiled into a plan (`simulator.strategies.pase_plan`) and played by the engine on the
p-device cluster with the scenario's analytic costs (roofline with per-kind efficiency,
contention on links, latencies), giving the simulated step time.

The dp row is PaSE's data-parallel configuration (every layer split by batch) compiled and played
like the other two: each layer's weight gradient is allreduced on its own as its backward ends. It
is not `ghpsim simulate`'s dp, which fuses gradients into DDP buckets of `strategy.bucket_size_bytes`
(AlexNet on 64 GTX 1080 Ti: 76.12 ms here, 75.07 ms in 25 MiB buckets); `dp_baseline` says so, and
what else of the scenario simulate's dp would use, in the command's output.
"""

from __future__ import annotations

import math

import time

from simulator.costs import AnalyticCosts
from simulator.engine import Engine
from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.pase.cost import CostSettings, strategy_breakdown
from simulator.pase.graph import Graph, describe
from simulator.pase.graphs import EXTRA_GRAPHS, graph_from_workload
from simulator.pase.search import (MAX_TABLE_ENTRIES, baseline_configs, build_problem, check_search_size, choice_of,
                                   dynamic_program)
from simulator.scenario import Scenario
from simulator.strategies.pase_plan import compile_pase_plan
from simulator.topology import Topology
from simulator.workload import dtype_bytes

STRATEGY_NAMES = ("pase", "expert", "dp")


def graph_for_scenario(scenario: Scenario) -> Graph:
    """The scenario's model as a graph: InceptionV3 by name, else the zoo/table workload's layers."""
    batch = scenario.training.global_batch_size
    name = (scenario.model.name or "").lower()
    if name in EXTRA_GRAPHS:
        return EXTRA_GRAPHS[name](batch, **scenario.model.params)
    return graph_from_workload(resolve_workload(scenario.model, scenario.base_dir), batch)


DP_BASELINE = ("dp: PaSE's data-parallel configuration (every layer split by batch), played like pase and "
               "expert: each layer's weight gradient allreduced on its own as its backward ends")


def dp_baseline(scenario: Scenario) -> dict:
    """What the dp row (the speedups' baseline) is, how `ghpsim simulate`'s dp on the same p GPUs
    differs for this scenario, and the override that makes simulate play the same allreduces when
    the DDP buckets are the only difference (None otherwise)."""
    from simulator.kernel_catalogue import kernel_model_chosen
    strategy, training, cluster, costs = scenario.strategy, scenario.training, scenario.cluster, scenario.costs
    bucket_mib = strategy.bucket_size_bytes / 2**20
    fusion = (f"gradients fused into DDP buckets of strategy.bucket_size_bytes ({bucket_mib:g} MiB)"
              if strategy.gradient_fusion == "buckets" else "Horovod fusion (strategy.gradient_fusion)")
    differences = [fusion]
    if kernel_model_chosen(costs.model, cluster.gpu):
        differences.append("the kernel cost model (here: the roofline)")
    settings = {"training.recompute": (training.recompute, "none"),
                "strategy.overlap_backward": (strategy.overlap_backward, True),
                "strategy.collective": (strategy.collective, "auto"),
                "strategy.dp_sync": (strategy.dp_sync, "allreduce"),
                "strategy.gradient_compression": (strategy.gradient_compression, "none"),
                "cluster.topology": (cluster.topology, "two_tier")}
    differences += [f"{key} {value}" for key, (value, default) in settings.items() if value != default]
    if cluster.degraded_links or cluster.stragglers or any(gpu != cluster.gpu for gpu in cluster.node_gpus.values()):
        differences.append("the cluster's degraded links, stragglers or mixed GPUs")
    same = "strategy.bucket_size_bytes=1" if differences == [fusion] and strategy.gradient_fusion == "buckets" else None
    return {"description": DP_BASELINE, "simulate_dp_differs_by": differences, "simulate_dp_same_with": same}


def describe_dp_baseline(baseline: dict) -> str:
    """`dp_baseline` as one printed line."""
    text = f"{baseline['description']}; `ghpsim simulate`'s dp differs: {', '.join(baseline['simulate_dp_differs_by'])}"
    if baseline["simulate_dp_same_with"]:
        text += f" (with --set {baseline['simulate_dp_same_with']}, a bucket per layer, it plays this row's allreduces)"
    return text


def check_gpus(scenario: Scenario, num_devices: int) -> None:
    per_node = scenario.cluster.gpus_per_node
    if num_devices < 1 or num_devices > scenario.num_gpus:
        raise ScenarioError(f"--gpus: {num_devices} is not between 1 and the scenario's {scenario.num_gpus} GPUs")
    if num_devices > per_node and num_devices % per_node:
        raise ScenarioError(f"--gpus: {num_devices} spans part of a node; use at most {per_node} "
                            f"(cluster.gpus_per_node) or a multiple of it")


def link_for(scenario: Scenario, num_devices: int) -> tuple[str, float]:
    """(name, bytes/s) of the slower link tier that p devices span."""
    cluster = scenario.cluster
    intra = (cluster.intra_node_link.name, cluster.intra_node_link.bandwidth_bytes_per_s)
    if num_devices <= cluster.gpus_per_node:
        return intra
    inter = (cluster.inter_node_link.name,
             cluster.inter_node_link.bandwidth_bytes_per_s * cluster.nics_per_node)
    return min(intra, inter, key=lambda item: item[1])


def sub_topology(scenario: Scenario, num_devices: int) -> Topology:
    cluster = scenario.cluster
    per_node = min(num_devices, cluster.gpus_per_node)
    return Topology(num_devices // per_node, per_node, cluster.intra_node_link, cluster.inter_node_link,
                    cluster.nics_per_node)


def search_point(scenario: Scenario, graph: Graph, num_devices: int, simulate: bool = True,
                 max_table_entries: int = MAX_TABLE_ENTRIES) -> dict:
    """PaSE, expert and DP on p devices: cost, seconds, speedup over DP, search time, simulation."""
    check_gpus(scenario, num_devices)
    check_search_size(graph, num_devices)
    peak = scenario.cluster.gpu.peak_for(scenario.training.dtype)
    link, bandwidth = link_for(scenario, num_devices)
    settings = CostSettings(num_devices, dtype_bytes(scenario.training.dtype), peak / bandwidth)
    started = time.perf_counter()
    problem = build_problem(graph, settings)
    solution = dynamic_program(problem, max_table_entries)
    search_s = time.perf_counter() - started
    strategies = {"pase": [tuple(int(c) for c in problem.configs[v][i]) for v, i in enumerate(solution.choice)]}
    rows, times = [], {"pase": search_s}
    for name in ("expert", "dp"):
        started = time.perf_counter()
        strategies[name] = baseline_configs(graph, num_devices, name)
        choice_of(problem, strategies[name])
        times[name] = time.perf_counter() - started
    for name in STRATEGY_NAMES:
        row = {"strategy": name, **strategy_breakdown(graph, strategies[name], settings), "search_s": times[name]}
        row["analytic_s"] = row["cost_flops"] / peak
        if simulate:
            row["simulated_step_s"] = simulate_strategy(scenario, graph, strategies[name], num_devices)
        row["configs"] = {v.name: describe(v, c) for v, c in zip(graph.vertices, strategies[name])}
        rows.append(row)
    dp = rows[-1]
    for row in rows:
        row["speedup_vs_dp"] = dp["cost_flops"] / row["cost_flops"]
        if simulate:
            row["simulated_speedup_vs_dp"] = dp["simulated_step_s"] / row["simulated_step_s"]
    return {"num_gpus": num_devices, "link": link, "r_flops_per_byte": settings.flops_per_byte,
            "num_vertices": graph.num_vertices, "num_edges": len(graph.edges),
            "max_dependent_set": solution.max_dependent_set, "largest_table_entries": solution.largest_table,
            "configs_per_vertex_max": max(len(c) for c in problem.configs), "results": rows,
            "dp_devices": max(math.prod(config) for config in strategies["dp"])}


def dp_idle_note(point: dict, batch: int) -> str | None:
    """The line for a point whose dp baseline leaves devices idle: it splits the batch only by the
    largest divisor of p that divides it (`search.baseline_configs`), so speedups over it count
    those devices' idleness."""
    used, num_devices = point["dp_devices"], point["num_gpus"]
    if used >= num_devices:
        return None
    return (f"p={num_devices}: dp splits the batch of {batch} over {used} of the {num_devices} GPUs (the largest "
            f"divisor of p that divides it); the other {num_devices - used} idle, so speedups vs DP count that")


def simulate_strategy(scenario: Scenario, graph: Graph, strategy, num_devices: int) -> float:
    """Step time of a strategy's plan played by the engine (analytic roofline costs)."""
    topology = sub_topology(scenario, num_devices)
    training = scenario.training
    plan, workload = compile_pase_plan(graph, strategy, num_devices, dtype_bytes(training.dtype),
                                       topology.gpus_per_node)
    costs = AnalyticCosts(workload, scenario.cluster.gpu, training.dtype, training.optimizer,
                          scenario.costs.efficiency)
    result = Engine(plan, topology, costs).run()
    return max((span[5] for span in result.spans), default=0.0)
