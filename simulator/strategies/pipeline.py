"""Pipeline plans: G replicas (HyPar-Flow's replicas, GHP's groups) of an M-stage pipeline.

A replica's batch B/G is split into m micro-batches of b = B/(G m) samples; micro-batch i of
replica g holds samples [g B/G + i b, g B/G + (i + 1) b) of the global batch. Each rank runs the
order of its schedule (`simulator.schedules`): forwards and backwards of its model chunk(s) on one
micro-batch each, with the activation sent to the next chunk (key ("act", g, chunk, i)) and the
input gradient to the previous one (("grad", g, chunk, i)). The contract with the validator is
/work/notes/pipeline_contract.md (Awan et al., HyPar-Flow, ISC 2020; Narayanan et al., SC'21).

Synchronous kinds (gpipe, 1f1b, interleaved_1f1b) accumulate the m micro-batch gradients and
update once after the flush; with G > 1 each stage's G peers allreduce its gradients first, in
buckets during the last backward of each chunk (`strategy.overlap_backward`) or in one piece
after it. Asynchronous kinds (pipedream, spectrain, delayed_gradient) update after every
backward (after the peers' allreduce of that micro-batch's gradient when G > 1, keyed
("allreduce", stage, bucket, i)); spectrain predicts weights (an axpy) before each forward
("predict") and, staggered, before each backward ("repredict", also copied into the forward's weights).
Their runtime also passes over a chunk's weights per micro-batch (Compute phases costed by
`CostModel.weight_pass_s`): pipedream with stashing copies them before the forward ("stash"),
and every asynchronous kind adds the gradient of the weights a backward ran on onto the live
gradient after each backward segment ("accumulate"), before that segment's allreduce.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs import CostModel
from simulator.errors import ScenarioError
from simulator.limits import check_simulation_size
from simulator.placement import place_ranks
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan, Recv, Send, Stage
from simulator.schedules import Schedule, checked_schedule
from simulator.schedules.analysis import in_flight_counts, stage_metrics
from simulator.schedules.ir import PREDICT, UPDATE
from simulator.strategies.ghp import GridConfig, _ActionList, _check_grid, bucket_segments
from simulator.strategies.stage_partition import grid_partition
from simulator.topology import Topology
from simulator.workload import Workload, dtype_bytes

PREDICT_PHASE, REPREDICT_PHASE = "predict", "repredict"
"""Compute phases of SpecTrain's weight prediction before a forward (new tensors) and, staggered,
before a backward (written into the weights that micro-batch's forward ran on, so its graph reads
them); both costed by `CostModel.weight_pass_s`."""
STASH_PHASE, ACCUMULATE_PHASE = "stash", "accumulate"
"""Compute phases of the weight copy before a stashing forward and of the gradient accumulation
after an asynchronous backward segment."""


@dataclass(frozen=True)
class PipelineConfig:
    """What a pipeline plan needs from a scenario (see `simulator.scenario.StrategyConfig`)."""

    kind: str
    num_groups: int
    num_stages: int
    num_microbatches: int
    global_batch_size: int
    dtype: str
    num_virtual_stages: int = 1
    placement: str | tuple[int, ...] = "group_per_node"
    partition: str | tuple[int, ...] = "balanced"
    bucket_size_bytes: float = 25 * 2**20
    overlap_backward: bool = True
    collective: str = "auto"
    weight_stashing: bool = True
    weight_prediction: str = "staggered"
    recompute: str = "none"
    split_memory: object = None
    """`memory_floor.SplitMemory` of the plan: where its balanced split is over the device, the
    partition keeps to splits that fit (`GridConfig.split_memory`)."""

    @property
    def microbatch_size(self) -> float:
        return self.global_batch_size / (self.num_groups * self.num_microbatches)

    def grid(self, num_stages: int | None = None) -> GridConfig:
        return GridConfig(strategy=self.kind, num_groups=self.num_groups,
                          workers_per_group=num_stages or self.num_stages,
                          global_batch_size=self.global_batch_size, dtype=self.dtype, placement=self.placement,
                          partition=self.partition, bucket_size_bytes=self.bucket_size_bytes,
                          overlap_backward=self.overlap_backward, collective=self.collective,
                          num_microbatches=self.num_microbatches, num_virtual_stages=self.num_virtual_stages,
                          split_memory=self.split_memory, recompute=self.recompute)


def pipeline_config(scenario) -> PipelineConfig:
    """The PipelineConfig of a validated `Scenario` whose kind is a pipeline kind."""
    strategy, training = scenario.strategy, scenario.training
    groups, stages = scenario.grid()
    if strategy.gradient_fusion != "buckets":
        raise ScenarioError(f"strategy.gradient_fusion: {strategy.gradient_fusion} applies to kinds dp, mp and ghp "
                            "(pipeline replicas reduce gradients in DDP buckets)")
    collective = "parameter_server" if strategy.dp_sync == "parameter_server" else strategy.collective
    return PipelineConfig(
        kind=strategy.kind, num_groups=groups, num_stages=stages, num_microbatches=strategy.num_microbatches,
        global_batch_size=training.global_batch_size, dtype=training.dtype,
        num_virtual_stages=strategy.num_virtual_stages, placement=strategy.placement,
        partition=strategy.partition, bucket_size_bytes=strategy.bucket_size_bytes,
        overlap_backward=strategy.overlap_backward, collective=collective,
        weight_stashing=strategy.weight_stashing, weight_prediction=strategy.weight_prediction,
        recompute=training.recompute)


def compile_pipeline_plan(config: PipelineConfig, workload: Workload, topology: Topology, costs: CostModel,
                          symmetry=None) -> Plan:
    """Per-rank actions of G replicas x M stages following the schedule of `config.kind`; with
    `symmetry` (`simulator.grid_symmetry.grid_symmetry`): replica 0's M ranks alone, standing for
    every replica."""
    _check(config, workload, topology)
    groups, num_stages, v = config.num_groups, config.num_stages, config.num_virtual_stages
    schedule = checked_schedule(config.kind, num_stages, config.num_microbatches, v,
                                config.weight_prediction == "staggered")
    rank_to_device = place_ranks(config.placement, groups, num_stages, topology.gpus_per_node)
    # chunk c of replica g runs on rank g x M + (c mod M); the partitioner reads replica-major rows
    chunk_devices = tuple(rank_to_device[group * num_stages + chunk % num_stages]
                          for group in range(groups) for chunk in range(schedule.num_chunks))
    ranges = grid_partition(config.grid(schedule.num_chunks), workload, topology, costs, chunk_devices,
                        config.microbatch_size)
    stages = tuple(_stage(workload, ranges, j, num_stages, v) for j in range(num_stages))
    peers = [tuple(range(j, groups * num_stages, num_stages)) for j in range(num_stages)]  # shared per stage
    num_ranks, folded = groups * num_stages, {}
    if symmetry is not None:
        folded["symmetry"] = symmetry
        peers, num_ranks = [(j,) for j in range(num_stages)], num_stages
    first = _RankActions(config, workload, schedule, ranges, stages, 0, peers[0]).build()
    check_simulation_size(num_ranks, len(first))  # refused up front when the plan would not fit in memory
    actions = (first, *(_RankActions(config, workload, schedule, ranges, stages, rank, peers[rank % num_stages]).build()
                        for rank in range(1, num_ranks)))
    stashing = config.kind == "pipedream" and config.weight_stashing
    meta = {**folded, "placement": config.placement, "partition": [b - a for a, b in ranges],
            "schedule_kind": config.kind, "num_microbatches": config.num_microbatches,
            "num_virtual_stages": v, "asynchronous": schedule.asynchronous, "weight_stashing": stashing,
            "receives": "preposted",  # each rank's next receive posted one ahead, as pipeline runtimes do
            "interleaves_passes": schedule.interleaves_passes,
            **stage_metrics(schedule, stashing), **in_flight_counts(schedule)}
    return Plan(config.kind, groups, num_stages, stages, rank_to_device, actions,
                config.global_batch_size / groups, meta=meta)


def label_in_flight(pipeline: dict, meta: dict) -> None:
    """Set each row of a pipeline summary's "stages" (`simulator.schedules.steady_state`) to the
    plan's `in_flight_counts` (its meta: a pipeline or megatron plan counts them from the schedule it
    played; a long pipeline extended from a few micro-batches, `simulator.steady_extension`, only
    repeats windows of its verified steady state, whose counts the played schedule already reaches)."""
    keys = ("microbatches_in_flight", "chunk_passes_in_flight")
    pipeline["stages"] = [{"stage": row["stage"], **{key: meta[key][row["stage"]] for key in keys},
                           **{key: value for key, value in row.items() if key not in keys}}
                          for row in pipeline["stages"]]


def _check(config: PipelineConfig, workload: Workload, topology: Topology) -> None:
    _check_grid(config.grid(), workload, topology)
    group_batch = config.global_batch_size // config.num_groups
    if group_batch % config.num_microbatches:
        raise ScenarioError(f"strategy.num_microbatches: {config.num_microbatches} does not divide the group "
                            f"batch {group_batch} (training.global_batch_size / G)")
    chunks = config.num_stages * config.num_virtual_stages
    if config.kind == "interleaved_1f1b" and config.num_stages < 2:
        raise ScenarioError("strategy.kind: interleaved_1f1b needs at least 2 stages per replica (G < N)")
    if chunks > workload.num_layers:
        raise ScenarioError(f"strategy.num_virtual_stages: {config.num_stages} stages x {config.num_virtual_stages} "
                            f"chunks exceed the {workload.num_layers} layers of model {workload.name}")


def _stage(workload: Workload, ranges, index: int, num_stages: int, v: int) -> Stage:
    own = tuple(ranges[index::num_stages])
    params = sum(layer.num_params for a, b in own for layer in workload.layers[a:b])
    return Stage(index, own[0][0], own[-1][1], params, chunks=own if v > 1 else ())


class _RankActions:
    """Translates one rank's schedule ops into plan actions."""

    def __init__(self, config: PipelineConfig, workload: Workload, schedule: Schedule, ranges, stages, rank: int,
                 peers: tuple[int, ...]):
        self.config, self.workload, self.schedule, self.ranges = config, workload, schedule, ranges
        self.group, self.stage_index = divmod(rank, config.num_stages)
        self.stage = stages[self.stage_index]
        self.peers = peers
        """The ranks of this stage in every replica (one tuple shared by all of them)."""
        self.element_bytes = dtype_bytes(config.dtype)
        self.batch = config.microbatch_size
        self.builder = _ActionList()
        self.pending: list[int] = []
        self.last_backward: int | None = None
        self.num_buckets = 0
        ops = schedule.ranks[self.stage_index]
        self.final_backward = {op.chunk: position for position, op in enumerate(ops) if op.phase == BACKWARD}

    def rank_of(self, chunk: int) -> int:
        return self.group * self.config.num_stages + chunk % self.config.num_stages

    def build(self) -> tuple:
        for position, op in enumerate(self.schedule.ranks[self.stage_index]):
            start, end = self.ranges[op.chunk]
            if op.phase == FORWARD:
                self._forward(op, start, end)
            elif op.phase == BACKWARD:
                self._backward(op, start, end, position)
            elif op.phase == PREDICT:
                self.builder.add(Compute, phase=self._prediction_phase(position), layer_start=start, layer_end=end, batch=self.batch,
                                 microbatch=op.microbatch, num_params=self.stage.num_params)
            elif op.phase == UPDATE:
                self._update(op)
        return tuple(self.builder.actions)

    def _prediction_phase(self, position: int) -> str:
        """REPREDICT_PHASE for the prediction at `position` of this rank's order when a backward
        follows it (staggered SpecTrain), else PREDICT_PHASE."""
        ops = self.schedule.ranks[self.stage_index]
        following = ops[position + 1].phase if position + 1 < len(ops) else None
        return REPREDICT_PHASE if following == BACKWARD else PREDICT_PHASE

    def _forward(self, op, start: int, end: int) -> None:
        add, chunk, i = self.builder.add, op.chunk, op.microbatch
        deps = ()
        if chunk > 0:
            deps = (add(Recv, src=self.rank_of(chunk - 1), key=("act", self.group, chunk - 1, i),
                        label=f"recv act{i}"),)
        if self.config.kind == "pipedream" and self.config.weight_stashing:
            add(Compute, phase=STASH_PHASE, layer_start=start, layer_end=end, batch=self.batch, microbatch=i,
                num_params=self._params(start, end))
        # an asynchronous forward runs on a copy of the weights (stashed, predicted or aliased): its
        # num_params are those weights (`CostModel.copy_forward_s`); a synchronous one's stay 0
        forward = add(Compute, phase=FORWARD, layer_start=start, layer_end=end, batch=self.batch,
                      microbatch=i, deps=deps,
                      num_params=self._params(start, end) if self.schedule.asynchronous else 0)
        if chunk < self.schedule.num_chunks - 1:
            size = self.workload.layers[end - 1].output_elements_per_sample * self.batch * self.element_bytes
            add(Send, dst=self.rank_of(chunk + 1), size_bytes=size, key=("act", self.group, chunk, i),
                deps=(forward,), label=f"send act{i}")

    def _backward(self, op, start: int, end: int, position: int) -> None:
        add, chunk, i = self.builder.add, op.chunk, op.microbatch
        deps = ()
        if chunk < self.schedule.num_chunks - 1:
            deps = (add(Recv, src=self.rank_of(chunk + 1), key=("grad", self.group, chunk, i),
                        label=f"recv grad{i}"),)
        reduce_now = (self.config.num_groups > 1 and self.config.overlap_backward
                      and (self.schedule.asynchronous or self.final_backward[chunk] == position))
        bucket_bytes = self.config.bucket_size_bytes if reduce_now else float("inf")
        for seg_start, seg_end, size in bucket_segments(self.workload, start, end, self.element_bytes, bucket_bytes):
            self.last_backward = add(Compute, phase=BACKWARD, layer_start=seg_start, layer_end=seg_end,
                                     batch=self.batch, microbatch=i, deps=deps)
            deps = ()
            if self.schedule.asynchronous:
                self.last_backward = add(Compute, phase=ACCUMULATE_PHASE, layer_start=seg_start, layer_end=seg_end,
                                         batch=self.batch, microbatch=i, num_params=self._params(seg_start, seg_end))
            if reduce_now and size > 0:
                self._allreduce(size, i)
        if chunk > 0:
            size = self.workload.layers[start].input_elements_per_sample * self.batch * self.element_bytes
            add(Send, dst=self.rank_of(chunk - 1), size_bytes=size, key=("grad", self.group, chunk - 1, i),
                deps=(self.last_backward,), label=f"send grad{i}")

    def _params(self, start: int, end: int) -> int:
        return sum(layer.num_params for layer in self.workload.layers[start:end])

    def _allreduce(self, size_bytes: float, microbatch: int) -> None:
        key = ("allreduce", self.stage_index, self.num_buckets)
        if self.schedule.asynchronous:
            key += (microbatch,)
        label = f"allreduce b{self.num_buckets}" + (f" mb{microbatch}" if self.schedule.asynchronous else "")
        self.pending.append(self.builder.add(Collective, op="allreduce", ranks=self.peers, size_bytes=size_bytes,
                                             key=key, deps=(self.last_backward,),
                                             algorithm=self.config.collective, label=label))
        self.num_buckets += 1

    def _update(self, op) -> None:
        if self.config.num_groups > 1 and not self.config.overlap_backward and self.stage.num_params > 0:
            self._allreduce(self.stage.num_params * self.element_bytes, op.microbatch)
        if self.schedule.asynchronous:
            self.num_buckets = 0
        self.builder.add(Compute, phase=OPTIMIZER, layer_start=self.stage.layer_start,
                         layer_end=self.stage.layer_end, batch=self.batch, microbatch=op.microbatch,
                         deps=(self.last_backward, *self.pending), num_params=self.stage.num_params)
        self.pending = []
