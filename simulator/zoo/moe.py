"""Mixture-of-experts decoders: LLaMA-style attention, then a router and E SwiGLU experts of which each
token uses k (top-k), with optional shared experts every token passes through.

Sources: Shazeer et al. 2017, "Outrageously Large Neural Networks: The Sparsely-Gated
Mixture-of-Experts Layer" (gating network, top-k); Fedus et al. 2021, "Switch Transformers", sec. 2.2
(expert capacity = capacity factor x tokens per batch / experts, here x k); Jiang et al. 2024,
"Mixtral of Experts" (8 SwiGLU experts, top-2, softmax over the k chosen logits); Dai et al. 2024,
"DeepSeekMoE" (fine-grained experts: many small routed experts, k of them, plus shared experts
every token uses; the first layer dense). DeepSeek-V2's MLA attention is out of scope: attention
is the LLaMA block's grouped-query attention (`simulator.zoo.llama`), as DeepSeekMoE 16B's MHA.

Per MoE block (s tokens, h hidden, E routed experts of intermediate size f, k per token, c the
capacity factor, f_s = shared experts x f), forward FLOPs: the LLaMA attention half (QKV, rotary,
core, out-proj, RMSNorm, residual add), the second RMSNorm, the router GEMM 2shE and its softmax
5sE, the experts on c k s routed tokens, c k s (6hf + 6f) (gate + up 4hf, silu-mul 6f, down 2hf),
the weighted combine 2 c k s h, the shared experts 6 s h f_s + 6 s f_s, their sum with the routed
output s h and the residual add s h. FLOPs count the routed tokens only (k of E experts per token):
with c = 1 (the default, balanced routing) exactly the active parameters' work. Parameters count
every expert: 2h^2 + 2hgd (attention) + hE (router) + 3hfE + 3hf_s + 2h (RMSNorms).

The capacity factor c sets the tokens each expert computes, c x k x s / E per sequence: with token
dropping (Switch, GShard) the buffer every expert is padded to; dropless (Megatron-Core's default,
Mixtral) with imbalanced routing, the busiest expert's load over the mean, since that expert sets
the pace of the grouped GEMM and of the all-to-all (Megatron-Core `--moe-expert-capacity-factor`).

Saved per block: the attention half as LLaMA's (4sh + 2sgd + a s^2), the second RMSNorm's input and
the router / shared-expert input (2sh), the router probabilities sE, the permuted tokens c k s h,
the experts' silu-mul inputs and down input 3 c k s f, the expert outputs for the combine's
probability gradient c k s h, and the shared experts' 3 s f_s.
"""

from __future__ import annotations

from typing import Any

from simulator.workload import Layer, Workload
from simulator.zoo._ops import ADD_FLOPS, SOFTMAX_FLOPS, SWIGLU_FLOPS, DimensionError, keyword_signature, require_positive
from simulator.zoo.llama import attention_half, llama_block, llama_embedding, llama_head
from simulator.zoo.transformer import check_sliding_window


def moe_block(name: str, hidden: int, heads: int, kv_heads: int, seq: int, *, num_experts: int, top_k: int,
              expert_ffn: int, shared_ffn: int = 0, capacity_factor: float = 1.0, sliding_window: int = 0) -> Layer:
    """Pre-RMSNorm block: GQA self-attention with rotary Q / K (over min(seq, W) keys with a sliding
    window W > 0, as `llama_block`), then a top-k routed SwiGLU MoE (+ shared SwiGLU experts of width
    `shared_ffn`); no biases (module docstring)."""
    t = attention_half(hidden, heads, kv_heads, seq, sliding_window)
    elems = seq * hidden
    t.linear(hidden, num_experts, tokens=seq, bias=False)  # router logits (saves the normed input)
    t.flops += SOFTMAX_FLOPS * seq * num_experts
    t.saved += seq * num_experts
    routed = capacity_factor * top_k * seq
    t.flops += routed * routed_token_flops(hidden, expert_ffn)
    t.params += 3 * hidden * expert_ffn * num_experts
    t.saved += routed * (2 * hidden + 3 * expert_ffn)
    if shared_ffn:
        t.linear(hidden, 2 * shared_ffn, tokens=seq, bias=False, save_input=False)  # the router's input
        t.swiglu(seq * shared_ffn)
        t.linear(shared_ffn, hidden, tokens=seq, bias=False)
        t.add(elems)
    t.flops += ADD_FLOPS * elems  # residual
    spec = {"kind": "moe_block", "hidden_size": hidden, "num_heads": heads, "num_kv_heads": kv_heads,
            "seq_len": seq, "num_experts": num_experts, "top_k": top_k, "expert_ffn_hidden_size": expert_ffn,
            "shared_ffn_hidden_size": shared_ffn, "capacity_factor": capacity_factor, "causal": True,
            "norm": "pre", "norm_type": "rmsnorm", "activation": "swiglu", "position_embedding": "rotary",
            "bias": False, "dropout": 0.0, **({"sliding_window": sliding_window} if sliding_window else {})}
    return t.layer(name, "attention", elems, elems, spec)


def routed_token_flops(hidden: int, expert_ffn: int) -> float:
    """Forward FLOPs of one routed token copy: gate + up 4hf, silu-mul 6f, down 2hf, weighted
    combine 2h (module docstring)."""
    return 6 * hidden * expert_ffn + SWIGLU_FLOPS * expert_ffn + 2 * hidden


def capacity_padding_flops_per_sample(layer: Layer) -> float:
    """Forward + backward FLOPs of a MoE block's capacity padding: the (c - 1) k s routed token
    copies beyond each token's k, x 3 (backward = 2 x forward, `make_layer`); 0 for other layers
    and at c = 1. Executed work (what the step is timed on), not model FLOPs (`simulator.flops`)."""
    spec = layer.spec
    if spec.get("kind") != "moe_block":
        return 0.0
    extra = (spec["capacity_factor"] - 1) * spec["top_k"] * spec["seq_len"]
    return 3 * extra * routed_token_flops(spec["hidden_size"], spec["expert_ffn_hidden_size"])


def _check(num_experts: int, top_k: int, expert_ffn: int, capacity_factor: float, num_shared: int,
           num_dense: int, dense_ffn: int, num_layers: int) -> None:
    require_positive(num_experts=num_experts, top_k=top_k, expert_ffn_hidden_size=expert_ffn)
    for key, count in (("num_shared_experts", num_shared), ("num_dense_layers", num_dense)):
        if count < 0:
            raise DimensionError(f"{{{key}}} must be at least 0", **{key: count})
    if top_k > num_experts:
        raise DimensionError("{top_k} exceeds {num_experts}", top_k=top_k, num_experts=num_experts)
    if not capacity_factor > 0:
        raise DimensionError("{capacity_factor} must be > 0", capacity_factor=capacity_factor)
    if capacity_factor > num_experts / top_k:  # an expert's slots, f k T / E, would exceed the T tokens
        raise DimensionError("{capacity_factor} exceeds {num_experts} / {top_k} (each expert would hold more "
                             "slots than there are tokens)", capacity_factor=capacity_factor,
                             num_experts=num_experts, top_k=top_k)
    if num_dense > num_layers:
        raise DimensionError("{num_dense_layers} exceeds {num_layers}", num_dense_layers=num_dense,
                             num_layers=num_layers)
    if num_dense and dense_ffn < 1:
        raise DimensionError("{num_dense_layers} needs a positive {dense_ffn_hidden_size}",
                             num_dense_layers=num_dense, dense_ffn_hidden_size=dense_ffn)


def moe_workload(name: str, *, num_layers: int = 32, hidden_size: int = 4096, num_heads: int = 32,
                 num_kv_heads: int = 0, seq_len: int = 4096, vocab_size: int = 32000, num_experts: int = 8,
                 top_k: int = 2, expert_ffn_hidden_size: int = 14336, num_shared_experts: int = 0,
                 num_dense_layers: int = 0, dense_ffn_hidden_size: int = 0, capacity_factor: float = 1.0,
                 max_positions: int = 0, tie_embeddings: bool = False, sliding_window: int = 0) -> Workload:
    """An MoE decoder called `name`: embedding, `num_dense_layers` dense LLaMA blocks of width
    `dense_ffn_hidden_size` (DeepSeekMoE's first layer), MoE blocks, RMSNorm + LM head. Shared
    experts form one SwiGLU MLP of width num_shared_experts x expert_ffn_hidden_size (as Hugging
    Face's DeepseekMoE builds them)."""
    kv = num_kv_heads or num_heads
    max_positions = max_positions or seq_len
    _check(num_experts, top_k, expert_ffn_hidden_size, capacity_factor, num_shared_experts,
           num_dense_layers, dense_ffn_hidden_size, num_layers)
    require_positive(num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads, num_kv_heads=kv,
                     seq_len=seq_len, vocab_size=vocab_size)
    if hidden_size % num_heads or num_heads % kv:
        raise DimensionError("{hidden_size}, {num_heads}, {num_kv_heads}: heads must divide hidden_size and kv "
                             "heads the heads", hidden_size=hidden_size, num_heads=num_heads, num_kv_heads=kv)
    if max_positions < seq_len:
        raise DimensionError("{max_positions} < {seq_len}", max_positions=max_positions, seq_len=seq_len)
    layers = [llama_embedding("embedding", vocab_size, hidden_size, seq_len, max_positions)]
    check_sliding_window(sliding_window)
    layers += [llama_block(f"block{i}", hidden_size, num_heads, kv, seq_len, dense_ffn_hidden_size, sliding_window)
               for i in range(num_dense_layers)]
    layers += [moe_block(f"block{i}", hidden_size, num_heads, kv, seq_len, num_experts=num_experts, top_k=top_k,
                         expert_ffn=expert_ffn_hidden_size, shared_ffn=num_shared_experts * expert_ffn_hidden_size,
                         capacity_factor=capacity_factor, sliding_window=sliding_window)
               for i in range(num_dense_layers, num_layers)]
    layers.append(llama_head("head", hidden_size, vocab_size, seq_len, tied=bool(tie_embeddings)))
    input_spec = {"shape": [seq_len], "vocab_size": vocab_size, "task": "causal_lm"}
    return Workload(name, tuple(layers), input_spec)


def moe(**config: Any) -> Workload:
    """Generic MoE decoder (`moe_workload`; defaults: Mixtral 8x7B's dimensions)."""
    return moe_workload("moe", **config)


moe.__signature__ = keyword_signature(moe_workload, {})  # type: ignore[attr-defined]


PRESETS: dict[str, dict[str, Any]] = {
    # Jiang et al. 2024, Table 1; HF mistralai/Mixtral-8x7B-v0.1 config.json (46.7B total, 12.9B active)
    "mixtral-8x7b": {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8,
                     "vocab_size": 32000, "num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 14336,
                     "seq_len": 4096},
    # Dai et al. 2024, sec. 5 / Table 8; HF deepseek-ai/deepseek-moe-16b-base config.json (16.4B)
    "deepseek-moe-16b": {"num_layers": 28, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 16,
                         "vocab_size": 102400, "num_experts": 64, "top_k": 6, "expert_ffn_hidden_size": 1408,
                         "num_shared_experts": 2, "num_dense_layers": 1, "dense_ffn_hidden_size": 10944,
                         "seq_len": 4096},
}
"""Published parameter counts: Mixtral 8x7B 46.7B (12.9B active), DeepSeekMoE 16B 16.4B."""


def _preset(name: str):
    base = PRESETS[name]

    def factory(**overrides: Any) -> Workload:
        return moe_workload(name, **{**base, **overrides})

    factory.__name__ = name.replace("-", "_")
    factory.__doc__ = f"{name} (`PRESETS`), any `moe_workload` keyword overridable."
    factory.__signature__ = keyword_signature(moe_workload, base)  # type: ignore[attr-defined]
    return factory


MOE_MODELS: dict[str, Any] = {"moe": moe, **{name: _preset(name) for name in PRESETS}}
