"""Torch modules of the LLaMA family's layer specs (`simulator.zoo.llama`): token embedding, the
pre-RMSNorm block (grouped-query attention with rotary Q / K, SwiGLU MLP, no biases) and the final
RMSNorm + LM head, with the zoo's exact parameters, GEMM shapes and FLOPs.

Sources: Touvron et al. 2023 (LLaMA, Llama 2) and Meta's reference `llama/model.py`; Hugging Face
`modeling_llama.py` for the layout conventions (rotate-half rotary, `repeat_kv` grouping);
RMSNorm: Zhang & Sennrich 2019 (eps 1e-5, Hugging Face `rms_norm_eps` of Llama 2 and 3; spec key
`rms_norm_eps` overrides it); rotary:
Su et al. 2021, base 10000 (Llama 2; spec key `rope_theta` overrides it, Llama 3 uses 500000);
SwiGLU: Shazeer 2020, down(silu(gate(x)) * up(x)).

Choices (as `validator.models` for GPT): no dropout, weights N(0, 0.02), RMSNorm weights 1. The
gate and up projections are one `Linear(h, 2 f)` (gate rows first) and Q, K, V one
`Linear(h, h + 2 g d)`, as the zoo counts them. The rotary cos / sin tables are non-persistent
buffers built once (not parameters, not in the state dict, computed outside the forward so that
its FLOPs are the zoo's). An untied head owns its V x h weight; a tied one (`tie_embeddings`)
holds a copy of the embedding table (`validator.models`, "Tied LM head").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from validator.attention_core import attention
from validator.layer_modules import LMHead, init_transformer

RMS_NORM_EPS = 1e-5
"""Hugging Face `rms_norm_eps` of Llama 2 / Llama 3 (Meta's `norm_eps`)."""
ROPE_THETA = 10000.0
"""Rotary base of Su et al. 2021 and Llama 2 (Hugging Face `rope_theta`)."""


class RMSNormFunction(torch.autograd.Function):
    """y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019, eq. 4), saving
    x and the per-row rstd only, as fused kernels do (Apex `FusedRMSNorm`, torch's CUDA
    `_fused_rms_norm`) and the zoo counts; autograd over the CPU decomposition would also keep
    x * rstd. Backward: dw = sum(g * x rstd), dx = rstd (g w - x rstd mean(g w x rstd))."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, rstd, weight = ctx.saved_tensors
        normed = x * rstd
        grad_weight = (grad * normed).reshape(-1, x.shape[-1]).sum(0)
        scaled = grad * weight
        grad_x = rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
        return grad_x, grad_weight, None


class SwiGLUFunction(torch.autograd.Function):
    """silu(gate) * up (Shazeer 2020), saving its two inputs only (as the zoo counts, and fused
    SwiGLU kernels such as Megatron's `bias_swiglu` do). Backward with s = sigmoid(gate):
    d gate = g up s (1 + gate (1 - s)), d up = g gate s."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        sigmoid = torch.sigmoid(gate)
        return grad * up * sigmoid * (1 + gate * (1 - sigmoid)), grad * gate * sigmoid


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (`RMSNormFunction`)."""

    def __init__(self, hidden: int, eps: float = RMS_NORM_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RMSNormFunction.apply(x, self.weight, self.eps)


def rotary_tables(seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [s, 1, d] of the angles p * theta^(-2i/d), each frequency used twice
    (rotate-half layout, Hugging Face `LlamaRotaryEmbedding`; Su et al. 2021, eq. 34)."""
    inverse = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inverse)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().float(), angles.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin on [B, s, heads, d] (3 FLOPs per element, as the zoo)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class LlamaEmbedding(nn.Module):
    """`embedding` with `position_embedding: rotary`: the token table only (positions act in
    attention). Takes int64 ids [B, S], returns [B, S, h]."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        if spec.get("token_types") or spec.get("layernorm"):
            raise ValueError("a rotary embedding has no token types or LayerNorm")
        self.token = nn.Embedding(spec["vocab_size"], spec["hidden_size"])
        init_transformer(self)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.token(ids)


class LlamaBlock(nn.Module):
    """`transformer_block` with RMSNorm, rotary GQA and SwiGLU: x + attn(norm1(x)), then
    + down(silu(gate) * up)(norm2(.))."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        hidden, heads = spec["hidden_size"], spec["num_heads"]
        kv_heads = spec.get("num_kv_heads") or heads
        _check_block(spec, hidden, heads, kv_heads)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.ffn, self.window = spec["ffn_hidden_size"], int(spec.get("sliding_window") or 0)
        eps = float(spec.get("rms_norm_eps", RMS_NORM_EPS))
        self.norm1 = RMSNorm(hidden, eps)
        self.qkv = nn.Linear(hidden, hidden + 2 * kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = RMSNorm(hidden, eps)
        self.gate_up = nn.Linear(hidden, 2 * self.ffn, bias=False)
        self.down = nn.Linear(self.ffn, hidden, bias=False)
        init_transformer(self)
        cos, sin = rotary_tables(spec["seq_len"], self.head_dim, float(spec.get("rope_theta", ROPE_THETA)))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        kv_hidden = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((hidden, kv_hidden, kv_hidden), dim=-1)
        cos, sin = self.cos[:seq], self.sin[:seq]
        q = rotate(q.view(batch, seq, self.heads, self.head_dim), cos, sin).transpose(1, 2)
        k = rotate(k.view(batch, seq, self.kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = v.reshape(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        context = attention(q, k, v, causal=True, window=self.window)
        return self.proj(context.transpose(1, 2).reshape(batch, seq, hidden))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.ffn, dim=-1)
        return self.down(SwiGLUFunction.apply(gate, up))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _check_block(spec: Mapping[str, Any], hidden: int, heads: int, kv_heads: int) -> None:
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} not divisible by num_heads {heads}")
    if heads % kv_heads:
        raise ValueError(f"num_heads {heads} not divisible by num_kv_heads {kv_heads}")
    if (hidden // heads) % 2:
        raise ValueError(f"head dimension {hidden // heads} must be even for rotary embeddings")
    for key, value in (("activation", "swiglu"), ("norm", "pre"), ("causal", True)):
        if spec.get(key, value) != value:
            raise ValueError(f"{key} {spec[key]!r} not supported in a rotary block (expected {value!r})")
    if spec.get("bias"):
        raise ValueError("bias True not supported in a rotary block")
    window = spec.get("sliding_window") or 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"sliding_window {window!r}: expected a positive number of keys (0: causal)")


class LlamaHead(LMHead):
    """`lm_head` with `norm_type: rmsnorm`: final RMSNorm -> Linear(h, V, no bias); its own
    weight, or a tied copy of the embedding table (`tied_embedding`, not counted)."""

    tied_by_default = False

    def __init__(self, spec: Mapping[str, Any]):
        if spec.get("bias"):
            raise ValueError("bias True not supported in an RMSNorm head")
        super().__init__(spec)

    @staticmethod
    def final_norm(spec: Mapping[str, Any]) -> nn.Module:
        return RMSNorm(spec["hidden_size"], float(spec.get("rms_norm_eps", RMS_NORM_EPS)))


LLAMA_BUILDERS: dict[str, type[nn.Module]] = {
    "embedding": LlamaEmbedding,
    "transformer_block": LlamaBlock,
    "lm_head": LlamaHead,
}
"""Builders of the spec kinds whose spec says `position_embedding: rotary` or
`norm_type: rmsnorm` (`validator.models.build_layer_module`)."""


def is_llama_spec(spec: Mapping[str, Any]) -> bool:
    """A LLaMA-family spec: rotary positions or RMSNorm (the GPT / BERT specs have neither)."""
    return spec.get("position_embedding") == "rotary" or spec.get("norm_type") == "rmsnorm"
