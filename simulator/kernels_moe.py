"""A mixture-of-experts block (`simulator.zoo.moe`) as the kernels Megatron-Core launches for it: the
LLaMA attention half (`simulator.kernels_attention`), then the router, the token permutation, the
experts as grouped GEMMs, the unpermutation (weighted combine) and the shared experts. Part of the
expansion in `simulator.kernels` (its module docstring gives the conventions).

Megatron-Core MoE (`megatron/core/transformer/moe/`: `router.py` TopKRouter, `token_dispatcher.py`
MoEAlltoAllTokenDispatcher, `experts.py` GroupedMLP over CUTLASS grouped GEMMs, `moe_utils.py`
permute / unpermute): the router GEMM runs on the rank's own tokens (s / t of them with sequence
parallelism) with the weight replicated over TP, its softmax and top-k in fp32; permute gathers
each token's k copies into expert order; the all-to-all dispatch (a collective, not a kernel here:
`simulator.strategies.experts`) brings every EP rank's tokens for its E / ep local experts, which
run as one grouped GEMM per projection, each expert on c k (b s) ep / E tokens (balanced routing,
c the capacity factor: `simulator.zoo.moe`), their weights split over TP along f as the dense MLP's;
unpermute scales each copy by its router probability and sums the k copies of a token. The expert
parallel degree comes from the layer spec's `expert_parallel_degree` (set by the megatron plan).
"""

from __future__ import annotations

from simulator.kernel_ops import STATS_BYTES, Kernel, add, gemm, linear, pointwise, rms_norm
from simulator.kernels_attention import block_core_kernels
from simulator.zoo._ops import ROTARY_FLOPS, SOFTMAX_FLOPS, SWIGLU_FLOPS

COMBINE_FLOPS = 2
"""Unpermute: one multiply by the router probability and one add per element of each routed copy."""


def grouped_linear(name: str, m: float, n: float, k: float, e: int, phase: str, groups: float) -> list[Kernel]:
    """`groups` bias-free linears y[m, n] = x[m, k] W[n, k]^T of one shape in one grouped-GEMM launch
    (Megatron-Core GroupedMLP); backward: the grouped data and weight gradients (as `linear`)."""
    if phase != "B":
        return [gemm(name, m, n, k, e, batch_count=groups)]
    return [gemm(f"{name}.dgrad", m, k, n, e, batch_count=groups),
            gemm(f"{name}.wgrad", n, k, m, e, batch_count=groups)]


def attention_half_kernels(spec, b: float, e: int, phase: str, t: int, flash: bool, sp: bool) -> list[Kernel]:
    """RMSNorm, fused QKV GEMM, rotary Q and K, attention core, out-projection, residual add: the
    first half of `kernels_attention.llama_block_kernels` (same kernels, same order)."""
    s, h, heads = spec["seq_len"], spec["hidden_size"], spec["num_heads"]
    kv = spec.get("num_kv_heads") or heads
    tokens, kv_h = b * s, kv * (h // heads)
    rows = tokens / t if sp else tokens
    core = block_core_kernels(spec, b, e, phase, t, flash)
    rotary = [pointwise("rotary_q", "elementwise", tokens * h / t, e, e, ROTARY_FLOPS),
              pointwise("rotary_k", "elementwise", tokens * kv_h / t, e, e, ROTARY_FLOPS)]
    if phase != "B":
        return [*rms_norm("norm1", rows, h, e, phase), *linear("qkv", tokens, (h + 2 * kv_h) / t, h, e, phase),
                *rotary, *core, *linear("proj", tokens, h, h / t, e, phase), add("residual1", rows * h, e)]
    rotary = [pointwise(f"{kernel.name}.bwd", "elementwise", kernel.flops / ROTARY_FLOPS, e, e, ROTARY_FLOPS)
              for kernel in rotary]
    return [*linear("proj", tokens, h, h / t, e, phase), *core, *rotary,
            *linear("qkv", tokens, (h + 2 * kv_h) / t, h, e, phase),
            *rms_norm("norm1", rows, h, e, phase), add("residual1.grad_accumulate", rows * h, e)]


def _shared_expert_kernels(tokens: float, h: int, fs: float, e: int, phase: str) -> list[Kernel]:
    """The shared experts: one SwiGLU MLP of width fs (per TP rank) on every token."""
    if not fs:
        return []
    if phase != "B":
        return [*linear("shared_fc1", tokens, 2 * fs, h, e, phase),
                pointwise("shared_swiglu", "elementwise", tokens * fs, 2 * e, e, SWIGLU_FLOPS),
                *linear("shared_fc2", tokens, h, fs, e, phase)]
    return [*linear("shared_fc2", tokens, h, fs, e, phase),
            pointwise("shared_swiglu.bwd", "elementwise", tokens * fs, 3 * e, 2 * e, SWIGLU_FLOPS),
            *linear("shared_fc1", tokens, 2 * fs, h, e, phase)]


def _check_split(spec, t: int) -> None:
    sizes = {"num_heads": spec["num_heads"], "num_kv_heads": spec.get("num_kv_heads") or spec["num_heads"],
             "expert_ffn_hidden_size": spec["expert_ffn_hidden_size"],
             "shared_ffn_hidden_size": spec.get("shared_ffn_hidden_size", 0)}
    for what, size in sizes.items():
        if size % t:
            raise ValueError(f"tp_degree {t} does not divide {what} {size}")
    ep = spec.get("expert_parallel_degree", 1)
    if spec["num_experts"] % ep:
        raise ValueError(f"ep_degree {ep} does not divide num_experts {spec['num_experts']}")


def moe_block_kernels(spec, b: float, e: int, phase: str, t: int, flash: bool, sp: bool) -> list[Kernel]:
    """The kernels of one TP / EP rank for an MoE block's pass (module docstring); ValueError when tp
    does not divide the heads, kv heads or expert widths, or ep the experts."""
    s, h, num_experts = spec["seq_len"], spec["hidden_size"], spec["num_experts"]
    _check_split(spec, t)
    f, fs = spec["expert_ffn_hidden_size"] / t, spec.get("shared_ffn_hidden_size", 0) / t
    copies = spec.get("capacity_factor", 1.0) * spec["top_k"]
    ep = spec.get("expert_parallel_degree", 1)
    tokens = b * s
    rows = tokens / t if sp else tokens
    local_experts, per_expert = num_experts / ep, copies * tokens * ep / num_experts
    routed_rows, routed = copies * rows * h, copies * tokens
    attention = attention_half_kernels(spec, b, e, phase, t, flash, sp)
    shared = _shared_expert_kernels(tokens, h, fs, e, phase)
    if phase != "B":
        return [*attention, *rms_norm("norm2", rows, h, e, phase),
                *linear("router", rows, num_experts, h, e, phase),
                pointwise("router.softmax_topk", "softmax", rows * num_experts, e, STATS_BYTES, SOFTMAX_FLOPS),
                pointwise("moe.permute", "copy", routed_rows, e, e),
                *grouped_linear("experts.fc1", per_expert, 2 * f, h, e, phase, local_experts),
                pointwise("experts.swiglu", "elementwise", routed * f, 2 * e, e, SWIGLU_FLOPS),
                *grouped_linear("experts.fc2", per_expert, h, f, e, phase, local_experts),
                Kernel("moe.unpermute", "elementwise", COMBINE_FLOPS * routed_rows, routed_rows * e, rows * h * e),
                *shared, *([add("moe.shared_add", rows * h, e)] if fs else []), add("residual2", rows * h, e)]
    return [*shared,
            Kernel("moe.unpermute.bwd", "elementwise", COMBINE_FLOPS * routed_rows, 2 * routed_rows * e,
                   routed_rows * e),
            *grouped_linear("experts.fc2", per_expert, h, f, e, phase, local_experts),
            pointwise("experts.swiglu.bwd", "elementwise", routed * f, 3 * e, 2 * e, SWIGLU_FLOPS),
            *grouped_linear("experts.fc1", per_expert, 2 * f, h, e, phase, local_experts),
            Kernel("moe.permute.bwd", "elementwise", routed_rows, routed_rows * e, rows * h * e),
            pointwise("router.softmax_topk.bwd", "softmax", rows * num_experts, 2 * STATS_BYTES, e, SOFTMAX_FLOPS),
            *linear("router", rows, num_experts, h, e, phase),
            add("moe.input_grad_accumulate", rows * h, e), *rms_norm("norm2", rows, h, e, phase),
            add("residual2.grad_accumulate", rows * h, e), *attention]
