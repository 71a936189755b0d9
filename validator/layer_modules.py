"""One torch module class per `Layer.spec` kind (`BUILDERS`), with the zoo's exact parameters and
GEMM shapes; the conventions (initialisation, tied heads, no dropout) are in `validator.models`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from validator.attention_core import attention


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
        init_transformer(self)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token(ids) + self.position(positions)
        if self.token_type is not None:
            x = x + self.token_type(torch.zeros_like(ids))
        return self.norm(x) if self.norm is not None else x


class TransformerBlock(nn.Module):
    """`transformer_block`: multi-head self-attention + GELU MLP, pre-LN (GPT) or post-LN (BERT);
    `sliding_window` W > 0 (causal only): each query sees its last W keys."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        hidden, heads = spec["hidden_size"], spec["num_heads"]
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} not divisible by num_heads {heads}")
        ffn = spec.get("ffn_hidden_size") or 4 * hidden
        if spec.get("activation", "gelu") != "gelu":
            raise ValueError(f"activation {spec['activation']!r} not supported")
        self.heads, self.causal = heads, bool(spec["causal"])
        self.window = int(spec.get("sliding_window") or 0)
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
        init_transformer(self)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        context = attention(q, k, v, causal=self.causal, window=self.window)
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
    tied_by_default = True

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        hidden, vocab = spec["hidden_size"], spec["vocab_size"]
        self.norm = self.final_norm(spec) if spec.get("final_norm", True) else nn.Identity()
        self.proj = nn.Linear(hidden, vocab, bias=bool(spec.get("bias", False)))
        if not spec.get("tied_embedding", self.tied_by_default):
            self.tied_parameter_names = ()
        init_transformer(self)

    @staticmethod
    def final_norm(spec: Mapping[str, Any]) -> nn.Module:
        return nn.LayerNorm(spec["hidden_size"])

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
        init_transformer(self)

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


def init_transformer(module: nn.Module) -> None:
    """GPT-2 / BERT initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    for child in module.modules():
        if isinstance(child, (nn.Linear, nn.Embedding)):
            nn.init.normal_(child.weight, mean=0.0, std=TRANSFORMER_INIT_STD)
            if getattr(child, "bias", None) is not None:
                nn.init.zeros_(child.bias)
