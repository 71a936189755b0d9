"""Group hybrid parallelism (GHP) plans; data and model parallelism are its two corners.

N = G x M workers form G groups of M (Joo & Youn, IEEE Access 2021). Each group holds the whole
model split into M contiguous stages and trains on B/G samples, serially through its stages
(model parallelism: activations forward, their gradients backward). Worker j of every group holds
stage j; after backward the G peers of stage j allreduce stage j's gradients, in buckets as the
backward pass produces them (as PyTorch DDP does, Li et al. VLDB 2020), or fused as Horovod's
background thread fuses them (`gradient_fusion: horovod`, `simulator.strategies.fusion`), then
update. DP is G = N, M = 1; MP is G = 1, M = N.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from simulator.costs import BACKWARD, FORWARD, CostModel
from simulator.errors import ScenarioError
from simulator.limits import check_simulation_size
from simulator.heterogeneity import DeviceCosts
from simulator.memory_activations import recompute_ranges
from simulator.placement import place_ranks
from simulator.plan import OPTIMIZER, Collective, Compute, Plan, Recv, Send, Stage, action_from_fields
from simulator.strategies.fusion import (HOROVOD_CYCLE_TIME_S, HOROVOD_FUSION_THRESHOLD_BYTES,
                                         horovod_segments)
from simulator.strategies.stage_partition import grid_partition
from simulator.topology import Topology
from simulator.workload import Workload, dtype_bytes


@dataclass(frozen=True)
class GridConfig:
    """What a GHP-family plan needs from a scenario (see `simulator.scenario.StrategyConfig`)."""

    strategy: str
    num_groups: int
    workers_per_group: int
    global_batch_size: int
    dtype: str
    placement: str | tuple[int, ...] = "group_per_node"
    partition: str | tuple[int, ...] = "balanced"
    bucket_size_bytes: float = 25 * 2**20
    overlap_backward: bool = True
    collective: str = "auto"
    num_parameter_servers: int = 1
    gradient_fusion: str = "buckets"
    horovod_cycle_time_s: float = HOROVOD_CYCLE_TIME_S
    horovod_fusion_threshold_bytes: float = HOROVOD_FUSION_THRESHOLD_BYTES
    optimizer: str = "sgd"
    num_microbatches: int = 1
    """A flushed pipeline's micro-batches per step and chunks per device: how its balanced partition
    weighs the fill against the slowest chunk (`simulator.partition.flushed_partition`)."""
    num_virtual_stages: int = 1
    memory_bytes: float = 0.0
    """The device memory a stage may fill (`memory_buffers.usable_memory_bytes`): the serial
    partition's cap where above the balanced split's largest stage (`stage_partition.grid_partition`)."""
    split_memory: object = None
    """A flushed pipeline's `memory_floor.SplitMemory`: where its balanced split is over the device, the
    partition keeps to splits that are not (`stage_partition.grid_partition`); None: no such check."""
    chain_reduction: object = None
    """A megatron chain's `strategies.chain_reduction.ChainReduction`: the data-parallel rings its
    partition weighs after each stage's backward; None: no replicas, or not megatron."""
    pass_tails: object = None
    """A megatron chain's `strategies.pass_tails.PassTails`: the TP collectives after each pass and the
    recomputed forwards its partition weighs; None: those of `recompute` alone."""
    recompute: str = "none"
    """`training.recompute`: a flushed pipeline's partition weighs the forward its backward re-runs."""


def compile_grid_plan(config: GridConfig, workload: Workload, topology: Topology, costs: CostModel,
                      symmetry=None) -> Plan:
    """Per-rank actions of a G x M grid (DP, MP and GHP); with `symmetry` (`simulator.grid_symmetry.
    grid_symmetry`): replica 0's M ranks alone, standing for every replica."""
    groups, stages_per_group = config.num_groups, config.workers_per_group
    _check_grid(config, workload, topology)
    group_batch = config.global_batch_size / groups
    rank_to_device = place_ranks(config.placement, groups, stages_per_group, topology.gpus_per_node)
    ranges = grid_partition(config, workload, topology, costs, rank_to_device, group_batch)
    stages = tuple(Stage(j, a, b, sum(layer.num_params for layer in workload.layers[a:b]))
                   for j, (a, b) in enumerate(ranges))
    element_bytes = dtype_bytes(config.dtype)
    segments = _gradient_segments(config, workload, topology, costs, rank_to_device, stages, group_batch)
    # one peers tuple per stage, shared by its G ranks' collectives (a tuple per rank is quadratic in DP)
    peers = [tuple(range(stage, groups * stages_per_group, stages_per_group)) for stage in range(stages_per_group)]
    meta = {"placement": config.placement, "partition": [b - a for a, b in ranges]}
    fold = symmetry is not None
    if fold:
        meta["symmetry"] = symmetry
        peers = [(stage,) for stage in range(stages_per_group)]
    actions = []
    for rank in range(stages_per_group if fold else groups * stages_per_group):
        group, stage = divmod(rank, stages_per_group)
        actions.append(_rank_actions(config, workload, stages, group, stage, group_batch, element_bytes,
                                     segments[stage], peers[stage]))
        if rank == 0:  # refused up front when the whole plan would not fit in memory
            check_simulation_size(stages_per_group if fold else groups * stages_per_group, len(actions[0]))
    return Plan(config.strategy, groups, stages_per_group, stages, rank_to_device, tuple(actions), group_batch,
                meta=meta)


def _check_grid(config: GridConfig, workload: Workload, topology: Topology) -> None:
    groups, stages_per_group = config.num_groups, config.workers_per_group
    if groups * stages_per_group != topology.num_devices:
        raise ScenarioError(f"strategy.num_groups: {groups} groups x {stages_per_group} workers "
                            f"!= {topology.num_devices} GPUs")
    if stages_per_group > workload.num_layers:
        field = "strategy.num_groups" if config.strategy == "ghp" else "strategy.kind"
        raise ScenarioError(f"{field}: {config.strategy} with G={groups} puts {stages_per_group} workers in a "
                            f"group, more than the {workload.num_layers} layers of model {workload.name}")
    if config.global_batch_size % groups:
        raise ScenarioError(f"training.global_batch_size: {config.global_batch_size} is not divisible "
                            f"by the {groups} groups")


def _gradient_segments(config: GridConfig, workload: Workload, topology: Topology, costs: CostModel,
                       rank_to_device, stages: tuple[Stage, ...], batch: float) -> list[list[tuple[int, int, float]]]:
    """Per stage, the backward segments that each end with one gradient allreduce: DDP buckets,
    or Horovod's fused tensors on the cost model's timeline (slowest of the stage's G devices)."""
    element_bytes, num_stages = dtype_bytes(config.dtype), len(stages)
    if config.gradient_fusion != "horovod" or not config.overlap_backward:
        size = config.bucket_size_bytes if config.overlap_backward else float("inf")
        return [bucket_segments(workload, stage.layer_start, stage.layer_end, element_bytes, size) for stage in stages]
    device_costs = DeviceCosts(costs, topology)

    def pass_s(stage: int, layer: int, phase: str) -> float:
        devices = {rank_to_device[g * num_stages + stage] for g in range(config.num_groups)}
        return max(device_costs.compute_s(device, layer, phase, batch) for device in devices)

    def stage_s(stage: Stage, phase: str) -> float:
        return sum(pass_s(stage.index, i, phase) for i in range(stage.layer_start, stage.layer_end))

    forward_s = sum(stage_s(stage, FORWARD) for stage in stages)
    backward_s = [stage_s(stage, BACKWARD) for stage in stages]
    return [horovod_segments(workload, stage.layer_start, stage.layer_end, element_bytes,
                             forward_s + sum(backward_s[stage.index + 1:]),
                             lambda layer, j=stage.index: pass_s(j, layer, BACKWARD),
                             config.horovod_cycle_time_s, config.horovod_fusion_threshold_bytes)
            for stage in stages]


def _rank_actions(config: GridConfig, workload: Workload, stages: tuple[Stage, ...], group: int,
                  stage_index: int, batch: float, element_bytes: int, segments, peers: tuple[int, ...]) -> tuple:
    """Forward, backward in bucket segments with their allreduces (among `peers`, the ranks of this
    stage in every group), sends/receives, update."""
    builder = _ActionList()
    stage = stages[stage_index]
    last_stage = len(stages) - 1
    stride = len(stages)
    deps: tuple[int, ...] = ()
    if stage_index > 0:
        deps = (builder.add(Recv, src=group * stride + stage_index - 1, key=("act", group, stage_index - 1),
                            label="recv act"),)
    forward = builder.add(Compute, phase=FORWARD, layer_start=stage.layer_start, layer_end=stage.layer_end,
                          batch=batch, deps=deps)
    if stage_index < last_stage:
        size = workload.layers[stage.layer_end - 1].output_elements_per_sample * batch * element_bytes
        builder.add(Send, dst=group * stride + stage_index + 1, size_bytes=size,
                    key=("act", group, stage_index), deps=(forward,), label="send act")
    deps = ()
    if stage_index < last_stage:
        deps = (builder.add(Recv, src=group * stride + stage_index + 1, key=("grad", group, stage_index),
                            label="recv grad"),)
    horovod = {"cycle_s": config.horovod_cycle_time_s} if config.gradient_fusion == "horovod" else {}
    reductions = []
    last_backward = None
    for bucket, (start, end, size) in enumerate(segments):
        last_backward = builder.add(Compute, phase=BACKWARD, layer_start=start, layer_end=end,
                                    batch=batch, deps=deps)
        deps = ()
        if config.num_groups > 1 and size > 0:  # peers: all G ranks, or replica 0's standing for them
            reductions.append(builder.add(Collective, op="allreduce", ranks=peers,
                                          size_bytes=size, key=("allreduce", stage_index, bucket),
                                          deps=(last_backward,), algorithm=config.collective,
                                          label=f"allreduce b{bucket}", **horovod))
    if stage_index > 0:
        size = workload.layers[stage.layer_start].input_elements_per_sample * batch * element_bytes
        builder.add(Send, dst=group * stride + stage_index - 1, size_bytes=size,
                    key=("grad", group, stage_index - 1), deps=(last_backward,), label="send grad")
    builder.add(Compute, phase=OPTIMIZER, layer_start=stage.layer_start, layer_end=stage.layer_end,
                batch=batch, deps=(last_backward, *reductions), num_params=stage.num_params)
    return tuple(builder.actions)


def bucket_segments(workload: Workload, layer_start: int, layer_end: int, element_bytes: int,
                    bucket_size_bytes: float) -> list[tuple[int, int, float]]:
    """Backward order segments [(start, end, gradient bytes)], each closing one gradient bucket.

    Layers are visited last to first; a bucket closes once it holds >= bucket_size_bytes (DDP's
    bucket_cap_mb rule). The final segment takes the remaining layers.
    """
    segments = []
    end, size = layer_end, 0.0
    for index in range(layer_end - 1, layer_start - 1, -1):
        size += workload.layers[index].num_params * element_bytes
        if size >= bucket_size_bytes and index > layer_start:
            segments.append((index, end, size))
            end, size = index, 0.0
    segments.append((layer_start, end, size))
    return segments


class _ActionList:
    """A rank's actions as they are added. Each is built from a copy of its class's template
    instance dict (defaults in place, keys shared with every instance of the class) updated with the
    given fields: a frozen dataclass's __init__ sets its fields one by one, and a plan of a million
    actions spent a third of its compile time there. A call that misses a required field or names
    an unknown one goes through the class itself, which raises as it would."""

    _templates: dict = {}

    def __init__(self):
        self.actions: list = []

    def add(self, kind, **fields) -> int:
        action_id = len(self.actions)
        fields["id"] = action_id
        known = self._templates.get(kind)
        if known is None:
            known = self._templates[kind] = _template(kind)
        template, num_fields, required = known
        values = template.copy()
        values.update(fields)
        if len(values) != num_fields or not required <= fields.keys():
            self.actions.append(kind(**fields))
            return action_id
        self.actions.append(action_from_fields(kind, values))
        return action_id


def _template(kind) -> tuple[dict, int, frozenset]:
    """(the instance dict of a `kind` built with its defaults, None for the required fields; how
    many fields it has; the names of the required ones)."""
    fields = dataclasses.fields(kind)
    required = frozenset(f.name for f in fields if f.default is dataclasses.MISSING)
    return vars(kind(**dict.fromkeys(required))), len(fields), required


# ----------------------------------------------------------------------------- training options

def training_options(scenario) -> dict:
    """Keyword arguments of `apply_training_options` from a scenario. memory_policy "laysa"
    implies top-k compression (LaySA = memory reuse + sparse communication)."""
    strategy, training = scenario.strategy, scenario.training
    topk = strategy.gradient_compression == "topk" or training.memory_policy == "laysa"
    return {"recompute": training.recompute, "gradient_compression": "topk" if topk else "none",
            "compression_density": strategy.compression_density, "dtype": training.dtype,
            "optimizer": training.optimizer}


def apply_training_options(plan: Plan, workload: Workload, recompute: str = "none",
                           gradient_compression: str = "none", compression_density: float = 0.01,
                           dtype: str = "fp32", optimizer: str = "sgd") -> Plan:
    """Any plan with activation recomputation and/or top-k sparse gradient exchange.

    Recompute: a `Compute(phase="F")` of the recomputed layers right before each backward
    segment (ids in `meta["recompute_actions"][rank]`). Top-k: each dense `allreduce` becomes a
    top-k selection pass (`Compute(phase="topk")` over the bucket's `num_params` gradient elements,
    ids in `meta["selection_actions"][rank]`, see `simulator.sparse`) followed by an `allgather` of k values + k indices per rank; the dense
    size of each exchange is kept in `meta["topk"]["dense_bytes"]`.
    """
    if recompute == "none" and gradient_compression == "none":
        return plan
    from simulator.sparse import INDEX_BYTES, SELECTION_PHASE, sparse_payload_bytes
    element_bytes = dtype_bytes(dtype)
    meta = {**plan.meta, "recompute": recompute, "recompute_actions": {}, "selection_actions": {}}
    dense_bytes: dict[str, float] = {}
    new_actions = []
    for rank, actions in enumerate(plan.actions):
        by_id = {action.id: action for action in actions}
        builder, remap = _ActionList(), {}
        recomputed, selections = [], []
        for action in actions:
            deps = tuple(remap[dep] for dep in getattr(action, "deps", ()))
            if isinstance(action, Compute) and action.phase == BACKWARD:
                for start, end in recompute_ranges(workload, action.layer_start, action.layer_end, recompute):
                    recomputed.append(builder.add(Compute, phase=FORWARD, layer_start=start, layer_end=end,
                                                  batch=action.batch, microbatch=action.microbatch))
            if isinstance(action, Collective) and action.op == "allreduce" and gradient_compression == "topk":
                source = next((by_id[d] for d in action.deps if isinstance(by_id[d], Compute)), None)
                stage = plan.stages[plan.grid_position(rank)[1]]
                first, last = (source.layer_start, source.layer_end) if source else (stage.layer_start, stage.layer_end)
                selections.append(builder.add(
                    Compute, phase=SELECTION_PHASE, layer_start=first, layer_end=last, batch=0.0,
                    microbatch=source.microbatch if source else 0, deps=deps,
                    num_params=round(action.size_bytes / element_bytes)))
                key = ("allgather", *action.key[1:])
                dense_bytes[repr(key)] = action.size_bytes
                remap[action.id] = builder.add(
                    Collective, op="allgather", ranks=action.ranks, key=key, deps=(selections[-1],),
                    size_bytes=sparse_payload_bytes(action.size_bytes, compression_density, element_bytes),
                    algorithm="ring", label=action.label.replace("allreduce", "allgather"))
                continue
            fields = {name: getattr(action, name) for name in action.__dataclass_fields__ if name != "id"}
            if "deps" in fields:
                fields["deps"] = deps
            remap[action.id] = builder.add(type(action), **fields)
        meta["recompute_actions"][rank] = recomputed
        meta["selection_actions"][rank] = selections
        new_actions.append(tuple(builder.actions))
    if gradient_compression == "topk":
        meta["topk"] = {"density": compression_density, "value_bytes": element_bytes,
                        "index_bytes": INDEX_BYTES, "dense_bytes": dense_bytes}
    return replace(plan, actions=tuple(new_actions), meta=meta)
