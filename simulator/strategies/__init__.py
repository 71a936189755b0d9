"""Strategies compile a scenario into a `Plan` (per-rank ordered actions).

`STRATEGIES` maps `strategy.kind` to the (G, M) grid it runs on; every kind so far is a GHP grid
(`simulator.strategies.ghp`): dp = (N, 1), mp = (1, N), ghp = (G, N / G).
"""

from __future__ import annotations

from simulator.costs import CostModel
from simulator.errors import ScenarioError
from simulator.plan import Plan
from simulator.strategies.ghp import GridConfig, compile_grid_plan
from simulator.topology import Topology
from simulator.workload import Workload


def _dp_grid(num_gpus: int, num_groups: int | None) -> tuple[int, int]:
    return num_gpus, 1


def _mp_grid(num_gpus: int, num_groups: int | None) -> tuple[int, int]:
    return 1, num_gpus


def _ghp_grid(num_gpus: int, num_groups: int | None) -> tuple[int, int]:
    return num_groups, num_gpus // num_groups


STRATEGIES = {"dp": _dp_grid, "mp": _mp_grid, "ghp": _ghp_grid}


def grid_config(scenario) -> GridConfig:
    """The GridConfig of a validated `Scenario`."""
    strategy, training = scenario.strategy, scenario.training
    if strategy.kind not in STRATEGIES:
        raise ScenarioError(f"strategy.kind: {strategy.kind!r} is not implemented yet")
    groups, workers = STRATEGIES[strategy.kind](scenario.num_gpus, strategy.num_groups)
    collective = "parameter_server" if strategy.dp_sync == "parameter_server" else strategy.collective
    return GridConfig(
        strategy=strategy.kind, num_groups=groups, workers_per_group=workers,
        global_batch_size=training.global_batch_size, dtype=training.dtype,
        placement=strategy.placement, partition=strategy.partition,
        bucket_size_bytes=strategy.bucket_size_bytes, overlap_backward=strategy.overlap_backward,
        collective=collective, num_parameter_servers=strategy.num_parameter_servers)


def compile_plan(scenario, workload: Workload, topology: Topology, costs: CostModel) -> Plan:
    return compile_grid_plan(grid_config(scenario), workload, topology, costs)
