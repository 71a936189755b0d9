"""Computation graphs for PaSE: the zoo's models with their branches and skips, and InceptionV3.

`graph_from_workload` turns a zoo workload into a graph from its layers' `spec`: a conv block is
one convolution vertex (dims b, co, h, w, ci; its ReLU and pool stay inside, as in the zoo), an
FC layer or classifier head one GEMM vertex (b, n, k), a residual block its convolutions plus an
`add` vertex that also receives the skip, a transformer block its GEMMs (b, s, n, k), the
attention core (b, a, s: batch, heads, query positions) and two residual adds. A layer without a
known spec becomes an opaque vertex that can only be split along the batch.
`inception_v3_graph` builds torchvision's InceptionV3 (no auxiliary head; 117 vertices), which the
zoo does not have: its modules' branches meet in `concat` vertices.
Per-sample FLOPs/parameters follow the zoo's conventions (`simulator/zoo/_ops.py`).
"""

from __future__ import annotations

import dataclasses

from simulator.pase.graph import Edge, Graph, Vertex
from simulator.workload import Layer, Workload
from simulator.zoo._ops import Tally, conv_out, make_layer

IMAGE = ("b", "c", "h", "w")


class GraphBuilder:
    """Adds vertices in topological order; an input is a vertex index or (index, offset, scale)."""

    def __init__(self, name: str, batch: int):
        self.name, self.batch = name, batch
        self.vertices: list[Vertex] = []
        self.edges: list[Edge] = []

    def add(self, vertex: Vertex, inputs=()) -> int:
        index = len(self.vertices)
        self.vertices.append(vertex)
        for source in inputs:
            src, offset, scale = source if isinstance(source, tuple) else (source, 0.0, 1.0)
            self.edges.append(Edge(src, index, _mapping(self.vertices[src], vertex, offset, scale)))
        return index

    def graph(self) -> Graph:
        return Graph(self.name, self.batch, tuple(self.vertices), tuple(self.edges))


def _mapping(producer: Vertex, consumer: Vertex, offset: float, scale: float):
    """Producer output dims -> consumer dims: feature axis to feature axis, same names otherwise."""
    rows = []
    for dim in producer.output:
        if dim == producer.out_feature:
            rows.append((dim, consumer.in_feature, offset, scale) if consumer.in_feature
                        else (dim, None, 0.0, 1.0))
        elif dim in consumer.dim_names and dim != consumer.in_feature:
            rows.append((dim, dim, 0.0, 1.0))
        else:
            rows.append((dim, None, 0.0, 1.0))
    return tuple(rows)


# ----------------------------------------------------------------------------- vertex kinds

def conv_vertex(layer: Layer, batch: int, cin: int, cout: int, hw) -> Vertex:
    dims = (("b", batch), ("co", cout), ("h", hw[0]), ("w", hw[1]), ("ci", cin))
    return Vertex(layer.name, "conv", dims, ("b", "co", "h", "w"), ("co", "ci"), "ci", "co", layer)


def fc_vertex(layer: Layer, batch: int, fin: int, fout: int) -> Vertex:
    return Vertex(layer.name, "linear", (("b", batch), ("n", fout), ("k", fin)), ("b", "n"),
                  ("n", "k"), "k", "n", layer)


def token_linear_vertex(layer: Layer, batch: int, seq: int, fin: int, fout: int) -> Vertex:
    dims = (("b", batch), ("s", seq), ("n", fout), ("k", fin))
    return Vertex(layer.name, "linear", dims, ("b", "s", "n"), ("n", "k"), "k", "n", layer)


def image_vertex(layer: Layer, kind: str, batch: int, channels: int, hw) -> Vertex:
    """concat / add / pool over (b, c, h, w): no reduction dimensions, no weights."""
    dims = (("b", batch), ("c", channels), ("h", hw[0]), ("w", hw[1]))
    return Vertex(layer.name, kind, dims, IMAGE, None, "c", "c", layer)


def token_vertex(layer: Layer, kind: str, batch: int, seq: int, hidden: int, weighted=False) -> Vertex:
    dims = (("b", batch), ("s", seq), ("n", hidden))
    return Vertex(layer.name, kind, dims, ("b", "s", "n"), ("n",) if weighted else None,
                  None if kind == "embedding" else "n", "n", layer)


def attention_vertex(layer: Layer, batch: int, seq: int, heads: int) -> Vertex:
    """Scores, softmax and context of all heads: split by batch, heads and query positions. Each
    query block needs every position's K and V, so its input edge maps no sequence dimension."""
    dims = (("b", batch), ("a", heads), ("s", seq))
    return Vertex(layer.name, "attention", dims, ("b", "s", "a"), None, "a", "a", layer)


def opaque_vertex(layer: Layer, batch: int) -> Vertex:
    return Vertex(layer.name, "opaque", (("b", batch),), ("b",), () if layer.num_params else None,
                  None, None, layer)


# ----------------------------------------------------------------------------- layers

def conv_layer(name: str, cin: int, cout: int, kernel, hw, *, stride: int = 1, pad=(0, 0),
               bn: bool = True, relu: bool = True) -> tuple[Layer, tuple[int, int]]:
    """conv (kh x kw, no bias) [-> BN] [-> ReLU] as in torchvision's BasicConv2d."""
    kh, kw = kernel
    out = (conv_out(hw[0], kh, stride, pad[0]), conv_out(hw[1], kw, stride, pad[1]))
    t = Tally()
    t.flops += 2 * cin * kh * kw * cout * out[0] * out[1]
    t.params += cin * kh * kw * cout
    t.saved += cin * hw[0] * hw[1]
    elements = cout * out[0] * out[1]
    if bn:
        t.norm(cout, elements)
    if relu:
        t.relu(elements, save_output=False)
    return t.layer(name, "conv", cin * hw[0] * hw[1], elements, {}), out


def _elementwise_layer(name: str, flops: float, input_elements: int, output_elements: int) -> Layer:
    return make_layer(name, "elementwise", flops, 0, input_elements, output_elements, 0, {})


def _conv(builder: GraphBuilder, source, name, cin, cout, kernel, hw, **options):
    layer, out = conv_layer(name, cin, cout, kernel, hw, **options)
    inputs = [] if source is None else [source]
    return builder.add(conv_vertex(layer, builder.batch, cin, cout, out), inputs), out


def _merge(builder: GraphBuilder, name: str, kind: str, sources, channels, hw) -> int:
    """A concat (inputs at their channel offsets) or an add of equally shaped inputs."""
    elements = sum(channels) * hw[0] * hw[1] if kind == "concat" else channels[0] * hw[0] * hw[1]
    flops = 0 if kind == "concat" else (len(sources) - 1) * elements
    layer = _elementwise_layer(name, flops, elements, elements)
    total = sum(channels) if kind == "concat" else channels[0]
    inputs, offset = [], 0
    for source, width in zip(sources, channels):
        inputs.append((source, offset / total, total / width) if kind == "concat" else source)
        offset += width
    return builder.add(image_vertex(layer, kind, builder.batch, total, hw), inputs)


# ----------------------------------------------------------------------------- zoo workloads

def graph_from_workload(workload: Workload, batch: int) -> Graph:
    builder = GraphBuilder(workload.name, batch)
    last = None
    for layer in workload.layers:
        spec = layer.spec
        kind = spec.get("kind")
        inputs = [] if last is None else [last]
        if kind == "conv_block":
            last = builder.add(conv_vertex(layer, batch, spec["in_channels"], spec["out_channels"],
                                           spec["conv_output_hw"]), inputs)
        elif kind == "fc":
            last = builder.add(fc_vertex(layer, batch, spec["in_features"], spec["out_features"]), inputs)
        elif kind == "classifier_head":
            channels, classes = spec["in_channels"], spec["num_classes"]
            fc_params = channels * classes + classes
            last = _head(builder, last, layer.name, channels, spec["input_hw"], classes,
                         layer.forward_flops_per_sample - 2 * channels * classes, layer.num_params - fc_params)
        elif kind in ("basic_block", "bottleneck_block"):
            last = _residual_block(builder, last, layer.name, spec)
        elif kind == "embedding":
            last = builder.add(token_vertex(layer, "embedding", batch, spec["seq_len"], spec["hidden_size"],
                                            weighted=True), inputs)
        elif kind == "transformer_block":
            last = _transformer_block(builder, last, layer.name, spec)
        elif kind in ("lm_head", "bert_mlm_head"):
            last = builder.add(token_linear_vertex(layer, batch, spec["seq_len"], spec["hidden_size"],
                                                   spec["vocab_size"]), inputs)
        else:
            last = builder.add(opaque_vertex(layer, batch), inputs)
    return builder.graph()


def _residual_block(builder: GraphBuilder, source: int, name: str, spec: dict) -> int:
    """Basic block (two 3x3 convs) or bottleneck (1x1, 3x3, 1x1) plus the shortcut into an add."""
    cin, cout, stride, hw = spec["in_channels"], spec["out_channels"], spec["stride"], spec["input_hw"]
    if spec["kind"] == "basic_block":
        branch, out = _conv(builder, source, f"{name}.conv1", cin, cout, (3, 3), hw, stride=stride, pad=(1, 1))
        branch, out = _conv(builder, branch, f"{name}.conv2", cout, cout, (3, 3), out, pad=(1, 1), relu=False)
        skip = source if cin == cout else (source, (cout - cin) // 2 / cout, cout / cin)
    else:
        mid = spec["mid_channels"]
        branch, out = _conv(builder, source, f"{name}.conv1", cin, mid, (1, 1), hw)
        branch, out = _conv(builder, branch, f"{name}.conv2", mid, mid, (3, 3), out, stride=stride, pad=(1, 1))
        branch, out = _conv(builder, branch, f"{name}.conv3", mid, cout, (1, 1), out, relu=False)
        skip = source
        if spec["shortcut"] == "conv":
            skip, _ = _conv(builder, source, f"{name}.shortcut", cin, cout, (1, 1), hw, stride=stride,
                            relu=False, bn=not spec["preact"])
    return _merge(builder, f"{name}.add", "add", [branch, skip], [cout, cout], out)


def _transformer_block(builder: GraphBuilder, source: int, name: str, spec: dict) -> int:
    """LN + QKV GEMM, attention core, out-projection, add; LN + MLP up (GELU), MLP down, add."""
    batch, s, h = builder.batch, spec["seq_len"], spec["hidden_size"]
    heads, ffn = spec["num_heads"], spec["ffn_hidden_size"]

    def linear(label, fin, fout, src, norm=False, gelu=False):
        t = Tally()
        if norm:
            t.norm(fin, s * fin)
        t.linear(fin, fout, tokens=s)
        if gelu:
            t.gelu(s * fout)
        layer = t.layer(f"{name}.{label}", "linear", s * fin, s * fout, {})
        return builder.add(token_linear_vertex(layer, batch, s, fin, fout), [src])

    def add(label, sources):
        layer = _elementwise_layer(f"{name}.{label}", s * h, s * h, s * h)
        return builder.add(token_vertex(layer, "add", batch, s, h), sources)

    qkv = linear("qkv", h, 3 * h, source, norm=True)
    t = Tally()
    t.attention_core(s, h, heads)
    core = t.layer(f"{name}.attention", "attention", 3 * s * h, s * h, {})
    core = dataclasses.replace(core, backward_flops_per_sample=2 * core.forward_flops_per_sample)
    attention = builder.add(attention_vertex(core, batch, s, heads), [qkv])
    first = add("add1", [linear("proj", h, h, attention), source])
    up = linear("mlp_up", h, ffn, first, norm=True, gelu=True)
    return add("add2", [linear("mlp_down", ffn, h, up), first])


# ----------------------------------------------------------------------------- InceptionV3

def inception_v3_graph(batch: int, image_size: int = 299, num_classes: int = 1000) -> Graph:
    """torchvision `inception_v3` without the auxiliary classifier (Szegedy et al., CVPR 2016):
    stem, 3 x InceptionA, B, 4 x C, D, 2 x E, average pool + FC."""
    g = GraphBuilder("inception_v3", batch)
    hw = (image_size, image_size)
    x, hw = _conv(g, None, "conv1a", 3, 32, (3, 3), hw, stride=2)
    x, hw = _conv(g, x, "conv2a", 32, 32, (3, 3), hw)
    x, hw = _conv(g, x, "conv2b", 32, 64, (3, 3), hw, pad=(1, 1))
    x, hw = _pool(g, x, "pool1", 64, hw, 3, 2, 0)
    x, hw = _conv(g, x, "conv3b", 64, 80, (1, 1), hw)
    x, hw = _conv(g, x, "conv4a", 80, 192, (3, 3), hw)
    x, hw = _pool(g, x, "pool2", 192, hw, 3, 2, 0)
    channels = 192
    for name, pool_features in (("5b", 32), ("5c", 64), ("5d", 64)):
        x, channels = _module(g, f"mixed{name}", x, channels, hw, _inception_a(pool_features))
    x, channels, hw = _reduction(g, "mixed6a", x, channels, hw, [[(384, (3, 3), 2, (0, 0))],
                                 [(64, (1, 1), 1, (0, 0)), (96, (3, 3), 1, (1, 1)), (96, (3, 3), 2, (0, 0))]])
    for name, c7 in (("6b", 128), ("6c", 160), ("6d", 160), ("6e", 192)):
        x, channels = _module(g, f"mixed{name}", x, channels, hw, _inception_c(c7))
    x, channels, hw = _reduction(g, "mixed7a", x, channels, hw, [
        [(192, (1, 1), 1, (0, 0)), (320, (3, 3), 2, (0, 0))],
        [(192, (1, 1), 1, (0, 0)), (192, (1, 7), 1, (0, 3)), (192, (7, 1), 1, (3, 0)), (192, (3, 3), 2, (0, 0))]])
    for name in ("7b", "7c"):
        x, channels = _inception_e(g, f"mixed{name}", x, channels, hw)
    _head(g, x, "head", channels, hw, num_classes, channels * hw[0] * hw[1], 0)
    return g.graph()


def _head(g: GraphBuilder, source: int, name: str, channels: int, hw, num_classes: int,
          pool_flops: float, pool_params: int) -> int:
    """Global average pool (with any pre-activation BN-ReLU: `pool_flops`, `pool_params`) as one
    vertex, then the FC layer on the pooled features (its input gradient is then b x channels)."""
    pool = make_layer(f"{name}.pool", "elementwise", pool_flops, pool_params, channels * hw[0] * hw[1],
                      channels, 0, {})
    pooled = g.add(dataclasses.replace(image_vertex(pool, "pool", g.batch, channels, (1, 1)),
                                       weight=("c",) if pool_params else None), [source])
    t = Tally()
    t.linear(channels, num_classes)
    return g.add(fc_vertex(t.layer(f"{name}.fc", "linear", channels, num_classes, {}), g.batch,
                           channels, num_classes), [pooled])


def _pool(g: GraphBuilder, source: int, name: str, channels: int, hw, k: int, stride: int, pad: int):
    out = (conv_out(hw[0], k, stride, pad), conv_out(hw[1], k, stride, pad))
    layer = _elementwise_layer(name, k * k * channels * out[0] * out[1], channels * hw[0] * hw[1],
                               channels * out[0] * out[1])
    return g.add(image_vertex(layer, "pool", g.batch, channels, out), [source]), out


def _branch(g: GraphBuilder, name: str, source: int, channels: int, hw, convs) -> tuple[int, int]:
    """A chain of (out channels, kernel, stride, pad) convolutions; returns (last vertex, width)."""
    for i, (cout, kernel, stride, pad) in enumerate(convs):
        source, hw = _conv(g, source, f"{name}.{i}", channels, cout, kernel, hw, stride=stride, pad=pad)
        channels = cout
    return source, channels


def _module(g: GraphBuilder, name: str, x: int, channels: int, hw, branches) -> tuple[int, int]:
    """Stride-1 module: each branch (optionally after a 3x3 average pool) into one concat."""
    outputs, widths = [], []
    for i, (pooled, convs) in enumerate(branches):
        start = _pool(g, x, f"{name}.b{i}.pool", channels, hw, 3, 1, 1)[0] if pooled else x
        end, width = _branch(g, f"{name}.b{i}", start, channels, hw, convs)
        outputs.append(end)
        widths.append(width)
    return _merge(g, f"{name}.concat", "concat", outputs, widths, hw), sum(widths)


def _reduction(g: GraphBuilder, name: str, x: int, channels: int, hw, branches):
    """Grid-size reduction (InceptionB / D): conv branches plus a 3x3 stride-2 max pool."""
    outputs, widths = [], []
    for i, convs in enumerate(branches):
        end, width = _branch(g, f"{name}.b{i}", x, channels, hw, convs)
        outputs.append(end)
        widths.append(width)
    pooled, out = _pool(g, x, f"{name}.pool", channels, hw, 3, 2, 0)
    outputs.append(pooled)
    widths.append(channels)
    return _merge(g, f"{name}.concat", "concat", outputs, widths, out), sum(widths), out


def _inception_a(pool_features: int):
    one = (0, 0)
    return [(False, [(64, (1, 1), 1, one)]),
            (False, [(48, (1, 1), 1, one), (64, (5, 5), 1, (2, 2))]),
            (False, [(64, (1, 1), 1, one), (96, (3, 3), 1, (1, 1)), (96, (3, 3), 1, (1, 1))]),
            (True, [(pool_features, (1, 1), 1, one)])]


def _inception_c(c7: int):
    one, row, col = (0, 0), ((1, 7), (0, 3)), ((7, 1), (3, 0))
    return [(False, [(192, (1, 1), 1, one)]),
            (False, [(c7, (1, 1), 1, one), (c7, row[0], 1, row[1]), (192, col[0], 1, col[1])]),
            (False, [(c7, (1, 1), 1, one), (c7, col[0], 1, col[1]), (c7, row[0], 1, row[1]),
                     (c7, col[0], 1, col[1]), (192, row[0], 1, row[1])]),
            (True, [(192, (1, 1), 1, one)])]


def _inception_e(g: GraphBuilder, name: str, x: int, channels: int, hw) -> tuple[int, int]:
    """InceptionE: the 3x3 branches end in a parallel (1x3, 3x1) pair, all six into one concat."""
    one = (0, 0)
    first, _ = _branch(g, f"{name}.b0", x, channels, hw, [(320, (1, 1), 1, one)])
    mid, _ = _branch(g, f"{name}.b1", x, channels, hw, [(384, (1, 1), 1, one)])
    deep, _ = _branch(g, f"{name}.b2", x, channels, hw, [(448, (1, 1), 1, one), (384, (3, 3), 1, (1, 1))])
    outputs = [first]
    for label, source, width in (("b1", mid, 384), ("b2", deep, 384)):
        outputs.append(_branch(g, f"{name}.{label}a", source, width, hw, [(384, (1, 3), 1, (0, 1))])[0])
        outputs.append(_branch(g, f"{name}.{label}b", source, width, hw, [(384, (3, 1), 1, (1, 0))])[0])
    pooled = _pool(g, x, f"{name}.b3.pool", channels, hw, 3, 1, 1)[0]
    outputs.append(_branch(g, f"{name}.b3", pooled, channels, hw, [(192, (1, 1), 1, one)])[0])
    widths = [320, 384, 384, 384, 384, 192]
    return _merge(g, f"{name}.concat", "concat", outputs, widths, hw), sum(widths)


EXTRA_GRAPHS = {"inception_v3": inception_v3_graph, "inceptionv3": inception_v3_graph}
"""Graphs for models the zoo does not have, by `model.name` (lower case)."""
