"""Megatron-style 3D parallelism: tensor (t) x pipeline (p) x data (d) parallel plans, kind `megatron`.

N = t p d GPUs. Each of the d replicas trains on B / d samples in m micro-batches of
b = B / (d m) through a p-stage pipeline (schedule 1f1b, or interleaved_1f1b when
`num_virtual_stages` v > 1: Narayanan et al. SC'21, sec. 2.2); every stage is split over t
tensor-parallel ranks (`simulator.strategies.tensor_layers`: a TP rank computes its share of each
layer, and the TP group runs two allreduces per block per pass, or with sequence parallelism an
allgather + reduce-scatter pair instead of each). The TP collectives of one pass (a chunk's
forward or backward on one micro-batch) are one collective run `repeat` times, after the pass's
compute and before anything that needs its output: the same time as Megatron's interleaving of
per-block GEMMs and allreduces whenever the TP links carry nothing else (TP inside a node), and
they run on their own stream (Megatron's TP communicator), beside the data-parallel stream.
With `tp_comm_overlap` (Megatron / TransformerEngine `--tp-comm-overlap`, which needs sequence
parallelism: the allgathers and reduce-scatters are split and pipelined with the GEMMs beside
them) the pass's TP collectives start with its compute instead of after it, and what follows waits
for both: a pass takes max(compute, TP communication) instead of their sum (at pass granularity,
so the communication may also hide behind the pass's non-GEMM kernels: an upper bound on TE's overlap).
Pipeline transfers use the scatter/gather optimisation (SC'21, sec. 4.1): each TP rank sends 1/t
of the activation to its counterpart in the next stage. The d copies of a (stage, TP rank)
allreduce its gradients in buckets during the last backward of each chunk (as `simulator.strategies.pipeline`),
or with ZeRO-1 (Rajbhandari et al. SC'20, stage 1) reduce-scatter them (or allreduce: `zero1_gradient_reduce`),
update 1/d of the parameters and allgather the updated parameters; ZeRO-2 / ZeRO-3 (FSDP) are
`simulator.strategies.zero`'s (pp 1: per-micro-batch reduce-scatters; ZeRO-3 per-layer gathers).

Expert parallelism (`strategy.ep_degree` e, MoE models) is `simulator.strategies.experts`'s: the EP
groups are carved out of the d replicas, each pass's all-to-alls follow its compute as the TP
collectives do, and expert gradients are allreduced among d / e copies (ZeRO-1: reduce-scattered,
and the updated expert shards allgathered, among them).

Context parallelism (`strategy.cp_degree` c) is `simulator.strategies.context`'s: N = t c p d, the
field `dp` below counts the d c ranks that reduce each gradient (index dp' = replica x c + cp),
each running the share b / c of a micro-batch, with ring K/V transfers between the c ranks.

Rank layout (Megatron's order, tp fastest, then cp): device = replica x (p c t) + pp x (c t) + cp x t + tp with placement
group_per_node, so a TP group fills consecutive devices (one node on NVSwitch when t divides
gpus_per_node); an explicit placement lists the device of each such position. Plan ranks are
numbered as pipelines: rank = g x p + pp with g = dp x t + tp (G = d t pipelines of p stages;
`Plan.grid_position` gives (g, pp)).

Recomputed layers (`training.recompute`, `memory_activations.recompute_ranges`) run forward again before each
backward segment with their TP collectives; ids in `meta["recompute_actions"]`."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs import AnalyticCosts, CostModel
from simulator.errors import ScenarioError
from simulator.layout_geometry import resolved_placement
from simulator.limits import check_simulation_size
from simulator.memory_activations import recompute_ranges
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan, Recv, Send, Stage
from simulator.schedules import checked_schedule
from simulator.schedules.analysis import in_flight_counts, stage_metrics
from simulator.schedules.ir import UPDATE
from simulator.strategies import chain_reduction, context, experts, pass_tails, zero
from simulator.strategies.ghp import GridConfig, _ActionList, bucket_segments
from simulator.strategies.stage_partition import grid_partition
from simulator.strategies.tensor_clone import relabelled_actions, relabelled_ranks_alike
from simulator.strategies.tensor_layers import pass_collectives, rank_workload
from simulator.topology import Topology
from simulator.workload import Workload, dtype_bytes
from simulator.units import whole
from simulator.zero_config import gradient_reduce_op, reduce_dtype_of

KIND = "megatron"


@dataclass(frozen=True)
class TensorConfig:
    """What a megatron plan needs from a scenario (see `simulator.scenario.StrategyConfig`)."""

    tp: int
    pp: int
    dp: int
    num_microbatches: int
    global_batch_size: int
    dtype: str = "fp32"
    num_virtual_stages: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    zero1_gradient_reduce: str = "reduce_scatter"
    recompute: str = "none"
    placement: str | tuple[int, ...] = "group_per_node"
    partition: str | tuple[int, ...] = "balanced"
    bucket_size_bytes: float = 25 * 2**20
    overlap_backward: bool = True
    collective: str = "auto"
    symmetry: str = "auto"
    tp_comm_overlap: bool = False
    fsdp_sharding: str | None = None
    fsdp_reduce_dtype: str | None = None
    fsdp_version: int = 1
    """2: PyTorch FSDP2's copy passes (`simulator.strategies.zero.copies`); 1: flat buffers, none."""
    gpus_per_node: int = 1
    ep: int = 1  # expert-parallel degree (`simulator.strategies.experts`)
    cp: int = 1
    """Context-parallel degree (`simulator.strategies.context`); `dp` counts d x c ranks."""

    @property
    def schedule_kind(self) -> str:
        return "interleaved_1f1b" if self.num_virtual_stages > 1 else "1f1b"

    @property
    def num_pipelines(self) -> int:
        return self.dp * self.tp

    @property
    def microbatch_size(self) -> float:
        return self.global_batch_size / (self.dp * self.num_microbatches)

    def device_of(self, dp: int, pp: int, tp: int) -> int:
        replica, cp = divmod(dp, self.cp)
        position = ((replica * self.pp + pp) * self.cp + cp) * self.tp + tp
        return self.placement[position] if isinstance(self.placement, tuple) else position


def tensor_config(scenario) -> TensorConfig:
    strategy, training = scenario.strategy, scenario.training
    tp, pp, cp = strategy.tp_degree, strategy.pp_degree, strategy.cp_degree
    if strategy.num_groups is not None:
        raise ScenarioError(f"strategy.num_groups: {strategy.num_groups} is not used by kind megatron "
                            "(replicas d = GPUs / (tp_degree x pp_degree))")
    if strategy.tp_comm_overlap and tp > 1 and not strategy.sequence_parallel:
        raise ScenarioError("strategy.tp_comm_overlap: needs strategy.sequence_parallel (Megatron: \"Tensor parallel "
                            "communication/GEMM overlap can happen only when sequence parallelism is enabled\")")
    others = "dp, mp, ghp and the pipeline kinds"
    for section, key, allowed, kinds, how in (  # the other kinds' settings, which megatron does not play
            ("strategy", "gradient_fusion", ("buckets",), "dp, mp and ghp", "reduces gradients in DDP buckets"),
            ("strategy", "dp_sync", ("allreduce",), others, "reduces gradients with allreduce"),
            ("strategy", "gradient_compression", ("none",), others, "reduces dense gradients"),
            ("training", "memory_policy", ("none", "reuse"), others, "keeps each gradient until the update")):
        if (value := getattr(getattr(scenario, section), key)) not in allowed:
            raise ScenarioError(f"{section}.{key}: {value} applies to kinds {kinds}; megatron {how}")
    if strategy.placement == "stage_per_node":
        raise ScenarioError("strategy.placement: stage_per_node is not a megatron layout (use group_per_node: "
                            "tp fastest, then pp, then dp; tp_dp_pp: tp, then dp, then pp; or a device list)")
    placement = resolved_placement(strategy.placement, tp, pp, scenario.num_gpus // (tp * pp * cp), cp)
    return TensorConfig(
        tp=tp, pp=pp, dp=scenario.num_gpus // (tp * pp), cp=cp, num_microbatches=strategy.num_microbatches,
        global_batch_size=training.global_batch_size, fsdp_reduce_dtype=reduce_dtype_of(strategy),
        num_virtual_stages=strategy.num_virtual_stages, sequence_parallel=strategy.sequence_parallel,
        zero_stage=strategy.zero_stage, zero1_gradient_reduce=strategy.zero1_gradient_reduce,
        recompute=training.recompute, placement=placement, ep=strategy.ep_degree, partition=strategy.partition,
        bucket_size_bytes=strategy.bucket_size_bytes, dtype=training.dtype, overlap_backward=strategy.overlap_backward,
        collective=strategy.collective, symmetry=strategy.symmetry, tp_comm_overlap=strategy.tp_comm_overlap,
        fsdp_sharding=strategy.fsdp_sharding, gpus_per_node=scenario.cluster.gpus_per_node,
        fsdp_version=strategy.fsdp_version or (2 if strategy.fsdp_sharding else 1))


def rank_costs(costs: CostModel, workload: Workload, tp_degree: int, sequence_parallel: bool) -> CostModel:
    """The costs of one TP rank's share of the layers (`workload` = its rank workload): the kernel
    model expands each whole layer with the TP split (`simulator.kernels`), the analytic model
    times the shard. With tp_degree 1 a rank runs whole layers, so any cost model (a calibration
    profile's whole-layer times too) is used as it is."""
    from simulator.kernel_costs import KernelCosts
    if isinstance(costs, KernelCosts):
        return experts.expert_costs(costs.with_tensor_parallel(tp_degree, sequence_parallel), workload)
    if not isinstance(costs, AnalyticCosts):
        if tp_degree == 1:
            return costs
        raise ScenarioError(f"strategy.tp_degree: {tp_degree} needs a GPU cost model (a calibration profile times "
                            "whole layers, not their tensor-parallel shares)")
    return AnalyticCosts(workload, costs.gpu, costs.dtype, costs.optimizer, costs.efficiency,
                         recompute=costs.recompute, tp_degree=tp_degree)


def _check(config: TensorConfig, workload: Workload) -> None:
    replica_batch = config.global_batch_size * config.cp / config.dp
    if replica_batch != int(replica_batch) or int(replica_batch) % config.num_microbatches:
        raise ScenarioError(f"strategy.num_microbatches: {config.num_microbatches} micro-batches do not divide "
                            f"the replica batch {replica_batch:g} (training.global_batch_size / d, d = {config.dp // config.cp})")
    if config.pp * config.num_virtual_stages > workload.num_layers:
        raise ScenarioError(f"strategy.pp_degree: {config.pp} stages x {config.num_virtual_stages} chunks exceed the "
                            f"{workload.num_layers} layers of model {workload.name}")
    if config.num_virtual_stages > 1 and config.pp < 2:
        raise ScenarioError("strategy.num_virtual_stages: interleaving needs strategy.pp_degree >= 2")
    for key, what, why in (("num_heads", "attention heads", "whole heads across TP ranks"),
                           ("num_kv_heads", "key-value heads", "whole key-value groups across TP ranks")):
        for count in sorted({layer.spec[key] for layer in workload.layers if layer.spec.get(key)}):
            if count % config.tp:
                raise ScenarioError(f"strategy.tp_degree: {config.tp} does not divide the {count} {what} of "
                                    f"model {workload.name} (Megatron splits {why})")
    for seq_len in sorted({layer.spec["seq_len"] for layer in workload.layers if layer.spec.get("seq_len")}):
        if config.sequence_parallel and seq_len % (config.tp * config.cp):
            raise ScenarioError(f"strategy.sequence_parallel: sequence length {seq_len} is not divisible by tp_degree x "
                                f"cp_degree = {config.tp * config.cp} (Megatron splits the sequence over the TP ranks)")


def compile_tensor_plan(scenario, workload: Workload, topology: Topology, costs: CostModel) -> Plan:
    """The megatron plan: every rank, or one representative per pipeline stage when the run is
    symmetric (`simulator.symmetry`; then `meta["symmetry"]` says what each stands for)."""
    from simulator.memory_floor import tensor_split_memory
    from simulator.symmetry import symmetry_decision, symmetry_for
    config = tensor_config(scenario)
    _check(config, workload)
    experts.check_expert_parallel(config, workload)
    context.check_context_parallel(config, workload)
    shard = experts.expert_rank_workload(workload, rank_workload(workload, config.tp, config.sequence_parallel),
                                         config.tp, config.sequence_parallel, config.ep)
    schedule = checked_schedule(config.schedule_kind, config.pp, config.num_microbatches, config.num_virtual_stages)
    chunk_devices = tuple(config.device_of(0, chunk % config.pp, 0) for chunk in range(schedule.num_chunks))
    grid = GridConfig(KIND, 1, schedule.num_chunks, config.global_batch_size, config.dtype, partition=config.partition,
                      num_microbatches=config.num_microbatches, num_virtual_stages=config.num_virtual_stages,
                      split_memory=tensor_split_memory(scenario, config, shard),
                      overlap_backward=config.overlap_backward, chain_reduction=chain_reduction.for_config(config),
                      pass_tails=pass_tails.for_config(config, workload, topology, costs))
    ranges = grid_partition(grid, shard, topology, rank_costs(costs, shard, config.tp, config.sequence_parallel), chunk_devices, config.microbatch_size)
    stages = tuple(_stage(shard, ranges, j, config.pp, config.num_virtual_stages) for j in range(config.pp))
    full_devices = tuple(config.device_of(g // config.tp, j, g % config.tp)
                         for g in range(config.num_pipelines) for j in range(config.pp))
    symmetric, reason = symmetry_decision(scenario, config, topology, costs)
    pipelines = 1 if symmetric else config.num_pipelines
    shared: dict = {}  # TP collectives per (layers, pass) and bucket segments, alike on every rank
    builders = [_TensorRank(config, workload, shard, schedule, ranges, stages, rank, symmetric, shared)
                for rank in range(pipelines * config.pp)]
    first = builders[0].build()  # refused up front when the whole plan would not fit in memory
    check_simulation_size(len(builders), len(first), "" if symmetric else f" (not folded: {reason})")
    actions = (first, *(builder.build() for builder in builders[1:config.pp]))
    if relabelled_ranks_alike(config, workload):
        relabelled: dict = {}
        actions += tuple(relabelled_actions(actions[builder.stage_index], builders[builder.stage_index].recomputed,
                                            builder, relabelled) for builder in builders[config.pp:])
    else:
        actions += tuple(builder.build() for builder in builders[config.pp:])
    meta = {"placement": config.placement, "partition": [b - a for a, b in ranges], "recompute_granularity": "layer",
            "schedule_kind": config.schedule_kind, "num_microbatches": config.num_microbatches,
            "num_virtual_stages": config.num_virtual_stages, "asynchronous": False, "weight_stashing": False,
            **stage_metrics(schedule, False), **in_flight_counts(schedule), "rank_workload": shard, "recompute": config.recompute,
            "recompute_actions": {rank: builder.recomputed for rank, builder in enumerate(builders)},
            "tensor": {"tp_degree": config.tp, "pp_degree": config.pp, "dp_degree": config.dp // config.cp,
                       "ep_degree": config.ep, "cp_degree": config.cp,
                       "sequence_parallel": config.sequence_parallel, "zero_stage": config.zero_stage,
                       "schedule": config.schedule_kind, "microbatch_size": whole(config.microbatch_size * config.cp),
                       "fsdp_sharding": config.fsdp_sharding, "shard_degree": zero.shard_degree(config),
                       "fsdp_version": config.fsdp_version if zero.gathers_per_unit(config) else None},
            "zero": zero.memory_meta(config, shard, ranges),
            "gradient_element_bytes": zero.gradient_element_bytes(config.dtype, config.zero_stage,
                                                                  config.fsdp_reduce_dtype),
            "symmetry_decision": {"used": symmetric, "reason": reason}}
    if symmetric:
        meta["symmetry"] = symmetry_for(config, topology, full_devices)
    return Plan(KIND, pipelines, config.pp, stages, full_devices[:pipelines * config.pp], actions,
                config.global_batch_size / config.dp, meta=meta)  # per d' = d c rank


def _stage(shard: Workload, ranges, index: int, num_stages: int, v: int) -> Stage:
    own = tuple(ranges[index::num_stages])
    params = sum(layer.num_params for a, b in own for layer in shard.layers[a:b])
    return Stage(index, own[0][0], own[-1][1], params, chunks=own if v > 1 else ())


class _TensorRank:
    """One rank's actions (plan rank g p + j; a symmetric run has the ranks j of pipeline 0 only)."""

    def __init__(self, config: TensorConfig, workload, shard, schedule, ranges, stages, rank: int, symmetric: bool,
                 shared: dict):
        self.config, self.workload, self.shard, self.schedule, self.ranges = config, workload, shard, schedule, ranges
        self.shared, self.rank, self.symmetric = shared, rank, symmetric
        p, t = config.pp, config.tp
        self.pipeline, self.stage_index = divmod(rank, p)
        self.dp_index, tp_index = divmod(self.pipeline, t)
        self.stage = stages[self.stage_index]
        if symmetric:  # the representative plays its group's collectives alone (simulator.symmetry)
            self.tp_ranks = self.dp_ranks = (rank,)
        else:
            self.tp_ranks = tuple((self.dp_index * t + k) * p + self.stage_index for k in range(t))
            key = ("dp_ranks", self.stage_index, tp_index)  # one tuple shared by the d copies (linear in d)
            self.dp_ranks = shared.get(key) or shared.setdefault(
                key, tuple((e * t + tp_index) * p + self.stage_index for e in range(config.dp)))
        self.dp_key = (self.stage_index, tp_index)
        self.zero_groups = zero.zero_groups(config, self.dp_ranks, self.dp_index)
        self.zero_degree = zero.shard_degree(config)
        self.element_bytes = dtype_bytes(config.dtype)
        self.gradient_bytes = zero.gradient_element_bytes(config.dtype, config.zero_stage, config.fsdp_reduce_dtype)
        self.batch, self.builder = config.microbatch_size, _ActionList()
        self.recomputed: list[int] = []
        self.pending: list[int] = []
        self.last_backward: int | None = None
        self.num_buckets = self.num_tp = self.num_ring = 0
        self.tp_tail: tuple[int, ...] = ()
        """The latest TP collective: Megatron runs them on the compute stream, so the next compute waits."""
        self.compute_deps: tuple[int, ...] = ()
        """What the latest compute waits for, stream predecessor included (tp_comm_overlap: its TP collectives too)."""
        self.last_compute: tuple[int, ...] = ()
        ops = schedule.ranks[self.stage_index]
        self.final_backward = {op.chunk: n for n, op in enumerate(ops) if op.phase == BACKWARD}

    def rank_of(self, chunk: int) -> int:
        return self.pipeline * self.config.pp + chunk % self.config.pp

    def build(self) -> tuple:
        for position, op in enumerate(self.schedule.ranks[self.stage_index]):
            start, end = self.ranges[op.chunk]
            if op.phase == FORWARD:
                self._forward(op.chunk, op.microbatch, start, end)
            elif op.phase == BACKWARD:
                self._backward(op.chunk, op.microbatch, start, end, position)
            elif op.phase == UPDATE:
                self._update()
        return tuple(self.builder.actions)

    def _tp(self, start: int, end: int, phase: str, after: int) -> tuple[int, ...]:
        """A pass's TP collectives after its compute `after` (tp_comm_overlap: beside it); what its output awaits."""
        ring = context.ring_exchange(self, start, end, phase)  # CP ring K/V, beside the compute
        after = experts.expert_alltoalls(self, start, end, phase, after)  # MoE dispatch and combine
        if self.config.tp == 1:
            self.tp_tail = ring or self.tp_tail  # the pass's compute already waited for the former tail
            return (after, *ring)
        overlap = self.config.tp_comm_overlap
        compute, deps = after, (self.compute_deps if overlap else (after,))
        collectives = self.shared.get((start, end, phase))
        if collectives is None:
            collectives = self.shared[(start, end, phase)] = [
                (op, count, elements * self.batch * self.element_bytes / (self.config.tp if op == "allgather" else 1),
                 f"tp {op} x{count}")
                for op, count, elements in pass_collectives(self.workload, start, end, phase,
                                                            self.config.sequence_parallel)]
        for op, count, size, label in collectives:
            after = self.builder.add(Collective, op=op, ranks=self.tp_ranks, size_bytes=size, repeat=count,
                                     key=("tp", self.dp_index, self.stage_index, self.num_tp), deps=deps,
                                     algorithm="ring", label=label)
            deps = (after,)
            self.num_tp += 1
            self.tp_tail = (after,)
        self.tp_tail = ((*self.tp_tail, *ring) if collectives else ring or self.tp_tail)
        return ((compute, after) if overlap and collectives else (after,)) + ring

    def _compute(self, deps: tuple[int, ...] = (), **fields) -> int:
        self.compute_deps = (*deps, *self.tp_tail, *self.last_compute)
        self.last_compute = (self.builder.add(Compute, deps=(*deps, *self.tp_tail), batch=self.batch, **fields),)
        return self.last_compute[0]

    def _forward(self, chunk: int, i: int, start: int, end: int) -> None:
        if zero.gathers_per_unit(self.config):
            return zero.zero3_forward(self, i, start, end)
        add, deps = self.builder.add, ()
        if chunk > 0:
            deps = (add(Recv, src=self.rank_of(chunk - 1), key=("act", self.pipeline, chunk - 1, i),
                        label=f"recv act{i}"),)
        done = self._compute(deps, phase=FORWARD, layer_start=start, layer_end=end, microbatch=i)
        done = self._tp(start, end, FORWARD, done)
        if chunk < self.schedule.num_chunks - 1:
            size = self.workload.layers[end - 1].output_elements_per_sample * self.batch * self.element_bytes
            add(Send, dst=self.rank_of(chunk + 1), size_bytes=size / self.config.tp,
                key=("act", self.pipeline, chunk, i), deps=done, label=f"send act{i}")

    def _backward(self, chunk: int, i: int, start: int, end: int, position: int) -> None:
        if zero.gathers_per_unit(self.config):
            return zero.zero3_backward(self, i, start, end)
        add, deps = self.builder.add, ()
        if chunk < self.schedule.num_chunks - 1:
            deps = (add(Recv, src=self.rank_of(chunk + 1), key=("grad", self.pipeline, chunk, i),
                        label=f"recv grad{i}"),)
        reduce_now = self.config.dp > 1 and self.config.overlap_backward and (
            self.final_backward[chunk] == position or self.config.zero_stage == 2)  # ZeRO-2: every micro-batch
        bucket_bytes = self.config.bucket_size_bytes if reduce_now else float("inf")
        done = None
        segments = self.shared.get((start, end, bucket_bytes))
        if segments is None:
            segments = self.shared[(start, end, bucket_bytes)] = bucket_segments(
                self.shard, start, end, self.gradient_bytes, bucket_bytes)
        for seg_start, seg_end, size in segments:
            for a, b in recompute_ranges(self.shard, seg_start, seg_end, self.config.recompute):
                redo = self._compute(deps, phase=FORWARD, layer_start=a, layer_end=b, microbatch=i)
                self.recomputed.append(redo)
                deps = self._tp(a, b, FORWARD, redo)
            self.last_backward = self._compute(deps, phase=BACKWARD, layer_start=seg_start, layer_end=seg_end,
                                               microbatch=i)
            done = self._tp(seg_start, seg_end, BACKWARD, self.last_backward)
            deps = done
            if reduce_now and size > 0:
                self._reduce_gradients(experts.expert_gradients(self, seg_start, seg_end, size))
        if chunk > 0:
            size = self.workload.layers[start].input_elements_per_sample * self.batch * self.element_bytes
            add(Send, dst=self.rank_of(chunk - 1), size_bytes=size / self.config.tp,
                key=("grad", self.pipeline, chunk - 1, i), deps=done, label=f"send grad{i}")

    def _reduce_gradients(self, size_bytes: float) -> None:
        """A bucket's gradients among the d copies: allreduce or reduce-scatter (`zero_config.gradient_reduce_op`)."""
        op = gradient_reduce_op(self.config)
        self.pending.append(self.builder.add(
            Collective, op=op, ranks=self.dp_ranks, size_bytes=size_bytes, key=(op, *self.dp_key, self.num_buckets),
            deps=(self.last_backward,), algorithm=self.config.collective if op == "allreduce" else "ring",
            label=f"{op} b{self.num_buckets}"))
        self.num_buckets += 1

    def _update(self) -> None:
        params, dp = self.stage.num_params, self.config.dp
        if dp > 1 and not self.config.overlap_backward and params > 0 and not zero.gathers_per_unit(self.config):
            self._reduce_gradients(params * self.gradient_bytes)
        update = self._compute((self.last_backward, *self.pending), phase=OPTIMIZER, layer_start=self.stage.layer_start,
                               layer_end=self.stage.layer_end, microbatch=-1,
                               num_params=experts.zero1_update_params(self, params))
        if self.config.zero_stage in (1, 2) and dp > 1 and not zero.gathers_per_unit(self.config):
            # ZeRO-1/2: every replica gathers the others' updated shards
            params = experts.zero1_allgathers(self, params, update)  # expert shards over d / e, the rest over d
            self.builder.add(Collective, op="allgather", ranks=self.dp_ranks, size_bytes=params * self.element_bytes / dp,
                             key=("zero_allgather", *self.dp_key), deps=(update,), algorithm="ring",
                             label="zero allgather params")
