"""Computation graphs with iteration spaces, and the configurations PaSE searches over.

Elango, "PaSE: Parallelization Strategies for Efficient DNN Training", IPDPS 2021 (problem
formulation): a DNN is a graph G = (V, E); each vertex is a layer with an iteration space (a GEMM
has the dimensions batch b, out n, in k); a configuration C_v = (c_1 .. c_d) splits dimension i
into c_i parts, with prod(c) <= p devices (devices beyond prod(c) idle for that layer); a strategy
assigns one configuration to every vertex. Splitting b is data parallelism, splitting any other
dimension is intra-layer ("parameter", tensor) parallelism.

Conventions of this package:
* `Vertex.dims` lists the splittable dimensions with their extents, in the order of the device
  layout: device d of a configuration c sits at the row-major coordinates of d in the grid c
  (first dimension outermost). Builders list batch first and reduction dimensions last, so the
  replicas of an output block (which allreduce it) are neighbouring devices.
* Kernel dimensions of convolutions are never split and are not listed.
* Tensors are described in fractions [0, 1) of each tensor dimension: a device holding part i of
  c along a dimension holds [i/c, (i+1)/c). An edge maps each of the producer's output dimensions
  to one consumer dimension (tensor fraction = (consumer fraction - offset) x scale, clipped to
  [0, 1]; a concatenation puts each input at its channel offset) or to none (the consumer needs
  the whole extent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simulator.workload import Layer, Workload


@dataclass(frozen=True)
class Vertex:
    """One layer: its iteration space, the tensors it indexes, and its per-sample costs."""

    name: str
    kind: str
    dims: tuple[tuple[str, int], ...]
    """(dimension, extent) in device-layout order; batch extent = the global batch size."""
    output: tuple[str, ...]
    """Dimensions indexing the output tensor; the others are reduction dimensions."""
    weight: tuple[str, ...] | None
    """Dimensions indexing the weight (None: no weights)."""
    in_feature: str | None
    """The dimension an input's channel/feature axis maps to (None: graph input only)."""
    out_feature: str
    """The output dimension that is the channel/feature axis."""
    layer: Layer
    """Per-sample FLOPs, parameters and tensor sizes (the zoo's conventions)."""

    @cached_property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.dims)

    @cached_property
    def _axis_of(self) -> dict[str, int]:
        return {name: axis for axis, (name, _) in enumerate(self.dims)}

    def index(self, dim: str) -> int:
        try:
            return self._axis_of[dim]
        except KeyError:
            raise ValueError(f"{dim!r} is not a dimension of {self.name}") from None


@dataclass(frozen=True)
class Edge:
    """A tensor from `src`'s output to `dst`'s input."""

    src: int
    dst: int
    mapping: tuple[tuple[str, str | None, float, float], ...]
    """Per producer output dimension: (producer dim, consumer dim or None, offset, scale)."""


@dataclass(frozen=True)
class Graph:
    name: str
    batch: int
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    """Edges go from a lower to a higher vertex index (vertices are in topological order)."""

    @property
    def num_vertices(self) -> int:
        return len(self.vertices)

    def neighbours(self) -> list[set[int]]:
        """Undirected adjacency (the DP only needs which vertices share an edge)."""
        adjacent: list[set[int]] = [set() for _ in self.vertices]
        for edge in self.edges:
            adjacent[edge.src].add(edge.dst)
            adjacent[edge.dst].add(edge.src)
        return adjacent

    def in_edges(self, vertex: int) -> list[int]:
        return list(self._edge_index[0].get(vertex, ()))

    def out_edges(self, vertex: int) -> list[int]:
        return list(self._edge_index[1].get(vertex, ()))

    @cached_property
    def _edge_index(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """({vertex: indices of its in-edges}, {vertex: of its out-edges}), in edge order, built once
        (a search asks for every vertex's edges many times)."""
        into: dict[int, list[int]] = {}
        out: dict[int, list[int]] = {}
        for index, edge in enumerate(self.edges):
            into.setdefault(edge.dst, []).append(index)
            out.setdefault(edge.src, []).append(index)
        return into, out

    def workload(self) -> Workload:
        """The vertices as a chain of layers in topological order (what the engine's costs index)."""
        return Workload(f"{self.name}-graph", tuple(v.layer for v in self.vertices))


def split_choices(num_devices: int) -> list[int]:
    """Allowed splits of one dimension: the divisors of p (the powers of two when p is one)."""
    return [c for c in range(1, num_devices + 1) if num_devices % c == 0]


def enumerate_configs(vertex: Vertex, num_devices: int) -> np.ndarray:
    """Every configuration of `vertex` for p devices, shape (K, number of dims).

    Each c_d is a divisor of p and at most the dimension's extent, and prod(c) <= p (idle devices
    allowed). Order (it breaks ties in the search): more devices first, then larger splits of the
    earlier dimensions first, so among equal costs batch splits (data parallelism) win.
    Counting: with p = 2^m and no extent limit there are C(m + d, d) configurations of d
    dimensions (p = 8: 56 for a 5-dimensional convolution, 20 for a GEMM; p = 64: 462 and 84).
    The DP refuses a table above `simulator.pase.search.MAX_TABLE_ENTRIES` (the cap on K^(M+1)).
    """
    choices = split_choices(num_devices)
    configs: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], used: int) -> None:
        if len(prefix) == len(vertex.dims):
            configs.append(prefix)
            return
        extent = vertex.dims[len(prefix)][1]
        for c in choices:
            if c <= extent and used * c <= num_devices:
                extend(prefix + (c,), used * c)

    extend((), 1)
    configs.sort(key=lambda c: (-math.prod(c), tuple(-x for x in c)))
    return np.array(configs, dtype=np.int64)


def config_index(configs: np.ndarray, config: tuple[int, ...]) -> int:
    matches = np.flatnonzero((configs == np.asarray(config)).all(axis=1))
    if not len(matches):
        raise ValueError(f"configuration {config} is not enumerated")
    return int(matches[0])


def device_coords(configs: np.ndarray, num_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-major grid coordinates of every device under every configuration.

    Returns coords (K, p, d) and active (K, p): device d works on the layer iff d < prod(c)."""
    configs = np.atleast_2d(configs)
    strides = np.ones_like(configs)
    for axis in range(configs.shape[1] - 2, -1, -1):
        strides[:, axis] = strides[:, axis + 1] * configs[:, axis + 1]
    devices = np.arange(num_devices)[None, :, None]
    coords = (devices // strides[:, None, :]) % configs[:, None, :]
    active = devices[..., 0] < configs.prod(axis=1)[:, None]
    return coords, active


def describe(vertex: Vertex, config) -> str:
    """`b4 n2` style label of a configuration (dimensions split 1 are left out)."""
    parts = [f"{name}{int(c)}" for (name, _), c in zip(vertex.dims, config) if c > 1]
    return " ".join(parts) if parts else "1"
