"""Layer kinds and recurrent FLOPs of `validator.import_model` rows.

`layer_kind` picks a row's kind from the modules it contains, in this order: `conv`, `attention`,
`linear` (an `nn.Linear`, or a recurrent layer: below), `embedding`, `norm`, `pool`, `elementwise`
(`simulator.scenario.LayerKind` has no recurrent kind).

**Recurrent layers** (`nn.LSTM`, `nn.GRU`, `nn.RNN` and their `...Cell`s) are GEMMs over time, so
their rows are `linear`, and their FLOPs are the closed form instead of what the trace counts (the
trace sees whatever torch decomposes them into; a fused kernel would be counted 0). Per token, per
layer and per direction: gates x (input + hidden) x hidden x 2 FLOPs (a multiply-add is 2), where
the gates are the products of the cell equations of the `torch.nn.LSTM` / `GRU` / `RNN` docs: 4 for
LSTM (i, f, g, o: Hochreiter & Schmidhuber 1997), 3 for GRU (r, z, n: Cho et al. 2014), 1 for an
Elman RNN. Each gate is W_i x + W_h h: input x hidden + hidden x hidden multiply-adds. A layer after
the first reads num_directions x hidden inputs. An LSTM with `proj_size` p (Sak et al. 2014) feeds
back p instead of hidden and adds the projection's p x hidden x 2. Biases, gate nonlinearities and
the cell's elementwise updates are not counted (small beside the GEMMs). Tokens: the elements of the
input (or of a `PackedSequence`'s data) / input_size, for one sample. Tensor parallelism splits a
`linear` row by its rule (`simulator.strategies.tensor_layers`); the all-gather of the hidden state
a split recurrence needs at every step is not modelled.
"""

from __future__ import annotations

import torch
from torch import nn

_GATES = ((nn.LSTM, 4), (nn.LSTMCell, 4), (nn.GRU, 3), (nn.GRUCell, 3), (nn.RNN, 1), (nn.RNNCell, 1))
_RECURRENT = tuple(cls for cls, _ in _GATES)
_SWALLOWED = "recurrent-closed-form"  # the counter's bucket while a recurrent module runs: discarded


def layer_kind(module: nn.Module) -> str:
    """The simulator kind of a row whose child is `module` (module docstring)."""
    modules = list(module.modules())
    if any(isinstance(m, nn.modules.conv._ConvNd) for m in modules):
        return "conv"
    if any(isinstance(m, nn.MultiheadAttention) or "Attention" in type(m).__name__ for m in modules):
        return "attention"
    if any(isinstance(m, (nn.Linear, *_RECURRENT)) for m in modules):
        return "linear"
    if any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in modules):
        return "embedding"
    norms = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm)
    if hasattr(nn, "RMSNorm"):
        norms = (*norms, nn.RMSNorm)
    if any(isinstance(m, norms) for m in modules):
        return "norm"
    pools = (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
             nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd)
    return "pool" if any(isinstance(m, pools) for m in modules) else "elementwise"


def recurrent_flops(module: nn.Module, args, kwargs) -> int | None:
    """Closed-form forward FLOPs of one call of a recurrent `module` (module docstring); None when
    `module` is not one or its input is neither a tensor nor a PackedSequence."""
    gates = next((count for cls, count in _GATES if isinstance(module, cls)), None)
    data = args[0] if args else kwargs.get("input")
    data = data.data if isinstance(data, nn.utils.rnn.PackedSequence) else data
    if gates is None or not isinstance(data, torch.Tensor):
        return None
    tokens, hidden = data.numel() // module.input_size, module.hidden_size
    if isinstance(module, nn.RNNCellBase):
        return tokens * gates * (module.input_size + hidden) * hidden * 2
    directions = 2 if module.bidirectional else 1
    fed_back = module.proj_size or hidden
    per_token = 0
    for layer in range(module.num_layers):
        inputs = module.input_size if layer == 0 else directions * fed_back
        projection = fed_back * hidden if module.proj_size else 0
        per_token += directions * 2 * (gates * (inputs + fed_back) * hidden + projection)
    return tokens * per_token


def count_recurrent_in_closed_form(model: nn.Module, counter) -> list:
    """Hooks on every recurrent module of `model` that replace what `counter` (a ForwardFlopCounter)
    counts during its calls by `recurrent_flops`, in the bucket the call runs in. Register them after
    the rows' hooks; returns the handles."""
    saved: list[tuple] = []

    def before(module, args, kwargs):
        flops = recurrent_flops(module, args, kwargs)
        saved.append((counter.bucket, flops))
        if flops is not None:
            counter.bucket = _SWALLOWED

    def after(module, args, kwargs, output):
        bucket, flops = saved.pop()
        if flops is not None:
            counter.bucket = bucket
            counter.gemm_by_bucket[bucket] += flops

    handles = []
    for module in model.modules():
        if isinstance(module, _RECURRENT):
            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(module.register_forward_hook(after, with_kwargs=True))
    return handles
