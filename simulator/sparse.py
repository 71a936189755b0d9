"""Top-k sparse gradient communication (LaySA, Zhao et al., IEEE Access 2021).

Each rank keeps the k = ceil(rho x n) largest-magnitude entries of a gradient bucket of n elements
(after adding its error-feedback residual, Stich et al., NeurIPS 2018) and the peers exchange them
with a ring allgather of k values + k int32 indices per rank, instead of a dense allreduce of n
values. Per rank a ring allgather moves (p-1) k (v + 4) bytes and a ring allreduce 2 (p-1)/p n v,
so with fp32 values (v = 4) sparse moves fewer bytes only while rho x p < 1: high density or many
ranks make it slower than dense, and the summary shows both figures (`compression_summary`).

Selection cost model (analytic, an assumption): a memory-bound pass of
`TOPK_SELECTION_BYTES_PER_ELEMENT` bytes per gradient element: residual += gradient (read g, read r,
write r: 12 bytes in fp32) and a threshold filter over r (read r: 4 bytes) whose threshold comes
from a small sample, as in Deep Gradient Compression (Lin et al., ICLR 2018); the k selected
writes are negligible. In plans it is a `Compute(phase=SELECTION_PHASE)` whose `num_params` is the
bucket's gradient elements, timed by `CostModel.topk_s` (a calibration profile measures it:
`simulator.profile`, key `topk`).
"""

from __future__ import annotations

import math

from simulator.collectives import allgather_phases, allreduce_phases, choose_algorithm
from simulator.costs import TOPK_SELECTION_BYTES_PER_ELEMENT
from simulator.plan import Collective, Plan
from simulator.topology import Topology

INDEX_BYTES = 4
"""int32 index per selected entry."""
SELECTION_PHASE = "topk"
"""Compute phase of the top-k selection pass (`TOPK_SELECTION_BYTES_PER_ELEMENT`: simulator.costs)."""


def topk_count(num_elements: float, density: float) -> int:
    """k = ceil(rho x n), at least 1 for a non-empty bucket."""
    return max(1, math.ceil(density * num_elements)) if num_elements > 0 else 0


def sparse_payload_bytes(dense_bytes: float, density: float, element_bytes: int) -> float:
    """Bytes one rank contributes to the allgather: k values + k indices."""
    return topk_count(dense_bytes / element_bytes, density) * (element_bytes + INDEX_BYTES)


def uncontended_time_s(topology: Topology, phases) -> float:
    """Time of flow phases alone on the network: latency + bytes / (slowest link share)."""
    total = 0.0
    for phase in phases:
        rate = min(topology.links[link].bandwidth_bytes_per_s / count for link, count in phase.usage)
        total += phase.latency_s + phase.bytes_per_subflow / rate
    return total


def compression_summary(plan: Plan, topology: Topology, memory_bandwidth_bytes_per_s: float) -> dict | None:
    """Sparse exchange vs the dense allreduce it replaces, per rank (uncontended closed forms).

    `sparse_s` = allgathers + top-k selection, `dense_s` = the dense allreduces of the same buckets;
    both are sums over one rank's collectives (serial on its communication stream); the worst rank
    is reported. None when the plan has no top-k exchange.
    """
    topk = plan.meta.get("topk")
    if not topk:
        return None
    worst = {"sparse_s": 0.0, "dense_s": 0.0, "selection_s": 0.0, "allgather_s": 0.0}
    for rank, actions in enumerate(plan.actions):
        row = dict.fromkeys(worst, 0.0)
        for action in actions:
            if not (isinstance(action, Collective) and action.op == "allgather"):
                continue
            devices = tuple(plan.rank_to_device[r] for r in action.ranks)
            dense_bytes = topk["dense_bytes"][repr(action.key)]
            algorithm = choose_algorithm(topology, devices, action.algorithm)
            row["dense_s"] += uncontended_time_s(topology, allreduce_phases(topology, devices, dense_bytes, algorithm))
            row["allgather_s"] += uncontended_time_s(topology, allgather_phases(topology, devices, action.size_bytes))
            elements = dense_bytes / topk["value_bytes"]
            row["selection_s"] += elements * TOPK_SELECTION_BYTES_PER_ELEMENT / memory_bandwidth_bytes_per_s
        row["sparse_s"] = row["allgather_s"] + row["selection_s"]
        if row["sparse_s"] >= worst["sparse_s"]:
            worst = row
    return {"method": "topk", "density": topk["density"], "num_exchanges": len(topk["dense_bytes"]),
            **worst, "sparse_faster": worst["sparse_s"] < worst["dense_s"]}
