"""PaSE's cost function, in FLOP units (Elango, PaSE, IPDPS 2021, problem formulation):

    F(G, phi) = sum_v t_l(v, phi, r) + sum_(u,v) r x t_x(u, v, phi),   r = peak FLOP/s / link bytes/s

* t_l = compute / prod(c) + r x intra-layer communication. Compute is the layer's forward +
  backward FLOPs (for a GEMM 3 m n k multiply-adds = 6 m n k FLOPs: the forward and the two
  backward GEMMs; FLOPs count a multiply-add as 2, the project's convention, so F / peak is
  seconds at peak). Intra-layer communication is ring allreduce traffic, 2 (g-1)/g x shard bytes
  per device (Patarasuk & Yuan 2009) for: the output over the split of its reduction dimensions
  (a GEMM's k), each input gradient over the split of the dimensions that input does not index
  (a GEMM's n), the weight gradient over the split of the dimensions the weight does not index
  (batch, and sequence or image height/width).
* t_x of an edge = the bytes a device needs for the consumer's configuration that it does not
  already hold from the producer's, maximised over devices (the busiest device bounds the
  transfer), forward for the activation plus the same count backward for its gradient (the
  producer's devices need the gradient of the block they produced). The paper's text describes
  the forward count; counting the gradient too is this implementation's choice.
Convolution halos (the border rows a spatially split convolution also needs) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.pase.graph import Edge, Graph, Vertex, device_coords

CHUNK_ELEMENTS = 131_072
"""Bound on the (K_u block x K_v x p) temporaries of the edge-cost computation (float32)."""


@dataclass(frozen=True)
class CostSettings:
    num_devices: int
    element_bytes: int
    flops_per_byte: float
    """r: device peak FLOP/s over link bytes/s."""


def ring_factor(group: np.ndarray) -> np.ndarray:
    """Bytes each device sends in a ring allreduce, per byte of the reduced buffer."""
    group = np.asarray(group, dtype=float)
    return 2.0 * (group - 1.0) / group


def compute_flops(vertex: Vertex, batch: int, configs: np.ndarray) -> np.ndarray:
    """Per-device forward + backward FLOPs of each configuration: total / prod(c)."""
    return vertex.layer.flops_per_sample * batch / configs.prod(axis=1)


def _split_of(vertex: Vertex, configs: np.ndarray, dims) -> np.ndarray:
    """prod(c_d) over the listed dimensions, per configuration."""
    columns = [vertex.index(d) for d in dims]
    return configs[:, columns].prod(axis=1) if columns else np.ones(len(configs), dtype=np.int64)


def _others(vertex: Vertex, dims) -> list[str]:
    return [d for d in vertex.dim_names if d not in dims]


def intra_layer_bytes(graph: Graph, index: int, configs: np.ndarray, element_bytes: int) -> np.ndarray:
    """Per-device allreduce bytes of each configuration (output, input gradients, weight gradient)."""
    vertex = graph.vertices[index]
    out_elements = vertex.layer.output_elements_per_sample * graph.batch
    total = ring_factor(_split_of(vertex, configs, _others(vertex, vertex.output)))
    total = total * out_elements / _split_of(vertex, configs, vertex.output)
    for edge in (graph.edges[i] for i in graph.in_edges(index)):
        mapped = [consumer for _, consumer, _, _ in edge.mapping if consumer is not None]
        elements = graph.vertices[edge.src].layer.output_elements_per_sample * graph.batch
        group = _split_of(vertex, configs, _others(vertex, mapped))
        total = total + ring_factor(group) * elements / _split_of(vertex, configs, mapped)
    if vertex.weight is not None and vertex.layer.num_params:
        group = _split_of(vertex, configs, _others(vertex, vertex.weight))
        total = total + ring_factor(group) * vertex.layer.num_params / _split_of(vertex, configs, vertex.weight)
    return total * element_bytes


def producer_blocks(producer: Vertex, edge: Edge, configs: np.ndarray, num_devices: int):
    """[lo, hi) fractions of the edge's tensor each device holds, shapes (K, p, T)."""
    coords, active = device_coords(configs, num_devices)
    lows, highs = [], []
    for producer_dim, _, _, _ in edge.mapping:
        axis = producer.index(producer_dim)
        parts = configs[:, axis][:, None]
        lows.append(coords[..., axis] / parts)
        highs.append((coords[..., axis] + 1) / parts)
    return _stack(lows, highs, active)


def consumer_blocks(consumer: Vertex, edge: Edge, configs: np.ndarray, num_devices: int):
    """[lo, hi) fractions of the edge's tensor each device needs, shapes (K, p, T)."""
    coords, active = device_coords(configs, num_devices)
    lows, highs = [], []
    for _, consumer_dim, offset, scale in edge.mapping:
        if consumer_dim is None:
            lows.append(np.zeros(active.shape))
            highs.append(np.ones(active.shape))
            continue
        axis = consumer.index(consumer_dim)
        parts = configs[:, axis][:, None]
        lows.append(np.clip((coords[..., axis] / parts - offset) * scale, 0.0, 1.0))
        highs.append(np.clip(((coords[..., axis] + 1) / parts - offset) * scale, 0.0, 1.0))
    return _stack(lows, highs, active)


def _stack(lows, highs, active):
    low = np.stack(lows, axis=-1) if lows else np.zeros(active.shape + (0,))
    high = np.stack(highs, axis=-1) if highs else np.ones(active.shape + (0,))
    low = np.where(active[..., None], low, 0.0).astype(np.float32)
    high = np.where(active[..., None], high, 0.0).astype(np.float32)
    return low, high


def volume(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return np.clip(high - low, 0.0, None).prod(axis=-1, dtype=np.float64)


def edge_bytes(graph: Graph, edge: Edge, configs_u: np.ndarray, configs_v: np.ndarray,
               num_devices: int, element_bytes: int, fractions: dict | None = None) -> np.ndarray:
    """Redistribution bytes of an edge for every pair of configurations, shape (K_u, K_v): the
    tensor's bytes times the largest fraction of it a device must receive (`edge_fractions`),
    remembered in `fractions` where given (a model's repeated blocks share their edges' fractions)."""
    if fractions is None:
        fraction = edge_fractions(graph, edge, configs_u, configs_v, num_devices)
    else:
        producer, consumer = graph.vertices[edge.src], graph.vertices[edge.dst]
        key = (producer.dim_names, configs_u.shape, configs_u.tobytes(), consumer.dim_names, configs_v.shape,
               configs_v.tobytes(), edge.mapping, num_devices)
        fraction = fractions.get(key)
        if fraction is None:
            fraction = fractions[key] = edge_fractions(graph, edge, configs_u, configs_v, num_devices)
    elements = graph.vertices[edge.src].layer.output_elements_per_sample * graph.batch
    return fraction * elements * element_bytes


def edge_fractions(graph: Graph, edge: Edge, configs_u: np.ndarray, configs_v: np.ndarray,
                   num_devices: int) -> np.ndarray:
    """Per pair of configurations, the largest fraction of the edge's tensor one device receives
    forward plus the largest it sends back (its gradient), shape (K_u, K_v): a function of the two
    vertices' dimension names, their configurations and the edge's mapping only."""
    lo_u, hi_u = producer_blocks(graph.vertices[edge.src], edge, configs_u, num_devices)
    lo_v, hi_v = consumer_blocks(graph.vertices[edge.dst], edge, configs_v, num_devices)
    have, need = volume(lo_u, hi_u), volume(lo_v, hi_v)
    result = np.empty((len(configs_u), len(configs_v)))
    step = max(1, CHUNK_ELEMENTS // max(1, len(configs_v) * num_devices))
    for start in range(0, len(configs_u), step):
        part = slice(start, start + step)
        overlap = _overlap(lo_u[part], hi_u[part], lo_v, hi_v)
        forward = (need[None] - overlap).max(axis=-1)
        backward = (have[part, None] - overlap).max(axis=-1)
        result[part] = forward + backward
    return np.clip(result, 0.0, None)


def _overlap(lo_u, hi_u, lo_v, hi_v) -> np.ndarray:
    """Volume of block_u(d) & block_v(d) for every (config u, config v, device d), float32 in place
    (fractions of power-of-two splits are exact in float32)."""
    shape = (lo_u.shape[0], lo_v.shape[0], lo_u.shape[1])
    total = np.ones(shape, dtype=np.float32)
    low, high = np.empty(shape, dtype=np.float32), np.empty(shape, dtype=np.float32)
    for t in range(lo_u.shape[-1]):
        np.maximum(lo_u[:, None, :, t], lo_v[None, :, :, t], out=low)
        np.minimum(hi_u[:, None, :, t], hi_v[None, :, :, t], out=high)
        np.subtract(high, low, out=high)
        np.maximum(high, 0.0, out=high)
        total *= high
    return total


def vertex_cost(graph: Graph, index: int, configs: np.ndarray, settings: CostSettings) -> np.ndarray:
    """t_l for every configuration of vertex `index`, in FLOP units."""
    compute = compute_flops(graph.vertices[index], graph.batch, configs)
    comm = intra_layer_bytes(graph, index, configs, settings.element_bytes)
    return compute + settings.flops_per_byte * comm


def edge_cost(graph: Graph, edge: Edge, configs_u: np.ndarray, configs_v: np.ndarray,
              settings: CostSettings, fractions: dict | None = None) -> np.ndarray:
    """r x t_x for every pair of configurations, in FLOP units (`fractions`: as `edge_bytes`)."""
    return settings.flops_per_byte * edge_bytes(graph, edge, configs_u, configs_v,
                                                settings.num_devices, settings.element_bytes, fractions)


def strategy_breakdown(graph: Graph, strategy, settings: CostSettings) -> dict:
    """Cost of one strategy (a configuration tuple per vertex), evaluated directly, with its parts."""
    one = [np.asarray([config], dtype=np.int64) for config in strategy]
    compute = sum(float(compute_flops(v, graph.batch, one[i])[0]) for i, v in enumerate(graph.vertices))
    intra = sum(float(intra_layer_bytes(graph, i, one[i], settings.element_bytes)[0])
                for i in range(graph.num_vertices))
    redistribution = sum(float(edge_bytes(graph, e, one[e.src], one[e.dst], settings.num_devices,
                                          settings.element_bytes)[0, 0]) for e in graph.edges)
    r = settings.flops_per_byte
    return {"cost_flops": compute + r * (intra + redistribution), "compute_flops": compute,
            "intra_layer_bytes": intra, "redistribution_bytes": redistribution}
