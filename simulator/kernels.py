"""A layer as the GPU kernels a framework launches for it, per pass (forward, backward, recompute).

`layer_kernels(layer, phase, batch, dtype=...)` reads the zoo layer's `spec` (simulator/zoo/README.md)
and returns a tuple of `Kernel`s: GEMMs with their (m, n, k, batch_count), and the memory-bound
kernels around them with the bytes they read and write. `simulator.kernel_costs` prices them.
Phases: "F" forward, "B" backward (data- and weight-gradient GEMMs and the elementwise backward
kernels), "R" the recompute forward of activation checkpointing (the same kernels as "F").

Kernel sets follow Megatron-LM for transformers (Shoeybi et al. 2019; Narayanan et al. SC'21,
sec. 2.3: QKV and MLP-up column-parallel, N / tp; out-projection and MLP-down row-parallel,
K / tp; heads / tp in the attention core; LayerNorms, dropouts and residual adds replicated, or
over s / tp tokens with sequence parallelism, Korthikanti et al. 2022), with its fused kernels
(apex LayerNorm, scale-mask-softmax, bias-GELU, bias-dropout-add) and PyTorch/cuDNN for CNNs
(convolutions as implicit GEMMs or Winograd, cuDNN batch norm: one kernel per pass).

FLOP conventions: those of `simulator.zoo._ops` (GEMM 2mnk; LayerNorm/BatchNorm 5, GELU 8,
softmax 5, residual add 1 per element; bias adds, dropout, copies 0). Differences from the
layer's own counts, which the tests bound: the zoo counts a layer's backward as 2x its whole
forward, here only the GEMMs double and an elementwise backward costs 1x its forward (about
-0.2 % on a GPT block); the LM head adds the softmax cross-entropy (5 FLOPs per logit, +2.5/h),
which the zoo leaves out; convolution data gradients are kept for the first layer too.
Flash attention's backward recomputes the scores: 2.5x its forward (Dao 2023, FlashAttention-2,
sec. 3.1.2), so its backward FLOPs exceed the zoo's 2x by half the attention core.

Dropout: p from `spec["dropout"]`, else `DEFAULT_DROPOUT` (Megatron-LM's default 0.1 for hidden
and attention dropout; the zoo itself models p = 0). Masks are 1 byte per element (torch bool).
"""

from __future__ import annotations

import math
from functools import lru_cache

from simulator.kernel_ops import (
    DEFAULT_DROPOUT,
    INDEX_BYTES,
    MASK_BYTES,
    PHASES,
    STATS_BYTES,
    Kernel,
    add,
    copy,
    dropout,
    layer_norm,
    linear,
    main_grad_bytes,
    pointwise,
    rms_norm,
    unfused_accumulation,
)
from simulator.kernels_attention import block_core_kernels, llama_block_kernels
from simulator.kernels_cnn import (
    basic_block_kernels,
    bottleneck_block_kernels,
    classifier_head_kernels,
    conv_block_kernels,
    fc_kernels,
)
from simulator.kernels_fp8 import FP8_KINDS, fp8_linears, weight_cast_passes
from simulator.kernels_moe import moe_block_kernels
from simulator.workload import Layer, dtype_bytes
from simulator.zoo._ops import ADD_FLOPS, GELU_FLOPS

# --- transformer (Megatron-LM) ------------------------------------------------------------------

def _check_tp(what: str, size: int, tp: int) -> None:
    if size % tp:
        raise ValueError(f"tp_degree {tp} does not divide {what} {size}")


def _bias_dropout_add(name: str, elements: float, width: int, e: int, phase: str,
                      p: float) -> list[Kernel]:
    """Megatron's jit-fused bias + dropout + residual add (the bias of a row-parallel GEMM)."""
    mask = MASK_BYTES if p > 0 else 0
    if phase != "B":
        return [pointwise(name, "elementwise", elements, 2 * e, e + mask, ADD_FLOPS)]
    kernels = [pointwise(f"{name}.bwd", "elementwise", elements, e + mask, e)] if p > 0 else []
    return kernels + [Kernel(f"{name}.bias_grad", "reduction", 0.0, elements * e, width * e)]


def transformer_block_kernels(spec, b: float, e: int, phase: str, t: int, flash: bool,
                              sp: bool) -> list[Kernel]:
    """Pre-/post-LN block: LN, QKV, attention core, out-proj, bias-dropout-add, LN, fc1,
    bias-GELU, fc2, bias-dropout-add (post-LN reorders the same kernels)."""
    s, h, heads, f = spec["seq_len"], spec["hidden_size"], spec["num_heads"], spec["ffn_hidden_size"]
    _check_tp("num_heads", heads, t)
    _check_tp("ffn_hidden_size", f, t)
    p = spec.get("dropout", DEFAULT_DROPOUT)
    tokens = b * s
    rows = tokens / t if sp else tokens  # LayerNorm / dropout / residual rows
    core = block_core_kernels(spec, b, e, phase, t, flash)
    if phase != "B":
        return [*layer_norm("ln1", rows, h, e, phase), *linear("qkv", tokens, 3 * h / t, h, e, phase),
                *core, *linear("proj", tokens, h, h / t, e, phase),
                *_bias_dropout_add("bda1", rows * h, h, e, phase, p),
                *layer_norm("ln2", rows, h, e, phase), *linear("fc1", tokens, f / t, h, e, phase),
                pointwise("bias_gelu", "elementwise", tokens * f / t, e, e, GELU_FLOPS),
                *linear("fc2", tokens, h, f / t, e, phase),
                *_bias_dropout_add("bda2", rows * h, h, e, phase, p)]
    return [*_bias_dropout_add("bda2", rows * h, h, e, phase, p),
            *linear("fc2", tokens, h, f / t, e, phase),
            pointwise("bias_gelu.bwd", "elementwise", tokens * f / t, 2 * e, e, GELU_FLOPS),
            Kernel("fc1.bias_grad", "reduction", 0.0, tokens * f / t * e, f / t * e),
            *linear("fc1", tokens, f / t, h, e, phase), *layer_norm("ln2", rows, h, e, phase),
            add("residual2.grad_accumulate", rows * h, e),
            *_bias_dropout_add("bda1", rows * h, h, e, phase, p),
            *linear("proj", tokens, h, h / t, e, phase), *core,
            *linear("qkv", tokens, 3 * h / t, h, e, phase, bias_grad=True),
            *layer_norm("ln1", rows, h, e, phase), add("residual1.grad_accumulate", rows * h, e)]


def embedding_kernels(spec, b: float, e: int, phase: str, t: int, sp: bool) -> list[Kernel]:
    """Vocab-parallel token gather (+ Megatron's out-of-range masking when tp > 1), position
    [+ token-type] gathers and adds, [LayerNorm], dropout, [s, b] transpose. Backward: each
    table's gradient is zero-filled and scatter-added (1 add per gathered element)."""
    s, h, vocab = spec["seq_len"], spec["hidden_size"], spec["vocab_size"]
    p = spec.get("dropout", DEFAULT_DROPOUT)
    tokens = b * s
    rows = tokens / t if sp else tokens
    tables = [("token", vocab / t)]
    tables += [("position", spec["max_positions"])] if spec.get("position_embedding", "learned") == "learned" else []
    tables += [("token_type", spec["token_types"])] if spec.get("token_types") else []
    if phase != "B":
        kernels = []
        if t > 1:
            kernels.append(pointwise("vocab_mask_ids", "elementwise", tokens, INDEX_BYTES,
                                     INDEX_BYTES + MASK_BYTES))
        for name, _ in tables:
            kernels.append(Kernel(f"{name}_gather", "embedding", 0.0, tokens * (INDEX_BYTES + h * e),
                                  tokens * h * e))
        if t > 1:
            kernels.append(pointwise("vocab_mask_rows", "elementwise", tokens * h, e + MASK_BYTES / h, e))
        kernels += [add(f"{name}_add", tokens * h, e) for name, _ in tables[1:]]
    else:
        kernels = [copy("transpose.bwd", tokens * h, e)]
        kernels += [dropout("dropout", rows * h, e, phase)] if p > 0 else []
        kernels += layer_norm("ln", rows, h, e, phase) if spec.get("layernorm") else []
        for name, table_rows in tables:
            kernels += [Kernel(f"{name}_grad_zero", "elementwise", 0.0, 0.0, table_rows * h * e),
                        Kernel(f"{name}_scatter_add", "embedding", tokens * h,
                               tokens * (INDEX_BYTES + 2 * h * e), tokens * h * e)]
        return kernels
    kernels += layer_norm("ln", rows, h, e, phase) if spec.get("layernorm") else []
    kernels += [dropout("dropout", rows * h, e, phase)] if p > 0 else []
    return kernels + [copy("transpose", tokens * h, e)]


def cross_entropy_kernels(tokens: float, vocab_part: float, e: int, phase: str) -> list[Kernel]:
    """Megatron's vocab-parallel softmax cross-entropy on fp32 logits (`.float()` upcast when
    training in 16 bits, fp16_lm_cross_entropy off): max, subtract, target logit, exp, sum,
    normalise (kept for backward), loss; backward: target update, scale by the loss gradient,
    downcast. 5 FLOPs per logit forward, 1 backward."""
    logits, f32 = tokens * vocab_part, STATS_BYTES
    small = pointwise("ce.target_logit", "elementwise", tokens, INDEX_BYTES + f32, f32)
    if phase != "B":
        cast = [pointwise("ce.upcast", "copy", logits, e, f32)] if e < f32 else []
        return cast + [pointwise("ce.max", "reduction", logits, f32, f32 / vocab_part, 1.0),
                       pointwise("ce.subtract_max", "elementwise", logits, f32, f32, 1.0), small,
                       pointwise("ce.exp", "elementwise", logits, f32, f32, 1.0),
                       pointwise("ce.sum", "reduction", logits, f32, f32 / vocab_part, 1.0),
                       pointwise("ce.normalise", "elementwise", logits, f32, f32, 1.0),
                       pointwise("ce.loss", "elementwise", tokens, 2 * f32, f32)]
    cast = [pointwise("ce.upcast.bwd", "copy", logits, f32, e)] if e < f32 else []
    return [small, pointwise("ce.scale_grad", "elementwise", logits, f32, f32, 1.0), *cast]


def lm_head_kernels(spec, b: float, e: int, phase: str, t: int, sp: bool) -> list[Kernel]:
    """[Final LN ->] tied vocab-parallel projection (N = V / tp) -> softmax cross-entropy."""
    s, h, vocab = spec["seq_len"], spec["hidden_size"], spec["vocab_size"]
    tokens = b * s
    rows = tokens / t if sp else tokens
    norm_kernels = rms_norm if spec.get("norm_type") == "rmsnorm" else layer_norm
    norm = norm_kernels("final_ln", rows, h, e, phase) if spec.get("final_norm", True) else []
    logits = linear("logits", tokens, vocab / t, h, e, phase, bias_grad=spec.get("bias", False))
    ce = cross_entropy_kernels(tokens, vocab / t, e, phase)
    return norm + logits + ce if phase != "B" else ce + logits + norm


def bert_mlm_head_kernels(spec, b: float, e: int, phase: str, t: int) -> list[Kernel]:
    """Dense h -> h (bias), GELU, LayerNorm, tied decoder with bias (N = V / tp), cross-entropy."""
    s, h, vocab = spec["seq_len"], spec["hidden_size"], spec["vocab_size"]
    tokens = b * s
    gelu = pointwise("gelu" + (".bwd" if phase == "B" else ""), "elementwise", tokens * h,
                     (2 if phase == "B" else 1) * e, e, GELU_FLOPS)
    kernels = [*linear("dense", tokens, h, h, e, phase, bias_grad=True), gelu,
               *layer_norm("ln", tokens, h, e, phase),
               *linear("decoder", tokens, vocab / t, h, e, phase, bias_grad=True),
               *cross_entropy_kernels(tokens, vocab / t, e, phase)]
    return kernels if phase != "B" else kernels[::-1]


# --- generic fallback, dispatch, cache ----------------------------------------------------------

SPLIT_KINDS = ("attention", "embedding", "linear")
"""Layer kinds a tensor-parallel rank computes 1/tp of (as `simulator.strategies.tensor_layers`)."""


def generic_kernels(layer: Layer, b: float, e: int, phase: str, t: int) -> list[Kernel]:
    """One kernel from the layer's own counts (no spec, or a spec kind not listed here):
    forward reads input + weights and writes output; backward reads saved input, output
    gradient and weights and writes input and weight gradients (as `AnalyticCosts`)."""
    split = t if layer.kind in SPLIT_KINDS else 1
    params = layer.num_params / split
    x, y = layer.input_elements_per_sample * b, layer.output_elements_per_sample * b
    if phase != "B":
        return [Kernel(layer.name, "generic", layer.forward_flops_per_sample * b / split, (x + params) * e, y * e)]
    return [Kernel(f"{layer.name}.bwd", "generic", layer.backward_flops_per_sample * b / split,
                   (2 * x + y + params) * e, (x + params) * e)]


def _expand(layer: Layer, b: float, e: int, phase: str, t: int, flash: bool, sp: bool,
            conv_algorithm: str = "implicit_gemm") -> list[Kernel]:
    spec = layer.spec
    kind = spec.get("kind")
    if kind == "transformer_block" and spec.get("activation") == "swiglu":
        _check_tp("num_heads", spec["num_heads"], t)
        _check_tp("num_kv_heads", spec.get("num_kv_heads") or spec["num_heads"], t)
        _check_tp("ffn_hidden_size", spec["ffn_hidden_size"], t)
        return llama_block_kernels(spec, b, e, phase, t, flash, sp)
    if kind == "transformer_block":
        return transformer_block_kernels(spec, b, e, phase, t, flash, sp)
    if kind == "moe_block":  # simulator.kernels_moe
        return moe_block_kernels(spec, b, e, phase, t, flash, sp)
    if kind == "embedding":
        return embedding_kernels(spec, b, e, phase, t, sp)
    if kind == "lm_head":
        return lm_head_kernels(spec, b, e, phase, t, sp)
    if kind == "bert_mlm_head":
        return bert_mlm_head_kernels(spec, b, e, phase, t)
    if kind == "fc":
        return fc_kernels(spec, b, e, phase, t)
    if kind == "classifier_head":
        return classifier_head_kernels(spec, b, e, phase, t)
    if kind in CONV_EXPANSIONS:
        return CONV_EXPANSIONS[kind](spec, b, e, phase, conv_algorithm)
    return generic_kernels(layer, b, e, phase, t)


CONV_EXPANSIONS = {"conv_block": conv_block_kernels, "basic_block": basic_block_kernels,
                   "bottleneck_block": bottleneck_block_kernels}


def _freeze(value):
    """A hashable copy of a spec value (dicts and lists nest in zoo specs)."""
    if isinstance(value, dict):
        return tuple(sorted((key, _freeze(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item) for item in value)
    return value


@lru_cache(maxsize=65536)
def _cached_kernels(layer: Layer, spec_key, phase: str, batch: float, dtype: str, tp_degree: int,
                    flash_attention: bool, sequence_parallel: bool, gradient_accumulation_fusion: bool = True,
                    conv_algorithm: str = "implicit_gemm", fp8_recipe: str | None = None) -> tuple[Kernel, ...]:
    if batch == 0:
        return ()
    phase_kernels = "F" if phase == "R" else phase
    kernels = _expand(layer, batch, dtype_bytes(dtype), phase_kernels, tp_degree, flash_attention,
                      sequence_parallel, conv_algorithm)
    if fp8_recipe is not None and layer.spec.get("kind") in FP8_KINDS:
        kernels = fp8_linears(kernels, dtype_bytes(dtype), phase_kernels, fp8_recipe)
    if phase == "B" and not gradient_accumulation_fusion:
        kernels = unfused_accumulation(kernels, dtype_bytes(dtype), main_grad_bytes(dtype, dtype_bytes(dtype)))
    return tuple(kernels)


def layer_kernels(layer: Layer, phase: str, batch: float, *, dtype: str, tp_degree: int = 1,
                  flash_attention: bool = False, sequence_parallel: bool = False,
                  gradient_accumulation_fusion: bool = True, conv_algorithm: str = "implicit_gemm",
                  fp8_recipe: str | None = None) -> tuple[Kernel, ...]:
    """The kernels one tensor-parallel rank launches for `layer`'s pass `phase` on `batch`
    samples. Cached per (layer, spec, phase, batch, dtype, tp, flags): `cache_info()`.
    `gradient_accumulation_fusion` False: Megatron without `--gradient-accumulation-fusion`, a
    main-gradient accumulation kernel after every weight-gradient GEMM (`unfused_accumulation`).
    `conv_algorithm`: how cuDNN runs the convolutions (`simulator.kernel_catalogue.conv_algorithm`).
    `fp8_recipe`: a block's linear layers in FP8 as Transformer Engine runs them (`simulator.kernels_fp8`)."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: expected one of {', '.join(PHASES)}")
    if batch < 0:
        raise ValueError(f"batch {batch!r}: must be >= 0")
    if int(tp_degree) != tp_degree or tp_degree < 1:
        raise ValueError(f"tp_degree {tp_degree!r}: must be a positive integer")
    return _cached_kernels(layer, _freeze(layer.spec), phase, batch, dtype, int(tp_degree),
                           bool(flash_attention), bool(sequence_parallel), bool(gradient_accumulation_fusion),
                           conv_algorithm, fp8_recipe)


layer_kernels.cache_info = _cached_kernels.cache_info  # type: ignore[attr-defined]
layer_kernels.cache_clear = _cached_kernels.cache_clear  # type: ignore[attr-defined]


# --- parameter tensors and the optimizer step ---------------------------------------------------

PARAM_TENSORS = {"transformer_block": 12, "lm_head": 2, "bert_mlm_head": 5, "fc": 2, "classifier_head": 2}
"""Parameter tensors per layer (weights, biases, norm scales and shifts): a block has 2 LNs x 2,
4 GEMMs x (weight, bias); the tied LM head only its final LN."""


def num_param_tensors(layer: Layer) -> int:
    """How many parameter tensors `layer` holds (what multi-tensor optimizer kernels iterate)."""
    spec, kind = layer.spec, layer.spec.get("kind")
    if kind == "embedding":
        learned = spec.get("position_embedding", "learned") == "learned"
        return 1 + learned + bool(spec.get("token_types")) + 2 * bool(spec.get("layernorm"))
    if kind == "transformer_block" and spec.get("bias") is False:
        return 6 + bool(spec.get("qkv_bias"))  # 2 RMSNorm weights, fused QKV (+ its bias), out-proj, gate + up, down
    if kind == "lm_head" and spec.get("norm_type") == "rmsnorm":
        return 1 + (not spec.get("tied_embedding", True))
    if kind == "conv_block":
        return 1 + bool(spec.get("bias")) + 2 * bool(spec.get("batch_norm"))
    if kind == "basic_block":
        return 2 + 2 * 2
    if kind == "bottleneck_block":
        projection = spec.get("shortcut") == "conv"
        if spec.get("preact"):
            return 3 + 3 * 2 + projection
        return 3 + 3 * 2 + 3 * projection
    if kind == "classifier_head":
        return 2 + 2 * bool(spec.get("pre_activation"))
    if kind in PARAM_TENSORS:
        return PARAM_TENSORS[kind]
    return 2 if layer.num_params else 0


MULTI_TENSOR_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
MULTI_TENSOR_MAX_CHUNKS = 320
MULTI_TENSOR_CHUNK_ELEMENTS = 65536
"""apex `csrc/multi_tensor_apply.cuh` (= PyTorch `ATen/native/cuda/MultiTensorApply.cuh`):
one launch takes at most depth_to_max_tensors[depth] tensors (depth = tensor lists: Adam's
g, p, m, v is 4) and depth_to_max_blocks = 320 chunks of 2048 x 32 elements (apex FusedAdam's
chunk_size; PyTorch's kChunkSize)."""


def multi_tensor_launches(num_params: float, num_tensors: int, depth: int) -> int:
    """Launches of one multi-tensor-apply pass: a new launch when the tensor list or the chunk
    list is full; each tensor's last chunk is partly filled (counted as a whole chunk)."""
    chunks = math.ceil(num_params / MULTI_TENSOR_CHUNK_ELEMENTS) + num_tensors
    return max(1, math.ceil(num_tensors / MULTI_TENSOR_MAX_TENSORS[min(depth, 5)]),
               math.ceil(chunks / MULTI_TENSOR_MAX_CHUNKS))


OPTIMIZER_PASSES = {
    # optimizer -> (tensor lists, bytes read per parameter, bytes written per parameter)
    "sgd": (2, 8, 4),          # read p, g; write p (fp32)
    "momentum": (3, 12, 8),    # read p, g, v; write p, v
    "adam": (4, 16, 12),       # read p, g, m, v; write p, m, v (Kingma & Ba 2015, Alg. 1)
}
"""The fused update kernel (apex FusedAdam / multi_tensor_sgd, PyTorch fused / _foreach), in
fp32: the parameters it updates are the fp32 master weights in mixed precision."""

MIXED_PRECISION_PASSES = (
    # name, tensor lists, bytes read / written per parameter, only for fp16 (loss scaling)
    ("unscale_grads", 1, 4, 4, True),     # _amp_foreach_non_finite_check_and_unscale_ on fp32 grads
    ("grad_norm", 1, 4, 0, False),        # multi_tensor_l2norm for clip_grad (default 1.0)
    ("copy_to_model_params", 2, 4, None, False),  # multi_tensor_scale: fp32 master -> 16-bit
)
"""Megatron-LM `Float16OptimizerWithFloat16Params.step` (megatron/optimizer/optimizer.py) around
the update in 16-bit training with fp32 master weights and fp32 main gradients; bf16 has no loss
scale. `None` bytes: the model dtype's."""


def optimizer_kernels(optimizer: str, num_params: float, num_tensors: int, dtype: str,
                      fp8_recipe: str | None = None) -> tuple[Kernel, ...]:
    """One optimizer step over `num_params` parameters in `num_tensors` tensors: zeroing the
    fp32 gradient buffer, then each multi-tensor pass split into its launches (under FP8 training
    also the weights' FP8 casts, `simulator.kernels_fp8.weight_cast_passes`)."""
    if optimizer not in OPTIMIZER_PASSES:
        raise ValueError(f"optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZER_PASSES)}")
    e = dtype_bytes(dtype)
    passes = [("zero_grads", 1, 0, 4)]
    depth, read, write = OPTIMIZER_PASSES[optimizer]
    passes.append((optimizer, depth, read, write))
    if e < 4:
        passes += [(name, lists, r, e if w is None else w) for name, lists, r, w, fp16_only
                   in MIXED_PRECISION_PASSES if dtype == "fp16" or not fp16_only]
    passes += weight_cast_passes(fp8_recipe, e)
    kernels = []
    for name, lists, read, write in passes:
        launches = 1 if name == "zero_grads" else multi_tensor_launches(num_params, num_tensors, lists)
        kernels += [Kernel(name, "optimizer", 0.0, read * num_params / launches,
                           write * num_params / launches)] * launches
    return tuple(kernels)
