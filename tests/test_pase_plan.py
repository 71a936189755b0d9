"""PaSE strategies as engine plans, and the `ghpsim search` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator import load_scenario
from simulator.engine import Engine
from simulator.pase.graphs import inception_v3_graph
from simulator.pase.run import search_point, simulate_strategy
from simulator.pase.search import baseline_configs
from simulator.plan import Collective, Send
from simulator.records import span_table
from simulator.strategies.pase_plan import compile_pase_plan
from simulator.topology import Topology
from tests.helpers import FixedCosts, link
from tests.test_pase import B, K, N, fc_chain

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
ALEXNET = str(SCENARIOS / "pase_alexnet_1080ti.yaml")


def actions_of(plan, kind):
    return [(rank, a) for rank, actions in enumerate(plan.actions) for a in actions if isinstance(a, kind)]


def test_data_parallel_plan_timeline():
    """F0 F1 B1 B0 at B/4 samples; weight allreduces in backward order on one comm stream."""
    graph = fc_chain([K, K, N])
    size_1 = (K * N + N) * 4
    bandwidth = 1.5 * size_1 / 0.1  # the ring moves 2 (4-1)/4 = 1.5 S per link: fc1's takes 0.1 s
    topology = Topology(1, 4, link(0.0, bandwidth), link(0.0, bandwidth))
    plan, _ = compile_pase_plan(graph, baseline_configs(graph, 4, "dp"), 4, 4, 4)
    assert not actions_of(plan, Send)
    spans = span_table(Engine(plan, topology, FixedCosts(1e-3)).run().spans)
    t0 = 1.5 * (K * K + K) * 4 / bandwidth
    assert spans["end_s"].max() == pytest.approx(0.064 + 0.064 + 0.1 + t0)
    rank0 = spans[(spans["rank"] == 0) & (spans["stream"] == "compute")]
    assert list(rank0["end_s"].round(9))[:4] == [0.032, 0.064, 0.128, 0.192]


def test_redistribution_pieces_are_the_missing_bytes():
    """b2 -> k2 on 2 devices: each device lacks a quarter of the activation, and of its gradient."""
    graph = fc_chain([K, K, N])
    plan, _ = compile_pase_plan(graph, [(2, 1, 1), (1, 1, 2)], 2, 4, 8)
    sends = actions_of(plan, Send)
    assert len(sends) == 4
    assert all(send.size_bytes == pytest.approx(B * K * 4 / 4) for _, send in sends)
    assert {(rank, send.dst) for rank, send in sends} == {(0, 1), (1, 0)}
    collectives = {(a.label.split()[1], a.ranks, a.size_bytes) for _, a in actions_of(plan, Collective)}
    assert ("out1", (0, 1), B * N * 4) in collectives  # fc1's output over its k split
    assert ("w0", (0, 1), (K * K + K) * 4) in collectives  # fc0's weight gradient over its b split
    spans = span_table(Engine(plan, Topology(1, 2, link(1e-6, 1e10), link(1e-6, 1e10)), FixedCosts(1e-6)).run().spans)
    assert (spans["stream"] == "send").sum() == 4


def test_many_pieces_become_one_collective_equivalent():
    graph = fc_chain([K, K, N])
    plan, _ = compile_pase_plan(graph, [(4, 1, 1), (1, 1, 4)], 4, 4, 4)
    gathers = [a for _, a in actions_of(plan, Collective) if a.op == "allgather"]
    assert len(gathers) == 2 * 4  # forward and backward, on every rank
    assert all(a.ranks == (0, 1, 2, 3) for a in gathers)
    # the busiest device lacks 3/16 of the tensor; each of its 3 ring peers brings a third
    assert all(a.size_bytes == pytest.approx(B * K * 4 * 3 / 16 / 3) for a in gathers)


def test_search_point_across_nodes_simulates_every_strategy():
    scenario = load_scenario(ALEXNET)
    from simulator.pase.run import graph_for_scenario
    point = search_point(scenario, graph_for_scenario(scenario), 16)
    rows = {row["strategy"]: row for row in point["results"]}
    assert point["link"] == "ib-edr"  # 16 devices span two nodes; EDR is slower than PCIe 3
    assert point["r_flops_per_byte"] == pytest.approx(11.34e12 / 12.5e9)
    assert rows["pase"]["cost_flops"] <= min(rows["expert"]["cost_flops"], rows["dp"]["cost_flops"])
    assert rows["dp"]["speedup_vs_dp"] == 1.0
    for row in rows.values():
        assert row["simulated_step_s"] >= row["compute_flops"] / 11.34e12
        assert row["analytic_s"] == pytest.approx(row["cost_flops"] / 11.34e12)


def test_inception_strategy_plays_without_deadlock():
    scenario = load_scenario(ALEXNET)
    graph = inception_v3_graph(32, image_size=139)
    step_s = simulate_strategy(scenario, graph, baseline_configs(graph, 8, "expert"), 8)
    assert step_s > 0


def test_search_command_json(capsys):
    code = main(["search", ALEXNET, "--gpus", "4,8", "--json", "--no-simulate"])
    out = capsys.readouterr().out
    assert code == 0
    points = json.loads(out)["points"]
    assert [p["num_gpus"] for p in points] == [4, 8]
    for point in points:
        costs = {row["strategy"]: row["cost_flops"] for row in point["results"]}
        assert costs["pase"] <= costs["expert"] and costs["pase"] <= costs["dp"]


@pytest.mark.parametrize("gpus", ["12", "128", "x"])
def test_search_command_rejects_bad_gpus(capsys, gpus):
    assert main(["search", ALEXNET, "--gpus", gpus]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ghpsim: error:") and "--gpus" in err and "\n" not in err


def test_repeated_blocks_share_edge_tables_and_plans_with_the_same_figures():
    """GPT-2 with 4 blocks: edges alike share one redistribution table in the search, and a
    strategy's plan shares pieces and groups among blocks alike; every cost and action is what each
    edge and rank gives when computed on its own."""
    import numpy as np

    from simulator.pase.cost import CostSettings, edge_cost
    from simulator.pase.graphs import graph_from_workload
    from simulator.pase.search import build_problem, dynamic_program
    from simulator.strategies import pase_plan
    from simulator.zoo import build_model
    graph = graph_from_workload(build_model("gpt2-small", num_layers=4, seq_len=64), 8)
    settings = CostSettings(num_devices=4, flops_per_byte=100.0, element_bytes=4)
    problem = build_problem(graph, settings)
    for edge in graph.edges:
        alone = edge_cost(graph, edge, problem.configs[edge.src], problem.configs[edge.dst], settings)
        shared = [e for e in graph.edges if (e.src, e.dst) == (edge.src, edge.dst)]
        if len(shared) == 1:
            assert np.array_equal(problem.pairs[(edge.src, edge.dst)], alone)
    fractions: dict = {}
    for edge in graph.edges:
        edge_cost(graph, edge, problem.configs[edge.src], problem.configs[edge.dst], settings, fractions)
    assert len(fractions) < len(graph.edges) / 2  # the blocks' edges are alike
    strategy = [tuple(problem.configs[i][k]) for i, k in enumerate(dynamic_program(problem).choice)]
    plan, _ = compile_pase_plan(graph, strategy, 4, 4, 2)
    assert actions_of(plan, Send) and len(set(strategy)) > 2  # a mixed strategy that redistributes
    layout = pase_plan._Layout(graph, strategy, 4)
    for index, vertex in enumerate(graph.vertices):
        coords, active = layout.coords[index], layout.active[index]
        axes = [vertex.index(d) for d in vertex.output]
        for rank in range(4):
            expected = tuple(int(r) for r in np.flatnonzero(active & (coords[:, axes] == coords[rank, axes]).all(axis=1)))
            assert layout.group(index, rank, vertex.output) == expected
    for edge in graph.edges:
        for backward in (False, True):
            pieces = pase_plan._pieces(graph, edge, strategy, 4, 2, backward)
            size = graph.vertices[edge.src].layer.output_elements_per_sample * graph.batch * 4
            sends = {(rank, a.dst, a.size_bytes) for rank, actions in enumerate(plan.actions) for a in actions
                     if isinstance(a, Send) and a.key[1:3] == ("B" if backward else "F", graph.edges.index(edge))}
            if not pase_plan._Transfers(pieces, size, 4).collective:
                assert sends == {(src, dst, fraction * size) for src, dst, fraction in pieces}
