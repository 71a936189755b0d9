"""The attention core (Q K^T, scale, mask, softmax, P V) written out for the validator's blocks.

Written with plain matmuls rather than `scaled_dot_product_attention`, so that its GEMMs are the
zoo's (`simulator.zoo._ops.Tally.attention_core`: 2 s k h for Q K^T and for P V, softmax 5 a s k,
k keys per query) under `validator.layers_flops.ForwardFlopCounter`, and it runs the same on
every backend.

* Grouped-query attention (Ainslie et al. 2023, "GQA"): `a` query heads share `g` key / value
  heads, query head i reading kv head i // (a / g) (Hugging Face `repeat_kv`). The queries of a
  group are stacked along the sequence axis ([B, g, (a/g) s, d]) so that K and V are never copied
  per query head: autograd keeps Q, K and V once, as the zoo counts.
* Causal mask: query i sees keys j <= i; the full s x s scores are computed and masked, as the
  zoo counts (k = s also when causal).
* Sliding window W (Mistral 7B, Jiang et al. 2023, sec. 2; Hugging Face: key j visible to query i
  iff i - W < j <= i): for W < s each query's W keys are gathered as a band ([B, g, s, W, d]
  after left-padding W - 1 zero keys, masked), so the GEMMs and the softmax cover s x W
  entries, the zoo's k = min(s, W). The band copies K and V W times: meant for the small
  validation models, not for long sequences.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F


def causal_mask(seq: int, device: torch.device) -> torch.Tensor:
    """True where query i must not see key j (j > i)."""
    return torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)


def _grouped(q: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, a, s, d] -> [B, g, (a/g) s, d]: the query heads of one kv head stacked along s."""
    batch, heads, seq, dim = q.shape
    return q.reshape(batch, groups, (heads // groups) * seq, dim)


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """q [B, a, s, d], k and v [B, g, s, d] -> context [B, a, s, d] over all s keys."""
    batch, heads, seq, dim = q.shape
    groups = k.shape[1]
    scores = (_grouped(q, groups) @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dim))
    if causal:
        mask = causal_mask(seq, q.device).repeat(heads // groups, 1)
        scores = scores.masked_fill(mask, float("-inf"))
    context = scores.softmax(dim=-1) @ v
    return context.reshape(batch, heads, seq, dim)


def _band(t: torch.Tensor, window: int) -> torch.Tensor:
    """[B, g, s, d] -> [B, g, s, W, d]: for query i the keys i - W + 1 .. i (zeros before 0)."""
    padded = F.pad(t, (0, 0, window - 1, 0))
    return padded.unfold(2, window, 1).transpose(-2, -1)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Sliding-window causal attention, W < s keys per query (module docstring)."""
    batch, heads, seq, dim = q.shape
    groups, ratio = k.shape[1], heads // k.shape[1]
    queries = q.reshape(batch, groups, ratio, seq, dim).transpose(2, 3)  # [B, g, s, a/g, d]
    scores = (queries @ _band(k, window).transpose(-2, -1)) * (1.0 / math.sqrt(dim))  # [B, g, s, a/g, W]
    # band slot w of query i holds key i - (W - 1 - w): padding where that is negative
    padding = torch.arange(seq, device=q.device)[:, None] < (window - 1 - torch.arange(window, device=q.device))
    scores = scores.masked_fill(padding[:, None, :], float("-inf"))
    context = scores.softmax(dim=-1) @ _band(v, window)  # [B, g, s, a/g, d]
    return context.transpose(2, 3).reshape(batch, heads, seq, dim)


_FUSED = [False]


@contextlib.contextmanager
def fused_attention(enabled: bool = True):
    """Inside the block, `attention` over all keys runs as torch's `scaled_dot_product_attention`
    (one fused kernel per pass, flash attention on CUDA: what `costs.flash_attention: true`
    prices) instead of the written-out matmuls; sliding windows keep the band."""
    before, _FUSED[0] = _FUSED[0], enabled
    try:
        yield
    finally:
        _FUSED[0] = before


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              window: int = 0) -> torch.Tensor:
    """Scaled dot-product attention; `window` W > 0 (causal) limits each query to W keys."""
    if window and window < q.shape[2]:
        if not causal:
            raise ValueError(f"sliding_window {window} needs a causal block")
        return window_attention(q, k, v, window)
    if _FUSED[0]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return full_attention(q, k, v, causal)
