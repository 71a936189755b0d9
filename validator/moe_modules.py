"""Torch module of the zoo's `moe_block` (`simulator.zoo.moe`): the LLaMA block's attention half
(`validator.llama_modules.LlamaBlock`: RMSNorm, rotary grouped-query attention, residual), then a
second RMSNorm, a top-k router and SwiGLU experts, plus optional shared experts; no biases.

Sources: Shazeer et al. 2017 (top-k gating); Jiang et al. 2024, "Mixtral of Experts", eq. 1-2
and Hugging Face `modeling_mixtral.py` (`MixtralSparseMoeBlock`): the router is a bias-free
Linear(h, E), routing weights = softmax over the E logits, the top k kept and divided by their
sum (= softmax over the k chosen logits), each expert down(silu(gate(x)) * up(x)), the block's
output the routing-weighted sum over a token's k experts; Dai et al. 2024, "DeepSeekMoE" (shared
experts: one SwiGLU MLP every token passes through, added to the routed output).

Parameters, as the zoo counts them: attention 2h^2 + 2hgd, router hE, experts 3hfE, shared
experts 3hf_s, two RMSNorm weights 2h. Choices:
* Dropless routing (Megatron-Core's default, Mixtral): every token reaches its k experts whatever
  `capacity_factor` says; the zoo's capacity factor only scales its FLOP estimate (the busiest
  expert's load over the mean). No load-balancing auxiliary loss (the zoo has no loss term).
* Spec key `norm_topk_prob` (Hugging Face's name, default True as Mixtral): False keeps the
  top-k softmax probabilities unnormalised (DeepSeekMoE).
* Every expert runs on every step, on zero tokens if none chose it, so that each parameter has a
  gradient (zero) and data-parallel buckets are complete. Tokens are gathered per expert in token
  order and scattered back with `index_add` (deterministic on the CPU); routing depends on the
  token only, so data-parallel training equals full-batch training.
* Weights N(0, 0.02), RMSNorm weights 1 (as `validator.llama_modules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from validator.layer_modules import init_transformer
from validator.llama_modules import LlamaBlock, SwiGLUFunction


class SwiGLUExpert(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up one bias-free Linear(h, 2f), gate rows
    first (as `LlamaBlock.mlp`): 3hf parameters."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.ffn = ffn
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.ffn, dim=-1)
        return self.down(SwiGLUFunction.apply(gate, up))


class MoEBlock(LlamaBlock):
    """`moe_block`: x + attn(norm1(x)) (the LLaMA block's), then + moe(norm2(.)) with
    moe(y) = sum over the top-k experts e of y's token of w_e expert_e(y) [+ shared(y)]."""

    def __init__(self, spec: Mapping[str, Any]):
        experts, top_k = int(spec["num_experts"]), int(spec["top_k"])
        expert_ffn, shared_ffn = int(spec["expert_ffn_hidden_size"]), int(spec.get("shared_ffn_hidden_size") or 0)
        if min(experts, top_k, expert_ffn) < 1 or shared_ffn < 0:
            raise ValueError("num_experts, top_k and expert_ffn_hidden_size must be positive")
        if top_k > experts:
            raise ValueError(f"top_k {top_k} exceeds num_experts {experts}")
        super().__init__({**spec, "ffn_hidden_size": expert_ffn})
        del self.gate_up, self.down  # the LLaMA block's dense MLP: replaced by the experts
        hidden = spec["hidden_size"]
        self.top_k, self.normalise = top_k, bool(spec.get("norm_topk_prob", True))
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLUExpert(hidden, expert_ffn) for _ in range(experts))
        self.shared = SwiGLUExpert(hidden, shared_ffn) if shared_ffn else None
        init_transformer(self.router)
        init_transformer(self.experts)
        if self.shared is not None:
            init_transformer(self.shared)

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], expert ids [T, k]): top-k of softmax(router(x)), divided by their sum
        when `normalise` (Mixtral eq. 2; Hugging Face `MixtralSparseMoeBlock`)."""
        probabilities = F.softmax(self.router(tokens), dim=-1)
        weights, chosen = probabilities.topk(self.top_k, dim=-1)
        if self.normalise:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, chosen

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(tokens)
        out = torch.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == index)  # token order: deterministic
            routed = expert(tokens[token]) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, routed)
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view_as(x)


MOE_BUILDERS: dict[str, type[nn.Module]] = {"moe_block": MoEBlock}
"""Builders of the mixture-of-experts spec kinds (`validator.models.build_layer_module`)."""
