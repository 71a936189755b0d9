"""PaSE's search: GENERATESEQ's vertex order and the dynamic program over it, plus the baselines.

Elango, PaSE, IPDPS 2021 (computing the strategy). The cost F(G, phi) is a sum of per-vertex and
per-edge terms, so the optimum is found by processing vertices one at a time:

* GENERATESEQ: every vertex starts with its neighbours as its dependent set D(v). Repeatedly
  take the unprocessed vertex with the smallest dependent set (ties: lowest index), append it to
  the sequence, and merge its dependent set into the sets of its dependents (each without itself
  and without v).
* Dynamic program along that sequence: the table of v(i) is indexed by the configurations of
  D(v(i)); an entry is the least cost of v(i) and of every earlier-processed vertex whose table
  involves v(i), given those configurations: min over C in C(v(i)) of t_l(v(i), C) + the edge
  costs between v(i) and D(v(i)) + the earlier tables that contain v(i). The last vertex of each
  connected component has an empty dependent set; its table is the optimum, and the argmin tables,
  read back in reverse order, give the strategy.
  Cost O(|V|^2 K^(M+1)) with K configurations per vertex and M = max |D| (the paper's bound;
  this implementation builds each table in O(K^(M+1)) numpy work).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from simulator.errors import ScenarioError
from simulator.pase.cost import CostSettings, edge_cost, vertex_cost
from simulator.pase.graph import Graph, config_index, enumerate_configs

MAX_TABLE_ENTRIES = 60_000_000
"""Cap on one DP table (K^(M+1) float64 entries, ~480 MB): beyond it the search refuses."""
MAX_SEARCH_ENTRIES = 4e9
"""Cap on the DP's table entries summed over the vertices, the search's work: GPT-3 175B (674
vertices) holds 9.3e8 on 64 GPUs and 3.1e9 on 128 (5 and 18 s of search on a 2-core host, about
6 ns an entry), so the cap is about 25 s; 256 GPUs would hold 9.0e9, 1,024 GPUs 5.8e10."""


@dataclass
class Problem:
    """The search space and the cost terms of one graph on p devices."""

    graph: Graph
    settings: CostSettings
    configs: list[np.ndarray]
    unary: list[np.ndarray]
    pairs: dict[tuple[int, int], np.ndarray]
    """(u, v) with u < v -> K_u x K_v edge cost (parallel edges summed)."""


def build_problem(graph: Graph, settings: CostSettings) -> Problem:
    configs = [enumerate_configs(v, settings.num_devices) for v in graph.vertices]
    unary = [vertex_cost(graph, i, configs[i], settings) for i in range(graph.num_vertices)]
    pairs: dict[tuple[int, int], np.ndarray] = {}
    fractions: dict = {}  # edges alike (a model's repeated blocks) share one redistribution table
    for edge in graph.edges:
        assert edge.src < edge.dst, "vertices must be in topological order"
        matrix = edge_cost(graph, edge, configs[edge.src], configs[edge.dst], settings, fractions)
        key = (edge.src, edge.dst)
        pairs[key] = pairs[key] + matrix if key in pairs else matrix
    return Problem(graph, settings, configs, unary, pairs)


def generate_seq(neighbours: list[set[int]]) -> list[tuple[int, frozenset[int]]]:
    """GENERATESEQ: the processing order and each vertex's dependent set when it is processed."""
    dependents = [set(n) for n in neighbours]
    remaining = set(range(len(neighbours)))
    order = []
    while remaining:
        vertex = min(remaining, key=lambda u: (len(dependents[u]), u))
        order.append((vertex, frozenset(dependents[vertex])))
        for other in dependents[vertex]:
            dependents[other] |= dependents[vertex]
            dependents[other] -= {other, vertex}
        remaining.remove(vertex)
    return order


def check_search_size(graph: Graph, num_devices: int) -> None:
    """ScenarioError naming --gpus when the DP on `num_devices` would exceed `MAX_SEARCH_ENTRIES`
    (counted from the configurations and GENERATESEQ's dependent sets, without building a table)."""
    sizes = [len(enumerate_configs(vertex, num_devices)) for vertex in graph.vertices]
    entries = sum(sizes[v] * math.prod(sizes[u] for u in dependents)
                  for v, dependents in generate_seq(graph.neighbours()))
    if entries > MAX_SEARCH_ENTRIES:
        raise ScenarioError(f"--gpus {num_devices}: PaSE's tables would hold ~{entries:.1e} entries over "
                            f"{graph.name}'s {graph.num_vertices} vertices (limit {MAX_SEARCH_ENTRIES:.0e}, about 25 s "
                            "of search on 2 cores); search fewer GPUs or a smaller model")


@dataclass
class Solution:
    cost_flops: float
    choice: list[int]
    """Configuration index per vertex."""
    max_dependent_set: int = 0
    largest_table: int = 0
    order: list[int] = field(default_factory=list)


def dynamic_program(problem: Problem, max_table_entries: int = MAX_TABLE_ENTRIES) -> Solution:
    """The optimum of F over all strategies, by the DP along GENERATESEQ's order."""
    sizes = [len(c) for c in problem.configs]
    order = generate_seq(problem.graph.neighbours())
    pool = [((v,), cost) for v, cost in enumerate(problem.unary)]
    pool += [(key, matrix) for key, matrix in problem.pairs.items()]
    constant, tables, largest = 0.0, [], 0
    for vertex, dependents in order:
        mine = [f for f in pool if vertex in f[0]]
        pool = [f for f in pool if vertex not in f[0]]
        scope = sorted(set().union(*(s for s, _ in mine)) - {vertex})
        assert set(scope) == dependents, "a table's index set is the GENERATESEQ dependent set"
        axes = [vertex, *scope]
        entries = math.prod(sizes[a] for a in axes)
        if entries > max_table_entries:
            name = problem.graph.vertices[vertex].name
            raise ScenarioError(f"--gpus: the PaSE table of vertex {name!r} would hold {entries:,} entries "
                                f"(dependent set of {len(scope)}), more than the cap {max_table_entries:,}")
        largest = max(largest, entries)
        total = np.zeros([sizes[a] for a in axes])
        for factor_scope, array in mine:
            total += _aligned(array, factor_scope, axes, sizes)
        best = total.argmin(axis=0)
        table = np.take_along_axis(total, best[None], axis=0)[0]
        tables.append((vertex, scope, best))
        if scope:
            pool.append((tuple(scope), table))
        else:
            constant += float(table)
    choice = [0] * len(sizes)
    for vertex, scope, best in reversed(tables):
        choice[vertex] = int(best[tuple(choice[u] for u in scope)])
    return Solution(constant, choice, max((len(d) for _, d in order), default=0), largest,
                    [v for v, _ in order])


def _aligned(array: np.ndarray, scope: tuple[int, ...], axes: list[int], sizes: list[int]) -> np.ndarray:
    """`array` (axes in `scope` order) transposed and broadcastable to the table's `axes`."""
    perm = sorted(range(len(scope)), key=lambda i: axes.index(scope[i]))
    shape = [sizes[a] if a in scope else 1 for a in axes]
    return array.transpose(perm).reshape(shape)


def strategy_cost(problem: Problem, choice: list[int]) -> float:
    """F of a strategy given as configuration indices, from the cost terms."""
    total = sum(float(problem.unary[v][i]) for v, i in enumerate(choice))
    return total + sum(float(m[choice[u], choice[v]]) for (u, v), m in problem.pairs.items())


def brute_force(problem: Problem) -> Solution:
    """Exhaustive search over every combination of configurations (small graphs only)."""
    best_cost, best_choice = math.inf, None
    for choice in itertools.product(*(range(len(c)) for c in problem.configs)):
        cost = strategy_cost(problem, list(choice))
        if cost < best_cost:
            best_cost, best_choice = cost, list(choice)
    return Solution(best_cost, best_choice)


def _largest_split(extent: int, num_devices: int) -> int:
    return max(c for c in range(1, num_devices + 1) if num_devices % c == 0 and c <= extent)


def baseline_configs(graph: Graph, num_devices: int, kind: str) -> list[tuple[int, ...]]:
    """Data parallelism ("dp": every vertex splits only the batch, by the largest divisor of p
    that fits it), or the "one weird trick" expert strategy ("expert", Krizhevsky 2014:
    data-parallel convolutions, model-parallel fully connected layers, i.e. their output
    dimension split p ways; every other vertex data-parallel)."""
    strategy = []
    for vertex in graph.vertices:
        config = [1] * len(vertex.dims)
        split_dim = "b"
        if kind == "expert" and vertex.kind == "linear":
            split_dim = vertex.out_feature
        axis = vertex.index(split_dim)
        config[axis] = _largest_split(vertex.dims[axis][1], num_devices)
        strategy.append(tuple(config))
    return strategy


def choice_of(problem: Problem, strategy: list[tuple[int, ...]]) -> list[int]:
    return [config_index(problem.configs[v], config) for v, config in enumerate(strategy)]
