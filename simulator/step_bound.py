"""A lower bound on a candidate layout's simulated step time, and a floor under its peak memory.

Both are cheap (no plan, no engine) and true bounds of what `simulator.simulate` returns, so the
layout search (`simulator.layout_search`) may drop a candidate whose bound exceeds a simulated time.

Step time. A synchronous pipeline of p ranks runs chunks c = 0 .. vp - 1 (chunk c on rank c mod p;
v = 1 and p = M for dp / mp / ghp, with m = 1). Per micro-batch, chunk c costs F_c (its forward
compute, then its tensor-parallel collectives: the next compute waits for them) and B_c (the
recomputed forward, the backward and their TP collectives); s_c and s'_c are the activation and
gradient transfers between chunks c and c + 1. Rank k's first op needs micro-batch 0's forward
through chunks 0 .. k - 1; its compute stream then runs all its m passes; its last op is the backward
of chunk k (every schedule's cool-down ends there), after which the gradient still crosses chunks
k - 1 .. 0 before rank 0's update U_0, while rank k itself waits for its last gradient buckets and
updates (the critical path of a pipeline flush, Narayanan et al. SC'21, sec. 2.2):

    T >= sum_{c<k} (F_c + s_c) + m sum_{c on k} (F_c + B_c) + max(tail_k, drain_k), at the k binding with R_k = 0
    drain_k = sum_{c<k} (s'_c + B_c) + R_0 + U_0 + AG_0,   tail_k = R_k + U_k + AG_k   (and host issue, below)

with R_k the data-parallel reduction left after the last backward (bucket i of the final backward
starts after its segment; the buckets run one after another on the stream; ZeRO-2 reduces every
micro-batch, which only adds; ZeRO-3 reduce-scatters each layer after its backward), AG the ZeRO-1/2
parameter allgather after the update (none for ZeRO-3, whose update is on the shard). With expert
parallelism (`simulator.strategies.experts`) the compute is the TP x EP rank's, R and AG count the
expert bytes over the d / e copies of each expert shard (the replicas e apart) and the rest over
all d, one after the other on the stream as the plan runs them, and each MoE layer's pass adds its
all-to-alls at link rate (`layout_geometry.expert_floors_s`). With context parallelism c
(`simulator.strategies.context`) a rank runs b / c of each micro-batch, the d c ranks of a stage reduce
and ZeRO-1-shard its gradients, and each pass takes at least its ring K/V sends to the next CP rank
(started with its compute; what follows waits for them): F_c, B_c >= that floor; the update waits
for the last pass's ring, the buckets only for its compute, so R_k is counted beyond the ring's
excess over it. ZeRO-3 full shard also has T >= its comm stream: m (2 allgathers + 1 reduce-scatter)
per unit, in series (`simulator.strategies.zero`); its gathers' waits are not counted, so the bound
stays below. Compute times are the engine's device times (per-layer, on the rank's GPU; SM
contention and stragglers only slow them); the host, which the engine lets run ahead, adds
T >= m x rank k's passes' host times, and a pass that receives its input lasts at least its host
time, except the final backward, whose bucket segments after the first are issued while their
predecessors' TP collectives run. Every transfer and collective is priced at link rate alone:
each flow phase the engine would play takes at least its latency plus its bytes at the bottleneck
link's share for its own sub-flows, so contention with other traffic can only add (max-min fairness
never exceeds capacity). A stage's data-parallel collectives are floored for its t TP ranks' groups
together, which run at once on shared links, with the algorithm the engine plays (NCCL's rail
decomposition for a gather or reduce-scatter across nodes). Asynchronous kinds (steady state, no
flush) get no bound (0).

Memory: a floor under each rank's peak, `simulator.memory_floor`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.collectives import choose_algorithm, gather_algorithm
from simulator.costs import BACKWARD, FORWARD, compute_parts
from simulator.heterogeneity import DeviceCosts
from simulator import memory_floor
from simulator.link_floors import LinkFloors
from simulator.memory_activations import recompute_ranges
from simulator.memory_buffers import usable_memory_bytes
from simulator.layout_geometry import (RememberedCosts, chain_partition, expert_floors_s, megatron_device,
                                      megatron_grid, ring_floors_s, tp_floors)
from simulator.partition import searched_partition
from simulator.placement import place_ranks
from simulator.schedules.ir import ASYNCHRONOUS_KINDS
from simulator.strategies.experts import expert_rank_workload, rank_expert_params
from simulator.strategies.ghp import GridConfig, bucket_segments
from simulator.strategies.stage_partition import grid_partition
from simulator.strategies.tensor import rank_costs
from simulator.strategies.tensor_layers import rank_workload
from simulator.zero_config import gradient_element_bytes, reduce_dtype_of
from simulator.workload import dtype_bytes

MEGATRON = "megatron"
SAFETY = 1 - 1e-9  # the flow model ends a flow within 1e-9 of its bytes; the bound keeps that much below


@dataclass(frozen=True)
class StepBound:
    """A lower bound on the step time and its parts on the binding rank."""

    step_s: float
    work_s: float  # compute of the binding rank (its m passes and update)
    comm_s: float  # tensor-parallel collectives, pipeline transfers and the exposed data-parallel tail
    bubble_s: float  # the rest but host_s: pipeline fill and drain compute, or idle
    host_s: float = 0.0  # the rest where the host's kernel issue paces the GPU


@dataclass
class _Geometry:
    """What a candidate's bound and memory floor share: chunk ranges, devices and per-layer costs."""

    ranges: list[tuple[int, int]]
    chain: list[int]  # device of rank k of replica 0 (TP rank 0)
    rings: list[tuple[int, ...]]  # stage k -> devices of its data-parallel copies (TP rank 0)
    tp_groups: list[tuple[int, ...]]
    workload: object  # the rank's workload (a TP shard for megatron)
    model: object  # the rank's cost model (TP share for megatron)
    dp_groups: list[tuple[tuple[int, ...], ...]]
    """Stage k -> its t TP ranks' data-parallel groups (`rings[k]` first), reducing at once (`symmetry`)."""

    def expert_groups(self, k: int, ep: int) -> tuple[tuple[int, ...], ...]:
        """Stage k's expert-data-parallel groups: every e-th copy of each DP group, all at once."""
        return tuple(ring[r::ep] for ring in self.dp_groups[k] for r in range(ep))


class BoundModel(LinkFloors):
    """Bounds of the candidates of one scenario on its N GPUs (costs and topology shared)."""

    def __init__(self, scenario, workload, topology, costs, costs_for=None):
        """`costs_for(megatron, selective)`: a candidate's cost model (`search_bounds.bound_model`), default `costs`."""
        self.scenario, self.workload, self.topology, self.costs = scenario, workload, topology, costs
        self.costs_for = costs_for or (lambda megatron, selective: costs)
        self.element = dtype_bytes(scenario.training.dtype)
        self.uniform_links = not scenario.cluster.degraded_links
        self._cache: dict = {}
        self.floor_layer_sums: dict = {}  # `simulator.memory_floor`: per recompute mode and sharding
        shared = getattr(costs, "shared_processors", None)
        self._compute_scale = min(1.0, shared.parallelism) if shared is not None else 1.0
        self._measured = getattr(costs, "communication", None)

    # ------------------------------------------------------------------ geometry
    def geometry(self, c) -> _Geometry:
        t, p, v, b = c.tp_degree, c.workers_per_group, c.num_virtual_stages, self.microbatch_size(c)
        key = ("geometry", MEGATRON if c.kind == MEGATRON else c.kind, t, self.sp(c), p, v, b, c.num_microbatches,
               c.placement, c.data_parallel, self.ep(c), c.cp_degree, self.recompute(c), self.zero(c))
        found = self._cache.get(key)
        if found is not None:
            return found
        strategy, scenario, chunks = self.scenario.strategy, self.scenario, p * v
        partition = searched_partition(strategy.partition, chunks)
        if c.kind == MEGATRON:
            d = self.dp_ranks(c)  # the d c ranks of a stage, dp' = replica x c + cp
            device = megatron_device(c.placement, t, p, c.data_parallel, c.cp_degree or 1)
            shard, model = self.rank_model(c)
            grid = megatron_grid(self, c, shard, partition, device, d)  # as the plan
            chunk_devices = tuple(device(0, chunk % p, 0) for chunk in range(chunks))
            ranges = chain_partition(self, grid, shard, model, chunk_devices, b)
            chain = [device(0, k, 0) for k in range(p)]
            rings = [tuple(device(e, k, 0) for e in range(d)) for k in range(p)]
            tp_groups = [tuple(device(0, k, i) for i in range(t)) for k in range(p)]
            dp_groups = [tuple(tuple(device(e, k, i) for e in range(d)) for i in range(t)) for k in range(p)]
        else:
            groups = c.num_groups
            placement = c.placement if c.kind in ("dp", "mp", "ghp") or groups > 1 else "group_per_node"
            rank_to_device = place_ranks(placement, groups, p, self.topology.gpus_per_node)
            grid = GridConfig(c.kind, groups, chunks, scenario.training.global_batch_size, scenario.training.dtype,
                              placement=placement, partition=partition, overlap_backward=strategy.overlap_backward,
                              optimizer=scenario.training.optimizer, num_parameter_servers=strategy.num_parameter_servers,
                              memory_bytes=usable_memory_bytes(scenario), num_microbatches=c.num_microbatches, num_virtual_stages=v,
                              collective="parameter_server" if strategy.dp_sync == "parameter_server" else strategy.collective)
            chunk_devices = tuple(rank_to_device[g * p + chunk % p] for g in range(groups) for chunk in range(chunks))
            shard, model = self.rank_model(c)
            memory = memory_floor.candidate_split_memory(self, c, shard)  # as the plan
            grid = replace(grid, split_memory=memory, recompute=self.recompute(c))
            ranges = grid_partition(grid, shard, self.topology, model, chunk_devices, b)
            chain = [rank_to_device[k] for k in range(p)]
            rings = [tuple(rank_to_device[g * p + k] for g in range(groups)) for k in range(p)]
            tp_groups, dp_groups = [(device,) for device in chain], [(ring,) for ring in rings]
        found = self._cache[key] = _Geometry(list(ranges), chain, rings, tp_groups, shard, model, dp_groups)
        return found

    def rank_model(self, c):
        """(workload, cost model) of one rank of candidate `c`: a megatron TP (x EP) rank's, else the whole model's."""
        selective, megatron = self.recompute(c) == "selective", c.kind == MEGATRON
        return self._tensor_model(*((c.tp_degree, self.sp(c), self.ep(c)) if megatron else (1, None, 1)), selective)

    def _tensor_model(self, t: int, sequence_parallel: bool | None, ep: int = 1, selective: bool = False):
        """(workload, cost model) of one TP (x EP) rank (t = 1, SP None: the whole model, not megatron),
        remembered where devices are alike (a mixed cluster's per-GPU models need the plain model)."""
        key = ("model", t, sequence_parallel, ep, selective)
        found = self._cache.get(key)
        if found is None:
            if sequence_parallel is None:
                shard, model = self.workload, self.costs_for(False, selective)
            else:
                shard = expert_rank_workload(self.workload, rank_workload(self.workload, t, sequence_parallel),
                                             t, sequence_parallel, ep)
                model = rank_costs(self.costs_for(True, selective), shard, t, sequence_parallel)
            found = self._cache[key] = (shard, model if self.scenario.cluster.node_gpus else RememberedCosts(model))
        return found

    def microbatch_size(self, c) -> float:
        batch = self.scenario.training.global_batch_size
        return batch / (self.dp_ranks(c) * c.num_microbatches)

    def dp_ranks(self, c) -> int:
        """Ranks reducing each gradient: the d replicas times the c CP ranks (`TensorConfig.dp`)."""
        return c.data_parallel * (c.cp_degree or 1)

    def recompute(self, c) -> str:
        return c.recompute or self.scenario.training.recompute

    def sp(self, c) -> bool:
        return self.scenario.strategy.sequence_parallel if c.sequence_parallel is None else c.sequence_parallel

    def ep(self, c) -> int:
        """Expert-parallel degree e (1 outside megatron)."""
        return 1 if c.kind != MEGATRON else self.scenario.strategy.ep_degree if c.ep_degree is None else c.ep_degree

    def experts(self, c, ranges, element: float | None = None) -> float:
        """Bytes of a rank's expert weights in `ranges` (`element` bytes each, default the dtype's):
        reduced and gathered over the d / e expert copies, not the d-replica ring
        (`simulator.strategies.experts`); 0 without EP."""
        ep = self.ep(c)
        return 0.0 if ep == 1 else rank_expert_params(self.workload, ranges, c.tp_degree, ep) * (element or self.element)

    def zero(self, c) -> int:
        return self.scenario.strategy.zero_stage if c.zero_stage is None else c.zero_stage

    def memory_floor_bytes(self, c) -> float:
        """Largest per-rank floor over the candidate's ranks (`simulator.memory_floor`)."""
        return memory_floor.memory_floor_bytes(self, c)

    def bound(self, c) -> StepBound:
        if c.kind in ASYNCHRONOUS_KINDS:
            return StepBound(0.0, 0.0, 0.0, 0.0)
        geo = self.geometry(c)
        p, v, m, b = c.workers_per_group, c.num_virtual_stages, c.num_microbatches, self.microbatch_size(c)
        fwd, bwd, tp_f, tp_b, host_f, host_b = self._layer_costs(c, geo, b)
        overlap = c.kind == MEGATRON and c.tp_degree > 1 and self.scenario.strategy.tp_comm_overlap \
            and self.sp(c)
        rc = self.recompute(c)
        chunks, redone, backs = [], [], []  # per chunk: (forward, forward TP, backward, backward TP); (device, host)
        for j, (start, end) in enumerate(geo.ranges):  # a pass that receives its input waits for its host too
            redo = [index for a, z in recompute_ranges(geo.workload, start, end, rc) for index in range(a, z)]
            redone.append(redo)
            back = sum(bwd[start:end]) + sum(fwd[i] for i in redo)
            backs.append((back, sum(host_b[start:end]) if j < len(geo.ranges) - 1 and not redo else 0.0))
            chunks.append((max(sum(fwd[start:end]), sum(host_f[start:end]) if j else 0.0), sum(tp_f[start:end]),
                           max(backs[j]), sum(tp_b[start:end]) + sum(tp_f[i] for i in redo)))

        def span(compute_s, tp_s):
            return max(compute_s, tp_s) if overlap else compute_s + tp_s

        ring_f, ring_b = ring_floors_s(self, c, geo, b, redone)
        f_pass = [max(span(cf, tf), ring) for (cf, tf, _, _), ring in zip(chunks, ring_f)]
        b_pass = [max(span(cb, tb), ring) for (_, _, cb, tb), ring in zip(chunks, ring_b)]
        b_last = [max(span(device, tb), ring, host) for (device, host), (_, _, _, tb), ring in zip(backs, chunks, ring_b)]
        excess = [max(ring - span(cb, tb), 0.0) for (_, _, cb, tb), ring in zip(chunks, ring_b)]
        # drain: megatron recomputes after the gradient arrives; the other kinds' recompute
        # (`simulator.strategies.ghp.apply_training_options`) waits for nothing and may run earlier
        last = len(geo.ranges) - 1
        b_chain = b_last if c.kind == MEGATRON else [max(span(sum(bwd[a:z]), sum(tp_b[a:z])), sum(host_b[a:z]) if j < last
                                                         else 0.0) for j, (a, z) in enumerate(geo.ranges)]
        sends, grads = self._transfers(c, geo, b)
        first_f = [sum(host_f[a:z]) for a, z in geo.ranges]  # the host issues chunk 0's from the step's start
        host_work = [m * sum(sum(host_f[a:z]) + sum(host_b[a:z]) + sum(host_f[i] for i in redone[j])
                             for j, (a, z) in enumerate(geo.ranges) if j % p == k) for k in range(p)]
        key = ("updates", id(geo), self.zero(c) if c.kind == MEGATRON and self.dp_ranks(c) > 1 else 0, c.num_groups > 1)
        updates = self._cache.get(key)
        if updates is None:
            updates = self._cache[key] = [self._update_s(c, geo, k) for k in range(p)]
        reduction0 = max(self._reduction_tail_s(c, geo, 0, overlap) - excess[0], 0.0)
        tail0 = reduction0 + updates[0][0] + updates[0][1]  # rank 0's update waits for its buckets too
        best = None
        for k in range(p):
            own = range(k, p * v, p)
            fill = sum(max(f_pass[j], first_f[j]) + sends[j] for j in range(k))  # first micro-batch: host too
            work = m * sum(f_pass[j] + b_pass[j] for j in own) - sum(b_pass[j] - b_last[j] for j in own)
            drain = sum(grads[j] + b_chain[j] for j in range(k)) + tail0
            update = updates[k][0] + updates[k][1]  # after its host issued every pass (reductions may overlap)
            issued = host_work[k] + max(drain - reduction0, update)
            value = fill + max(work + max(drain, update), issued)
            if best is None or value > best[0]:
                best = (value, k, fill, work, drain, issued)
        value, k, fill, work, drain, issued = best
        reduction = reduction0 if k == 0 else max(self._reduction_tail_s(c, geo, k, overlap) - excess[k], 0.0)
        tail = reduction + updates[k][0] + updates[k][1]
        step = max(fill + max(work + max(drain, tail), issued), self._zero3_stream_s(c, geo)) * SAFETY
        compute = m * sum(chunks[j][0] + chunks[j][2] for j in range(k, p * v, p)) + updates[k][0]
        waiting = reduction + updates[k][1] if tail >= drain else reduction0 + updates[0][1] + sum(grads[:k])
        comm = min(step - compute, work - m * sum(chunks[j][0] + chunks[j][2] for j in range(k, p * v, p))
                   + sum(sends[:k]) + waiting)
        rest = max(step - compute - comm, 0.0)
        host = min(max(issued - work - max(drain, tail), 0.0), rest)  # the host issues slower than the GPU works
        return StepBound(step, compute, max(comm, 0.0), rest - host, host)

    def _layer_costs(self, c, geo: _Geometry, b: float):
        """Per layer: forward and backward seconds on the slowest-free device of the chain (the engine's
        `compute_s`), and the TP collectives' floor after each pass."""
        key = ("layers", id(geo), b)
        found = self._cache.get(key)
        if found is not None:
            return found
        models = DeviceCosts(geo.model, self.topology)
        count = len(geo.workload.layers)
        fwd, bwd, host_f, host_b = [0.0] * count, [0.0] * count, [0.0] * count, [0.0] * count
        for k, (start, end) in enumerate(geo.ranges):
            model = models.model_of(geo.chain[k % len(geo.chain)])
            for index in range(start, end):  # device and host parts (the engine's `ActionDurations.parts`)
                (fwd[index], host_f[index]), (bwd[index], host_b[index]) = (
                    (part * self._compute_scale for part in compute_parts(model, index, phase, b))
                    for phase in (FORWARD, BACKWARD))
        tp_f, tp_b = [0.0] * count, [0.0] * count
        t = c.tp_degree if c.kind == MEGATRON else 1
        if t > 1:
            for k, (start, end) in enumerate(geo.ranges):
                group_f, group_b = tp_floors(self, geo.tp_groups[k % len(geo.tp_groups)], self.sp(c), b)
                tp_f[start:end], tp_b[start:end] = group_f[start:end], group_b[start:end]
        for index, floor in expert_floors_s(self, c, geo, b).items():  # after each pass, as the TP ones
            tp_f[index] += floor
            tp_b[index] += floor
        found = self._cache[key] = (fwd, bwd, tp_f, tp_b, host_f, host_b)
        return found

    def _transfers(self, c, geo: _Geometry, b: float) -> tuple[list[float], list[float]]:
        """Per chunk boundary c -> c + 1: the activation and the gradient transfer floors."""
        layers, t = self.workload.layers, (c.tp_degree if c.kind == MEGATRON else 1)
        sends, grads = [], []
        p = len(geo.chain)
        for j in range(len(geo.ranges) - 1):
            src, dst = geo.chain[j % p], geo.chain[(j + 1) % p]
            end, start = geo.ranges[j][1], geo.ranges[j + 1][0]
            sends.append(self.p2p_floor_s(src, dst, layers[end - 1].output_elements_per_sample * b * self.element / t))
            grads.append(self.p2p_floor_s(dst, src, layers[start].input_elements_per_sample * b * self.element / t))
        return sends + [0.0], grads + [0.0]

    def _update_s(self, c, geo: _Geometry, k: int) -> tuple[float, float]:
        """(update compute on the 1/d shard from ZeRO-1 (hybrid: 1/s, s <= d, so 1/d stays a floor),
        allgather floor of the updated parameters for ZeRO-1 and -2) of rank k."""
        p, v = c.workers_per_group, c.num_virtual_stages
        own = [geo.ranges[j] for j in range(k, p * v, p)]
        first, last = own[0][0], own[-1][1]
        params = sum(geo.workload.layers[i].num_params for a, z in own for i in range(a, z))
        model = DeviceCosts(geo.model, self.topology).model_of(geo.chain[k])
        if c.kind == MEGATRON:
            d = self.dp_ranks(c)
            sharded = self.zero(c) and d > 1
            update = model.optimizer_s(params / d if sharded else params, layers=(first, last))
            experts = self.experts(c, own)  # expert shards: over the d / e copies, before the rest
            copies = geo.expert_groups(k, self.ep(c))
            gather = self._gather_floor_s(geo.dp_groups[k], "allgather", (params * self.element - experts) / d) \
                if sharded and self.zero(c) < 3 else 0.0
            if gather and experts > 0 and len(copies[0]) > 1:
                gather += self._gather_floor_s(copies, "allgather", experts / len(copies[0]))
            return update * self._compute_scale, gather
        update = model.optimizer_s(params, layers=(first, last))
        if c.num_groups > 1:
            update += model.weight_pass_s("average", params, layers=(first, last))
        return update * self._compute_scale, 0.0

    def _gather_floor_s(self, groups, op: str, size_bytes: float) -> float:
        """Floor of a data-parallel collective run by all `groups` at once, with the algorithm the
        engine plays for them (`simulator.engine.Engine._phase_key`): its choice for an allreduce,
        NCCL's rail decomposition or a ring for the gathers and reduce-scatters."""
        if op == "allreduce":
            algorithm = choose_algorithm(self.topology, groups[0], self.scenario.strategy.collective)
        else:
            algorithm = f"{gather_algorithm(self.topology, groups[0])}_{op}"
        return self.collective_floor_s(groups, op, size_bytes, algorithm)

    def _zero3_stream_s(self, c, geo: _Geometry) -> float:
        """ZeRO-3 (full shard, so p = 1): the data-parallel comm stream runs every unit's two
        allgathers and its reduce-scatter per micro-batch one after another (`simulator.strategies.zero`)."""
        if c.kind != MEGATRON or self.dp_ranks(c) < 2 or self.zero(c) != 3 \
                or self.scenario.strategy.fsdp_sharding == "hybrid_shard":
            return 0.0
        d, total = self.dp_ranks(c), 0.0
        gradient = gradient_element_bytes(self.scenario.training.dtype, 3, reduce_dtype_of(self.scenario.strategy))
        for count in (layer.num_params for layer in geo.workload.layers if layer.num_params):
            total += 2 * self._gather_floor_s(geo.dp_groups[0], "allgather", count * self.element / d) \
                + self._gather_floor_s(geo.dp_groups[0], "reduce_scatter", count * gradient)
        return c.num_microbatches * total

    def _reduction_tail_s(self, c, geo: _Geometry, k: int, overlap: bool) -> float:
        """Data-parallel reduction still running after rank k's last backward (chunk k's)."""
        strategy = self.scenario.strategy
        peers = len(geo.rings[k])
        if peers < 2 or strategy.gradient_compression != "none" or strategy.dp_sync != "allreduce":
            return 0.0
        if c.kind in ("dp", "mp", "ghp") and strategy.gradient_fusion != "buckets":
            return 0.0
        start, end = geo.ranges[k]
        zero = self.zero(c) if c.kind == MEGATRON else 0
        if zero == 3 and self.scenario.strategy.fsdp_sharding == "hybrid_shard":
            return 0.0  # node-local shard groups: the d-replica ring is no floor of theirs
        op = "reduce_scatter" if zero else "allreduce"
        bucket_bytes = strategy.bucket_size_bytes if strategy.overlap_backward else float("inf")
        gradient = (gradient_element_bytes(self.scenario.training.dtype, zero, reduce_dtype_of(self.scenario.strategy))
                    if c.kind == MEGATRON else self.element)
        segments = bucket_segments(geo.workload, start, end, gradient, 0.0 if zero == 3 else bucket_bytes)
        experts = [self.experts(c, ((a, z),), gradient) for a, z, _ in segments]  # over the d / e copies
        copies = geo.expert_groups(k, self.ep(c))
        reduce_s = [(self._gather_floor_s(geo.dp_groups[k], op, size - expert) if size > expert else 0.0)
                    + (self._gather_floor_s(copies, op, expert) if expert > 0 and len(copies[0]) > 1 else 0.0)
                    for (_, _, size), expert in zip(segments, experts)]
        fwd, bwd, tp_f, tp_b, _, _ = self._layer_costs(c, geo, self.microbatch_size(c))
        rc = self.recompute(c)
        tail, after_s, queued_s = 0.0, 0.0, 0.0
        for index in range(len(segments) - 1, -1, -1):  # from the last segment run to the first
            seg_start, seg_end, _ = segments[index]
            backward, backward_tp = sum(bwd[seg_start:seg_end]), sum(tp_b[seg_start:seg_end])
            # bucket i starts once segment i's backward compute ends (its TP collectives may follow)
            own_tp = max(backward, backward_tp) - backward if overlap else backward_tp
            queued_s += reduce_s[index]
            tail = max(tail, queued_s - after_s - own_tp)
            redo = [i for a, z in recompute_ranges(geo.workload, seg_start, seg_end, rc) for i in range(a, z)]
            redo_s, redo_tp = sum(fwd[i] for i in redo), sum(tp_f[i] for i in redo)
            after_s += (max(redo_s, redo_tp) + max(backward, backward_tp)) if overlap \
                else redo_s + redo_tp + backward + backward_tp
        return tail
