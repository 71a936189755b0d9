"""One tensor-parallel rank's share of each layer, and the TP collectives each layer needs.

Megatron-LM tensor parallelism (Shoeybi et al. 2019, sec. 3; Narayanan et al. SC'21, sec. 2.3)
splits a transformer block over t ranks: QKV and the first MLP GEMM are column-parallel, the
attention heads are split, the attention out-projection and the second MLP GEMM are
row-parallel. Sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2) also splits the
LayerNorms, dropouts and residual adds along the sequence. Rules per layer kind (t = tp_degree,
SP = sequence parallel; figures per sample, as in `simulator.workload`):

- attention (a transformer block): FLOPs of the GEMMs, attention core, softmax and GELU / t; the
  2 LayerNorms + 2 residual adds (12 s h) replicated (SP: / t). Parameters / t but 6 h replicated
  (LayerNorms, row-parallel biases). Saved activations: 4 s h replicated (inputs of both
  LayerNorms, of QKV and of fc1), the rest / t; SP: all / t (Korthikanti eq. 2-4, in elements,
  without dropout masks). TP collectives of b s h: 2 allreduces in forward, 2 in backward; SP:
  2 allgathers + 2 reduce-scatters in forward, and in backward 2 more allgathers: each
  column-parallel GEMM gathers its sequence-sharded input again for its weight gradient, since
  only the shard is kept (Korthikanti et al. 2022, sec. 4.2.2; Megatron-LM's
  `LinearWithGradAccumulationAndAsyncCommunication`).
- embedding: vocab-parallel token table (parameters / t), position table replicated; its adds and
  saved ids replicated (SP: / t); an allreduce of the output in forward (SP: a reduce-scatter).
- linear (the LM head): column-parallel, vocab-parallel logits (FLOPs, output / t); its LayerNorm
  (5 s h FLOPs, 2 h parameters) and saved inputs replicated (SP: / t); an allreduce of the input
  gradient in backward (SP: allgather in forward; in backward the input gathered again for the
  weight gradient, and a reduce-scatter).
- norm, elementwise: replicated (every TP rank computes the whole layer); SP: / t.
- conv, pool: replicated.

Replicated parts come from the zoo layer's `spec` (transformer_block, lm_head, embedding); a
layer without one is split whole by the rule of its kind. Activations between blocks are
sequence-sharded with SP (input and output elements / t); the logits of the vocab-parallel head
are / t in any case. The cross-entropy's per-token reductions (3 scalars per token) are ignored.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from simulator.workload import Layer, Workload
from simulator.zoo._ops import ADD_FLOPS, NORM_FLOPS, RMS_NORM_FLOPS

SPLIT_KINDS = ("attention", "embedding", "linear")
SEQUENCE_KINDS = ("norm", "elementwise")
"""Replicated without SP, split along the sequence with it."""

TP_COLLECTIVES = {
    # (layer kind, phase, sequence parallel) -> ((op, count, "input" | "output"), ...)
    ("attention", "F", False): (("allreduce", 2, "input"),),
    ("attention", "B", False): (("allreduce", 2, "input"),),
    ("attention", "F", True): (("allgather", 2, "input"), ("reduce_scatter", 2, "input")),
    ("attention", "B", True): (("allgather", 4, "input"), ("reduce_scatter", 2, "input")),
    ("embedding", "F", False): (("allreduce", 1, "output"),),
    ("embedding", "F", True): (("reduce_scatter", 1, "output"),),
    ("linear", "B", False): (("allreduce", 1, "input"),),
    ("linear", "F", True): (("allgather", 1, "input"),),
    ("linear", "B", True): (("allgather", 1, "input"), ("reduce_scatter", 1, "input")),
}
"""Megatron's f and g operators (Shoeybi et al. 2019, Fig. 3) per layer and pass; SP replaces each
allreduce by an allgather + reduce-scatter pair moving the same bytes (Korthikanti et al. 2022,
Fig. 5), and its backward gathers each column-parallel GEMM's input again (module docstring)."""

OP_ORDER = {"allgather": 0, "reduce_scatter": 1, "allreduce": 2}


def _replicated(layer: Layer) -> tuple[float, float, float]:
    """(forward FLOPs, parameters, saved elements) per sample of `layer` that TP does not split."""
    spec = layer.spec
    kind = spec.get("kind")
    if layer.kind not in SPLIT_KINDS:
        return layer.forward_flops_per_sample, layer.num_params, layer.saved_elements_per_sample
    if kind == "transformer_block":
        s, h = spec["seq_len"], spec["hidden_size"]
        if spec.get("norm_type") == "rmsnorm":  # two RMSNorm weights, no biases (LLaMA)
            return (2 * RMS_NORM_FLOPS + 2 * ADD_FLOPS) * s * h, 2 * h, 4 * s * h
        return (2 * NORM_FLOPS + 2 * ADD_FLOPS) * s * h, 6 * h, 4 * s * h
    if kind == "lm_head":
        s, h = spec["seq_len"], spec["hidden_size"]
        return NORM_FLOPS * s * h, 2 * h, layer.saved_elements_per_sample
    if kind == "embedding":
        h = spec["hidden_size"]
        token_table = spec["vocab_size"] * h
        return layer.forward_flops_per_sample, layer.num_params - token_table, layer.saved_elements_per_sample
    return 0.0, 0, 0


def shard_layer(layer: Layer, tp: int, sequence_parallel: bool) -> Layer:
    """The share of `layer` one of `tp` tensor-parallel ranks holds and computes (module table)."""
    if tp == 1:
        return layer
    flops, params, saved = _replicated(layer)
    along_sequence = sequence_parallel and (layer.kind in SPLIT_KINDS or layer.kind in SEQUENCE_KINDS)
    kept = tp if along_sequence else 1  # divisor of the replicated parts
    forward = (layer.forward_flops_per_sample - flops) / tp + flops / kept
    scale = forward / layer.forward_flops_per_sample if layer.forward_flops_per_sample else 1.0
    shard_io = along_sequence and layer.kind != "embedding"
    output = layer.output_elements_per_sample / (tp if along_sequence or layer.kind == "linear" else 1)
    return replace(
        layer,
        forward_flops_per_sample=forward,
        backward_flops_per_sample=layer.backward_flops_per_sample * scale,
        num_params=(layer.num_params - params) / tp + params,
        saved_elements_per_sample=(layer.saved_elements_per_sample - saved) / tp + saved / kept,
        input_elements_per_sample=layer.input_elements_per_sample / (tp if shard_io else 1),
        output_elements_per_sample=output,
    )


def rank_workload(workload: Workload, tp: int, sequence_parallel: bool) -> Workload:
    """The workload one TP rank runs: every layer replaced by its share (same layer indices)."""
    if tp == 1:
        return workload
    layers = tuple(shard_layer(layer, tp, sequence_parallel) for layer in workload.layers)
    return Workload(workload.name, layers, workload.input_spec)


def pass_collectives(workload: Workload, layer_start: int, layer_end: int, phase: str,
                     sequence_parallel: bool) -> list[tuple[str, int, float]]:
    """TP collectives of a pass over layers [layer_start, layer_end) of the full `workload`:
    [(op, count, elements per sample of the full tensor)], allgathers first, then reduce-scatters,
    then allreduces (serialised with compute, so their order inside a pass does not change its time)."""
    counts: Counter = Counter()
    for layer in workload.layers[layer_start:layer_end]:
        for op, count, which in TP_COLLECTIVES.get((layer.kind, phase, sequence_parallel), ()):
            elements = layer.input_elements_per_sample if which == "input" else layer.output_elements_per_sample
            counts[(op, elements)] += count
    return [(op, count, elements) for (op, elements), count in
            sorted(counts.items(), key=lambda item: (OP_ORDER[item[0][0]], item[0][1]))]
