"""PaSE search: configurations, cost closed forms, GENERATESEQ, DP == exhaustive search, graphs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.pase.cost import CostSettings, consumer_blocks, edge_bytes, strategy_breakdown, vertex_cost
from simulator.pase.graph import enumerate_configs
from simulator.pase.graphs import (GraphBuilder, conv_layer, conv_vertex, fc_vertex, graph_from_workload, image_vertex,
                                   inception_v3_graph, token_linear_vertex, token_vertex)
from simulator.pase.search import (baseline_configs, brute_force, build_problem, choice_of,
                                   dynamic_program, generate_seq, strategy_cost)
from simulator.workload import Layer
from simulator.zoo import build_model
from simulator.zoo._ops import make_layer

B, N, K = 128, 1000, 4096


def fc_layer(name: str, fin: int, fout: int) -> Layer:
    return make_layer(name, "linear", 2 * fin * fout, fin * fout + fout, fin, fout, fin, {})


def fc_chain(sizes, batch=B) -> "Graph":
    """FC layers sizes[0] -> sizes[1] -> ... as a chain graph."""
    g = GraphBuilder("chain", batch)
    last = None
    for i, (fin, fout) in enumerate(zip(sizes, sizes[1:])):
        last = g.add(fc_vertex(fc_layer(f"fc{i}", fin, fout), batch, fin, fout), [] if last is None else [last])
    return g.graph()


def token_diamond(batch=8, seq=4, hidden=16) -> "Graph":
    """x -> (a, b) -> add: a diamond of token GEMMs merged by a residual add."""
    g = GraphBuilder("diamond", batch)

    def linear(name, inputs):
        layer = make_layer(name, "linear", 2 * hidden * hidden * seq, hidden * hidden, seq * hidden,
                           seq * hidden, seq * hidden, {})
        return g.add(token_linear_vertex(layer, batch, seq, hidden, hidden), inputs)

    x = linear("x", [])
    a, b = linear("a", [x]), linear("b", [x])
    add = make_layer("add", "elementwise", seq * hidden, 0, seq * hidden, seq * hidden, 0, {})
    g.add(token_vertex(add, "add", batch, seq, hidden), [a, b])
    return g.graph()


def skip_graph(batch=8) -> "Graph":
    """fc0 -> fc1 -> fc2 and fc0 -> fc2's add: a residual skip over one layer."""
    g = GraphBuilder("skip", batch)
    layers = [fc_layer(f"fc{i}", 64, 64) for i in range(2)]
    first = g.add(fc_vertex(layers[0], batch, 64, 64))
    second = g.add(fc_vertex(layers[1], batch, 64, 64), [first])
    add = make_layer("add", "elementwise", 64, 0, 64, 64, 0, {})
    vertex = token_vertex(add, "add", batch, 1, 64)
    g.add(vertex, [first, second])
    return g.graph()


# ----------------------------------------------------------------------------- configurations

def test_configuration_counts_are_compositions_of_log2_p():
    gemm = fc_chain([K, N]).vertices[0]
    conv = conv_vertex(conv_layer("c", 256, 256, (3, 3), (64, 64), pad=(1, 1))[0], B, 256, 256, (64, 64))
    for p, m in ((4, 2), (8, 3), (64, 6)):
        assert len(enumerate_configs(gemm, p)) == math.comb(m + 3, 3)
        assert len(enumerate_configs(conv, p)) == math.comb(m + 5, 5)
        configs = enumerate_configs(conv, p)
        assert (configs.prod(axis=1) <= p).all() and (p % configs == 0).all()
        assert tuple(configs[0]) == (p, 1, 1, 1, 1)  # ties go to data parallelism


def test_configurations_respect_extents():
    tiny = fc_chain([3, 2], batch=4).vertices[0]  # b=4, n=2, k=3
    configs = enumerate_configs(tiny, 8)
    assert configs[:, 0].max() == 4 and configs[:, 1].max() == 2 and configs[:, 2].max() == 2


# ----------------------------------------------------------------------------- cost closed forms

def test_gemm_layer_cost_closed_forms():
    graph = fc_chain([K, K, N])
    r, p = 500.0, 8
    settings = CostSettings(p, 4, r)
    second = graph.vertices[1]
    configs = np.array([(8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2)])
    cost = vertex_cost(graph, 1, configs, settings)
    compute = 3 * 2 * B * N * K / 8
    weights = second.layer.num_params * 4
    assert cost[0] == pytest.approx(compute + r * 2 * 7 / 8 * weights)  # weight gradient over b
    assert cost[1] == pytest.approx(compute + r * 2 * 7 / 8 * B * K * 4)  # input gradient over n
    assert cost[2] == pytest.approx(compute + r * 2 * 7 / 8 * B * N * 4)  # output over k
    mixed = 2 * 1 / 2 * (B * N / 4 + B * K / 4 + second.layer.num_params / 4)  # groups of 2
    assert cost[3] == pytest.approx(compute + r * mixed * 4)


def test_edge_cost_closed_forms():
    graph = fc_chain([K, K, N])
    edge, tensor = graph.edges[0], B * K * 4

    def cost(cu, cv, p=8):
        return edge_bytes(graph, edge, np.array([cu]), np.array([cv]), p, 4)[0, 0]

    assert cost((8, 1, 1), (8, 1, 1)) == 0
    assert cost((1, 8, 1), (1, 1, 8)) == 0  # out-split feeds the in-split one to one
    assert cost((8, 1, 1), (1, 1, 8)) == pytest.approx(2 * 7 / 64 * tensor)
    assert cost((1, 1, 8), (8, 1, 1)) == pytest.approx(7 / 8 * tensor)  # all hold it; gradient back
    assert cost((4, 1, 1), (8, 1, 1)) == pytest.approx((1 / 8 + 1 / 4) * tensor)  # idle devices 4-7


def test_concat_inputs_sit_at_their_channel_offsets():
    g = GraphBuilder("concat", 2)
    sources = [g.add(image_vertex(make_layer(f"s{i}", "elementwise", 0, 0, c, c, 0, {}), "pool", 2, c, (1, 1)))
               for i, c in enumerate((64, 32))]
    layer = make_layer("cat", "elementwise", 0, 0, 96, 96, 0, {})
    g.add(image_vertex(layer, "concat", 2, 96, (1, 1)), [(sources[0], 0.0, 96 / 64), (sources[1], 64 / 96, 3.0)])
    graph = g.graph()
    config = np.array([(1, 2, 1, 1)])
    low, high = consumer_blocks(graph.vertices[2], graph.edges[0], config, 2)
    assert (high - low)[0, :, 1] == pytest.approx([48 / 64, 16 / 64])
    low, high = consumer_blocks(graph.vertices[2], graph.edges[1], config, 2)
    assert (high - low)[0, :, 1] == pytest.approx([0.0, 1.0])


# ----------------------------------------------------------------------------- the search

def test_generate_seq_dependent_sets():
    chain = [{1}, {0, 2}, {1, 3}, {2}]
    assert generate_seq(chain) == [(0, {1}), (1, {2}), (2, {3}), (3, set())]
    diamond = [{1, 2}, {0, 3}, {0, 3}, {1, 2}]
    order = generate_seq(diamond)
    assert order[0] == (0, {1, 2}) and max(len(d) for _, d in order) == 2


@pytest.mark.parametrize("builder", [lambda: fc_chain([64, 32, 64, 16], batch=8), token_diamond, skip_graph],
                         ids=["chain", "diamond", "skip"])
@pytest.mark.parametrize("r", [1.0, 1e4])
def test_dynamic_program_equals_exhaustive_search(builder, r):
    problem = build_problem(builder(), CostSettings(4, 4, r))
    solution, exhaustive = dynamic_program(problem), brute_force(problem)
    assert solution.cost_flops == pytest.approx(exhaustive.cost_flops, rel=1e-12)
    assert strategy_cost(problem, solution.choice) == pytest.approx(solution.cost_flops, rel=1e-12)


def test_optimum_is_not_trivial_when_communication_is_dear():
    graph = fc_chain([K, K, N])
    problem = build_problem(graph, CostSettings(8, 4, 1000.0))
    solution = dynamic_program(problem)
    dp = strategy_cost(problem, choice_of(problem, baseline_configs(graph, 8, "dp")))
    assert solution.cost_flops < 0.5 * dp
    strategy = [tuple(problem.configs[v][i]) for v, i in enumerate(solution.choice)]
    assert strategy_breakdown(graph, strategy, problem.settings)["cost_flops"] == pytest.approx(solution.cost_flops)


def test_baselines():
    graph = graph_from_workload(build_model("alexnet"), B)
    dp, expert = baseline_configs(graph, 16, "dp"), baseline_configs(graph, 16, "expert")
    assert all(c[0] == 16 and math.prod(c) == 16 for c in dp)
    assert expert[:5] == dp[:5]
    assert all(c == (1, 16, 1) for c in expert[5:])  # b, n, k: output features split


# ----------------------------------------------------------------------------- graphs

def test_inception_v3_graph_matches_torchvision_and_searches_fast():
    graph = inception_v3_graph(B)
    assert graph.num_vertices >= 100
    assert sum(v.layer.num_params for v in graph.vertices) == 23_834_568  # torchvision, no aux head
    assert sum(1 for v in graph.vertices if v.kind == "concat") == 11
    problem = build_problem(graph, CostSettings(8, 4, 720.0))
    solution = dynamic_program(problem)
    dp = strategy_cost(problem, choice_of(problem, baseline_configs(graph, 8, "dp")))
    assert solution.max_dependent_set <= 3 and solution.cost_flops <= dp


@pytest.mark.parametrize("name, params", [("alexnet", {}), ("resnet50", {}), ("resnet20", {}),
                                          ("gpt2-small", {"num_layers": 2, "seq_len": 64})])
def test_zoo_graphs_keep_parameters_and_flops(name, params):
    workload = build_model(name, **params)
    graph = graph_from_workload(workload, 8)
    assert sum(v.layer.num_params for v in graph.vertices) == workload.num_params
    flops = sum(v.layer.forward_flops_per_sample for v in graph.vertices)
    assert flops == pytest.approx(workload.forward_flops_per_sample, rel=2e-3)
    assert all(e.src < e.dst for e in graph.edges)
    skips = len(graph.edges) - (graph.num_vertices - 1)
    assert skips == {"alexnet": 0, "resnet50": 16, "resnet20": 9, "gpt2-small": 4}[name]


# ----------------------------------------------------------------------------- the command

def test_search_table_labels_r_with_its_unit_and_refuses_a_repeated_size(capsys):
    from ghpsim.cli import main
    assert main(["search", "scenarios/pase_alexnet_1080ti.yaml", "--gpus", "4", "--no-simulate"]) == 0
    out = capsys.readouterr().out
    assert "link (r, FLOP/byte)" in out and "pcie3 (720)" in out
    assert main(["search", "scenarios/pase_alexnet_1080ti.yaml", "--gpus", "4,4", "--no-simulate"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "ghpsim: error: --gpus '4,4': 4 is given twice\n"
