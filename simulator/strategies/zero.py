"""Sharded data parallelism in megatron plans: ZeRO-2, ZeRO-3 / PyTorch FSDP (full, grad-op and hybrid shard).

Stages (Rajbhandari et al., "ZeRO", SC'20, sec. 5), over the s = d replicas that hold one shard each
(hybrid_shard: s = the replicas within one node; the s-groups of different nodes are replicas):
- ZeRO-1 (`simulator.strategies.tensor`): gradients reduce-scattered per DDP bucket after the last
  backward, 1/s of the parameters updated, the updated parameters allgathered.
- ZeRO-2: as ZeRO-1, but the gradients are kept sharded, so every micro-batch's buckets are
  reduce-scattered as its backward produces them (DeepSpeed reduces each micro-batch's gradients
  into the partition).
- FSDP SHARD_GRAD_OP (`fsdp_sharding: shard_grad_op`, stage 2; FSDP2 `reshard_after_forward=False`):
  the same states sharded as ZeRO-2, but the parameters are sharded outside computation: each
  unit's are allgathered before its forward (prefetched as below), kept through its backward and
  resharded after it, and its gradients reduce-scattered after its backward; no allgather follows
  the update (PyTorch FSDP docs, `ShardingStrategy.SHARD_GRAD_OP`). Same bytes as ZeRO-2, at other
  times: beside the forward instead of after the update.
- ZeRO-3 / FSDP FULL_SHARD (Zhao et al., "PyTorch FSDP", VLDB'23, sec. 3-4): parameters stay
  sharded; one FSDP unit = one layer of the workload (FSDP wraps each transformer block). Before
  each unit's forward and again before its backward its parameters are allgathered over the shard
  group (FSDP reshards after forward, so with gradient accumulation this repeats per micro-batch);
  the next unit's allgather is issued when the current unit's compute starts (forward prefetch of
  one unit; backward_prefetch=BACKWARD_PRE: the previous unit's gather is issued when this unit's
  backward starts), so gathers run on the data-parallel comm stream beside compute. After each
  unit's backward its gradients are reduce-scattered (HYBRID_SHARD: then its gradient shard
  allreduced among the node groups, FSDP sec. 3.2.2); the optimizer steps on the 1/s shard and no
  allgather follows. Per device per step: 2 allgathers + 1 reduce-scatter of the parameters,
  3 (s-1)/s Psi bytes in ring-volume terms, 1.5x DP's allreduce 2 (s-1)/s Psi (ZeRO sec. 7.2.2).

Copies (`strategy.fsdp_version`): PyTorch FSDP2 (`fully_shard`, per-parameter shards) copies each
gathered unit out of the all-gather buffer into its parameters before the unit computes, and each
unit's gradients into the reduce-scatter buffer (cast to the reduce dtype) before its
reduce-scatter, both on the compute stream (torch `_fsdp_collectives.py`: `split_with_sizes_copy`
in `foreach_all_gather_copy_out`, `_chunk_cat` in `foreach_reduce`): memory-bound passes
(`simulator.costs.WEIGHT_PASS_WORDS`); with a profile calibrated `--fsdp`, each copy pass also carries
FSDP2's host work for the collective it goes with (`simulator.profile_costs`). FSDP1's FlatParameter and DeepSpeed's ZeRO-3 gather into
flat buffers whose views are the parameters and reduce the flat gradient in place: no copies
(version 1, the default of `zero_stage` without `fsdp_sharding`).

Memory (`shard_memory`, the summary's post-hoc adjustment of `simulator.memory`'s persistent
categories, ZeRO Fig. 1): fp32 master weights and optimizer state / s for stage >= 1, weight
gradients / s for stage >= 2, weights / s for stage 3 and SHARD_GRAD_OP (FSDP keeps each rank's
shard all step: FSDP2's sharded parameters, FSDP1's local shard); with expert parallelism (ZeRO-1
only) the expert weights' states / (s / e) (`state_divisor`). Transients, in `comm_buffers`: ZeRO-2
the largest gradient bucket before its reduce-scatter, added at the activation peak. Where units
are gathered (ZeRO-3, SHARD_GRAD_OP) the transients are timed in the memory walk
(`unit_transient_events`): each gathered unit from its allgather's issue to the end of the pass it
serves (ZeRO-3: the prefetched one overlaps the current one; SHARD_GRAD_OP: its backward, so every
unit is gathered at the first backward, the whole weights beside the shard), each unit's full
gradient from the end of its backward, as its activations go, while the next unit computes
(FSDP2: the unsharded gradient until its copy-in ends, and the reduce-scatter buffer it is copied
into until the next unit's copy-in, `_gradient_events`). A fixed addition at the activation peak
over-counted them: FSDP2 on 2 CPU ranks measured a shard grad op peak equal to DDP's to the byte,
and full shard 15.4-16.0 MB against 18.2 predicted so (`reports/ACCURACY.md`).
"""

from __future__ import annotations

from bisect import bisect_right

from simulator.errors import ScenarioError
from simulator.plan import BACKWARD, FORWARD, Collective, Compute
from simulator.memory_activations import recompute_ranges
from simulator.strategies.ghp import bucket_segments
from simulator.workload import dtype_bytes
from simulator.zero_config import gradient_element_bytes

GATHER_KEY, REDUCE_KEY, HYBRID_ALLREDUCE_KEY = "fsdp_gather", "fsdp_reduce_scatter", "fsdp_allreduce"
GATHER_LABEL = "fsdp allgather"
"""ZeRO-3 parameter gathers and gradient reduce-scatters: left out of `simulator.memory`'s generic
walk, which would hold a gather's buffer until the update like a top-k allgather's; their buffers
join it as `unit_transient_events`."""


def shard_degree(config) -> int:
    """s: replicas sharing one copy of the model states (d; hybrid_shard: those within one node,
    which must sit side by side: replica e's shard group is e // s)."""
    if config.zero_stage == 0 or config.dp == 1:
        return 1
    if config.fsdp_sharding != "hybrid_shard":
        return config.dp
    nodes = [config.device_of(e, 0, 0) // config.gpus_per_node for e in range(config.dp)]
    per_node = nodes.count(nodes[0])
    if config.dp % per_node or any(nodes[e] != nodes[e - e % per_node] for e in range(config.dp)):
        raise ScenarioError(f"strategy.fsdp_sharding: hybrid_shard needs the replicas of each node side by side "
                            f"in equal numbers (replica nodes {nodes[:16]})")
    return per_node


def sharded(config) -> bool:
    """ZeRO-3 with more than one replica: the plan gathers and reduce-scatters per unit."""
    return config.zero_stage == 3 and config.dp > 1


def gathers_per_unit(config) -> bool:
    """The plan gathers each unit's parameters before it computes: ZeRO-3 (`sharded`), or FSDP
    SHARD_GRAD_OP with more than one replica (before the forward only)."""
    return sharded(config) or (config.fsdp_sharding == "shard_grad_op" and config.dp > 1)


def replicated(config) -> bool:
    """ZeRO-3 hybrid_shard with more than one shard group: replicas across nodes."""
    return sharded(config) and shard_degree(config) < config.dp


def zero_groups(config, dp_ranks: tuple[int, ...], dp_index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shard group, replicate group) of a rank among its d data-parallel copies `dp_ranks` (a
    symmetric run's representative: itself in both where it has replicas, `simulator.symmetry`)."""
    s = shard_degree(config)
    if len(dp_ranks) == 1:  # d = 1, or the representative of a symmetric run, standing for every group
        return dp_ranks, (dp_ranks if replicated(config) else ())
    if s == len(dp_ranks):  # full shard
        return dp_ranks, ()
    first = dp_index - dp_index % s
    return dp_ranks[first:first + s], dp_ranks[dp_index % s::s]


def _gather(rank, layer: int, microbatch: int, phase: str, deps: tuple[int, ...]) -> int | None:
    """Allgather of `layer`'s parameter shards over the shard group (None: nothing to gather)."""
    shard_ranks = rank.zero_groups[0]
    params = rank.shard.layers[layer].num_params
    if params == 0 or rank.zero_degree == 1:  # hybrid with one replica per node: nothing sharded
        return None
    return rank.builder.add(Collective, op="allgather", ranks=shard_ranks,
                            size_bytes=params * rank.element_bytes / rank.zero_degree,
                            key=(GATHER_KEY, *rank.dp_key, shard_ranks[0], microbatch, phase, layer), deps=deps,
                            algorithm="ring",
                            label=f"{GATHER_LABEL} {phase}{microbatch} L{layer}")


def copies(config) -> bool:
    """FSDP2's copy-out and copy-in passes (module docstring) are part of the plan."""
    return config.fsdp_version == 2


def _copy_out(rank, layer: int, microbatch: int, gather: tuple[int, ...]) -> tuple[int, ...]:
    """FSDP2: the gathered unit copied into its parameters on the compute stream, after the gather."""
    if not gather or not copies(rank.config):
        return gather
    return (rank._compute(gather, phase="fsdp_copy_out", layer_start=layer, layer_end=layer + 1,
                          microbatch=microbatch, num_params=rank.shard.layers[layer].num_params),)


def copy_in_pass(element_bytes: int, gradient_bytes: int) -> str:
    """The FSDP2 reduce-scatter copy-in pass that casts `element_bytes` gradients to `gradient_bytes`."""
    if gradient_bytes == element_bytes:
        return "fsdp_copy_in"
    return "fsdp_copy_in_upcast" if gradient_bytes > element_bytes else "fsdp_copy_in_downcast"


def _prefetching(rank, layers: list[int], microbatch: int, phase: str) -> dict[int, int | None]:
    """The first unit's gather, issued after the rank's previous compute; the rest are added by
    `_prefetch_next` as each unit's compute starts."""
    gathers: dict[int, int | None] = {}
    units = [layer for layer in layers if rank.shard.layers[layer].num_params > 0]
    if units:
        gathers[units[0]] = _gather(rank, units[0], microbatch, phase, (*rank.tp_tail, *rank.last_compute))
    return gathers


def _prefetch_next(rank, gathers: dict, layers: list[int], position: int, microbatch: int, phase: str) -> tuple:
    """This unit's gather (what its compute waits for); issues the next unit's gather with the same
    dependencies as this unit's first compute, so it starts when that compute starts."""
    own = gathers.get(layers[position])
    deps = () if own is None else (own,)
    if layers[position] in gathers:
        following = next((layer for layer in layers[position + 1:] if rank.shard.layers[layer].num_params > 0), None)
        if following is not None:
            gathers[following] = _gather(rank, following, microbatch, phase,
                                         (*deps, *rank.tp_tail, *rank.last_compute))
    return deps


def zero3_forward(rank, microbatch: int, start: int, end: int) -> None:
    """One micro-batch's forward, unit by unit, each after its parameters' allgather."""
    layers = list(range(start, end))
    gathers = _prefetching(rank, layers, microbatch, FORWARD)
    for position, layer in enumerate(layers):
        deps = _copy_out(rank, layer, microbatch, _prefetch_next(rank, gathers, layers, position, microbatch, FORWARD))
        done = rank._compute(deps, phase=FORWARD, layer_start=layer, layer_end=layer + 1, microbatch=microbatch)
        rank._tp(layer, layer + 1, FORWARD, done)


def zero3_backward(rank, microbatch: int, start: int, end: int) -> None:
    """One micro-batch's backward, last unit first: gather (ZeRO-3 only: SHARD_GRAD_OP kept the
    forward's), recompute (if any), backward, then the unit's gradients reduce-scattered (and,
    hybrid, their shard allreduced across node groups)."""
    layers = list(range(end - 1, start - 1, -1))
    regather = sharded(rank.config)
    gathers = _prefetching(rank, layers, microbatch, BACKWARD) if regather else {}
    deps: tuple[int, ...] = ()
    for position, layer in enumerate(layers):
        own = _prefetch_next(rank, gathers, layers, position, microbatch, BACKWARD) if regather else ()
        own = _copy_out(rank, layer, microbatch, own)
        for a, b in recompute_ranges(rank.shard, layer, layer + 1, rank.config.recompute):
            redo = rank._compute((*deps, *own), phase=FORWARD, layer_start=a, layer_end=b, microbatch=microbatch)
            rank.recomputed.append(redo)
            deps = rank._tp(a, b, FORWARD, redo)
        rank.last_backward = rank._compute((*deps, *own), phase=BACKWARD, layer_start=layer, layer_end=layer + 1,
                                           microbatch=microbatch)
        deps = rank._tp(layer, layer + 1, BACKWARD, rank.last_backward)
        _reduce_unit(rank, layer, microbatch)


def _reduce_unit(rank, layer: int, microbatch: int) -> None:
    """A unit's gradients after its backward: reduce-scatter over the shard group, then (hybrid)
    the shard allreduced among the node groups; the update waits for the last of them."""
    size = rank.shard.layers[layer].num_params * rank.gradient_bytes
    if size == 0:
        return
    shard_ranks, replicas = rank.zero_groups
    after = (rank.last_backward,)
    if rank.zero_degree > 1 and copies(rank.config):
        after = (rank._compute(after, phase=copy_in_pass(rank.element_bytes, rank.gradient_bytes), layer_start=layer,
                               layer_end=layer + 1, microbatch=microbatch, num_params=rank.shard.layers[layer].num_params),)
    if rank.zero_degree > 1:
        after = (rank.builder.add(Collective, op="reduce_scatter", ranks=shard_ranks, size_bytes=size,
                                  key=(REDUCE_KEY, *rank.dp_key, shard_ranks[0], microbatch, layer),
                                  deps=after, algorithm="ring", label=f"fsdp reduce_scatter B{microbatch} L{layer}"),)
    if replicas:
        after = (rank.builder.add(Collective, op="allreduce", ranks=replicas, size_bytes=size / rank.zero_degree,
                                  key=(HYBRID_ALLREDUCE_KEY, *rank.dp_key, replicas[0], microbatch, layer), deps=after,
                                  algorithm=rank.config.collective, label=f"fsdp allreduce B{microbatch} L{layer}"),)
    rank.pending.append(after[0])


def unit_transient_events(plan, spans) -> dict[int, list[tuple[float, float, str]]]:
    """Per rank, the per-unit transients of a plan that gathers each unit (ZeRO-3, FSDP SHARD_GRAD_OP:
    `gathers_per_unit`) as events of the memory walk, (time_s, delta_bytes, "comm_buffers"), at the
    boundaries of the rank's computes (played spans, in the rank's order), so they order with its
    activations whatever the computes last: each gathered unit from the end of the computes its
    allgather waits for (the prefetch: as the unit before starts) to the end of the pass it serves
    (its backward, after any recompute; SHARD_GRAD_OP gathers before the forward only and keeps the
    unit until the end of its backward); each unit's full gradient from the end of its backward to
    the end of the rank's next compute, beside which FSDP reduce-scatters it. None for other plans."""
    zero = plan.meta.get("zero") or {}
    if not zero.get("gathers_per_unit") or zero.get("shard_degree", 1) == 1:
        return {}
    rows = spans.itertuples(index=False, name=None) if hasattr(spans, "itertuples") else spans
    computes: list[list] = [[] for _ in range(plan.num_ranks)]
    for rank, stream, _name, _kind, start, end, *_rest in rows:
        if stream == "compute":
            computes[rank].append((start, end))
    events: dict[int, list] = {}
    for rank, actions in enumerate(plan.actions):
        ends, order, passes = {}, [], {}  # compute id -> end; ends in order; (mb, phase, layer) -> first end
        for action, (_start, end) in zip((a for a in actions if type(a) is Compute), sorted(computes[rank])):
            ends[action.id] = end
            order.append(end)
            passes.setdefault((action.microbatch, action.phase, action.layer_start), end)  # not a recompute
        out = events.setdefault(rank, [])
        reduces = [a for a in actions if type(a) is Collective and a.key[0] == REDUCE_KEY]
        gradients = dict(zip((a.id for a in reduces), _gradient_events(reduces, ends, order, passes, zero)))
        for action in actions:  # in the rank's order
            if type(action) is not Collective or action.key[0] not in (GATHER_KEY, REDUCE_KEY):
                continue
            if action.key[0] == REDUCE_KEY:
                out += gradients[action.id]
                continue
            microbatch, phase, layer = action.key[-3:]  # (..., microbatch, phase, layer)
            alloc = max((ends[dep] for dep in action.deps if dep in ends), default=0.0)
            served = phase if zero["stage"] == 3 else BACKWARD  # SHARD_GRAD_OP: kept through the backward
            size, free = action.size_bytes * zero["shard_degree"], passes[(microbatch, served, layer)]
            out += [(alloc, size, "comm_buffers"), (max(free, alloc), -size, "comm_buffers")]
    return events


def _gradient_events(reduces: list, ends: dict, order: list[float], passes: dict, zero: dict) -> list[list[tuple]]:
    """A rank's unit gradients in the walk (`unit_transient_events`), per reduce-scatter in the rank's order.
    Without copies: each unit's full gradient from the end of its backward to the end of the rank's
    next compute. FSDP2 (a copy-in pass before each reduce-scatter): the unsharded gradient from the
    end of the unit's backward to the end of its copy-in into the reduce-scatter buffer, and that
    buffer until the next unit's copy-in of the same micro-batch ends (FSDP2 keeps the previous
    reduce-scatter's state until the next one is issued, freeing all at the backward's end: torch
    `_fsdp_param_group.py`, `post_backward`, `reduce_scatter_state`), else the rank's next compute."""
    def next_compute_end(time_s: float) -> float:
        after = bisect_right(order, time_s)  # ends in order
        return order[after] if after < len(order) else time_s
    copied = [max((ends[dep] for dep in action.deps if dep in ends), default=None) for action in reduces]
    out = []
    for index, action in enumerate(reduces):
        microbatch, layer = action.key[-2:]  # (..., microbatch, layer)
        alloc = passes[(microbatch, BACKWARD, layer)]
        copy_end = copied[index] if copied[index] is not None and copied[index] > alloc else None
        if copy_end is None:
            out.append([(alloc, action.size_bytes, "comm_buffers"), (next_compute_end(alloc), -action.size_bytes, "comm_buffers")])
            continue
        unsharded = action.size_bytes * zero["element_bytes"] / zero["gradient_bytes"]
        following = next((copied[later] for later in range(index + 1, len(reduces))
                          if reduces[later].key[-2] == microbatch and copied[later] is not None), None)
        free = following if following is not None and following > copy_end else next_compute_end(copy_end)
        out.append([(alloc, unsharded, "comm_buffers"), (copy_end, -unsharded, "comm_buffers"),
                    (alloc, action.size_bytes, "comm_buffers"), (free, -action.size_bytes, "comm_buffers")])
    return out


def memory_meta(config, shard_workload, stage_ranges: tuple[tuple[int, int], ...]) -> dict:
    """What `shard_memory` needs: the stage, s, whether units are gathered (their transients timed
    in the walk, `unit_transient_events`) and ZeRO-2's bucket transient (module docstring; bytes)."""
    grad_element = gradient_element_bytes(config.dtype, config.zero_stage, config.fsdp_reduce_dtype)
    gradient = 0.0
    if config.zero_stage == 2 and config.fsdp_sharding != "shard_grad_op":
        gradient = max((size for a, b in stage_ranges for _, _, size in
                        bucket_segments(shard_workload, a, b, grad_element, config.bucket_size_bytes)), default=0.0)
    return {"stage": config.zero_stage, "shard_degree": shard_degree(config), "gathers_per_unit": gathers_per_unit(config),
            "element_bytes": dtype_bytes(config.dtype), "gradient_bytes": grad_element,
            "gradient_transient_bytes": gradient, "expert_parallel_degree": config.ep,
            "expert_shares": _expert_shares(config, shard_workload, stage_ranges)}


def _expert_shares(config, shard_workload, stage_ranges) -> list[float]:
    """Per stage, the share of a rank's parameters that are expert weights (0 without expert
    parallelism): their model states are sharded over the d / e expert-data-parallel copies only."""
    from simulator.strategies.experts import rank_expert_params
    shares = []
    for stage in range(config.pp):
        ranges = stage_ranges[stage::config.pp]
        params = sum(layer.num_params for a, b in ranges for layer in shard_workload.layers[a:b])
        experts = rank_expert_params(shard_workload, ranges, config.tp, config.ep) if config.ep > 1 else 0.0
        shares.append(experts / params if params else 0.0)
    return shares


def state_divisor(zero: dict, stage: int) -> float:
    """What ZeRO divides a stage's sharded model states by: s, or with expert parallelism
    s / (1 + x (e - 1)) for an expert share x, the expert states being split over s / e copies only
    (Megatron-Core's distributed optimizer, `simulator.strategies.experts`)."""
    shares = zero.get("expert_shares") or [0.0]
    share = shares[stage % len(shares)]
    return zero["shard_degree"] / (1 + share * (zero.get("expert_parallel_degree", 1) - 1))


def sharded_categories(zero: dict) -> list[str]:
    """The memory categories ZeRO shards (module docstring, ZeRO Fig. 1): the weights too where each
    unit is gathered (ZeRO-3, SHARD_GRAD_OP), the gathered copies being the walk's transients."""
    stage = zero["stage"]
    return ["master_weights", "optimizer_state"] + (["weight_gradients"] if stage >= 2 else []) \
        + (["weights"] if stage == 3 or zero.get("gathers_per_unit") else [])


def shard_memory(summary: dict, zero: dict) -> None:
    """Each device row's breakdown and peak with ZeRO's sharding (module docstring), in place. The
    sharded states are allocated the whole step, so every instant, and the peak, drops by the same
    amount; ZeRO-2's transients are alive at the activation peak (a unit computes there), so they
    add (ZeRO-3's are in the walk already)."""
    s, stage = zero["shard_degree"], zero["stage"]
    if s == 1 or stage == 0:
        return
    sharded = sharded_categories(zero)
    added = zero["gradient_transient_bytes"]
    capacity = summary["memory"]["capacity_bytes"]
    stages = len(zero.get("expert_shares") or [0.0])
    for row in summary["devices"]:
        breakdown = dict(row["memory_breakdown_bytes"])
        divisor = state_divisor(zero, row["rank"] % stages)  # plan rank g p + stage
        saved = sum(breakdown[category] * (1 - 1 / divisor) for category in sharded)
        for category in sharded:
            breakdown[category] /= divisor
        breakdown["comm_buffers"] += added
        row["memory_breakdown_bytes"] = breakdown
        row["peak_memory_bytes"] += added - saved
        row["fits_in_memory"] = row["peak_memory_bytes"] <= capacity
    memory = summary["memory"]
    memory["peak_memory_bytes"] = max(row["peak_memory_bytes"] for row in summary["devices"])
    memory["fits_in_memory"] = summary["fits_in_memory"] = all(row["fits_in_memory"] for row in summary["devices"])
