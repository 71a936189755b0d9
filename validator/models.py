"""Torch modules built from the simulator's layer specs (`Layer.spec`, `simulator/zoo/README.md`).

`build_modules(workload)` returns one `nn.Module` per simulator layer, in order: module i takes
layer i's input (layer i-1's output) and returns layer i's output, so any contiguous range of
modules is a pipeline stage. Every module has exactly the parameters, GEMM shapes and output
shape the zoo counts (`tests/test_validator_models.py` checks all three layer by layer).

Choices:
* No dropout anywhere (the zoo does not model it); everything is deterministic on the CPU.
* BatchNorm runs in training mode like any `nn.BatchNorm2d`: its statistics come from the batch
  a module sees, so training on B/G samples per group is not bit-identical to full-batch
  training, and a batch of 1 sample fails on a 1x1 feature map (torch's own check).
* Attention is written out (Q K^T, scale, causal mask, softmax, P V) rather than with
  `scaled_dot_product_attention`, so its GEMMs are the zoo's `2 s^2 h` twice and it runs the
  same on every backend. GELU is the exact (erf) form.
* Transformer weights start as GPT-2 / BERT do: N(0, 0.02) for linear and embedding weights,
  zero biases; CNN / MLP modules keep torch's default initialisation.
* **Tied LM head.** The zoo ties the LM head (GPT) / MLM decoder (BERT) weight to the token
  embedding and counts those V x h parameters once, in the embedding layer. A head built here
  is a standalone layer (possibly on another pipeline stage), so it holds its *own copy* of the
  weight; `build_modules` initialises the copy equal to the embedding table, after which the
  two train independently (no gradient is shared between them). Such copies are listed in the
  module's `tied_parameter_names`, and `count_params` skips them so that it reproduces the
  simulator's `num_params`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from simulator.workload import Layer, Workload

TIED_ATTRIBUTE = "tied_parameter_names"
TRANSFORMER_INIT_STD = 0.02


# ----------------------------------------------------------------------------- CNN layers

class ConvBlock(nn.Sequential):
    """`conv_block`: conv -> [BN] -> [ReLU] -> [max pool]."""

    def __init__(self, spec: Mapping[str, Any]):
        layers: dict[str, nn.Module] = {
            "conv": nn.Conv2d(spec["in_channels"], spec["out_channels"], spec["kernel_size"],
                              stride=spec["stride"], padding=spec["padding"],
                              bias=bool(spec["bias"]))}
        if spec["batch_norm"]:
            layers["bn"] = nn.BatchNorm2d(spec["out_channels"])
        if spec["activation"] is not None:
            layers["relu"] = _activation(spec["activation"])
        pool = spec["pool"]
        if pool is not None:
            if pool["type"] != "max":
                raise ValueError(f"pool type {pool['type']!r} not supported")
            layers["pool"] = nn.MaxPool2d(pool["kernel_size"], pool["stride"], pool["padding"])
        super().__init__(OrderedDict(layers))


class FullyConnected(nn.Sequential):
    """`fc`: [adaptive avg pool] -> flatten -> Linear -> [ReLU]."""

    def __init__(self, spec: Mapping[str, Any]):
        layers: dict[str, nn.Module] = {}
        if spec.get("adaptive_avgpool") is not None:
            layers["avgpool"] = nn.AdaptiveAvgPool2d(tuple(spec["adaptive_avgpool"]))
        layers["flatten"] = nn.Flatten(1)
        layers["linear"] = nn.Linear(spec["in_features"], spec["out_features"],
                                     bias=bool(spec.get("bias", True)))
        if spec.get("activation") is not None:
            layers["relu"] = _activation(spec["activation"])
        super().__init__(OrderedDict(layers))


class ClassifierHead(nn.Sequential):
    """`classifier_head`: [BN -> ReLU] -> global average pool -> flatten -> Linear."""

    def __init__(self, spec: Mapping[str, Any]):
        layers: dict[str, nn.Module] = {}
        if spec["pre_activation"]:
            layers["bn"] = nn.BatchNorm2d(spec["in_channels"])
            layers["relu"] = nn.ReLU()
        layers["avgpool"] = nn.AdaptiveAvgPool2d(1)
        layers["flatten"] = nn.Flatten(1)
        layers["linear"] = nn.Linear(spec["in_channels"], spec["num_classes"])
        super().__init__(OrderedDict(layers))


class BasicBlock(nn.Module):
    """`basic_block`: conv3x3(stride)-BN-ReLU-conv3x3-BN + shortcut, ReLU (option-A padding)."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        cin, cout, stride = spec["in_channels"], spec["out_channels"], spec["stride"]
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = spec["shortcut"]
        if self.shortcut not in ("identity", "pad"):
            raise ValueError(f"basic_block shortcut {self.shortcut!r} not supported")
        if self.shortcut == "identity" and (stride != 1 or cin != cout):
            raise ValueError("identity shortcut needs stride 1 and in_channels == out_channels")
        if cout < cin:
            raise ValueError("pad shortcut needs out_channels >= in_channels")
        self.stride = stride
        self.pad_before = (cout - cin) // 2
        self.pad_after = cout - cin - self.pad_before

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.shortcut == "identity":
            skip = x
        else:
            skip = x[:, :, ::self.stride, ::self.stride]
            skip = F.pad(skip, (0, 0, 0, 0, self.pad_before, self.pad_after))
        return F.relu(out + skip)


class BottleneckBlock(nn.Module):
    """`bottleneck_block`, post-activation (ResNet v1.5) or pre-activation (ResNet-1001)."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        cin, mid, cout = spec["in_channels"], spec["mid_channels"], spec["out_channels"]
        stride, self.preact = spec["stride"], bool(spec["preact"])
        shortcut = spec["shortcut"]
        if shortcut not in ("identity", "conv"):
            raise ValueError(f"bottleneck_block shortcut {shortcut!r} not supported")
        if shortcut == "identity" and (stride != 1 or cin != cout):
            raise ValueError("identity shortcut needs stride 1 and in_channels == out_channels")
        self.bn1 = nn.BatchNorm2d(cin if self.preact else mid)
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(mid if self.preact else cout)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.projection = (nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
                           if shortcut == "conv" else None)
        self.projection_bn = (nn.BatchNorm2d(cout)
                              if shortcut == "conv" and not self.preact else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.preact:
            pre = F.relu(self.bn1(x))
            out = self.conv1(pre)
            out = self.conv2(F.relu(self.bn2(out)))
            out = self.conv3(F.relu(self.bn3(out)))
            skip = self.projection(pre) if self.projection is not None else x
            return out + skip
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        skip = x if self.projection is None else self.projection_bn(self.projection(x))
        return F.relu(out + skip)


# ----------------------------------------------------------------------------- transformer layers

class Embedding(nn.Module):
    """`embedding`: token + learned position [+ token type (ids all 0)], summed [-> LayerNorm].

    Takes int64 token ids [B, S] and returns [B, S, h]. Owns the token table that the LM head
    is tied to."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        vocab, hidden = spec["vocab_size"], spec["hidden_size"]
        self.max_positions = spec.get("max_positions") or spec["seq_len"]
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(self.max_positions, hidden)
        types = spec.get("token_types", 0)
        self.token_type = nn.Embedding(types, hidden) if types else None
        self.norm = nn.LayerNorm(hidden, eps=1e-12) if spec.get("layernorm") else None
        _init_transformer(self)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token(ids) + self.position(positions)
        if self.token_type is not None:
            x = x + self.token_type(torch.zeros_like(ids))
        return self.norm(x) if self.norm is not None else x


class TransformerBlock(nn.Module):
    """`transformer_block`: multi-head self-attention + GELU MLP, pre-LN (GPT) or post-LN (BERT)."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        hidden, heads = spec["hidden_size"], spec["num_heads"]
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} not divisible by num_heads {heads}")
        ffn = spec.get("ffn_hidden_size") or 4 * hidden
        if spec.get("activation", "gelu") != "gelu":
            raise ValueError(f"activation {spec['activation']!r} not supported")
        self.heads, self.causal = heads, bool(spec["causal"])
        self.pre_norm = spec["norm"] == "pre"
        if spec["norm"] not in ("pre", "post"):
            raise ValueError(f"norm {spec['norm']!r} not supported")
        eps = 1e-5 if self.pre_norm else 1e-12
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        _init_transformer(self)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        if self.causal:
            mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        context = scores.softmax(dim=-1) @ v
        return self.proj(context.transpose(1, 2).reshape(batch, seq, hidden))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attention(x))
        return self.ln2(x + self.mlp(x))


class LMHead(nn.Module):
    """`lm_head`: final LayerNorm -> Linear(hidden, vocab, no bias); `proj.weight` is the tied
    copy of the token embedding (not counted by `count_params`)."""

    tied_parameter_names = ("proj.weight",)

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        hidden, vocab = spec["hidden_size"], spec["vocab_size"]
        self.norm = nn.LayerNorm(hidden) if spec.get("final_norm", True) else nn.Identity()
        self.proj = nn.Linear(hidden, vocab, bias=bool(spec.get("bias", False)))
        if not spec.get("tied_embedding", True):
            self.tied_parameter_names = ()
        _init_transformer(self)

    @property
    def tied_weight(self) -> nn.Parameter:
        return self.proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class BertMLMHead(nn.Module):
    """`bert_mlm_head`: Linear(h, h) -> GELU -> LayerNorm -> Linear(h, vocab) with its own bias;
    `decoder.weight` is the tied copy of the token embedding (not counted by `count_params`)."""

    tied_parameter_names = ("decoder.weight",)

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        hidden, vocab = spec["hidden_size"], spec["vocab_size"]
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.decoder = nn.Linear(hidden, vocab)
        if not spec.get("tied_embedding", True):
            self.tied_parameter_names = ()
        _init_transformer(self)

    @property
    def tied_weight(self) -> nn.Parameter:
        return self.decoder.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(F.gelu(self.dense(x))))


BUILDERS: dict[str, type[nn.Module]] = {
    "conv_block": ConvBlock,
    "fc": FullyConnected,
    "classifier_head": ClassifierHead,
    "basic_block": BasicBlock,
    "bottleneck_block": BottleneckBlock,
    "embedding": Embedding,
    "transformer_block": TransformerBlock,
    "lm_head": LMHead,
    "bert_mlm_head": BertMLMHead,
}


# ----------------------------------------------------------------------------- helpers

def _activation(name: str) -> nn.Module:
    if name == "relu":
        return nn.ReLU()
    if name == "gelu":
        return nn.GELU()
    raise ValueError(f"activation {name!r} not supported")


def _init_transformer(module: nn.Module) -> None:
    """GPT-2 / BERT initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    for child in module.modules():
        if isinstance(child, (nn.Linear, nn.Embedding)):
            nn.init.normal_(child.weight, mean=0.0, std=TRANSFORMER_INIT_STD)
            if getattr(child, "bias", None) is not None:
                nn.init.zeros_(child.bias)


# ----------------------------------------------------------------------------- public API

def build_layer_module(layer: Layer) -> nn.Module:
    """The torch module of one simulator layer, from `layer.spec` (ValueError naming the layer
    if the spec is empty, of an unknown kind, or inconsistent)."""
    spec = layer.spec or {}
    kind = spec.get("kind")
    if not spec or kind is None:
        raise ValueError(f"layer {layer.name!r}: no spec; it can be simulated but not built "
                         f"as a torch module (layer tables carry no spec)")
    builder = BUILDERS.get(kind)
    if builder is None:
        raise ValueError(f"layer {layer.name!r}: unknown spec kind {kind!r}; "
                         f"known: {', '.join(sorted(BUILDERS))}")
    try:
        return builder(spec)
    except KeyError as error:
        raise ValueError(f"layer {layer.name!r}: spec of kind {kind!r} lacks {error}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"layer {layer.name!r}: bad {kind!r} spec: {error}") from None


def build_modules(workload: Workload, seed: int = 0) -> list[nn.Module]:
    """One module per layer (module i == layer i), initialised deterministically from `seed`.

    Seeds torch's global generator with `seed` and builds in order (the caller's generator
    state is restored afterwards). A tied head's own copy of the embedding weight is set equal
    to the (preceding) embedding layer's token table."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        modules = [build_layer_module(layer) for layer in workload.layers]
    embedding = None
    for module in modules:
        if isinstance(module, Embedding):
            embedding = module
        elif getattr(module, TIED_ATTRIBUTE, ()) and embedding is not None:
            weight = module.tied_weight
            if weight.shape == embedding.token.weight.shape:
                with torch.no_grad():
                    weight.copy_(embedding.token.weight)
    return modules


def _task(workload: Workload) -> str:
    spec = workload.input_spec or {}
    return spec.get("task") or ("causal_lm" if "vocab_size" in spec else "classification")


def make_batch(workload: Workload, batch_size: int,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic synthetic (inputs, targets) for `workload.input_spec`.

    * images `[C, H, W]`: float32 N(0, 1) `[B, C, H, W]`; MLP `[D]`: float32 `[B, D]`;
      targets: class ids `[B]` in `[0, num_classes)`.
    * tokens (`vocab_size` given): int64 ids `[B, S]`, targets the next tokens `[B, S]` (one
      sequence of S + 1 tokens, shifted by one); also for `masked_lm`, which only needs some
      token targets to train on.
    Uses a private generator: the global RNG is untouched."""
    spec = workload.input_spec or {}
    if "shape" not in spec:
        raise ValueError(f"workload {workload.name!r}: input_spec has no 'shape'; "
                         f"cannot make a batch")
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    generator = torch.Generator().manual_seed(seed)
    shape = [int(d) for d in spec["shape"]]
    if _task(workload) in ("causal_lm", "masked_lm"):
        (seq,) = shape
        tokens = torch.randint(0, int(spec["vocab_size"]), (batch_size, seq + 1),
                               generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if "num_classes" not in spec:
        raise ValueError(f"workload {workload.name!r}: input_spec has no 'num_classes'")
    inputs = torch.randn(batch_size, *shape, generator=generator, dtype=torch.float32)
    targets = torch.randint(0, int(spec["num_classes"]), (batch_size,), generator=generator)
    return inputs, targets


def loss_fn(workload: Workload, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy: over samples for classification, over all B x S tokens for LMs."""
    if _task(workload) in ("causal_lm", "masked_lm"):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def count_params(modules: nn.Module | Iterable[nn.Module]) -> int:
    """Parameters of `modules` (one module or several) under the simulator's convention: each
    parameter once, tied copies (`tied_parameter_names`) not at all."""
    if isinstance(modules, nn.Module):
        modules = [modules]
    seen: set[int] = set()
    total = 0
    for module in modules:
        skipped = set()
        for owner_name, owner in module.named_modules():
            for tied in getattr(owner, TIED_ATTRIBUTE, ()):
                skipped.add(f"{owner_name}.{tied}" if owner_name else tied)
        for name, parameter in module.named_parameters(remove_duplicate=False):
            if name in skipped or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            total += parameter.numel()
    return total


__all__ = ["BUILDERS", "build_layer_module", "build_modules", "count_params", "loss_fn",
           "make_batch"]
