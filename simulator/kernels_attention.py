"""The attention core of a Megatron transformer block as kernels: scores, (fused or unfused)
scale-mask-softmax, dropout, values and the context permute; or flash attention; with grouped-query
attention (Ainslie et al. 2023) K and V have kv_heads / tp heads per rank; with a sliding window W
(Mistral, Jiang et al. 2023, sec. 2) each query meets k = min(s, W) keys: the unfused path computes
s x k scores, flash attention skips the tiles outside the band. Selective recompute (Korthikanti et
al. 2023, sec. 5) re-runs the unfused core's forward inside the block's backward
(`core_recompute_kernels`). Also the LLaMA block (`llama_block_kernels`). Part of the expansion in
`simulator.kernels` (its module docstring gives the conventions)."""

from __future__ import annotations

import math
from dataclasses import replace

from simulator.kernel_ops import (
    DEFAULT_DROPOUT,
    STATS_BYTES,
    Kernel,
    add,
    copy,
    dropout,
    gemm,
    linear,
    pointwise,
    rms_norm,
)
from simulator.memory_activations import attention_keys
from simulator.zoo._ops import ROTARY_FLOPS, SOFTMAX_FLOPS, SWIGLU_FLOPS

FP32 = 4
FLASH_BACKWARD_KERNEL = "attn.flash_bwd"
"""The flash-attention backward kernel's name (`simulator.kernel_costs.kernel_s` prices an
implementation's forward and backward apart)."""


def fused_softmax_available(attention_batches: float, sq: int, sk: int, e: int, causal: bool) -> bool:
    """Megatron's FusedScaleMaskSoftmax.is_kernel_available (megatron/model/fused_softmax.py): a
    16-bit input, 16 < sk <= 4096, sq and sk multiples of 4, b x heads per rank a multiple of 4,
    and that count (causal) or sq (otherwise) a multiple of the kernel's batches per block:
    (128 threads / warp) x batches per warp, warp = min(32, next power of two >= sk), 2 batches
    per warp up to 128 keys, else 1 (megatron/fused_kernels/scaled_masked_softmax.h,
    get_batch_per_block)."""
    if e != 2 or not 16 < sk <= 4096 or sq % 4 or sk % 4 or attention_batches % 4:
        return False
    keys = 1 << math.ceil(math.log2(sk))
    per_block = (128 // min(keys, 32)) * (2 if keys <= 128 else 1)
    return (attention_batches if causal else sq) % per_block == 0


def _torch_softmax(probs: float, e: int, phase: str) -> list[Kernel]:
    """Megatron's fallback when the fused kernel is unavailable (forward_torch_softmax, softmax in
    fp32 as query-key layer scaling forces): cast up, scale, masked_fill_, softmax, cast down;
    the backward runs each op's gradient kernel in reverse."""
    if phase != "B":
        return [pointwise("attn.softmax.to_fp32", "elementwise", probs, e, FP32),
                pointwise("attn.softmax.scale", "elementwise", probs, FP32, FP32, 1.0),
                pointwise("attn.softmax.mask", "elementwise", probs, FP32, FP32),
                pointwise("attn.softmax", "softmax", probs, FP32, FP32, SOFTMAX_FLOPS),
                pointwise("attn.softmax.to_half", "elementwise", probs, FP32, e)]
    return [pointwise("attn.softmax.to_half.bwd", "elementwise", probs, e, FP32),
            pointwise("attn.softmax.bwd", "softmax", probs, 2 * FP32, FP32, SOFTMAX_FLOPS),
            pointwise("attn.softmax.mask.bwd", "elementwise", probs, FP32, FP32),
            pointwise("attn.softmax.scale.bwd", "elementwise", probs, FP32, FP32, 1.0),
            pointwise("attn.softmax.to_fp32.bwd", "elementwise", probs, FP32, e)]


def flash_work_fraction(s: int, keys: int, causal: bool) -> float:
    """Share of the s x s tile grid flash attention runs: causal with a window W = keys < s, the
    mean band width over s, W/s - W^2/(2 s^2) (1/2 without a window); not causal, keys / s."""
    if not causal:
        return keys / s
    return keys / s - keys * keys / (2.0 * s * s)


def block_core_kernels(spec, b: float, e: int, phase: str, t: int, flash: bool) -> list[Kernel]:
    """`attention_core_kernels` of a zoo transformer block's spec (dropout p: `spec["dropout"]`,
    else Megatron's default; keys: `simulator.memory_activations.attention_keys`)."""
    heads = spec["num_heads"]
    return attention_core_kernels(b, spec["seq_len"], spec["hidden_size"], heads, t, e, phase, flash,
                                  spec.get("causal", True), spec.get("dropout", DEFAULT_DROPOUT),
                                  spec.get("num_kv_heads") or heads, keys=attention_keys(spec))


def core_recompute_kernels(spec, b: float, e: int, t: int, flash: bool) -> list[Kernel]:
    """Selective recompute's extra work in a block's backward: the unfused core's forward kernels
    (scores, softmax, dropout, P V) from the kept Q, K, V (Korthikanti et al. 2023, sec. 5); none
    with flash attention, whose backward recomputes the scores already and keeps no s x s tensor."""
    if flash:
        return []
    return [replace(kernel, name=f"recompute.{kernel.name}")
            for kernel in block_core_kernels(spec, b, e, "F", t, flash)]


def attention_core_kernels(b: float, s: int, h: int, heads: int, t: int, e: int, phase: str,
                    flash: bool, causal: bool, p: float, kv_heads: int | None = None,
                    keys: int | None = None) -> list[Kernel]:
    """Scores Q K^T (batched per head, scale in the GEMM's alpha), fused scale-mask-softmax (or
    its unfused fallback, `fused_softmax_available`), dropout, P V, context permute (Megatron
    CoreAttention); or one flash-attention kernel
    (Dao 2023) between layout copies, tiled as m = s queries, n = d, k = 2s (forward: 4 s^2 d
    FLOPs per head) or k = 5s (backward: 5 GEMMs, scores recomputed). With `kv_heads` < heads
    (GQA) the unfused path first repeats K and V to every query head (Megatron-core's
    `repeat_interleave`; its backward sums them back); flash attention reads them as they are.
    `keys` (default s): keys per query under a sliding window (module docstring)."""
    d, a = h // heads, heads // t
    k = s if keys is None else min(s, keys)
    tokens, heads_total = b * s, b * a
    probs = heads_total * s * k
    grouped = kv_heads is not None and kv_heads != heads
    qkv_e, ctx_e = 3 * tokens * h / t, tokens * h / t
    if grouped:
        qkv_e = tokens * (h + 2 * kv_heads * d) / t
    repeat = [pointwise("attn.kv_repeat", "copy", 2 * ctx_e, e * kv_heads / heads, e)] if grouped else []
    repeat_bwd = ([pointwise("attn.kv_repeat.bwd", "reduction", 2 * ctx_e, e, e * kv_heads / heads, 1.0)]
                  if grouped else [])
    work = flash_work_fraction(s, k, causal)
    if flash:
        if phase != "B":
            return [copy("attn.qkv_layout", qkv_e, e),
                    Kernel("attn.flash", "flash_attention", 4.0 * heads_total * s * k * d,
                           qkv_e * e, ctx_e * e + heads_total * s * STATS_BYTES,
                           s, d, 2 * s, heads_total, work),
                    copy("attn.context_layout", ctx_e, e)]
        return [copy("attn.context_layout.bwd", ctx_e, e),
                pointwise("attn.flash_bwd_dot_do_o", "reduction", ctx_e, 2 * e, 0.0),
                Kernel(FLASH_BACKWARD_KERNEL, "flash_attention", 10.0 * heads_total * s * k * d,
                       (qkv_e + 2 * ctx_e) * e + heads_total * s * STATS_BYTES,
                       2 * ctx_e * e + ctx_e * STATS_BYTES, s, d, 5 * s, heads_total, work),
                pointwise("attn.flash_bwd_convert_dq", "elementwise", ctx_e, STATS_BYTES, e),
                copy("attn.qkv_layout.bwd", qkv_e, e)]
    fused = fused_softmax_available(heads_total, s, k, e, causal)
    if phase != "B":
        kernels = [*repeat, gemm("attn.score", s, k, d, e, batch_count=heads_total),
                   *([pointwise("attn.softmax", "softmax", probs, e, e, SOFTMAX_FLOPS)] if fused
                     else _torch_softmax(probs, e, phase))]
        kernels += [dropout("attn.dropout", probs, e, phase)] if p > 0 else []
        return kernels + [gemm("attn.value", s, d, k, e, batch_count=heads_total),
                          copy("attn.context_permute", ctx_e, e)]
    kernels = [copy("attn.context_permute.bwd", ctx_e, e),
               gemm("attn.value.dgrad_probs", s, k, d, e, batch_count=heads_total),
               gemm("attn.value.dgrad_v", k, d, s, e, batch_count=heads_total)]
    kernels += [dropout("attn.dropout", probs, e, phase)] if p > 0 else []
    kernels += ([pointwise("attn.softmax.bwd", "softmax", probs, 2 * e, e, SOFTMAX_FLOPS)] if fused
                else _torch_softmax(probs, e, phase))
    return kernels + [gemm("attn.score.dgrad_q", s, d, k, e, batch_count=heads_total),
                      gemm("attn.score.dgrad_k", k, d, s, e, batch_count=heads_total),
                      *repeat_bwd, copy("attn.qkv_split.bwd", qkv_e, e)]


def llama_block_kernels(spec, b: float, e: int, phase: str, t: int, flash: bool,
                        sp: bool) -> list[Kernel]:
    """LLaMA block as Megatron-core runs it (--normalization RMSNorm, --swiglu, rope, GQA,
    --disable-bias-linear, dropout 0): RMSNorm, fused QKV GEMM (N = (h + 2 g d) / tp), rotary on
    Q and K (one elementwise kernel each; Su et al. 2021), attention core, out-proj, residual add,
    RMSNorm, fused gate + up GEMM (N = 2 f / tp), fused silu-mul (Shazeer 2020), down GEMM,
    residual add. Caller checks tp divides heads, kv heads and f."""
    s, h, heads, f = spec["seq_len"], spec["hidden_size"], spec["num_heads"], spec["ffn_hidden_size"]
    kv = spec.get("num_kv_heads") or heads
    tokens, kv_h = b * s, kv * (h // heads)
    rows = tokens / t if sp else tokens
    core = block_core_kernels({"dropout": 0.0, **spec}, b, e, phase, t, flash)
    if phase != "B":
        return [*rms_norm("norm1", rows, h, e, phase), *linear("qkv", tokens, (h + 2 * kv_h) / t, h, e, phase),
                pointwise("rotary_q", "elementwise", tokens * h / t, e, e, ROTARY_FLOPS),
                pointwise("rotary_k", "elementwise", tokens * kv_h / t, e, e, ROTARY_FLOPS),
                *core, *linear("proj", tokens, h, h / t, e, phase), add("residual1", rows * h, e),
                *rms_norm("norm2", rows, h, e, phase), *linear("fc1", tokens, 2 * f / t, h, e, phase),
                pointwise("swiglu", "elementwise", tokens * f / t, 2 * e, e, SWIGLU_FLOPS),
                *linear("fc2", tokens, h, f / t, e, phase), add("residual2", rows * h, e)]
    return [*linear("fc2", tokens, h, f / t, e, phase),
            pointwise("swiglu.bwd", "elementwise", tokens * f / t, 3 * e, 2 * e, SWIGLU_FLOPS),
            *linear("fc1", tokens, 2 * f / t, h, e, phase), *rms_norm("norm2", rows, h, e, phase),
            add("residual2.grad_accumulate", rows * h, e),
            *linear("proj", tokens, h, h / t, e, phase), *core,
            pointwise("rotary_q.bwd", "elementwise", tokens * h / t, e, e, ROTARY_FLOPS),
            pointwise("rotary_k.bwd", "elementwise", tokens * kv_h / t, e, e, ROTARY_FLOPS),
            *linear("qkv", tokens, (h + 2 * kv_h) / t, h, e, phase),
            *rms_norm("norm1", rows, h, e, phase), add("residual1.grad_accumulate", rows * h, e)]
