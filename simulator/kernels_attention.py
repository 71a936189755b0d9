"""The attention core of a Megatron transformer block as kernels: scores, (fused or unfused)
scale-mask-softmax, dropout, values and the context permute; or flash attention. Part of the
expansion in `simulator.kernels` (its module docstring gives the conventions)."""

from __future__ import annotations

import math

from simulator.kernel_ops import STATS_BYTES, Kernel, copy, dropout, gemm, pointwise
from simulator.zoo._ops import SOFTMAX_FLOPS

FP32 = 4


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


def attention_core_kernels(b: float, s: int, h: int, heads: int, t: int, e: int, phase: str,
                    flash: bool, causal: bool, p: float) -> list[Kernel]:
    """Scores Q K^T (batched per head, scale in the GEMM's alpha), fused scale-mask-softmax (or
    its unfused fallback, `fused_softmax_available`), dropout, P V, context permute (Megatron
    CoreAttention); or one flash-attention kernel
    (Dao 2023) between layout copies, tiled as m = s queries, n = d, k = 2s (forward: 4 s^2 d
    FLOPs per head) or k = 5s (backward: 5 GEMMs, scores recomputed)."""
    d, a = h // heads, heads // t
    tokens, heads_total = b * s, b * a
    probs = heads_total * s * s
    qkv_e, ctx_e = 3 * tokens * h / t, tokens * h / t
    work = 0.5 if causal else 1.0
    if flash:
        if phase != "B":
            return [copy("attn.qkv_layout", qkv_e, e),
                    Kernel("attn.flash", "flash_attention", 4.0 * heads_total * s * s * d,
                           qkv_e * e, ctx_e * e + heads_total * s * STATS_BYTES,
                           s, d, 2 * s, heads_total, work),
                    copy("attn.context_layout", ctx_e, e)]
        return [copy("attn.context_layout.bwd", ctx_e, e),
                pointwise("attn.flash_bwd_dot_do_o", "reduction", ctx_e, 2 * e, 0.0),
                Kernel("attn.flash_bwd", "flash_attention", 10.0 * heads_total * s * s * d,
                       (qkv_e + 2 * ctx_e) * e + heads_total * s * STATS_BYTES,
                       2 * ctx_e * e + ctx_e * STATS_BYTES, s, d, 5 * s, heads_total, work),
                pointwise("attn.flash_bwd_convert_dq", "elementwise", ctx_e, STATS_BYTES, e),
                copy("attn.qkv_layout.bwd", qkv_e, e)]
    fused = fused_softmax_available(heads_total, s, s, e, causal)
    if phase != "B":
        kernels = [gemm("attn.score", s, s, d, e, batch_count=heads_total),
                   *([pointwise("attn.softmax", "softmax", probs, e, e, SOFTMAX_FLOPS)] if fused
                     else _torch_softmax(probs, e, phase))]
        kernels += [dropout("attn.dropout", probs, e, phase)] if p > 0 else []
        return kernels + [gemm("attn.value", s, d, s, e, batch_count=heads_total),
                          copy("attn.context_permute", ctx_e, e)]
    kernels = [copy("attn.context_permute.bwd", ctx_e, e),
               gemm("attn.value.dgrad_probs", s, s, d, e, batch_count=heads_total),
               gemm("attn.value.dgrad_v", s, d, s, e, batch_count=heads_total)]
    kernels += [dropout("attn.dropout", probs, e, phase)] if p > 0 else []
    kernels += ([pointwise("attn.softmax.bwd", "softmax", probs, 2 * e, e, SOFTMAX_FLOPS)] if fused
                else _torch_softmax(probs, e, phase))
    return kernels + [gemm("attn.score.dgrad_q", s, d, s, e, batch_count=heads_total),
                      gemm("attn.score.dgrad_k", s, d, s, e, batch_count=heads_total),
                      copy("attn.qkv_split.bwd", qkv_e, e)]
