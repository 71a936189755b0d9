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


def collective_alone_s(topology, communication, group: tuple[int, ...], op: str, size_bytes: float,
                       repeat: int) -> float:
    """Seconds of `repeat` back-to-back ring collectives `op` of `size_bytes` on `group`, alone on the
    fabric; from `communication.collective_s` (a profile's fits) where that is given."""
    if communication is not None:
        return repeat * communication.collective_s(op, size_bytes, len(group))
    return isolated_time_s(topology, collective_phases(topology, (group,), op, size_bytes, "ring", 1, repeat))


def layer_tails_s(workload, sequence_parallel: bool, microbatch_size: float, element_bytes: int, tp_degree: int,
                  collective_s) -> tuple[np.ndarray, np.ndarray]:
    """(after forward, after backward): per layer of the full `workload`, the seconds of its TP
    collectives in one pass of `microbatch_size` samples; `collective_s(op, size_bytes, repeat)` prices
    them on the group. An allgather moves each rank's 1 / t share (`strategies.tensor`)."""
    count = len(workload.layers)
    forward, backward = np.zeros(count), np.zeros(count)
    for index in range(count):
        for phase, out in ((FORWARD, forward), (BACKWARD, backward)):
            for op, repeat, elements in pass_collectives(workload, index, index + 1, phase, sequence_parallel):
                size_bytes = elements * microbatch_size * element_bytes / (tp_degree if op == "allgather" else 1)
                out[index] += collective_s(op, size_bytes, repeat)
    return forward, backward


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
                  microbatch_size: float, element_bytes: int, memo: dict | None = None,
                  signature=tuple) -> PassTails | None:
    """`layer_tails_s` of each chunk's TP group (`tp_groups[k]`), shape (L,) where the groups time
    alike, else (chunks, L), a recomputed layer's forward tail added to its backward's; None without
    tensor parallelism or recomputed layers. `memo` keeps each group's arrays under `signature(group)`
    (groups whose collectives time alike may share one key), and the chain's `PassTails` under its
    groups' signatures and recomputed layers (so chains alike there share one object)."""
    tp_degree, recomputed = len(tp_groups[0]), recomputed_layers(workload, recompute)
    if tp_degree == 1 and not recomputed.any():
        return None
    memo = {} if memo is None else memo
    chain_key = ("chain tails", tuple(signature(group) for group in tp_groups), sequence_parallel,
                 recomputed.tobytes(), microbatch_size, element_bytes, communication is None)
    found = memo.get(chain_key)
    if found is not None:
        return found
    rows = []
    for group in tp_groups:
        key = ("pass tails", signature(group), sequence_parallel, microbatch_size, element_bytes, communication is None)
        if key not in memo:
            memo[key] = layer_tails_s(workload, sequence_parallel, microbatch_size, element_bytes, tp_degree,
                                      lambda op, size, repeat, group=group: 0.0 if tp_degree == 1 else
                                      collective_alone_s(topology, communication, group, op, size, repeat))
        rows.append(memo[key])
    forward, backward = (rows[0] if all(row is rows[0] for row in rows) else
                         (np.array([row[0] for row in rows]), np.array([row[1] for row in rows])))
    found = memo[chain_key] = PassTails(forward, backward + np.where(recomputed, forward, 0.0), recomputed)
    return found


def chunk_tp_groups(device_of, t: int, p: int, v: int) -> list[tuple[int, ...]]:
    """Each of the p v chunks' TP group in replica 0 (chunk k on stage k mod p), `device_of(dp', pp, tp)`."""
    return [tuple(device_of(0, chunk % p, i) for i in range(t)) for chunk in range(p * v)]


def for_config(config, workload, topology, costs) -> PassTails | None:
    """`chain_tails_s` of a `strategies.tensor.TensorConfig`."""
    from simulator.workload import dtype_bytes
    groups = chunk_tp_groups(config.device_of, config.tp, config.pp, config.num_virtual_stages)
    return chain_tails_s(workload, topology, costs.communication, groups, sequence_parallel=config.sequence_parallel,
                         recompute=config.recompute, microbatch_size=config.microbatch_size,
                         element_bytes=dtype_bytes(config.dtype))
