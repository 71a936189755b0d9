"""Strategies compile a scenario into a `Plan` (per-rank ordered actions).

`STRATEGIES` maps `strategy.kind` to the (G, M) grid it runs on. dp, mp and ghp are GHP grids
(`simulator.strategies.ghp`): dp = (N, 1), mp = (1, N), ghp = (G, N / G). The pipeline kinds
(`simulator.strategies.pipeline`) run G = `num_groups` (default 1) replicas of an M = N / G stage
pipeline. megatron (`simulator.strategies.tensor`) runs d replicas x p stages x t tensor-parallel ranks.
"""

from __future__ import annotations

import dataclasses

from simulator.costs import CostModel
from simulator.errors import ScenarioError
from simulator.plan import Plan
from simulator.scenario import PIPELINE_KINDS
from simulator.strategies.ghp import GridConfig, apply_training_options, compile_grid_plan, training_options
from simulator.strategies.pipeline import compile_pipeline_plan, pipeline_config
from simulator.topology import Topology
from simulator.workload import Workload


def _dp_grid(num_gpus: int, num_groups: int | None) -> tuple[int, int]:
    return num_gpus, 1


def _mp_grid(num_gpus: int, num_groups: int | None) -> tuple[int, int]:
    return 1, num_gpus


def _ghp_grid(num_gpus: int, num_groups: int | None) -> tuple[int, int]:
    return num_groups, num_gpus // num_groups


def _pipeline_grid(num_gpus: int, num_groups: int | None) -> tuple[int, int]:
    groups = num_groups or 1
    return groups, num_gpus // groups


STRATEGIES = {"dp": _dp_grid, "mp": _mp_grid, "ghp": _ghp_grid,
              **{kind: _pipeline_grid for kind in PIPELINE_KINDS}}


def grid_config(scenario) -> GridConfig:
    """The GridConfig of a validated `Scenario` (dp, mp, ghp)."""
    from simulator.memory_buffers import usable_memory_bytes
    strategy, training = scenario.strategy, scenario.training
    if strategy.kind not in STRATEGIES or strategy.kind in PIPELINE_KINDS:
        raise ScenarioError(f"strategy.kind: {strategy.kind!r} is not a dp/mp/ghp grid")
    groups, workers = STRATEGIES[strategy.kind](scenario.num_gpus, strategy.num_groups)
    collective = "parameter_server" if strategy.dp_sync == "parameter_server" else strategy.collective
    return GridConfig(
        strategy=strategy.kind, num_groups=groups, workers_per_group=workers,
        global_batch_size=training.global_batch_size, dtype=training.dtype,
        placement=strategy.placement, partition=strategy.partition,
        bucket_size_bytes=strategy.bucket_size_bytes, overlap_backward=strategy.overlap_backward,
        collective=collective, num_parameter_servers=strategy.num_parameter_servers,
        gradient_fusion=strategy.gradient_fusion, horovod_cycle_time_s=strategy.horovod_cycle_time_s,
        horovod_fusion_threshold_bytes=strategy.horovod_fusion_threshold_bytes, optimizer=training.optimizer,
        memory_bytes=usable_memory_bytes(scenario))


def compile_plan(scenario, workload: Workload, topology: Topology, costs: CostModel) -> Plan:
    """The scenario's plan; meta["partition_note"] says where memory kept its balanced partition
    from the fastest split (`stage_partition.partition_notes`)."""
    from simulator.strategies.stage_partition import partition_notes
    with partition_notes() as notes:
        plan = _compiled_plan(scenario, workload, topology, costs)
    if notes:
        plan.meta["partition_note"] = notes[-1]
    return plan


def _compiled_plan(scenario, workload: Workload, topology: Topology, costs: CostModel) -> Plan:
    if scenario.strategy.kind == "megatron":  # tensor x pipeline x data parallelism
        from simulator.strategies.tensor import compile_tensor_plan
        return compile_tensor_plan(scenario, workload, topology, costs)
    if scenario.strategy.placement == "tp_dp_pp":  # the planner's megatron order (`simulator.layout_geometry`)
        raise ScenarioError(f"strategy.placement: tp_dp_pp is a rank order of kind megatron only; kind "
                            f"{scenario.strategy.kind} takes group_per_node, stage_per_node or a device list")
    from simulator.grid_symmetry import grid_fold_decision, grid_symmetry
    from simulator.placement import place_ranks
    pipeline = scenario.strategy.kind in PIPELINE_KINDS
    config = pipeline_config(scenario) if pipeline else grid_config(scenario)
    groups, stages = config.num_groups, (config.num_stages if pipeline else config.workers_per_group)
    rank_to_device = place_ranks(config.placement, groups, stages, topology.gpus_per_node)
    chunks = config.num_virtual_stages if pipeline else 1
    fold, reason = grid_fold_decision(scenario, groups, stages, costs, topology, rank_to_device, chunks)
    symmetry = grid_symmetry(groups, stages, rank_to_device, config.collective, chunks) if fold else None
    if pipeline:
        from simulator.memory_floor import pipeline_split_memory
        config = dataclasses.replace(config, split_memory=pipeline_split_memory(scenario, config, workload))
        plan = compile_pipeline_plan(config, workload, topology, costs, symmetry)
    else:
        plan = compile_grid_plan(config, workload, topology, costs, symmetry)
    if groups > 1:
        plan.meta["symmetry_decision"] = {"used": fold, "reason": reason}
    return apply_training_options(plan, workload, **training_options(scenario))
