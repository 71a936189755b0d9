"""PipeDream's partitioner (replicated stages) against brute force on small cases."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from simulator.errors import ScenarioError
from simulator.pipedream_partition import StageCosts, pipedream_partition


def _allreduce_s(size_bytes, replicas):
    return 2 * (replicas - 1) / replicas * size_bytes / 1e3 + 0.01 * (replicas - 1)


def _random_costs(rng, num_layers, with_memory=True):
    return StageCosts(
        compute_s=[rng.uniform(0.5, 3.0) for _ in range(num_layers)],
        gradient_bytes=[rng.choice([0.0, 100.0, 2000.0]) for _ in range(num_layers)],
        boundary_s=[rng.uniform(0.0, 1.0) for _ in range(num_layers)],
        allreduce_s=_allreduce_s,
        state_bytes=[rng.uniform(1, 4) for _ in range(num_layers)] if with_memory else (),
        weight_bytes=[rng.uniform(0.5, 1) for _ in range(num_layers)] if with_memory else (),
        activation_bytes=[rng.uniform(0.5, 2) for _ in range(num_layers)] if with_memory else ())


def _brute_force(costs, num_layers, num_workers, memory_bytes):
    """Every set of cuts and every replication vector using all workers."""
    best = math.inf
    for num_stages in range(1, min(num_layers, num_workers) + 1):
        for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
            bounds = (0, *cuts, num_layers)
            ranges = list(zip(bounds[:-1], bounds[1:]))
            if any(costs.memory_bytes(a, b, num_stages - s) > memory_bytes for s, (a, b) in enumerate(ranges)):
                continue
            for replicas in itertools.product(range(1, num_workers + 1), repeat=num_stages):
                if sum(replicas) == num_workers:
                    best = min(best, max(costs.time_s(a, b, r) for (a, b), r in zip(ranges, replicas)))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dynamic_program_equals_brute_force(seed):
    rng = random.Random(seed)
    num_layers, num_workers = rng.randint(1, 6), rng.randint(1, 5)
    costs = _random_costs(rng, num_layers)
    memory = rng.choice([math.inf, 12.0, 20.0])
    expected = _brute_force(costs, num_layers, num_workers, memory)
    if math.isinf(expected):
        with pytest.raises(ScenarioError, match="cluster.gpu.memory_bytes: no PipeDream partition"):
            pipedream_partition(costs, num_workers, memory)
        return
    partition = pipedream_partition(costs, num_workers, memory)
    assert partition.slowest_stage_s == pytest.approx(expected, rel=1e-12)
    stages = partition.stages
    assert stages[0].layer_start == 0 and stages[-1].layer_end == num_layers
    assert all(a.layer_end == b.layer_start for a, b in zip(stages, stages[1:]))
    assert sum(stage.num_replicas for stage in stages) == num_workers
    assert all(stage.memory_bytes <= memory for stage in stages)


def test_a_heavy_layer_without_parameters_is_replicated():
    # An 8 s layer without weights between two 1 s layers with large gradients (an allreduce of
    # both among 4 would take 15 s), 4 workers: replicating only the heavy layer, 2 ways, gives
    # stages of 1, (8 + 0.01 latency) / 2 and 1 s (one 4-way stage: (10 + 15.03) / 4 s; 3 + 1 ways: 4.12 s).
    costs = StageCosts(compute_s=[1.0, 8.0, 1.0], gradient_bytes=[5000.0, 0.0, 5000.0], boundary_s=[0.0, 0.0, 0.0],
                       allreduce_s=_allreduce_s)
    partition = pipedream_partition(costs, 4)
    assert [(s.layer_start, s.layer_end, s.num_replicas) for s in partition.stages] == [(0, 1, 1), (1, 2, 2), (2, 3, 1)]
    assert partition.slowest_stage_s == pytest.approx(4.005)


def test_memory_forces_more_stages():
    # Without a memory limit one replicated stage is best (no boundary); each layer's state takes
    # 10 bytes, so with 15 bytes per worker only a stage per layer fits.
    costs = StageCosts(compute_s=[2.0, 2.0], gradient_bytes=[0.0, 0.0], boundary_s=[0.5, 0.5],
                       allreduce_s=_allreduce_s, state_bytes=[10.0, 10.0])
    assert len(pipedream_partition(costs, 2).stages) == 1
    partition = pipedream_partition(costs, 2, memory_bytes=15.0)
    assert [(s.layer_start, s.layer_end, s.num_replicas) for s in partition.stages] == [(0, 1, 1), (1, 2, 1)]
    assert partition.slowest_stage_s == pytest.approx(2.5)
