"""Expert parallelism in the megatron kind (`strategy.ep_degree` e): each rank holds E / e experts of
every MoE layer (`simulator.zoo.moe`), and tokens travel to their experts and back by all-to-all.

Megatron-Core MoE (Shoeybi et al.; `megatron/core/parallel_state.py`, `transformer/moe/`): the
expert-parallel groups are carved out of the d data-parallel replicas, so e divides d; the e
replicas dp = g e .. g e + e - 1 of one (stage, TP rank) form EP group g. Per MoE layer and micro-batch
the forward runs an all-to-all dispatch (each rank's c k routed copies of its tokens to the ranks
holding their experts) and an all-to-all combine (the expert outputs back), the backward the same
two with the gradients (MoEAlltoAllTokenDispatcher; Lepikhin et al. 2021, "GShard", sec. 2.2;
Fedus et al. 2021, "Switch Transformers", sec. 2.2). Each all-to-all moves a buffer of
c k (b s / t) h x dtype bytes per rank (b s / t: the rank's sequence-parallel rows), (e - 1) / e of it
to other ranks (`simulator.collective_forms.alltoall_time_s`; played as NCCL's grouped sends,
`simulator.collectives.alltoall_phases`). As the TP collectives, a pass's all-to-alls run after its
compute, `repeat` times back to back, on the TP / EP stream, and the next compute waits for them
(Megatron runs them on the compute stream). Expert weight gradients are allreduced among the d / e
ranks holding the same experts (the expert-data-parallel group), the other gradients among all d.

Per rank (`shard_moe_layer`): the attention and shared experts split over TP as a LLaMA block, the
two RMSNorms and the router replicated (Megatron-Core keeps the router weight whole on every TP
rank; with sequence parallelism they run on the rank's s / t rows), the experts split over TP along
their width and over EP by expert: 3 h f E / (t e) parameters. With balanced routing (c: the
capacity factor) a rank's expert work does not depend on e, only its grouped GEMMs' shapes do
(E / e experts of c k b s e / E tokens each, `simulator.kernels_moe`).

ZeRO-1 (Megatron-Core's distributed optimizer, `--use-distributed-optimizer`, which shards the
expert parameters' optimizer state over the expert-data-parallel group and the rest over the data-
parallel group: `megatron/core/optimizer/__init__.py`, one DistributedOptimizer per parameter
group): each bucket's expert gradients are reduce-scattered among the d / e copies of its experts,
the rest among all d; the update runs on X / (d / e) + (P - X) / d parameters (X of the rank's P
parameters expert weights); the updated expert shards are allgathered over the d / e copies, the
rest over d (`zero1_allgathers`). Its memory: `simulator.strategies.zero.shard_memory`.

Not modelled yet (refused): ZeRO-2/3 with e > 1, gradients reduced after the backward
(`overlap_backward: false`), tp > 1 without sequence parallelism (Megatron-Core requires it with
MoE). With t > 1 the routed tokens are allgathered over
TP before the experts and reduce-scattered after them (`_routed_tp_collectives`).
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace

from simulator.errors import ScenarioError
from simulator.plan import Collective
from simulator.workload import Layer, Workload
from simulator.zero_config import gradient_reduce_op, zero_setting
from simulator.zoo._ops import ADD_FLOPS, RMS_NORM_FLOPS, SOFTMAX_FLOPS

MOE_KIND = "moe_block"


def is_moe(layer: Layer) -> bool:
    return layer.spec.get("kind") == MOE_KIND


def check_expert_parallel(config, workload: Workload) -> None:
    """ScenarioError naming the field and value when `config.ep` (TensorConfig) cannot run `workload`."""
    ep = config.ep
    if ep == 1:
        return
    experts = {layer.spec["num_experts"] for layer in workload.layers if is_moe(layer)}
    if not experts:
        raise ScenarioError(f"strategy.ep_degree: {ep} needs a mixture-of-experts model "
                            f"({workload.name} has no expert layers)")
    if config.dp % ep:
        raise ScenarioError(f"strategy.ep_degree: {ep} does not divide the {config.dp} data-parallel replicas "
                            "(d = GPUs / (tp_degree x pp_degree); expert-parallel groups are carved out of them)")
    for count in sorted(experts):
        if count % ep:
            raise ScenarioError(f"strategy.ep_degree: {ep} does not divide the {count} experts "
                                f"of model {workload.name}")
    if config.tp > 1 and not config.sequence_parallel:
        raise ScenarioError(f"strategy.sequence_parallel: false with tp_degree {config.tp} and ep_degree {ep} "
                            "(Megatron-Core needs sequence parallelism for MoE with tensor parallelism)")
    if config.zero_stage >= 2:
        raise ScenarioError(f"{zero_setting(config, config.zero_stage)} with ep_degree {ep} is not modelled "
                            "(use zero_stage 0 or 1, Megatron-Core's distributed optimizer, and no fsdp_sharding)")
    if not config.overlap_backward:
        raise ScenarioError(f"strategy.overlap_backward: false with ep_degree {ep} is not modelled "
                            "(expert gradients are reduced in buckets during the backward)")


def expert_params(spec) -> int:
    """Parameters of all routed experts of an MoE block: 3 h f E (gate, up, down of each)."""
    return 3 * spec["hidden_size"] * spec["expert_ffn_hidden_size"] * spec["num_experts"]


def shard_moe_layer(layer: Layer, tp: int, sequence_parallel: bool, ep: int) -> Layer:
    """The share of MoE block `layer` one rank of a t x e (TP x EP) grid holds and computes (module
    docstring); its spec gains `expert_parallel_degree` for the kernel expansion."""
    spec = layer.spec
    s, h, num_experts = spec["seq_len"], spec["hidden_size"], spec["num_experts"]
    experts = expert_params(spec)
    replicated_params = 2 * h + h * num_experts  # two RMSNorm weights, the router
    split_params = layer.num_params - experts - replicated_params
    replicated_flops = (2 * RMS_NORM_FLOPS + 2 * ADD_FLOPS) * s * h + (2 * h + SOFTMAX_FLOPS) * s * num_experts
    replicated_saved = 4 * s * h + s * num_experts  # both norms' inputs, QKV's and the router's, router probs
    kept = tp if sequence_parallel else 1
    forward = (layer.forward_flops_per_sample - replicated_flops) / tp + replicated_flops / kept
    scale = forward / layer.forward_flops_per_sample
    sharded_io = tp if sequence_parallel else 1
    return replace(
        layer, forward_flops_per_sample=forward, backward_flops_per_sample=layer.backward_flops_per_sample * scale,
        num_params=split_params / tp + replicated_params + experts / (tp * ep),
        saved_elements_per_sample=(layer.saved_elements_per_sample - replicated_saved) / tp + replicated_saved / kept,
        input_elements_per_sample=layer.input_elements_per_sample / sharded_io,
        output_elements_per_sample=layer.output_elements_per_sample / sharded_io,
        spec={**spec, "expert_parallel_degree": ep})


def expert_rank_workload(workload: Workload, shard: Workload, tp: int, sequence_parallel: bool, ep: int) -> Workload:
    """`shard` (a TP rank's workload, `tensor_layers.rank_workload`) with every MoE block of the full
    `workload` replaced by its TP x EP share (`shard_moe_layer`)."""
    if not any(is_moe(layer) for layer in workload.layers) or (tp, ep) == (1, 1):
        return shard
    layers = tuple(shard_moe_layer(full, tp, sequence_parallel, ep) if is_moe(full) else own
                   for full, own in zip(workload.layers, shard.layers))
    return Workload(shard.name, layers, shard.input_spec)


def expert_costs(costs, shard: Workload):
    """A kernel cost model (`KernelCosts`, expanding the whole model's layers) whose MoE blocks carry
    the rank workload's `expert_parallel_degree`, so their grouped GEMMs get the EP shapes; `costs`
    itself when no layer is expert-parallel."""
    if not any(layer.spec.get("expert_parallel_degree", 1) > 1 for layer in shard.layers):
        return costs
    full = costs.workload
    layers = tuple(replace(layer, spec=own.spec) if is_moe(own) else layer
                   for layer, own in zip(full.layers, shard.layers))
    model = copy.copy(costs)
    model.workload, model._cache = Workload(full.name, layers, full.input_spec), {}
    return model


def alltoall_bytes_per_sample(spec, tp: int, sequence_parallel: bool, element_bytes: int) -> float:
    """One all-to-all's buffer per rank and sample: c k (s / t with SP) h elements (module docstring)."""
    rows = spec["seq_len"] / (tp if sequence_parallel else 1)
    return spec.get("capacity_factor", 1.0) * spec["top_k"] * rows * spec["hidden_size"] * element_bytes


def dense_bytes_per_sample(spec, tp: int, sequence_parallel: bool, element_bytes: int) -> float:
    """A rank's (s / t with SP) h activations per sample: what the block's sequence-parallel pair
    already moves of an all-to-all's buffer (`_routed_tp_collectives` moves the rest)."""
    return spec["seq_len"] / (tp if sequence_parallel else 1) * spec["hidden_size"] * element_bytes


def ep_ranks(rank) -> tuple[int, ...]:
    """Plan ranks of the EP group of a `tensor._TensorRank`: the e replicas of its block, same stage
    and TP rank."""
    config = rank.config
    if rank.symmetric:  # the representative plays every EP group's all-to-all (`simulator.symmetry`)
        return (rank.rank,)
    dp_index, tp_index = divmod(rank.pipeline, config.tp)
    first = dp_index - dp_index % config.ep
    return tuple((dp * config.tp + tp_index) * config.pp + rank.stage_index for dp in range(first, first + config.ep))


def expert_alltoalls(rank, start: int, end: int, phase: str, after: int) -> int:
    """The dispatch and combine all-to-alls of the MoE layers in [start, end) for one pass of a
    `tensor._TensorRank`, after `after` (its compute); returns the last one's id (or `after`)."""
    config = rank.config
    if config.ep == 1:
        return after
    sizes = rank.shared.get(("ep", start, end))
    if sizes is None:
        counts = Counter((alltoall_bytes_per_sample(layer.spec, config.tp, config.sequence_parallel,
                                                    rank.element_bytes),
                          dense_bytes_per_sample(layer.spec, config.tp, config.sequence_parallel, rank.element_bytes))
                         for layer in rank.workload.layers[start:end] if is_moe(layer))
        sizes = rank.shared[("ep", start, end)] = sorted(counts.items())
    ranks = ep_ranks(rank)
    for (size, dense), count in sizes:
        after = rank.builder.add(Collective, op="alltoall", ranks=ranks, size_bytes=size * rank.batch, repeat=2 * count,
                                 key=("ep", ranks[0], len(rank.builder.actions)), deps=(after,), algorithm="pairwise",
                                 label=f"ep alltoall x{2 * count}")
        rank.tp_tail = (after,)
        if config.tp > 1 and size > dense:
            after = _routed_tp_collectives(rank, (size - dense) * rank.batch, count, after)
    return after


def _routed_tp_collectives(rank, extra_bytes: float, count: int, after: int) -> int:
    """With TP, the tokens an EP rank receives are allgathered over its TP group before the experts
    and reduce-scattered after them (Megatron-Core 0.7 MoEAlltoAllTokenDispatcher,
    gather_from / reduce_scatter_to_sequence_parallel_region): c k (b s / t) h per rank, of which the
    block's sequence-parallel pair (`tensor_layers.TP_COLLECTIVES`) counts the dense MLP's b s h / t;
    these move the rest, `extra_bytes` = (c k - 1) (b s / t) h x dtype per rank."""
    tp = rank.config.tp
    for op, size in (("allgather", extra_bytes), ("reduce_scatter", extra_bytes * tp)):
        after = rank.builder.add(Collective, op=op, ranks=rank.tp_ranks, size_bytes=size, repeat=count,
                                 key=("tp", rank.dp_index, rank.stage_index, rank.num_tp), deps=(after,),
                                 algorithm="ring", label=f"tp moe {op} x{count}")
        rank.num_tp += 1
        rank.tp_tail = (after,)
    return after


def rank_expert_params(workload: Workload, ranges, tp: int, ep: int) -> float:
    """Expert parameters one rank of a t x e grid holds of the MoE layers in `ranges` ([start, end)
    pairs of the full `workload`): 3 h f E / (t e) per layer."""
    return sum(expert_params(layer.spec) / (tp * ep) for start, end in ranges
               for layer in workload.layers[start:end] if is_moe(layer))


def expert_data_ranks(rank) -> tuple[int, ...]:
    """The expert-data-parallel group of a `tensor._TensorRank`: the d / e ranks holding the same
    experts, at the same position in every EP group (a symmetric run's representative: itself,
    standing for every such group, `simulator.symmetry`)."""
    return rank.dp_ranks[rank.dp_index % rank.config.ep::rank.config.ep]


def expert_copies(config) -> int:
    """d / e: the ranks of an expert-data-parallel group, the copies of each expert shard."""
    return config.dp // config.ep


def expert_gradients(rank, start: int, end: int, size_bytes: float) -> float:
    """A gradient bucket over layers [start, end) of a `tensor._TensorRank`: its expert weight
    gradients allreduced (ZeRO-1: reduce-scattered) among the d / e ranks holding the same experts
    (none when d = e); returns the bytes left for the data-parallel reduction among all d."""
    config = rank.config
    if config.ep == 1:
        return size_bytes
    experts = rank_expert_params(rank.workload, ((start, end),), config.tp, config.ep) * rank.gradient_bytes
    ranks = expert_data_ranks(rank)
    op = gradient_reduce_op(config)
    if experts > 0 and expert_copies(config) > 1:
        rank.pending.append(rank.builder.add(
            Collective, op=op, ranks=ranks, size_bytes=experts, deps=(rank.last_backward,),
            key=(f"expert_{op}", ranks[0], len(rank.builder.actions)),
            algorithm=config.collective if op == "allreduce" else "ring", label=f"expert {op}"))
    return size_bytes - experts


def zero1_update_params(rank, params: float) -> float:
    """Parameters a ZeRO-1 rank updates (module docstring): X / (d / e) + (P - X) / d of its stage's
    P (`params`), X of them expert weights; P / s without expert parallelism."""
    config = rank.config
    if config.ep == 1 or config.zero_stage == 0 or config.dp == 1:
        return params / rank.zero_degree
    experts = rank_expert_params(rank.workload, rank.ranges[rank.stage_index::config.pp], config.tp, config.ep)
    return experts * config.ep / config.dp + (params - experts) / config.dp


def zero1_allgathers(rank, params: float, update: int) -> float:
    """After a ZeRO-1 update `update`: the updated expert shards allgathered over the expert-data-
    parallel group (when it has more than one rank); returns the parameters left for the allgather
    over all d (all of `params` without expert parallelism)."""
    config = rank.config
    if config.ep == 1:
        return params
    experts = rank_expert_params(rank.workload, rank.ranges[rank.stage_index::config.pp], config.tp, config.ep)
    ranks, copies = expert_data_ranks(rank), expert_copies(config)
    if experts > 0 and copies > 1:
        rank.builder.add(Collective, op="allgather", ranks=ranks, size_bytes=experts * rank.element_bytes / copies,
                         key=("expert_zero_allgather", ranks[0], rank.stage_index), deps=(update,), algorithm="ring",
                         label="expert zero allgather params")
    return params - experts
