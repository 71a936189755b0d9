"""Closed forms of collective communication times (alpha-beta, Hockney 1994): point-to-point, ring,
tree and hierarchical allreduce, ring and hierarchical allgather and reduce-scatter, and the
pairwise all-to-all.

The flow phases the engine plays on the topology are in `simulator.collectives`; these closed forms
are what the heuristics, the PipeDream partitioner and the tests check those phases against.
"""

from __future__ import annotations

import math


def p2p_time_s(size_bytes: float, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Hockney's alpha-beta model: alpha + S / bandwidth (Hockney, Parallel Computing 1994)."""
    return latency_s + size_bytes / bandwidth_bytes_per_s


def ring_allreduce_time_s(size_bytes: float, num_ranks: int, latency_s: float,
                          bandwidth_bytes_per_s: float) -> float:
    """Ring allreduce = reduce-scatter + allgather: 2(p-1)/p * S/bw + 2(p-1) * alpha.

    Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms", JPDC 2009; Thakur et al. 2005.
    """
    if num_ranks <= 1:
        return 0.0
    steps = 2 * (num_ranks - 1)
    return steps / num_ranks * size_bytes / bandwidth_bytes_per_s + steps * latency_s


def tree_allreduce_time_s(size_bytes: float, num_ranks: int, latency_s: float,
                          bandwidth_bytes_per_s: float) -> float:
    """Binary-tree reduce then broadcast, each pipelined: 2 S/bw + 2 ceil(log2 p) alpha.

    Thakur, Rabenseifner & Gropp, IJHPCA 2005 (reduce + broadcast); the pipelined form is the
    bandwidth term of NCCL's trees (Sanders, Speck & Traeff, Parallel Computing 2009).
    """
    if num_ranks <= 1:
        return 0.0
    return 2 * size_bytes / bandwidth_bytes_per_s + 2 * math.ceil(math.log2(num_ranks)) * latency_s


def ring_allgather_time_s(per_rank_bytes: float, num_ranks: int, latency_s: float,
                          bandwidth_bytes_per_s: float) -> float:
    """Ring allgather of `per_rank_bytes` from each rank: (p-1) steps of alpha + S_rank/bw.

    Thakur, Rabenseifner & Gropp, IJHPCA 2005 (ring allgather); used for sparse top-k exchange,
    where each rank contributes k values + k indices (LaySA, Zhao et al. 2021; PAPERS.md 3).
    """
    if num_ranks <= 1:
        return 0.0
    return (num_ranks - 1) * (latency_s + per_rank_bytes / bandwidth_bytes_per_s)


def ring_reduce_scatter_time_s(size_bytes: float, num_ranks: int, latency_s: float,
                               bandwidth_bytes_per_s: float) -> float:
    """Ring reduce-scatter of a `size_bytes` buffer (each rank keeps S/p reduced): (p-1) steps of
    alpha + S/(p bw); with the ring allgather of S/p per rank it is the ring allreduce
    (Thakur, Rabenseifner & Gropp, IJHPCA 2005; Patarasuk & Yuan, JPDC 2009)."""
    if num_ranks <= 1:
        return 0.0
    return (num_ranks - 1) * (latency_s + size_bytes / num_ranks / bandwidth_bytes_per_s)


def hierarchical_allreduce_time_s(size_bytes: float, num_nodes: int, ranks_per_node: int,
                                  intra_latency_s: float, intra_bandwidth: float,
                                  inter_latency_s: float, inter_bandwidth_per_node: float) -> float:
    """Reduce-scatter inside nodes, ring allreduce of S/g across nodes per local rank (the g rings
    share the node's NICs), allgather inside nodes (Goyal et al. 2017; NCCL/Horovod hierarchical)."""
    g, n = ranks_per_node, num_nodes
    inside = (g - 1) / g * size_bytes / intra_bandwidth + (g - 1) * intra_latency_s if g > 1 else 0.0
    across = ring_allreduce_time_s(size_bytes, n, inter_latency_s, inter_bandwidth_per_node)
    return 2 * inside + across


def hierarchical_allgather_time_s(per_rank_bytes: float, num_nodes: int, ranks_per_node: int,
                                  intra_latency_s: float, intra_bandwidth: float,
                                  inter_latency_s: float, inter_bandwidth_per_node: float) -> float:
    """Each local rank's ring allgather across the nodes (the g rings share the node's NICs: g blocks
    cross them a step), then each node's ring allgather of the n blocks each rank gathered
    (`simulator.collectives.allgather_phases`)."""
    g, n = ranks_per_node, num_nodes
    return (ring_allgather_time_s(per_rank_bytes * g, n, inter_latency_s, inter_bandwidth_per_node)
            + ring_allgather_time_s(per_rank_bytes * n, g, intra_latency_s, intra_bandwidth))


def hierarchical_reduce_scatter_time_s(size_bytes: float, num_nodes: int, ranks_per_node: int,
                                       intra_latency_s: float, intra_bandwidth: float,
                                       inter_latency_s: float, inter_bandwidth_per_node: float) -> float:
    """Each node's ring reduce-scatter of S, then each local rank's ring reduce-scatter of its S / g
    across the nodes (the g rings share the node's NICs); with `hierarchical_allgather_time_s` of
    S / p per rank it is `hierarchical_allreduce_time_s` (`simulator.collectives.reduce_scatter_phases`)."""
    g, n = ranks_per_node, num_nodes
    return (ring_reduce_scatter_time_s(size_bytes, g, intra_latency_s, intra_bandwidth)
            + ring_reduce_scatter_time_s(size_bytes, n, inter_latency_s, inter_bandwidth_per_node))


def alltoall_time_s(size_bytes: float, num_ranks: int, latency_s: float,
                    bandwidth_bytes_per_s: float) -> float:
    """All-to-all of a `size_bytes` buffer per rank (1/p of it to each rank, its own share stays):
    every rank sends its p-1 blocks concurrently (NCCL's grouped send / recv, as
    `torch.distributed.all_to_all_single` runs it), so one latency + (p-1)/p x S / bw on each rank's
    link (Thakur, Rabenseifner & Gropp, IJHPCA 2005, sec. 4.4, the pairwise exchange's volume)."""
    if num_ranks <= 1:
        return 0.0
    return latency_s + (num_ranks - 1) / num_ranks * size_bytes / bandwidth_bytes_per_s
