"""The GHP paper's configuration heuristics, computed analytically (no simulation).

Joo & Youn, "Accelerating Distributed SGD With Group Hybrid Parallelism", IEEE Access 2021, as
reconstructed in ../shared/PAPERS.md section 1 (the full text was not available):

    T_GHP(G, M) = sum_l c_l(B/G) + sum_{j<M} 2 a_end(j) (B/G) / beta_j + max_j AR(W_j, G)
    AR(X, n)    = 2(n-1)/n X / beta + 2(n-1) alpha                      (ring allreduce)
    memory_j    = W_j (weights + grads + optimizer state) + activations of S_j at B/G + workspace

c_l = forward + backward time of layer l (from the cost model). Departures, both from the
topology: beta_j is the slowest link on the route from stage j's device to stage j+1's in a group
(so it follows the placement), and a ring that leaves a node shares the node's NICs with the other
stages' rings leaving it at the same time (beta = min(intra, inter x NICs / k), k such rings).
Stages come from the balanced partitioner on compute alone (no transfer terms).

Heuristics: memory-first = the smallest M whose every stage fits in device memory (G = N / M);
time-minimising = the (G, M, placement) with the smallest T_GHP among those that fit. Both pick the
placement (`group_per_node`: a group's workers on one node; `stage_per_node`: a stage's G peers on
one node) with the smaller T_GHP.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from simulator.collective_forms import ring_allreduce_time_s
from simulator.costs import BACKWARD, FORWARD, CostModel
from simulator.partition import balanced_partition
from simulator.placement import place_ranks
from simulator.topology import Topology
from simulator.workload import Workload, dtype_bytes

PLACEMENTS = ("group_per_node", "stage_per_node")

OPTIMIZER_STATE_BYTES_PER_PARAM = {"sgd": 0, "momentum": 4, "adam": 8}
"""fp32 optimizer state per parameter: none for SGD, the velocity for momentum, two moments for
Adam (Kingma & Ba 2015, Alg. 1)."""

MASTER_WEIGHT_BYTES_PER_PARAM = 4
"""fp16/bf16 training keeps an fp32 master copy of the weights (Micikevicius et al., ICLR 2018)."""


def state_bytes_per_param(dtype: str, optimizer: str) -> int:
    """Weights and gradients in the training dtype, the optimizer's fp32 state, and an fp32 master
    copy when the dtype is narrower than 4 bytes (the planning estimates' per-parameter bytes)."""
    element = dtype_bytes(dtype)
    return 2 * element + OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer] + (MASTER_WEIGHT_BYTES_PER_PARAM if element < 4 else 0)


def estimate_peak_memory_bytes(workload: Workload, layer_start: int, layer_end: int, *, dtype: str,
                               optimizer: str, stashed_samples: float, pass_samples: float | None = None) -> float:
    """Peak bytes of a device holding layers [layer_start, layer_end) (PAPERS.md section 1, memory_j).

    weights + gradients (training dtype) + optimizer state (fp32, `OPTIMIZER_STATE_BYTES_PER_PARAM`)
    + an fp32 master copy when the dtype is narrower than 4 bytes
    + saved activations of the stage for `stashed_samples` samples (all samples whose backward is
      still pending: the group batch B/G without pipelining)
    + workspace: the largest layer's input and output (gradient) buffers at `pass_samples` samples
      (one pass, default `stashed_samples`), live together during its backward.
    A planning estimate: no allocator fragmentation, framework context or communication buffers.
    """
    element = dtype_bytes(dtype)
    layers = workload.layers[layer_start:layer_end]
    params = sum(layer.num_params for layer in layers)
    per_param = state_bytes_per_param(dtype, optimizer)
    saved = sum(layer.saved_elements_per_sample for layer in layers) * stashed_samples * element
    one_pass = stashed_samples if pass_samples is None else pass_samples
    workspace = max((layer.input_elements_per_sample + layer.output_elements_per_sample for layer in layers),
                    default=0) * one_pass * element
    return params * per_param + saved + workspace


@dataclass(frozen=True)
class GridEstimate:
    """The closed form of one (G, M, placement): its terms, stages and memory."""

    num_groups: int
    workers_per_group: int
    placement: str
    compute_s: float
    activation_s: float
    allreduce_s: float
    ranges: tuple[tuple[int, int], ...]
    peak_memory_bytes: float
    fits: bool

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.activation_s + self.allreduce_s


def closed_form_step(workload: Workload, costs: CostModel, topology: Topology, num_groups: int,
                     placement: str, *, global_batch_size: int, dtype: str, optimizer: str,
                     device_memory_bytes: float) -> GridEstimate:
    """T_GHP(G, M) and memory of a G x M grid on `topology` (M = devices / G); see module doc."""
    workers = topology.num_devices // num_groups
    batch = global_batch_size / num_groups
    element = dtype_bytes(dtype)
    compute = np.array([costs.compute_s(i, FORWARD, batch) + costs.compute_s(i, BACKWARD, batch)
                        for i in range(workload.num_layers)])
    zeros = np.zeros((workers, workload.num_layers))
    ranges = balanced_partition(compute, zeros, zeros, workers)
    devices = place_ranks(placement, num_groups, workers, topology.gpus_per_node)
    activation_s = 0.0
    for stage, (_start, end) in enumerate(ranges[:-1]):
        size = workload.layers[end - 1].output_elements_per_sample * batch * element
        activation_s += 2 * size / route_bandwidth(topology, devices[stage], devices[stage + 1])
    allreduce_s = 0.0
    for stage, (start, end) in enumerate(ranges if num_groups > 1 else ()):
        size = sum(layer.num_params for layer in workload.layers[start:end]) * element
        peers = [devices[group * workers + stage] for group in range(num_groups)]
        latency, bandwidth = ring_link(topology, devices, workers, peers)
        allreduce_s = max(allreduce_s, ring_allreduce_time_s(size, num_groups, latency, bandwidth))
    memory = max(estimate_peak_memory_bytes(workload, start, end, dtype=dtype, optimizer=optimizer,
                                            stashed_samples=batch) for start, end in ranges)
    return GridEstimate(num_groups, workers, placement, float(compute.sum()), activation_s, allreduce_s,
                        tuple(ranges), memory, memory <= device_memory_bytes)


def route_bandwidth(topology: Topology, source: int, target: int) -> float:
    """Bandwidth of the slowest link between two devices."""
    return min(topology.links[i].bandwidth_bytes_per_s for i in topology.route(source, target))


def ring_link(topology: Topology, devices: tuple[int, ...], workers: int, peers: list[int]) -> tuple[float, float]:
    """(alpha, beta) of a ring over `peers` (in group order): the slowest hop's latency, and its
    bandwidth with a node's NICs shared by every stage ring that leaves that node."""
    hops = list(zip(peers, peers[1:] + peers[:1]))
    latency = max(topology.route_latency_s(a, b) for a, b in hops)
    bandwidth = min(route_bandwidth(topology, a, b) for a, b in hops)
    if len({topology.node_of(device) for device in peers}) > 1:
        leaving = rings_leaving(topology, devices, workers)[topology.node_of(peers[0])]
        inter = next(link for link in topology.links if link.tier == "inter").bandwidth_bytes_per_s
        bandwidth = min(bandwidth, inter / leaving)
    return latency, bandwidth


def rings_leaving(topology: Topology, devices: tuple[int, ...], workers: int) -> Counter:
    """Per node, the stages with a rank on it whose peers span several nodes (their rings share its NICs)."""
    nodes_of_stage: dict[int, set[int]] = {}
    for rank, device in enumerate(devices):
        nodes_of_stage.setdefault(rank % workers, set()).add(topology.node_of(device))
    return Counter(node for nodes in nodes_of_stage.values() if len(nodes) > 1 for node in nodes)


def grid_estimates(workload: Workload, costs: CostModel, topology: Topology, *, global_batch_size: int,
                   dtype: str, optimizer: str, device_memory_bytes: float) -> list[GridEstimate]:
    """The closed form for every divisor pair (G, M) the batch and the layers allow, and each
    placement that differs (one when G = 1, M = 1 or a single node)."""
    num_devices = topology.num_devices
    estimates = []
    for groups in (g for g in range(1, num_devices + 1) if num_devices % g == 0):
        workers = num_devices // groups
        if global_batch_size % groups or workers > workload.num_layers:
            continue
        distinct = groups not in (1, num_devices) and topology.num_nodes > 1
        for placement in PLACEMENTS if distinct else PLACEMENTS[:1]:
            estimates.append(closed_form_step(
                workload, costs, topology, groups, placement, global_batch_size=global_batch_size,
                dtype=dtype, optimizer=optimizer, device_memory_bytes=device_memory_bytes))
    return estimates


def memory_first(estimates: list[GridEstimate]) -> GridEstimate | None:
    """The smallest M whose stages all fit (fastest placement of it); None if nothing fits."""
    fitting = [estimate for estimate in estimates if estimate.fits]
    if not fitting:
        return None
    smallest = min(estimate.workers_per_group for estimate in fitting)
    return min((e for e in fitting if e.workers_per_group == smallest), key=lambda e: e.step_time_s)


def time_minimising(estimates: list[GridEstimate]) -> GridEstimate | None:
    """The smallest T_GHP among the grids that fit (among all if none fits); None if no grid."""
    if not estimates:
        return None
    pool = [estimate for estimate in estimates if estimate.fits] or estimates
    return min(pool, key=lambda estimate: estimate.step_time_s)


HEURISTICS = {"memory-first": memory_first, "time-minimising": time_minimising}
