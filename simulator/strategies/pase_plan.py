"""A PaSE strategy (one configuration per graph vertex) as an engine plan.

Rank d is device d of the first p devices. For each vertex v in topological order, forward:
  * receive the pieces of v's inputs that d needs for v's configuration and does not hold;
  * if d works on v (d < prod(c)), compute its 1/prod(c) share: a `Compute` of layer v at the
    equivalent batch fraction B / prod(c) (the cost model's time for that many samples of the
    whole layer, i.e. the layer's FLOPs / prod(c); the plan's workload gives each layer only the
    weight shard a device holds, so the roofline's memory term reads the shard, not all weights);
  * `Collective(op="allreduce")` of its output block among the ranks sharing it (those that differ
    only along the reduction dimensions);
  * send the pieces of its output block that consumers' devices need (point-to-point `Send` /
    `Recv`; one piece per (holder block, needing device), from a holder on the receiver's node
    when there is one).
Backward in reverse order: receive output-gradient pieces, compute, allreduce each input gradient
among the ranks that split the dimensions that input does not index, allreduce the weight
gradient among the ranks that split the dimensions the weight does not index, send the input
gradient pieces back to the producers' devices. Then each rank updates its weight shards.
The bytes moved are the ones PaSE's cost counts (`simulator.pase.cost`), so the engine's timing
of this plan and F / peak FLOP/s can be compared directly.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np

from simulator.pase.cost import consumer_blocks, producer_blocks
from simulator.pase.graph import Graph, device_coords
from simulator.plan import BACKWARD, FORWARD, OPTIMIZER, Collective, Compute, Plan, Recv, Send, Stage
from simulator.workload import Workload


def compile_pase_plan(graph: Graph, strategy, num_devices: int, element_bytes: int,
                      gpus_per_node: int) -> tuple[Plan, Workload]:
    """The plan of `strategy` (a configuration tuple per vertex) and the workload its actions index."""
    layout = _Layout(graph, strategy, num_devices)
    forward, backward = [], []
    alike: dict = {}  # edges of a model's repeated blocks move the same pieces
    for e in graph.edges:
        size = graph.vertices[e.src].layer.output_elements_per_sample * graph.batch * element_bytes
        u, v = graph.vertices[e.src], graph.vertices[e.dst]
        for direction, into in ((False, forward), (True, backward)):
            key = (u.dim_names, layout.strategy[e.src], v.dim_names, layout.strategy[e.dst], e.mapping, direction)
            pieces = alike.get(key)
            if pieces is None:
                pieces = alike[key] = _pieces(graph, e, strategy, num_devices, gpus_per_node, backward=direction)
            into.append(_Transfers(pieces, size, num_devices))
    actions = tuple(_rank_actions(graph, layout, forward, backward, element_bytes, rank)
                    for rank in range(num_devices))
    workload = Workload(f"{graph.name}-pase", tuple(
        dataclasses.replace(v.layer, num_params=round(layout.weight_shard(i))) for i, v in enumerate(graph.vertices)))
    stages = (Stage(0, 0, graph.num_vertices, workload.num_params),)
    plan = Plan("pase", num_devices, 1, stages, tuple(range(num_devices)), actions, graph.batch / num_devices,
                meta={"placement": "pase", "partition": [graph.num_vertices]})
    return plan, workload


class _Layout:
    """Coordinates, activity and allreduce groups of every vertex's configuration; vertices alike
    (the same configuration of the same dimensions: a model's repeated blocks) share them."""

    def __init__(self, graph: Graph, strategy, num_devices: int):
        self.graph, self.strategy = graph, [tuple(int(c) for c in s) for s in strategy]
        self.coords, self.active = [], []
        grids: dict[tuple[int, ...], tuple] = {}
        for config in self.strategy:
            if config not in grids:
                coords, active = device_coords(np.asarray([config]), num_devices)
                grids[config] = coords[0], active[0]
            self.coords.append(grids[config][0])
            self.active.append(grids[config][1])
        self._groups: dict[tuple, list[tuple[int, ...]]] = {}

    def parts(self, vertex: int) -> int:
        return math.prod(self.strategy[vertex])

    def split(self, vertex: int, dims) -> int:
        v = self.graph.vertices[vertex]
        return math.prod(self.strategy[vertex][v.index(d)] for d in dims)

    def group(self, vertex: int, rank: int, same_dims) -> tuple[int, ...]:
        """Active ranks whose coordinates equal `rank`'s along `same_dims` (sorted); every rank's
        group of a (configuration, dimensions) found at once, on its first call."""
        v = self.graph.vertices[vertex]
        key = (self.strategy[vertex], v.dim_names, tuple(same_dims))
        groups = self._groups.get(key)
        if groups is None:
            axes = [v.index(d) for d in same_dims]
            coords, active = self.coords[vertex], self.active[vertex]
            members: dict[tuple, list[int]] = defaultdict(list)
            rows = [tuple(row) for row in coords[:, axes].tolist()]
            for device, row in enumerate(rows):
                if active[device]:
                    members[row].append(device)
            groups = self._groups[key] = [tuple(members.get(row, ())) for row in rows]
        return groups[rank]

    def weight_shard(self, vertex: int) -> float:
        v = self.graph.vertices[vertex]
        return v.layer.num_params / self.split(vertex, v.weight or ())


def _pieces(graph: Graph, edge, strategy, num_devices: int, gpus_per_node: int, backward: bool):
    """(source rank, destination rank, fraction of the tensor) transfers of one edge.

    Forward: every consumer device receives, from one holder of each producer block it overlaps
    (other than its own), the overlap. Backward: every producer device receives, from one holder
    of each consumer region overlapping its block (other than its own), the input gradient overlap.
    """
    u, v = graph.vertices[edge.src], graph.vertices[edge.dst]
    lo_u, hi_u = (a[0] for a in producer_blocks(u, edge, np.asarray([strategy[edge.src]]), num_devices))
    lo_v, hi_v = (a[0] for a in consumer_blocks(v, edge, np.asarray([strategy[edge.dst]]), num_devices))
    if backward:
        (lo_u, hi_u), (lo_v, hi_v) = (lo_v, hi_v), (lo_u, hi_u)
    holders = defaultdict(list)
    for device in range(num_devices):
        if (hi_u[device] > lo_u[device]).all():
            holders[(tuple(lo_u[device]), tuple(hi_u[device]))].append(device)
    if not holders:
        return []
    blocks_low = np.asarray([block_low for block_low, _ in holders], dtype=float)  # (holders, dims)
    blocks_high = np.asarray([block_high for _, block_high in holders], dtype=float)
    members_of = list(holders.values())
    # every (device, holder) overlap at once: (devices, holders) products of the per-dim overlaps
    overlaps = np.clip(np.minimum(hi_v[:, None, :], blocks_high[None]) - np.maximum(lo_v[:, None, :], blocks_low[None]),
                       0.0, None).prod(axis=2)
    receives = (hi_v > lo_v).all(axis=1)
    pieces = []
    for device in np.flatnonzero(receives).tolist():
        for holder in np.flatnonzero(overlaps[device] > 1e-12).tolist():
            members = members_of[holder]
            if device in members:
                continue
            local = [m for m in members if m // gpus_per_node == device // gpus_per_node] or members
            pieces.append((local[device % len(local)], device, float(overlaps[device, holder])))
    return pieces


class _Transfers:
    """One edge direction: its pieces, and whether the plan plays it as point-to-point messages or,
    when the edge has more pieces than devices, as one collective equivalent: a ring allgather
    among the devices that send or receive, with size_bytes per rank chosen so that every
    participant receives as many bytes as the busiest receiver of the pieces (the quantity
    PaSE's edge cost counts); the engine's per-flow cost keeps this cheap where p^2 messages
    would not be."""

    def __init__(self, pieces, tensor_bytes: float, num_devices: int):
        self.pieces = [(src, dst, fraction * tensor_bytes) for src, dst, fraction in pieces]
        self.collective = len(self.pieces) > num_devices
        received = defaultdict(float)
        for _, dst, size in self.pieces:
            received[dst] += size
        self.ranks = tuple(sorted({r for src, dst, _ in self.pieces for r in (src, dst)}))
        self.per_rank_bytes = max(received.values(), default=0.0) / max(1, len(self.ranks) - 1)


def _rank_actions(graph: Graph, layout: _Layout, forward, backward, element_bytes: int, rank: int):
    """Forward in topological order, backward in reverse, then the update (module docstring)."""
    builder = _Builder(graph, layout, rank, element_bytes)
    for index in range(graph.num_vertices):
        builder.forward(index, forward)
    for index in range(graph.num_vertices - 1, -1, -1):
        builder.backward(index, backward)
    builder.add(Compute, phase=OPTIMIZER, layer_start=0, layer_end=graph.num_vertices, batch=0.0,
                deps=tuple(d for d in (builder.last, *builder.updates) if d is not None),
                num_params=round(builder.params))
    return tuple(builder.actions)


class _Builder:
    def __init__(self, graph: Graph, layout: _Layout, rank: int, element_bytes: int):
        self.graph, self.layout, self.rank, self.element_bytes = graph, layout, rank, element_bytes
        self.actions: list = []
        self.arrivals: dict[tuple[str, int], int] = {}
        self.last, self.updates, self.params = None, [], 0.0

    def add(self, kind, **fields) -> int:
        self.actions.append(kind(id=len(self.actions), **fields))
        return len(self.actions) - 1

    def tensor_bytes(self, vertex: int) -> float:
        return self.graph.vertices[vertex].layer.output_elements_per_sample * self.graph.batch * self.element_bytes

    def receive(self, edges, transfers, phase) -> tuple[int, ...]:
        ids = [self.arrivals[(phase, e)] for e in edges if (phase, e) in self.arrivals]
        for e in edges:
            if not transfers[e].collective:
                ids += [self.add(Recv, src=src, key=("pase", phase, e, src, self.rank, "x"), label=f"recv {phase}{e}")
                        for src, dst, _ in transfers[e].pieces if dst == self.rank]
        return tuple(ids)

    def send(self, e: int, transfer: _Transfers, phase: str, ready: int | None) -> None:
        """Point-to-point sends of this rank, or its part in the edge's collective equivalent."""
        if transfer.collective:
            if self.rank in transfer.ranks:
                self.arrivals[(phase, e)] = self.add(
                    Collective, op="allgather", ranks=transfer.ranks, size_bytes=transfer.per_rank_bytes,
                    key=("pase", phase, e), deps=() if ready is None else (ready,), label=f"redistribute {phase}{e}")
            return
        for src, dst, size in transfer.pieces:
            if src == self.rank:
                self.add(Send, dst=dst, size_bytes=size, key=("pase", phase, e, src, dst, "x"),
                         deps=(ready,), label=f"send {phase}{e}")

    def allreduce(self, tag, vertex, same_dims, size_bytes, deps) -> int | None:
        members = self.layout.group(vertex, self.rank, same_dims)
        if len(members) < 2 or size_bytes <= 0:
            return None
        return self.add(Collective, op="allreduce", ranks=members, size_bytes=size_bytes,
                        key=("pase", tag, vertex, members[0]), deps=deps, label=f"allreduce {tag}{vertex}")

    def forward(self, index: int, transfers) -> None:
        vertex, layout = self.graph.vertices[index], self.layout
        deps = self.receive(self.graph.in_edges(index), transfers, "F")
        ready = None
        if layout.active[index][self.rank]:
            ready = self.add(Compute, phase=FORWARD, layer_start=index, layer_end=index + 1,
                             batch=self.graph.batch / layout.parts(index), deps=deps)
            shard = self.tensor_bytes(index) / layout.split(index, vertex.output)
            reduced = self.allreduce("out", index, vertex.output, shard, (ready,))
            ready = ready if reduced is None else reduced
        for e in self.graph.out_edges(index):
            self.send(e, transfers[e], "F", ready)

    def backward(self, index: int, transfers) -> None:
        vertex, layout = self.graph.vertices[index], self.layout
        deps = self.receive(self.graph.out_edges(index), transfers, "B")
        active = layout.active[index][self.rank]
        if active:
            self.last = self.add(Compute, phase=BACKWARD, layer_start=index, layer_end=index + 1,
                                 batch=self.graph.batch / layout.parts(index), deps=deps)
        for e in self.graph.in_edges(index):
            ready = None
            if active:
                mapped = [d for _, d, _, _ in self.graph.edges[e].mapping if d is not None]
                shard = self.tensor_bytes(self.graph.edges[e].src) / layout.split(index, mapped)
                reduced = self.allreduce(f"in{e}.", index, mapped, shard, (self.last,))
                ready = self.last if reduced is None else reduced
            self.send(e, transfers[e], "B", ready)
        if active and vertex.layer.num_params:
            self.params += layout.weight_shard(index)
            size = layout.weight_shard(index) * self.element_bytes
            reduced = self.allreduce("w", index, vertex.weight or (), size, (self.last,))
            self.updates += [reduced] if reduced is not None else []
