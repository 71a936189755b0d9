"""What a layer keeps for its backward, by recompute mode: the activation rules of `simulator.memory`.

All figures are bytes per sample on one rank (multiply by the micro-batch). A layer without a
transformer- or MoE-block spec keeps its `saved_elements_per_sample` in the training dtype.

Transformer blocks (zoo spec kind "transformer_block": GPT in `simulator.zoo.transformer`, LLaMA in
`simulator.zoo.llama`) follow Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023), sec. 4.1-4.2.3, with s tokens, h hidden, a heads, f ffn hidden,
g d the key/value width (g kv heads of d = h / a; g d = h without grouped queries), k = min(s, W)
keys per query (W the sliding window, `spec["sliding_window"]`; k = s for a causal or full mask, as
the unfused kernels compute the whole s x s score matrix), e bytes per element, t the TP degree:
- replicated (/ t with sequence parallelism, else whole): the inputs of both norms, of QKV and of
  the first MLP GEMM, 4 s h e, and the two hidden dropout masks, 2 s h bytes (when p > 0);
- split (/ t): Q s h e, K and V 2 s g d e, the out-projection input s h e, and the MLP's saved
  inputs: GELU's input and fc2's input 2 s f e (GPT), SwiGLU's gate and up and the down input
  3 s f e (LLaMA);
- the attention core (/ t): the softmax output a s k e, and with dropout p > 0 its mask a s k
  bytes and its output a s k e; with flash attention (Dao 2023) only the softmax's logsumexp,
  4 a s bytes (fp32), the output being the out-projection input already counted.
GPT with p > 0, e = 2, W >= s: sbh(34 + 5as/h) without parallelism (eq. 1), sbh(10 + 24/t + 5as/(ht))
with TP (eq. 2), sbh(34/t + 5as/(ht)) with TP and sequence parallelism (eq. 4). Dropout p:
`spec["dropout"]`, else Megatron-LM's default (`simulator.kernel_ops.DEFAULT_DROPOUT`, as the kernel
model); masks are 1 byte (torch bool).
Under FP8 training (`Sharding.fp8`, `training.fp8_recipe`) the linear layers' saved inputs (QKV's,
the out-projection's, the MLP's two GEMMs', the experts' grouped GEMMs') are 1 byte an element:
Transformer Engine keeps the FP8 cast it multiplies (`simulator.kernels_fp8`).

Mixture-of-experts blocks (zoo spec kind "moe_block", `simulator.zoo.moe`) extend the formula as
Megatron-Core's MoE layer saves its tensors (`megatron/core/transformer/moe/`: TopKRouter,
MoEAlltoAllTokenDispatcher, GroupedMLP, `moe_utils.py` permute / unpermute; its fine-grained
recompute modules `moe_act` and `layernorm` name the SwiGLU and norm tensors counted here), with E routed
experts of width f_e, k per token, c the capacity factor (the busiest expert's load: balanced
routing gives every EP rank c k s routed tokens whatever the EP degree), f_s the shared width:
- the attention half as a LLaMA block's (`block_bytes` with no MLP): 4 s h e replicated (both
  RMSNorms' inputs, QKV's and the router's / shared experts' input), 2 s h e + 2 s g d e and the
  core split over TP;
- the router's softmax probabilities, s E fp32 (4 bytes; its logits are not kept), replicated
  over TP (/ t with sequence parallelism, as Megatron-Core runs the router on the rank's rows);
- the permuted tokens, the input of the experts' first grouped GEMM, c k s h e: whole on every
  TP rank (the dispatched tokens are allgathered over TP before the experts);
- the experts' SwiGLU tensors, gate and up outputs and the activation (the down GEMM's input),
  3 c k s f_e e / t (the experts split along f_e over TP);
- the expert outputs kept by the weighted combine for the probabilities' gradient, c k s h e / t
  (after the reduce-scatter over TP, on the rank's sequence-parallel rows; / 1 without TP);
- the shared experts' SwiGLU tensors 3 s f_s e / t (their input is the router's, counted above).
Mixtral (no TP, flash, bf16): s h (12 + 4 g d / h) + 4 s E + 4 a s + 4 c k s h + 6 c k s f_e bytes.

Recompute (`training.recompute`):
- selective (sec. 5, Table 2): a transformer block keeps everything but its attention core's s x s
  tensors, which the block's backward recomputes from the kept Q, K, V (present only while that
  backward runs): sbh(10 + 24/t) per layer, 34 sbh / t with sequence parallelism. With flash
  attention the core keeps no s x s tensor, so selective keeps and recomputes nothing more than
  none. An `attention` layer without a block spec keeps only its input (its core is unknown: the
  whole layer is re-run by the plan, `recompute_ranges` below).
- full: only the input of each backward segment's first layer (a checkpoint per gradient bucket,
  the stage input when one bucket); the rest is rematerialised by the recompute forward (or, if
  the plan has none, at the start of the backward segment) and freed with the layer's activations.
  A plan whose `meta["recompute_granularity"]` is "layer" (Megatron's `--recompute-granularity
  full --recompute-method uniform --recompute-num-layers 1`, what the megatron kind plans;
  Korthikanti et al. sec. 5: full recompute keeps each layer's input, 2 sbh) keeps every layer's
  input under full, and rematerialises a layer only when its own backward starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.kernel_ops import DEFAULT_DROPOUT, MASK_BYTES, STATS_BYTES
from simulator.kernels_fp8 import FP8_BYTES
from simulator.workload import Layer, Workload
from simulator.zoo._ops import SOFTMAX_FLOPS


@dataclass(frozen=True)
class Sharding:
    """How the plan splits each layer's activations: Megatron's TP degree and sequence parallelism,
    and whether the attention core runs as flash attention."""

    tp_degree: int = 1
    sequence_parallel: bool = False
    flash_attention: bool = False
    fp8: bool = False
    """FP8 training (`training.fp8_recipe`): Transformer Engine keeps its linear layers' inputs in FP8."""


def attention_keys(spec) -> int:
    """Keys each query attends to: min(s, W) with a sliding window W (Mistral, Jiang et al. 2023,
    sec. 2), else s."""
    window = spec.get("sliding_window")
    return min(spec["seq_len"], window) if window else spec["seq_len"]


BLOCK_FIELDS = {"transformer_block": ("seq_len", "hidden_size", "num_heads", "ffn_hidden_size"),
                "moe_block": ("seq_len", "hidden_size", "num_heads", "num_experts", "top_k",
                              "expert_ffn_hidden_size")}
"""The spec keys a block rule needs, by zoo spec kind."""
ROUTER_PROBS_BYTES = 4
"""Megatron-Core's TopKRouter computes the softmax and top-k in fp32."""


def linear_input_bytes(element_bytes: int, sharding: Sharding) -> int:
    """Bytes an element of a linear layer's saved input: 1 under FP8 (Transformer Engine saves the FP8
    cast it multiplies, `simulator.kernels_fp8`), else the training dtype's."""
    return FP8_BYTES if sharding.fp8 else element_bytes


def is_block(layer: Layer) -> bool:
    """A zoo transformer or MoE block whose dimensions are known (a bare kind keeps its saved
    elements)."""
    spec = layer.spec or {}
    fields = BLOCK_FIELDS.get(spec.get("kind"))
    return fields is not None and all(key in spec for key in fields)


def block_bytes(spec, element_bytes: int, sharding: Sharding) -> tuple[float, float]:
    """(kept, core): bytes per sample a transformer block saves besides its attention core's s x k
    tensors, and those tensors (module docstring; Korthikanti et al. 2023, sec. 4.1-4.2.3)."""
    s, h, heads, f = spec["seq_len"], spec["hidden_size"], spec["num_heads"], spec["ffn_hidden_size"]
    kv_width = (spec.get("num_kv_heads") or heads) * (h // heads)
    p = spec.get("dropout", DEFAULT_DROPOUT)
    t, e, x = sharding.tp_degree, element_bytes, linear_input_bytes(element_bytes, sharding)
    replicated = (2 * e + 2 * x) * s * h + (2 * s * h * MASK_BYTES if p > 0 else 0)  # norms', QKV's, fc1's inputs
    mlp = (2 if spec.get("activation") == "swiglu" else 1) * s * f * e + s * f * x  # fc2's input: x
    split = (s * h + 2 * s * kv_width) * e + s * h * x + mlp  # Q, K, V; the out-projection's input
    scores = heads * s * attention_keys(spec)
    if sharding.flash_attention:
        split += heads * s * STATS_BYTES
        core = 0.0
    else:
        core = scores * (e + (MASK_BYTES + e if p > 0 else 0))
    kept = replicated / (t if sharding.sequence_parallel else 1) + split / t
    return kept, core / t


def moe_block_bytes(spec, element_bytes: int, sharding: Sharding) -> tuple[float, float]:
    """(kept, core) of an MoE block, as `block_bytes` (module docstring: the LLaMA attention half,
    then the router, the routed experts and the shared experts, Megatron-Core's saved tensors)."""
    s, h, e, t = spec["seq_len"], spec["hidden_size"], element_bytes, sharding.tp_degree
    x = linear_input_bytes(element_bytes, sharding)
    kept, core = block_bytes({**spec, "ffn_hidden_size": 0}, element_bytes, sharding)
    routed = spec.get("capacity_factor", 1.0) * spec["top_k"] * s
    router = s * spec["num_experts"] * ROUTER_PROBS_BYTES / (t if sharding.sequence_parallel else 1)
    f_e, f_s = spec["expert_ffn_hidden_size"], spec.get("shared_ffn_hidden_size", 0)
    experts = routed * h * x + ((2 * e + x) * routed * f_e + routed * h * e) / t
    shared = (2 * e + x) * s * f_s / t
    return kept + router + experts + shared, core


def layer_block_bytes(layer: Layer, element_bytes: int, sharding: Sharding) -> tuple[float, float]:
    """(kept, core) of a block layer (`is_block`) by its spec kind."""
    rule = moe_block_bytes if layer.spec["kind"] == "moe_block" else block_bytes
    return rule(layer.spec, element_bytes, sharding)


def saved_bytes(layer: Layer, element_bytes: int, sharding: Sharding) -> float:
    """Bytes per sample `layer` saves for its backward without recompute."""
    if is_block(layer):
        return sum(layer_block_bytes(layer, element_bytes, sharding))
    return layer.saved_elements_per_sample * element_bytes


def kept_bytes(layer: Layer, mode: str, element_bytes: int, sharding: Sharding, checkpoint: bool) -> float:
    """Bytes per sample `layer` keeps after its forward under recompute `mode`; `checkpoint`: under
    full, whether the layer's input is a kept checkpoint (module docstring)."""
    if mode == "selective" and is_block(layer):
        return layer_block_bytes(layer, element_bytes, sharding)[0]
    if mode == "selective" and layer.kind == "attention":
        return min(layer.input_elements_per_sample, layer.saved_elements_per_sample) * element_bytes
    if mode == "full":
        return layer.input_elements_per_sample * element_bytes if checkpoint else 0.0
    return saved_bytes(layer, element_bytes, sharding)


def selective_recomputes_core(layer: Layer, sharding: Sharding) -> bool:
    """Whether selective recompute re-runs this layer's attention core inside its backward."""
    return is_block(layer) and not sharding.flash_attention


def core_recompute_flops(layer: Layer, tp_degree: int = 1) -> float:
    """Forward FLOPs per sample of `layer`'s attention core on one of `tp_degree` TP ranks (heads
    split), what selective recompute re-runs in its backward (0 for other layers): Q K^T and P V,
    2 x 2 s k h, and the softmax, 5 a s k (the zoo's counts, `simulator.zoo._ops`)."""
    if not is_block(layer):
        return 0.0
    spec = layer.spec
    s, h, k = spec["seq_len"], spec["hidden_size"], attention_keys(spec)
    return (4.0 * s * k * h + SOFTMAX_FLOPS * spec["num_heads"] * s * k) / tp_degree


def recompute_ranges(workload: Workload, layer_start: int, layer_end: int, mode: str) -> list[tuple[int, int]]:
    """Layer ranges of [layer_start, layer_end) re-run forward before their backward.

    full: all of them (checkpoints at the backward segment's first input, Chen et al. 2016);
    selective: each run of attention layers without a transformer-block spec (their internals are
    dropped in forward; their core unknown, the whole layer is re-run). A transformer block's
    attention core is recomputed inside its own backward (Korthikanti et al. 2023, sec. 5; the cost
    models price it, `core_recompute_flops`), so it needs no recompute action. none: nothing.
    """
    if mode == "full":
        return [(layer_start, layer_end)]
    if mode != "selective":
        return []
    ranges, start = [], None
    for index in range(layer_start, layer_end + 1):
        attention = (index < layer_end and workload.layers[index].kind == "attention"
                     and not is_block(workload.layers[index]))
        if attention and start is None:
            start = index
        elif not attention and start is not None:
            ranges.append((start, index))
            start = None
    return ranges
