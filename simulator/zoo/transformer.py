"""Transformer family: generic decoder-only GPT, GPT-2 / GPT-3 presets and BERT-Large.

Layer granularity: the embedding (token + position [+ token type, LayerNorm]) is one layer, every
transformer block is one layer, the final LayerNorm + LM head (GPT) or the MLM head (BERT) is one
layer.  The LM head / MLM decoder weight is tied to the token embedding: its V*h parameters are
counted once, in the embedding layer, while the head still counts the 2*s*h*V projection FLOPs.

Per block (s = seq_len, h = hidden, a = heads, f = ffn hidden = 4h), forward FLOPs:
QKV 6sh^2 + out-proj 2sh^2 + scores 2s^2h + context 2s^2h + MLP 4shf (= 16sh^2), i.e.
24sh^2 + 4s^2h (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters using Megatron-LM", eq. for 24Bslh^2(1 + s/6h) per layer), plus the elementwise terms
of ``_ops.py`` (2 LayerNorms, GELU, softmax, 2 residual adds).  The full s x s score matrix is
counted also for causal models (as the GEMMs run it), and GPT-3's alternating locally banded
sparse attention is modelled as dense.  Parameters per block: 12h^2 + 13h (f = 4h).
Saved per block: 16sh + a*s^2 elements (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", 34sbh + 5as^2b bytes without the dropout masks and
in elements); pre- and post-LN blocks have identical totals. The memory model counts the dropout
masks and output too (`simulator.memory_activations`).
Attention mask (GPT): causal by default; `sliding_window` W > 0 (Mistral-style, Jiang et al. 2023,
sec. 2) lets each query attend to min(s, W) keys: the core's FLOPs are 4skh + 5ask and its
softmax output a*s*k with k = min(s, W) (spec key "sliding_window").
"""

from __future__ import annotations

from typing import Any

from simulator.workload import Layer, Workload
from simulator.zoo._ops import DimensionError, Tally, keyword_signature, require_positive


def _check_config(num_layers: int, hidden_size: int, num_heads: int, seq_len: int,
                  vocab_size: int, max_positions: int) -> None:
    require_positive(num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads, seq_len=seq_len,
                     vocab_size=vocab_size)
    if hidden_size % num_heads:
        raise DimensionError("{hidden_size} not divisible by {num_heads}", hidden_size=hidden_size, num_heads=num_heads)
    if max_positions < seq_len:
        raise DimensionError("{max_positions} < {seq_len}", max_positions=max_positions, seq_len=seq_len)


def check_sliding_window(sliding_window) -> None:
    """0 (no window: the causal mask) or a positive number of keys."""
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 0:
        raise ValueError(f"sliding_window {sliding_window!r}: expected a positive number of keys (0: causal, "
                         "no window)")


def _dropout_spec(dropout: float | None) -> dict:
    """The spec's "dropout" key: absent (None) leaves Megatron-LM's default to the kernel and
    memory models (`simulator.kernel_ops.DEFAULT_DROPOUT`); 0 means no dropout kernels or masks."""
    if dropout is None:
        return {}
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout {dropout} must be in [0, 1)")
    return {"dropout": float(dropout)}


def embedding_layer(name: str, vocab: int, hidden: int, seq: int, max_positions: int, *,
                    token_types: int = 0, layernorm: bool = False, dropout: float | None = None) -> Layer:
    """Token + learned position [+ token-type] embeddings, summed [-> LayerNorm]."""
    t = Tally()
    t.embedding(vocab, hidden, seq)
    t.embedding(max_positions, hidden, seq, save_ids=False)  # positions are implicit
    t.add(seq * hidden)
    if token_types:
        t.embedding(token_types, hidden, seq)
        t.add(seq * hidden)
    if layernorm:
        t.norm(hidden, seq * hidden)
    spec = {"kind": "embedding", "vocab_size": vocab, "hidden_size": hidden, "seq_len": seq,
            "max_positions": max_positions, "token_types": token_types, "layernorm": layernorm,
            **_dropout_spec(dropout)}
    return t.layer(name, "embedding", seq, seq * hidden, spec)


def transformer_block(name: str, hidden: int, heads: int, seq: int, ffn: int, *,
                      causal: bool, pre_norm: bool, sliding_window: int = 0,
                      dropout: float | None = None) -> Layer:
    """Multi-head self-attention + GELU MLP with two LayerNorms and two residuals (biases on);
    `sliding_window` W > 0: each query attends to min(seq, W) keys (module docstring)."""
    t = Tally()
    elems = seq * hidden
    t.norm(hidden, elems)  # pre-LN: LN1 (saves the block input); post-LN: LN after attention
    t.linear(hidden, 3 * hidden, tokens=seq)
    t.attention_core(seq, hidden, heads, keys=sliding_window or None)
    t.linear(hidden, hidden, tokens=seq)
    t.add(elems)
    t.norm(hidden, elems)
    t.linear(hidden, ffn, tokens=seq)
    t.gelu(seq * ffn)
    t.linear(ffn, hidden, tokens=seq)
    t.add(elems)
    spec = {"kind": "transformer_block", "hidden_size": hidden, "num_heads": heads,
            "seq_len": seq, "ffn_hidden_size": ffn, "causal": causal,
            "norm": "pre" if pre_norm else "post", "activation": "gelu",
            **({"sliding_window": sliding_window} if sliding_window else {}), **_dropout_spec(dropout)}
    return t.layer(name, "attention", elems, elems, spec)


def lm_head(name: str, hidden: int, vocab: int, seq: int) -> Layer:
    """Final LayerNorm + bias-free vocabulary projection tied to the token embedding."""
    t = Tally()
    t.norm(hidden, seq * hidden)
    t.linear(hidden, vocab, tokens=seq, bias=False, tied=True)
    spec = {"kind": "lm_head", "hidden_size": hidden, "vocab_size": vocab, "seq_len": seq,
            "final_norm": True, "bias": False, "tied_embedding": True}
    return t.layer(name, "linear", seq * hidden, seq * vocab, spec)


def bert_mlm_head(name: str, hidden: int, vocab: int, seq: int) -> Layer:
    """BERT MLM head on every position: dense-GELU-LayerNorm, tied decoder with its own bias."""
    t = Tally()
    t.linear(hidden, hidden, tokens=seq)
    t.gelu(seq * hidden)
    t.norm(hidden, seq * hidden)
    t.linear(hidden, vocab, tokens=seq, bias=True, tied=True)
    spec = {"kind": "bert_mlm_head", "hidden_size": hidden, "vocab_size": vocab, "seq_len": seq,
            "tied_embedding": True}
    return t.layer(name, "linear", seq * hidden, seq * vocab, spec)


def _gpt(name: str, *, num_layers: int = 12, hidden_size: int = 768, num_heads: int = 12,
         seq_len: int = 1024, vocab_size: int = 50257, ffn_hidden_size: int | None = None,
         max_positions: int | None = None, sliding_window: int = 0, dropout: float | None = None) -> Workload:
    ffn = ffn_hidden_size or 4 * hidden_size
    max_positions = max_positions or seq_len
    _check_config(num_layers, hidden_size, num_heads, seq_len, vocab_size, max_positions)
    check_sliding_window(sliding_window)
    layers = [embedding_layer("embedding", vocab_size, hidden_size, seq_len, max_positions, dropout=dropout)]
    layers += [transformer_block(f"block{i}", hidden_size, num_heads, seq_len, ffn, causal=True,
                                 pre_norm=True, sliding_window=sliding_window, dropout=dropout)
               for i in range(num_layers)]
    layers.append(lm_head("head", hidden_size, vocab_size, seq_len))
    input_spec = {"shape": [seq_len], "vocab_size": vocab_size, "task": "causal_lm"}
    return Workload(name, tuple(layers), input_spec)


def _bert(name: str, *, num_layers: int = 24, hidden_size: int = 1024, num_heads: int = 16,
          seq_len: int = 512, vocab_size: int = 30522, ffn_hidden_size: int | None = None,
          max_positions: int | None = None, dropout: float | None = None) -> Workload:
    ffn = ffn_hidden_size or 4 * hidden_size
    max_positions = max_positions or seq_len
    _check_config(num_layers, hidden_size, num_heads, seq_len, vocab_size, max_positions)
    layers = [embedding_layer("embedding", vocab_size, hidden_size, seq_len, max_positions,
                              token_types=2, layernorm=True, dropout=dropout)]
    layers += [transformer_block(f"block{i}", hidden_size, num_heads, seq_len, ffn,
                                 causal=False, pre_norm=False, dropout=dropout) for i in range(num_layers)]
    layers.append(bert_mlm_head("head", hidden_size, vocab_size, seq_len))
    input_spec = {"shape": [seq_len], "vocab_size": vocab_size, "task": "masked_lm"}
    return Workload(name, tuple(layers), input_spec)


def transformer(**config: Any) -> Workload:
    """Generic decoder-only GPT (pre-LN, learned positions, tied LM head, FFN = 4h).

    Parameters: num_layers, hidden_size, num_heads, seq_len, vocab_size (defaults: GPT-2 small),
    optional ffn_hidden_size (default 4*hidden_size), max_positions (default seq_len),
    sliding_window (default 0: causal; W > 0: each query attends to min(seq_len, W) keys) and
    dropout (default: Megatron-LM's 0.1 on hidden states and attention probabilities; 0: none, as
    most LLM pre-training runs today)."""
    return _gpt("transformer", **config)


GPT2_SMALL = {"num_layers": 12, "hidden_size": 768, "num_heads": 12, "seq_len": 1024,
              "vocab_size": 50257}
GPT2_XL = {"num_layers": 48, "hidden_size": 1600, "num_heads": 25, "seq_len": 1024,
           "vocab_size": 50257}
GPT3_175B = {"num_layers": 96, "hidden_size": 12288, "num_heads": 96, "seq_len": 2048,
             "vocab_size": 50257}
BERT_LARGE = {"num_layers": 24, "hidden_size": 1024, "num_heads": 16, "seq_len": 512,
              "vocab_size": 30522}


def gpt2_small(**overrides: Any) -> Workload:
    """GPT-2 small (Radford et al. 2019): 124,439,808 parameters (published 124M)."""
    return _gpt("gpt2-small", **{**GPT2_SMALL, **overrides})


def gpt2_1_5b(**overrides: Any) -> Workload:
    """GPT-2 1.5B / XL: 1,557,611,200 parameters (published 1.558B)."""
    return _gpt("gpt2-1.5b", **{**GPT2_XL, **overrides})


def gpt3_175b(**overrides: Any) -> Workload:
    """GPT-3 175B (Brown et al. 2020, dense attention assumed): 174.6B parameters counted."""
    return _gpt("gpt3-175b", **{**GPT3_175B, **overrides})


def bert_large(**overrides: Any) -> Workload:
    """BERT-Large (Devlin et al. 2019) with the MLM pre-training head, no pooler / NSP head.

    Counts word + position (512) + token-type (2) embeddings and their LayerNorm, 24 post-LN
    encoder blocks and the MLM head (dense 1024x1024 + LayerNorm + 30522 decoder bias; decoder
    weight tied): 335,174,458 parameters = Hugging Face ``BertForMaskedLM`` (bert-large-uncased).
    ``BertModel`` (pooler instead of MLM head) is 335,141,888; the paper rounds to 340M."""
    return _bert("bert-large", **{**BERT_LARGE, **overrides})


# the keywords these factories forward, with their defaults (`model.params` are checked against them)
transformer.__signature__ = keyword_signature(_gpt, {})  # type: ignore[attr-defined]
gpt2_small.__signature__ = keyword_signature(_gpt, GPT2_SMALL)  # type: ignore[attr-defined]
gpt2_1_5b.__signature__ = keyword_signature(_gpt, GPT2_XL)  # type: ignore[attr-defined]
gpt3_175b.__signature__ = keyword_signature(_gpt, GPT3_175B)  # type: ignore[attr-defined]
bert_large.__signature__ = keyword_signature(_bert, BERT_LARGE)  # type: ignore[attr-defined]
