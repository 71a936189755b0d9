"""LLaMA family: decoder-only transformers with RMSNorm, rotary positions, grouped-query attention,
a SwiGLU MLP, bias-free linears and untied input / output embeddings.

Sources: Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models" and "Llama 2:
Open Foundation and Fine-Tuned Chat Models"; Llama Team 2024, "The Llama 3 Herd of Models"
(Table 3: 8B / 70B / 405B); RMSNorm: Zhang & Sennrich 2019; rotary embeddings: Su et al. 2021,
"RoFormer"; SwiGLU: Shazeer 2020, "GLU Variants Improve Transformer"; grouped-query attention:
Ainslie et al. 2023, "GQA" (num_kv_heads = 1 is multi-query attention, = num_heads plain MHA).

Layers as for GPT (`simulator.zoo.transformer`): the token embedding (no position table: rotary
acts inside attention), one layer per block, the final RMSNorm + LM head. The head owns its own
V x h weight unless `tie_embeddings`. Per block (s tokens, h hidden, a heads, g kv heads,
d = h / a, f = ffn hidden), forward FLOPs: Q 2sh^2, K and V 4shgd, out-proj 2sh^2, gate + up
4shf, down 2shf, the attention core 4s^2h, and the elementwise terms of `_ops.py` (2 RMSNorms,
rotary on Q and K, silu-mul on s f, softmax, 2 residual adds). Parameters: 2h^2 + 2hgd + 3hf + 2h (+ h + 2gd with `qkv_bias`).
Saved: 6sh + 2sgd (inputs of RMSNorm, QKV, the core's Q, K, V, out-proj, RMSNorm, gate/up)
+ 3sf (silu-mul inputs, down input) + a s^2 (softmax output).
Attention mask: causal by default; `sliding_window` W > 0 (Mistral 7B, Jiang et al. 2023, sec. 2)
lets each query attend to min(s, W) keys: the core's FLOPs 4skh + 5ask and its softmax output
a s k with k = min(s, W) (spec key "sliding_window"; a Hugging Face config's `sliding_window`).
"""

from __future__ import annotations

from typing import Any

from simulator.workload import Layer, Workload
from simulator.zoo._ops import DimensionError, Tally, require_positive
from simulator.zoo.transformer import check_sliding_window


def default_ffn_hidden_size(hidden: int, multiple_of: int = 256) -> int:
    """Meta's rule (llama/model.py): 2/3 of 4h, rounded up to a multiple of `multiple_of`."""
    ffn = int(2 * 4 * hidden / 3)
    return multiple_of * ((ffn + multiple_of - 1) // multiple_of)


def llama_embedding(name: str, vocab: int, hidden: int, seq: int, max_positions: int) -> Layer:
    """Token embedding only (rotary positions have no table); no dropout."""
    t = Tally()
    t.embedding(vocab, hidden, seq)
    spec = {"kind": "embedding", "vocab_size": vocab, "hidden_size": hidden, "seq_len": seq,
            "max_positions": max_positions, "token_types": 0, "layernorm": False,
            "position_embedding": "rotary", "dropout": 0.0}
    return t.layer(name, "embedding", seq, seq * hidden, spec)


def attention_half(hidden: int, heads: int, kv_heads: int, seq: int, sliding_window: int = 0,
                   qkv_bias: bool = False) -> Tally:
    """The tally of a pre-RMSNorm decoder block up to its MLP input: RMSNorm, fused QKV projection
    (GQA: kv_heads key-value heads; with biases if `qkv_bias`, as Qwen2's), rotary Q / K, attention
    core over min(seq, W) keys, output projection, residual add, the MLP's RMSNorm (shared by
    `llama_block` and the MoE block)."""
    t = Tally()
    elems, kv_hidden = seq * hidden, kv_heads * (hidden // heads)
    t.rms_norm(hidden, elems)
    t.linear(hidden, hidden + 2 * kv_hidden, tokens=seq, bias=qkv_bias)
    t.rotary(seq * (hidden + kv_hidden))
    t.attention_core(seq, hidden, heads, kv_hidden, keys=sliding_window or None)
    t.linear(hidden, hidden, tokens=seq, bias=False)
    t.add(elems)
    t.rms_norm(hidden, elems)
    return t


def llama_block(name: str, hidden: int, heads: int, kv_heads: int, seq: int, ffn: int,
                sliding_window: int = 0, qkv_bias: bool = False) -> Layer:
    """Pre-RMSNorm block: GQA self-attention with rotary Q / K, then a SwiGLU MLP; no biases but
    the QKV projection's with `qkv_bias`; `sliding_window` W > 0: each query attends to min(seq, W) keys."""
    t = attention_half(hidden, heads, kv_heads, seq, sliding_window, qkv_bias)
    elems = seq * hidden
    t.linear(hidden, 2 * ffn, tokens=seq, bias=False)
    t.swiglu(seq * ffn)
    t.linear(ffn, hidden, tokens=seq, bias=False)
    t.add(elems)
    spec = {"kind": "transformer_block", "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": kv_heads, "seq_len": seq, "ffn_hidden_size": ffn, "causal": True,
            "norm": "pre", "norm_type": "rmsnorm", "activation": "swiglu",
            "position_embedding": "rotary", "bias": False, "dropout": 0.0,
            **({"sliding_window": sliding_window} if sliding_window else {}),
            **({"qkv_bias": True} if qkv_bias else {})}
    return t.layer(name, "attention", elems, elems, spec)


def llama_head(name: str, hidden: int, vocab: int, seq: int, *, tied: bool) -> Layer:
    """Final RMSNorm + bias-free vocabulary projection (its own weight unless `tied`)."""
    t = Tally()
    t.rms_norm(hidden, seq * hidden)
    t.linear(hidden, vocab, tokens=seq, bias=False, tied=tied)
    spec = {"kind": "lm_head", "hidden_size": hidden, "vocab_size": vocab, "seq_len": seq,
            "final_norm": True, "norm_type": "rmsnorm", "bias": False, "tied_embedding": tied}
    return t.layer(name, "linear", seq * hidden, seq * vocab, spec)


def _check(num_layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int,
           vocab: int, max_positions: int) -> None:
    require_positive(num_layers=num_layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                     ffn_hidden_size=ffn, seq_len=seq, vocab_size=vocab)
    if hidden % heads:
        raise DimensionError("{hidden_size} not divisible by {num_heads}", hidden_size=hidden, num_heads=heads)
    if heads % kv_heads:
        raise DimensionError("{num_heads} not divisible by {num_kv_heads}", num_heads=heads, num_kv_heads=kv_heads)
    if max_positions < seq:
        raise DimensionError("{max_positions} < {seq_len}", max_positions=max_positions, seq_len=seq)


def llama_workload(name: str, *, num_layers: int = 32, hidden_size: int = 4096, num_heads: int = 32,
           num_kv_heads: int = 0, ffn_hidden_size: int = 0, seq_len: int = 4096,
           vocab_size: int = 32000, max_positions: int = 0,
           tie_embeddings: bool = False, sliding_window: int = 0, qkv_bias: bool = False) -> Workload:
    """A LLaMA-style Workload called `name` (parameters as `llama`)."""
    kv = num_kv_heads or num_heads
    ffn = ffn_hidden_size or default_ffn_hidden_size(hidden_size)
    max_positions = max_positions or seq_len
    _check(num_layers, hidden_size, num_heads, kv, ffn, seq_len, vocab_size, max_positions)
    check_sliding_window(sliding_window)
    layers = [llama_embedding("embedding", vocab_size, hidden_size, seq_len, max_positions)]
    layers += [llama_block(f"block{i}", hidden_size, num_heads, kv, seq_len, ffn, sliding_window, bool(qkv_bias))
               for i in range(num_layers)]
    layers.append(llama_head("head", hidden_size, vocab_size, seq_len, tied=bool(tie_embeddings)))
    input_spec = {"shape": [seq_len], "vocab_size": vocab_size, "task": "causal_lm"}
    return Workload(name, tuple(layers), input_spec)


def llama(*, num_layers: int = 32, hidden_size: int = 4096, num_heads: int = 32,
          num_kv_heads: int = 0, ffn_hidden_size: int = 0, seq_len: int = 4096,
          vocab_size: int = 32000, max_positions: int = 0, tie_embeddings: bool = False,
          sliding_window: int = 0, qkv_bias: bool = False) -> Workload:
    """Generic LLaMA-style decoder (defaults: LLaMA-2 7B). num_kv_heads 0 = num_heads (MHA);
    ffn_hidden_size 0 = `default_ffn_hidden_size`; max_positions 0 = seq_len; sliding_window
    0 = causal, W > 0 = each query attends to min(seq_len, W) keys (Mistral-style); qkv_bias:
    biases on the Q, K and V projections (Qwen2: Yang et al. 2024, "Qwen2 Technical Report")."""
    return llama_workload("llama", num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, ffn_hidden_size=ffn_hidden_size, seq_len=seq_len,
                  vocab_size=vocab_size, max_positions=max_positions, tie_embeddings=tie_embeddings,
                  sliding_window=sliding_window, qkv_bias=qkv_bias)


PRESETS: dict[str, dict[str, int]] = {
    # Llama 2 (Touvron et al. 2023, Table 1; HF meta-llama/Llama-2-*-hf config.json)
    "llama2-7b": {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 32,
                  "ffn_hidden_size": 11008, "vocab_size": 32000, "seq_len": 4096},
    "llama2-13b": {"num_layers": 40, "hidden_size": 5120, "num_heads": 40, "num_kv_heads": 40,
                   "ffn_hidden_size": 13824, "vocab_size": 32000, "seq_len": 4096},
    "llama2-70b": {"num_layers": 80, "hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8,
                   "ffn_hidden_size": 28672, "vocab_size": 32000, "seq_len": 4096},
    # Llama 3 (Llama Team 2024, Table 3; HF meta-llama/Meta-Llama-3-*, Llama-3.1-405B)
    "llama3-8b": {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8,
                  "ffn_hidden_size": 14336, "vocab_size": 128256, "seq_len": 8192},
    "llama3-70b": {"num_layers": 80, "hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8,
                   "ffn_hidden_size": 28672, "vocab_size": 128256, "seq_len": 8192},
    "llama3-405b": {"num_layers": 126, "hidden_size": 16384, "num_heads": 128, "num_kv_heads": 8,
                    "ffn_hidden_size": 53248, "vocab_size": 128256, "seq_len": 8192},
}
"""Published parameter counts: 6.74B, 13.0B, 69.0B (Llama 2); 8.03B, 70.6B, 405.9B (Llama 3)."""


def _preset(name: str):
    base = PRESETS[name]

    def factory(*, num_layers: int = base["num_layers"], hidden_size: int = base["hidden_size"],
                num_heads: int = base["num_heads"], num_kv_heads: int = base["num_kv_heads"],
                ffn_hidden_size: int = base["ffn_hidden_size"], seq_len: int = base["seq_len"],
                vocab_size: int = base["vocab_size"], max_positions: int = 0,
                tie_embeddings: bool = False, sliding_window: int = 0) -> Workload:
        return llama_workload(name, num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
                      num_kv_heads=num_kv_heads, ffn_hidden_size=ffn_hidden_size, seq_len=seq_len,
                      vocab_size=vocab_size, max_positions=max_positions,
                      tie_embeddings=tie_embeddings, sliding_window=sliding_window)

    factory.__name__ = name.replace("-", "_")
    factory.__doc__ = f"{name} (`PRESETS`), any dimension overridable by keyword."
    return factory


LLAMA_MODELS: dict[str, Any] = {"llama": llama, **{name: _preset(name) for name in PRESETS}}
