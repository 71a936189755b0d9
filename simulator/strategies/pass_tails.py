"""What a pipeline pass plays besides its compute, per layer, as the stage partition weighs it
(`stage_costs.HostIssue`). A megatron pass's TP collectives (Megatron's f and g operators,
`tensor_layers.pass_collectives`), serialised after the compute as the plan plays them
(`strategies.tensor`), each priced alone on its TP group: the flow phases the engine plays
(`collectives.collective_phases`), each at its latency plus its bytes at its bottleneck link's rate
(`link_floors.isolated_time_s`), or the profile's measured fit where communication was measured.
And a recomputed layer's forward (`memory_activations.recompute_ranges`), with its collectives,
before its backward: megatron's once the gradient arrives, the layer-table kinds' as soon as the
rank is free (`ghp.apply_training_options` gives it no dependency)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.collectives import collective_phases
from simulator.link_floors import isolated_time_s
from simulator.memory_activations import recompute_ranges
from simulator.plan import BACKWARD, FORWARD
from simulator.strategies.experts import alltoall_bytes_per_sample, dense_bytes_per_sample, is_moe
from simulator.strategies.tensor_layers import pass_collectives


@dataclass(frozen=True)
class PassTails:
    """Per layer, shape (L,) or (chunks, L): seconds after its forward and after its backward pass;
    `recomputed` (L,): the layers whose backward first re-runs their forward."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    recomputed: np.ndarray
    recompute_waits: bool = True
    """Whether a backward's recompute waits for its gradient (megatron's, `strategies.tensor`), or
    runs as soon as its rank is free (the layer-table kinds', `ghp.apply_training_options`)."""


def collective_alone_s(topology, communication, groups: tuple[tuple[int, ...], ...], op: str, size_bytes: float,
                       repeat: int, algorithm: str = "ring") -> float:
    """Seconds of `repeat` back-to-back collectives `op` of `size_bytes` run by every group of `groups`
    at once, alone on the fabric; from `communication.collective_s` (a profile's fits, per group)
    where that is given, as the engine plays them."""
    if communication is not None:
        return repeat * communication.collective_s(op, size_bytes, len(groups[0]))
    return isolated_time_s(topology, collective_phases(topology, groups, op, size_bytes, algorithm, 1, repeat))


def layer_tails_s(workload, sequence_parallel: bool, microbatch_size: float, element_bytes: int, tp_degree: int,
                  collective_s) -> tuple[np.ndarray, np.ndarray]:
    """(after forward, after backward): per layer of the full `workload`, the seconds of its TP
    collectives in one pass of `microbatch_size` samples; `collective_s(op, size_bytes, repeat)` prices
    them on the group, once for each collective alike (a model's blocks repeat theirs). An allgather
    moves each rank's 1 / t share (`strategies.tensor`)."""
    count, priced = len(workload.layers), {}
    forward, backward = np.zeros(count), np.zeros(count)
    for index in range(count):
        for phase, out in ((FORWARD, forward), (BACKWARD, backward)):
            for op, repeat, elements in pass_collectives(workload, index, index + 1, phase, sequence_parallel):
                size_bytes = elements * microbatch_size * element_bytes / (tp_degree if op == "allgather" else 1)
                key = (op, size_bytes, repeat)
                if key not in priced:
                    priced[key] = collective_s(op, size_bytes, repeat)
                out[index] += priced[key]
    return forward, backward


def expert_layer_s(spec: dict, tp_degree: int, sequence_parallel: bool, microbatch_size: float, element_bytes: int,
                   alltoall_s, tp_collective_s) -> float:
    """One MoE layer's expert-parallel collectives after a pass (`experts.expert_alltoalls`): the
    dispatch and combine all-to-alls, `alltoall_s(size_bytes)`, and with TP the routed tokens'
    allgather and reduce-scatter over the TP group, `tp_collective_s(op, size_bytes)`."""
    t, b = tp_degree, microbatch_size
    size_bytes = alltoall_bytes_per_sample(spec, t, sequence_parallel, element_bytes) * b
    seconds = alltoall_s(size_bytes)
    extra_bytes = size_bytes - dense_bytes_per_sample(spec, t, sequence_parallel, element_bytes) * b
    if t > 1 and extra_bytes > 0:
        seconds += tp_collective_s("allgather", extra_bytes) + tp_collective_s("reduce_scatter", extra_bytes * t)
    return seconds


def _expert_tails_s(workload, topology, communication, ep_groups, tp_group, sequence_parallel: bool,
                    microbatch_size: float, element_bytes: int) -> np.ndarray:
    """Per layer: `expert_layer_s` of each MoE layer, its all-to-alls on the t groups `ep_groups` at once."""
    return np.array([expert_layer_s(
        layer.spec, len(tp_group), sequence_parallel, microbatch_size, element_bytes,
        lambda size: collective_alone_s(topology, communication, ep_groups, "alltoall", size, 2, "pairwise"),
        lambda op, size: collective_alone_s(topology, communication, (tp_group,), op, size, 1))
        if is_moe(layer) else 0.0 for layer in workload.layers])


def recomputed_layers(workload, recompute: str) -> np.ndarray:
    """Per layer, whether its backward first re-runs its forward (`memory_activations.recompute_ranges`)."""
    recomputed = np.zeros(len(workload.layers), dtype=bool)
    for start, end in recompute_ranges(workload, 0, len(workload.layers), recompute):
        recomputed[start:end] = True
    return recomputed


def recompute_tails(workload, recompute: str) -> PassTails | None:
    """The `PassTails` of a layer-table pipeline: its recomputed layers alone; None without any."""
    recomputed = recomputed_layers(workload, recompute)
    return PassTails(0.0, 0.0, recomputed, recompute_waits=False) if recomputed.any() else None


def chain_tails_s(workload, topology, communication, tp_groups, *, sequence_parallel: bool, recompute: str,
                  microbatch_size: float, element_bytes: int, ep_groups=None, memo: dict | None = None,
                  signature=tuple) -> PassTails | None:
    """`layer_tails_s` of each chunk's TP group (`tp_groups[k]`), with expert parallelism each MoE
    layer's all-to-alls among its chunk's EP groups (`ep_groups[k]`, one a TP rank) after either pass,
    shape (L,) where the groups time alike, else (chunks, L), a recomputed layer's forward tail added
    to its backward's; None without tensor or expert parallelism or recomputed layers. `memo` keeps
    each group's arrays under `signature(group)` (groups whose collectives time alike may share one
    key), and the chain's `PassTails` under its groups' signatures and recomputed layers (so chains
    alike there share one object)."""
    tp_degree, recomputed = len(tp_groups[0]), recomputed_layers(workload, recompute)
    ep_groups = ep_groups if ep_groups and len(ep_groups[0][0]) > 1 else None
    if tp_degree == 1 and ep_groups is None and not recomputed.any():
        return None
    memo = {} if memo is None else memo
    ep_keys = [None] * len(tp_groups) if ep_groups is None else [tuple(map(signature, ep)) for ep in ep_groups]
    chain_key = ("chain tails", tuple(signature(group) for group in tp_groups), tuple(ep_keys), sequence_parallel,
                 recomputed.tobytes(), microbatch_size, element_bytes, communication is None)
    found = memo.get(chain_key)
    if found is not None:
        return found
    rows = []
    for chunk, group in enumerate(tp_groups):
        key = ("pass tails", signature(group), ep_keys[chunk], sequence_parallel, microbatch_size, element_bytes,
               communication is None)
        if key not in memo:
            memo[key] = layer_tails_s(workload, sequence_parallel, microbatch_size, element_bytes, tp_degree,
                                      lambda op, size, repeat, group=group: 0.0 if tp_degree == 1 else
                                      collective_alone_s(topology, communication, (group,), op, size, repeat))
            if ep_groups is not None:
                experts = _expert_tails_s(workload, topology, communication, ep_groups[chunk], group, sequence_parallel,
                                          microbatch_size, element_bytes)
                memo[key] = tuple(tails + experts for tails in memo[key])
        rows.append(memo[key])
    forward, backward = (rows[0] if all(row is rows[0] for row in rows) else
                         (np.array([row[0] for row in rows]), np.array([row[1] for row in rows])))
    found = memo[chain_key] = PassTails(forward, backward + np.where(recomputed, forward, 0.0), recomputed)
    return found


def chunk_tp_groups(device_of, t: int, p: int, v: int) -> list[tuple[int, ...]]:
    """Each of the p v chunks' TP group in replica 0 (chunk k on stage k mod p), `device_of(dp', pp, tp)`."""
    return [tuple(device_of(0, chunk % p, i) for i in range(t)) for chunk in range(p * v)]


def chunk_ep_groups(device_of, t: int, p: int, v: int, e: int) -> list[tuple[tuple[int, ...], ...]]:
    """Each chunk's t EP groups in the first e replicas (one a TP rank), as `experts.ep_ranks` forms them."""
    return [tuple(tuple(device_of(replica, chunk % p, i) for replica in range(e)) for i in range(t))
            for chunk in range(p * v)]


def for_config(config, workload, topology, costs) -> PassTails | None:
    """`chain_tails_s` of a `strategies.tensor.TensorConfig`; None where no balanced split weighs them."""
    from simulator.workload import dtype_bytes
    t, p, v = config.tp, config.pp, config.num_virtual_stages
    if config.partition != "balanced" or p * v == 1:
        return None
    return chain_tails_s(workload, topology, costs.communication, chunk_tp_groups(config.device_of, t, p, v),
                         sequence_parallel=config.sequence_parallel, recompute=config.recompute,
                         microbatch_size=config.microbatch_size, element_bytes=dtype_bytes(config.dtype),
                         ep_groups=chunk_ep_groups(config.device_of, t, p, v, config.ep))
