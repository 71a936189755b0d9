"""Collectives as NCCL runs them: its tuner's tables of latency and bandwidth, and its choice of
algorithm and protocol by the least predicted time (NVIDIA/nccl `src/graph/tuning.cc`, 2.20).

For each algorithm a (ring, tree, NVLS) and protocol p (LL, LL128, Simple) NCCL predicts

    time = base_latency[a, p] + sum over hops of hop_latency[link kind, a, p]
           + traffic_per_rank / (line rate x link efficiency x protocol efficiency x algorithm factor)

and runs the pair with the least time. Every figure below is a table entry with its source; the
functions only count hops and bytes. Pure functions over plain numbers: no simpy, no torch.
The engine plays the same tables on its flow network (`simulator.collectives`: links carry line
rate x LINK_EFFICIENCY, phases NCCL's latency and protocol), so on an uncontended node it takes
exactly these closed-form times (tests/test_nccl_in_engine.py).

Two departures from the tuner, both to match what nccl-tests measures:
- Pipeline fill. A ring moves each channel's share of the buffer in slices through 2(n-1) steps
  (n-1 for either half); the first slice crosses all of them before the pipeline runs full, so a
  collective also pays (steps - 1) x slice / channel bandwidth, where the slice is the rank's
  share of the buffer split over the channels, S / (n x channels), up to PIPELINE_SLICE_BYTES.
  With it the time is base + hops + S_traffic / bw + fill (`pipeline_fill_s`): at mid sizes
  (S / n below channels x slice) the fill is about as long as the transfer itself, which is
  why measured bus bandwidth at 2-128 MB is half of the asymptote on all three GPUs of
  published/nccl_allreduce_8gpu_node.csv. Simple and LL128 pay it (both forward whole slices);
  LL forwards 8-byte lines and does not. NVLS is given the same pipeline over its own channels.
  Only collectives inside one NVLink node pay it (FILL_LINK_KINDS): the slice was fitted on
  NVLink curves, and PCIe rings (fewer channels) and network rings have no curve here to fit.
- A hop never costs less than the link's own measured one-way latency
(`Tier.latency_s`). NCCL's NVLink LL hop is 0.6 us, but a single-channel ring measures 10 us at 2
GPUs and 34 us at 8 on DGX-A100 (8-128 B; published/README.md), i.e. 2 us a hop, which is the
NVLink latency of the hardware catalogue; with the floor the model reproduces both figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

us = 1e-6
GB = 1e9

LINK_KINDS = ("nvlink", "pcie", "infiniband", "roce", "ethernet", "host")
NCCL_LINK_KINDS = frozenset({"nvlink", "pcie", "infiniband", "roce"})
"""The kinds whose transports NCCL's tables describe (its NVLink, PCI and NET-over-RDMA classes).
The flow model plays collectives with NCCL's latency and protocols only over these; Ethernet
(NCCL's socket transport, or gloo/MPI) and host links keep the user's figures."""
PROTOCOLS = ("LL", "LL128", "Simple")

# ----------------------------------------------------------------------------- tables

BASE_LATENCY_S: dict[tuple[str, str], float] = {
    # NCCL 2.20 tuning.cc baseLat (us), also published/README.md.
    ("ring", "LL"): 6.6 * us, ("ring", "LL128"): 14.0 * us, ("ring", "Simple"): 8.4 * us,
    ("tree", "LL"): 6.8 * us, ("tree", "LL128"): 14.0 * us, ("tree", "Simple"): 0.0,
    # NCCL 2.20 puts all of NVLS's latency in its per-hop entry (baseLat 0).
    ("nvls", "Simple"): 0.0,
}

_NVLINK_HOPS = {  # NCCL 2.20 tuning.cc hwLat[NCCL_HW_NVLINK] (us)
    ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4,
    ("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 28.0,
    ("nvls", "Simple"): 23.0,  # one "hop": the whole single-node NVLS latency
}
_PCI_HOPS = {  # NCCL 2.20 tuning.cc hwLat[NCCL_HW_PCI] (us)
    ("ring", "LL"): 1.0, ("ring", "LL128"): 2.5, ("ring", "Simple"): 5.7,
    ("tree", "LL"): 1.0, ("tree", "LL128"): 1.9, ("tree", "Simple"): 28.0,
}
_NET_HOPS = {  # NCCL 2.20 tuning.cc hwLat[NCCL_HW_NET] (us), also published/README.md
    ("ring", "LL"): 2.7, ("ring", "LL128"): 4.0, ("ring", "Simple"): 14.0,
    ("tree", "LL"): 5.0, ("tree", "LL128"): 8.5, ("tree", "Simple"): 28.0,
}
# NCCL has three hardware classes: NVLink, PCI (any other path inside a node, host memory
# included) and NET (any network transport: IB verbs, RoCE, sockets).
_HOPS_BY_KIND = {"nvlink": _NVLINK_HOPS, "pcie": _PCI_HOPS, "host": _PCI_HOPS,
                 "infiniband": _NET_HOPS, "roce": _NET_HOPS, "ethernet": _NET_HOPS}
HOP_LATENCY_S: dict[tuple[str, str, str], float] = {
    (kind, algorithm, protocol): value * us
    for kind, table in _HOPS_BY_KIND.items() for (algorithm, protocol), value in table.items()}

PROTOCOL_EFFICIENCY: dict[str, float] = {
    # LL: 8-byte stores carrying 4 bytes of data + a 4-byte flag; "at most 50 %" (README, NCCL
    # maintainers); NCCL >= 2.21 models ring LL as busBw x 0.5.
    "LL": 0.5,
    # LL128: 128-byte lines carrying 120 bytes of data + 8 of flag; "about 95 %" (README). The value
    # is that payload share, 120 / 128 = 0.9375 (NCCL_LL128_DATAELEMS / NCCL_LL128_LINEELEMS, 15 of
    # every 16 8-byte elements, src/include/device.h), not tuning.cc's ring LL128 "0.92 /*120.0/128.0*/".
    "LL128": 120 / 128,
    # Simple: payload only, synchronised by fences.
    "Simple": 1.0,
}

LINK_EFFICIENCY: dict[str, float] = {
    # Achievable bus bandwidth / per-direction line rate.
    # NVLink application bandwidth "about 80 %" of line rate (README): A100 ~230 GB/s busbw of
    # 300, H100 ~370 of 450; NCCL's own A100 ring model is 12 channels x 20 GB/s = 240 of 300.
    "nvlink": 0.80,
    # PCIe: nvbandwidth host_to_device 26.28 GB/s on A100 (PCIe 4 x16, 31.5) = 0.83, 51 GB/s on
    # H100 (PCIe 5 x16, 63) = 0.81 (published/gpu_microbenchmarks.csv).
    "pcie": 0.80,
    # Host-staged copies cross PCIe, pipelined: the PCIe figure above.
    "host": 0.80,
    # IB with GPUDirect RDMA: HDR ~24 GB/s busbw per NIC of 25 (0.96), NDR 46-48 of 50
    # (0.92-0.96) (README); the middle of the range.
    "infiniband": 0.94,
    # RoCE: the same RDMA/GPUDirect path as IB; no separate published figure, so IB's.
    "roce": 0.94,
    # NCCL's socket transport: "not ... more than 60 % of wire speed" on 32 Gb/s TCP
    # (NVIDIA/nccl issue #209).
    "ethernet": 0.60,
}

ALGORITHM_BANDWIDTH_FACTOR: dict[str, float] = {
    "ring": 1.0,
    "tree": 0.92,  # tuning.cc: tree busBw x .92
    # NVLink SHARP: ~480 GB/s allreduce busbw on H100 vs ~370 with ring (README).
    "nvls": 480 / 370,
}

ALGORITHM_PROTOCOLS: dict[str, tuple[str, ...]] = {
    "ring": PROTOCOLS, "tree": PROTOCOLS,
    "nvls": ("Simple",),  # tuning.cc: NVLS runs Simple only
}

# LL's bus bandwidth cap, by number of nodes (1, 2, 3 or more): tuning.cc 2.20 llMaxBws, the
# Ampere/Hopper single-node entry and the Intel-CPU multi-node entries (GB/s).
LL_MAX_BUS_BANDWIDTH_BYTES_PER_S: dict[int, float] = {1: 87.7 * GB, 2: 39.0 * GB, 3: 20.4 * GB}

# tuning.cc enables LL128 by default only with NVLink inside the node and a GPUDirect NIC across
# nodes ("other cases are not tested and may cause silent data corruption").
LL128_LINK_KINDS = frozenset({"nvlink", "infiniband", "roce"})

# NCCL runs one CTA (thread block, one SM) per channel. NCCL INFO logs of 8-GPU NVLink nodes
# (8x A100 SXM; 8x H100, p5.48xlarge): "24 coll channels, 16 nvls channels, 32 p2p channels".
# Nodes whose GPUs meet over PCIe: "2 coll channels" (2- and 4-GPU PCIe nodes, P2P/CUMEM/read).
NCCL_DEFAULT_NUM_CHANNELS = 24
NCCL_NVLS_NUM_CHANNELS = 16
NCCL_PCIE_NUM_CHANNELS = 2


def collective_channels(intra_node_link_kind: str) -> int:
    """NCCL's collective channels on a node whose GPUs meet over this kind of link (the logs above)."""
    return NCCL_PCIE_NUM_CHANNELS if intra_node_link_kind == "pcie" else NCCL_DEFAULT_NUM_CHANNELS

# The largest slice a channel's pipeline forwards (module docstring, "Pipeline fill"). Fitted, not
# sourced: the one free parameter of the collective model, chosen on the A100 curve of
# published/nccl_allreduce_8gpu_node.csv (least worst error above 1 MB: 12 % at 64-160 KiB) and
# checked on the two GPUs it was not fitted to (H100 17 %, H200 15 % worst above 1 MB; without
# the fill 57 % and 48 %). tests/test_nccl_model.py prints the tables.
PIPELINE_SLICE_BYTES = 128 * 1024
FILL_PROTOCOLS = frozenset({"LL128", "Simple"})
FILL_LINK_KINDS = frozenset({"nvlink"})


# ----------------------------------------------------------------------------- inputs, results

@dataclass(frozen=True)
class Tier:
    """One level of the network as a rank sees it: the link kind, its per-direction line rate
    per GPU (for a network tier: the NIC bandwidth per GPU), its one-way latency, and whether
    the NVSwitch offers NVLink SHARP (NVLS)."""

    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    nvls: bool = False

    def __post_init__(self):
        if self.kind not in LINK_KINDS:
            raise ValueError(f"unknown link kind {self.kind!r}; known: {', '.join(LINK_KINDS)}")
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {self.bandwidth_bytes_per_s!r}")
        if not self.latency_s >= 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s!r}")


class CollectiveTime(NamedTuple):
    """A predicted time and the (algorithm, protocol) NCCL would run."""

    time_s: float
    algorithm: str
    protocol: str


_NOTHING_TO_DO = CollectiveTime(0.0, "ring", "Simple")  # NCCL's choice for a single rank


# ----------------------------------------------------------------------------- building blocks

def hop_latency_s(tier: Tier, algorithm: str, protocol: str) -> float:
    """NCCL's per-hop latency for the link kind, never below the link's measured latency."""
    return max(HOP_LATENCY_S[tier.kind, algorithm, protocol], tier.latency_s)


def effective_bandwidth_bytes_per_s(tier: Tier) -> float:
    """Line rate x the link kind's achievable fraction (LINK_EFFICIENCY)."""
    return tier.bandwidth_bytes_per_s * LINK_EFFICIENCY[tier.kind]


def _layout(num_ranks: int, intra: Tier, inter: Tier | None, ranks_per_node: int | None):
    """(ranks per node, number of nodes); one node when there is no network tier."""
    if inter is None:
        return num_ranks, 1
    per_node = ranks_per_node or num_ranks
    if per_node < 1 or num_ranks % per_node:
        raise ValueError(f"num_ranks {num_ranks} is not a multiple of ranks_per_node {per_node}")
    return per_node, num_ranks // per_node


def _bus_bandwidth(intra: Tier, inter: Tier | None, per_node: int, num_nodes: int) -> float:
    """Ring/tree bus bandwidth: every channel crosses NVLink inside a node and one NIC between
    nodes, so the node's NICs together (ranks per node x per-GPU NIC rate) bound it."""
    bandwidth = effective_bandwidth_bytes_per_s(intra) if per_node > 1 else math.inf
    if num_nodes > 1:
        bandwidth = min(bandwidth, per_node * effective_bandwidth_bytes_per_s(inter))
    return bandwidth


def _protocol_ok(protocol: str, intra: Tier, inter: Tier | None, per_node: int, num_nodes: int) -> bool:
    if protocol != "LL128":
        return True
    kinds = ([intra.kind] if per_node > 1 else []) + ([inter.kind] if num_nodes > 1 else [])
    return all(kind in LL128_LINK_KINDS for kind in kinds)


def achievable_bandwidth_bytes_per_s(kind: str, line_rate_bytes_per_s: float) -> float:
    """The application bandwidth of a link of `kind`: line rate x LINK_EFFICIENCY for the kinds
    NCCL's tables describe (NCCL_LINK_KINDS); Ethernet and host links keep their configured rate
    (how much of it an application gets is the scenario's figure to set)."""
    if kind in NCCL_LINK_KINDS:
        return line_rate_bytes_per_s * LINK_EFFICIENCY[kind]
    return line_rate_bytes_per_s


def candidate_latency_s(algorithm: str, protocol: str, hops: tuple[tuple[Tier, int], ...],
                        base: bool = True) -> float:
    """base latency (when `base`) + sum of count x hop latency over `hops` ((tier, count), ...)
    (NCCL 2.20 tuning.cc, ncclTopoTuneModel: baseLat + nsteps x hwLat)."""
    return (BASE_LATENCY_S[algorithm, protocol] if base else 0.0) + sum(
        count * hop_latency_s(tier, algorithm, protocol) for tier, count in hops if count)


def candidate_bandwidth_bytes_per_s(bus_bytes_per_s: float, algorithm: str, protocol: str, num_nodes: int) -> float:
    """bus bandwidth x protocol efficiency x algorithm factor, LL capped at llMaxBw (NCCL 2.20
    tuning.cc, ncclTopoTuneModel)."""
    bandwidth = bus_bytes_per_s * PROTOCOL_EFFICIENCY[protocol] * ALGORITHM_BANDWIDTH_FACTOR[algorithm]
    if protocol == "LL":
        bandwidth = min(bandwidth, LL_MAX_BUS_BANDWIDTH_BYTES_PER_S[min(num_nodes, 3)])
    return bandwidth


def pipeline_fill_s(algorithm: str, protocol: str, steps: int, rank_share_bytes: float,
                    bandwidth_bytes_per_s: float) -> float:
    """(steps - 1) x min(rank share, channels x PIPELINE_SLICE_BYTES) / bandwidth: the time for the
    first slice of every channel to cross the pipeline's `steps` before it runs full (module
    docstring). `rank_share_bytes` is S / n, `bandwidth_bytes_per_s` the candidate's bus
    bandwidth (all channels together). 0 for LL, for trees and for a single step."""
    if protocol not in FILL_PROTOCOLS or algorithm == "tree" or steps <= 1:
        return 0.0
    channels = NCCL_NVLS_NUM_CHANNELS if algorithm == "nvls" else NCCL_DEFAULT_NUM_CHANNELS
    return (steps - 1) * min(rank_share_bytes, channels * PIPELINE_SLICE_BYTES) / bandwidth_bytes_per_s


def fills(kinds, num_nodes: int) -> bool:
    """Whether a collective over links of these kinds on `num_nodes` nodes pays the pipeline fill
    (module docstring: one node, NVLink only)."""
    return num_nodes == 1 and all(kind in FILL_LINK_KINDS for kind in kinds)


def _candidate_time_s(traffic_bytes: float, bus_bytes_per_s: float, algorithm: str, protocol: str,
                      hops: tuple[tuple[Tier, int], ...], num_nodes: int, steps: int = 1) -> float:
    """latency + traffic / bandwidth (NCCL 2.20 tuning.cc, ncclTopoGetAlgoTime) + the pipeline
    fill of a `steps`-step pipeline moving traffic / steps per step (`pipeline_fill_s`), where
    the hops' links pay it (`fills`)."""
    if not fills({tier.kind for tier, count in hops if count}, num_nodes):
        steps = 1
    bandwidth = candidate_bandwidth_bytes_per_s(bus_bytes_per_s, algorithm, protocol, num_nodes)
    return (candidate_latency_s(algorithm, protocol, hops) + traffic_bytes / bandwidth
            + pipeline_fill_s(algorithm, protocol, steps, traffic_bytes / steps, bandwidth))


def choose(candidates: dict[tuple[str, str], float]) -> CollectiveTime:
    """The (algorithm, protocol) of least predicted time; ties go to the first in name order."""
    (algorithm, protocol), time_s = min(candidates.items(), key=lambda item: (item[1], item[0]))
    return CollectiveTime(time_s, algorithm, protocol)


# ----------------------------------------------------------------------------- collectives

def allreduce_candidates(size_bytes: float, num_ranks: int, *, intra: Tier, inter: Tier | None = None,
                         ranks_per_node: int | None = None) -> dict[tuple[str, str], float]:
    """NCCL's tuner table for one allreduce: predicted seconds per (algorithm, protocol) it may run.

    Ring: 2(n-1) steps (n-1 reduce-scatter + n-1 allgather), 2(N-1) of them across the N nodes,
    each rank moving 2(n-1)/n x S (Patarasuk & Yuan, JPDC 2009). Tree (multi-node only; NCCL runs
    a chain inside a node and a double binary tree across nodes): 2((g-1) + log2 N) hops, 2S per
    rank (tuning.cc: algBw = busBw / 2). NVLS: one node whose NVSwitch has NVLink SHARP.
    `inter` and `ranks_per_node` describe several nodes; without `inter` all ranks share one node.
    """
    per_node, num_nodes = _layout(num_ranks, intra, inter, ranks_per_node)
    bus = _bus_bandwidth(intra, inter, per_node, num_nodes)
    ring_inter = 2 * (num_nodes - 1)  # NCCL >= 2.21; 2.20 counted 2N
    ring_steps = 2 * (num_ranks - 1)
    plans = {"ring": (ring_steps / num_ranks * size_bytes,
                      ((intra, ring_steps - ring_inter), (inter, ring_inter)), ring_steps)}
    if num_nodes > 1:
        plans["tree"] = (2.0 * size_bytes,
                         ((intra, 2 * (per_node - 1)), (inter, 2 * math.ceil(math.log2(num_nodes)))), 1)
    if num_nodes == 1 and intra.nvls:
        plans["nvls"] = (ring_steps / num_ranks * size_bytes, ((intra, 1),), ring_steps)
    return {(algorithm, protocol): _candidate_time_s(traffic, bus, algorithm, protocol, hops, num_nodes, steps)
            for algorithm, (traffic, hops, steps) in plans.items()
            for protocol in ALGORITHM_PROTOCOLS[algorithm]
            if _protocol_ok(protocol, intra, inter, per_node, num_nodes)}


def allreduce_time_s(size_bytes: float, num_ranks: int, *, intra: Tier, inter: Tier | None = None,
                     ranks_per_node: int | None = None) -> CollectiveTime:
    """Allreduce of `size_bytes` over `num_ranks`: the least predicted time of NCCL's tuner table
    (`allreduce_candidates`) and the (algorithm, protocol) it picks (ncclTopoGetAlgoInfo)."""
    if num_ranks <= 1 or size_bytes <= 0:
        return _NOTHING_TO_DO
    return choose(allreduce_candidates(size_bytes, num_ranks, intra=intra, inter=inter,
                                        ranks_per_node=ranks_per_node))


def _ring_half_time_s(size_bytes: float, num_ranks: int, intra: Tier, inter: Tier | None,
                      ranks_per_node: int | None) -> CollectiveTime:
    """Half a ring allreduce: n-1 steps (N-1 across nodes), (n-1)/n x S per rank (tuning.cc
    nsteps = n-1 for allgather and reduce-scatter; Thakur, Rabenseifner & Gropp, IJHPCA 2005)."""
    if num_ranks <= 1 or size_bytes <= 0:
        return _NOTHING_TO_DO
    per_node, num_nodes = _layout(num_ranks, intra, inter, ranks_per_node)
    bus = _bus_bandwidth(intra, inter, per_node, num_nodes)
    hops = ((intra, (num_ranks - 1) - (num_nodes - 1)), (inter, num_nodes - 1))
    traffic = (num_ranks - 1) / num_ranks * size_bytes
    return choose({("ring", protocol): _candidate_time_s(traffic, bus, "ring", protocol, hops, num_nodes,
                                                          num_ranks - 1)
                    for protocol in PROTOCOLS if _protocol_ok(protocol, intra, inter, per_node, num_nodes)})


def allgather_time_s(size_bytes: float, num_ranks: int, *, intra: Tier, inter: Tier | None = None,
                     ranks_per_node: int | None = None) -> CollectiveTime:
    """Ring allgather; `size_bytes` is the gathered buffer (num_ranks x each rank's part), as
    nccl-tests counts it (busbw = S/t x (n-1)/n, nccl-tests doc/PERFORMANCE.md)."""
    return _ring_half_time_s(size_bytes, num_ranks, intra, inter, ranks_per_node)


def reduce_scatter_time_s(size_bytes: float, num_ranks: int, *, intra: Tier, inter: Tier | None = None,
                          ranks_per_node: int | None = None) -> CollectiveTime:
    """Ring reduce-scatter of a `size_bytes` input buffer (each rank keeps S/n reduced)."""
    return _ring_half_time_s(size_bytes, num_ranks, intra, inter, ranks_per_node)


def alltoall_time_s(size_bytes: float, num_ranks: int, *, intra: Tier, inter: Tier | None = None,
                    ranks_per_node: int | None = None) -> CollectiveTime:
    """Pairwise-exchange alltoall of a `size_bytes` send buffer per rank: n-1 rounds, each rank
    sends (n-1)/n x S, all over the slowest tier it uses (Thakur, Rabenseifner & Gropp, IJHPCA
    2005, pairwise exchange), with NCCL's point-to-point protocol, Simple."""
    if num_ranks <= 1 or size_bytes <= 0:
        return _NOTHING_TO_DO
    per_node, num_nodes = _layout(num_ranks, intra, inter, ranks_per_node)
    slowest = inter if num_nodes > 1 else intra
    bandwidth = effective_bandwidth_bytes_per_s(slowest)
    if num_nodes > 1 and per_node > 1:
        bandwidth = min(bandwidth, effective_bandwidth_bytes_per_s(intra))
    traffic = (num_ranks - 1) / num_ranks * size_bytes
    time_s = _candidate_time_s(traffic, bandwidth, "ring", "Simple", ((slowest, num_ranks - 1),), num_nodes)
    return CollectiveTime(time_s, "pairwise", "Simple")


def p2p_time_s(size_bytes: float, tier: Tier) -> float:
    """One send/recv of `size_bytes` over `tier`: NCCL's Simple base latency and one Simple hop,
    then the bytes at the link's achievable rate."""
    if size_bytes <= 0:
        return 0.0
    return _candidate_time_s(size_bytes, effective_bandwidth_bytes_per_s(tier), "ring", "Simple",
                             ((tier, 1),), 1)


def allreduce_bus_bandwidth_bytes_per_s(size_bytes: float, num_ranks: int, time_s: float) -> float:
    """nccl-tests' allreduce bus bandwidth: S/t x 2(n-1)/n (nccl-tests doc/PERFORMANCE.md)."""
    return size_bytes / time_s * 2 * (num_ranks - 1) / num_ranks


# ----------------------------------------------------------------------------- SMs taken

def compute_slowdown_while_communicating(num_sms: int, num_channels: int = NCCL_DEFAULT_NUM_CHANNELS) -> float:
    """Factor (>= 1) by which an SM-bound compute kernel slows while an NCCL collective runs
    beside it: NCCL holds one CTA, so one SM, per channel (NCCL_DEFAULT_NUM_CHANNELS), leaving
    num_sms - num_channels SMs to compute. Memory-bandwidth contention is not included."""
    if not 0 <= num_channels < num_sms:
        raise ValueError(f"num_channels must be in [0, num_sms={num_sms}), got {num_channels}")
    return num_sms / (num_sms - num_channels)
