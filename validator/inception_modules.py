"""Torch modules of InceptionV3's `inception_module` spec kind (`simulator.zoo.inception`), in
torchvision's layout (`torchvision/models/inception.py`: InceptionA-E, BasicConv2d, InceptionAux;
Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer Vision", fig. 5-7, 10).
The stem convolutions and the head are `conv_block` / `classifier_head` (`validator.layer_modules`).

BasicConv2d is a bias-free conv -> BatchNorm (eps 0.001, torchvision's) -> ReLU; branch outputs
are concatenated along channels in torchvision's order. Pooled branches use a 3x3 stride-1
average pool with padding 1 (counting the padding, torchvision's `avg_pool2d` default).

What the spec does not say, and where it comes from:
* A's `pool_features` = out_channels - 224 (its other branches give 64 + 64 + 96);
* C's `channels_7x7` (128, 160, 160, 192 in Mixed_6b..6e): spec key `channels_7x7` if present,
  else torchvision's value for the zoo's layer name (`TORCHVISION_CHANNELS_7X7`);
* the auxiliary classifier's `num_classes` (Mixed_6e with `aux_logits`): spec key `num_classes`
  if present, else the workload's `input_spec` (`validator.models.build_modules`).

Auxiliary classifier (`aux_logits`): built and run in training mode on Mixed_6e's output, as
torchvision does, so its parameters, FLOPs and saved tensors are the zoo's. Its logits end in a
loss the validator does not have (the pipeline carries one tensor and one loss per sample), so
they join the main output through `AuxJoin`: identity on the main path, and a zero gradient into
the auxiliary branch, whose backward therefore runs in full (same kernels and memory as with
torchvision's 0.4-weighted auxiliary loss) while its parameters receive zero gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from simulator.workload import Layer

BN_EPS = 0.001
"""torchvision `BasicConv2d`: `nn.BatchNorm2d(out_channels, eps=0.001)`."""
TORCHVISION_CHANNELS_7X7 = {"mixed6b": 128, "mixed6c": 160, "mixed6d": 160, "mixed6e": 192}
"""torchvision `Inception3`: InceptionC(768, channels_7x7=...) for Mixed_6b..Mixed_6e."""
A_FIXED_CHANNELS = 64 + 64 + 96


class BasicConv2d(nn.Sequential):
    """Conv (no bias) -> BatchNorm(eps 0.001) -> ReLU."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False),
                         nn.BatchNorm2d(cout, eps=BN_EPS), nn.ReLU())


def _chain(cin: int, convs) -> nn.Sequential:
    """BasicConv2d chain from (cout, kernel, stride, padding) tuples."""
    layers = []
    for cout, kernel, stride, padding in convs:
        layers.append(BasicConv2d(cin, cout, kernel, stride, padding))
        cin = cout
    return nn.Sequential(*layers)


def _avgpool(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)


class PooledBranch(nn.Module):
    """3x3 stride-1 average pool (padding 1) -> BasicConv2d 1x1."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = BasicConv2d(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(_avgpool(x))


class MaxPoolBranch(nn.Module):
    """3x3 stride-2 max pool (B, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, kernel_size=3, stride=2)


class SplitBranch(nn.Module):
    """E's split branches: a stem chain, then (1,3) and (3,1) convs side by side, concatenated."""

    def __init__(self, cin: int, stem, width: int = 384):
        super().__init__()
        self.stem = _chain(cin, stem)
        mid = stem[-1][0]
        self.row = BasicConv2d(mid, width, (1, 3), padding=(0, 1))
        self.col = BasicConv2d(mid, width, (3, 1), padding=(1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return torch.cat([self.row(x), self.col(x)], dim=1)


class AuxJoin(torch.autograd.Function):
    """Returns `main` (a copy); backward: the gradient to `main`, zeros to `aux` (module docstring)."""

    @staticmethod
    def forward(ctx, main: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_shape, ctx.aux_dtype = aux.shape, aux.dtype
        return main.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.zeros(ctx.aux_shape, dtype=ctx.aux_dtype, device=grad.device)


class InceptionAux(nn.Module):
    """torchvision InceptionAux: avg pool 5/3 -> BasicConv2d 1x1 128 -> 5x5 768 -> adaptive avg
    pool -> flatten -> Linear(768, classes)."""

    def __init__(self, cin: int, num_classes: int):
        super().__init__()
        self.conv0 = BasicConv2d(cin, 128, 1)
        self.conv1 = BasicConv2d(128, 768, 5)
        self.fc = nn.Linear(768, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, kernel_size=5, stride=3)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _branches(kind: str, cin: int, spec: Mapping[str, Any]) -> list[nn.Module]:
    """torchvision's branches of Inception module `kind` (A-E) on `cin` input channels."""
    if kind == "A":
        pool_features = spec["out_channels"] - A_FIXED_CHANNELS
        if pool_features < 1:
            raise ValueError(f"out_channels {spec['out_channels']} leaves no pool features for module A")
        return [_chain(cin, [(64, 1, 1, 0)]),
                _chain(cin, [(48, 1, 1, 0), (64, 5, 1, 2)]),
                _chain(cin, [(64, 1, 1, 0), (96, 3, 1, 1), (96, 3, 1, 1)]),
                PooledBranch(cin, pool_features)]
    if kind == "B":
        return [_chain(cin, [(384, 3, 2, 0)]),
                _chain(cin, [(64, 1, 1, 0), (96, 3, 1, 1), (96, 3, 2, 0)]),
                MaxPoolBranch()]
    if kind == "C":
        c7 = int(spec["channels_7x7"])
        return [_chain(cin, [(192, 1, 1, 0)]),
                _chain(cin, [(c7, 1, 1, 0), (c7, (1, 7), 1, (0, 3)), (192, (7, 1), 1, (3, 0))]),
                _chain(cin, [(c7, 1, 1, 0), (c7, (7, 1), 1, (3, 0)), (c7, (1, 7), 1, (0, 3)),
                             (c7, (7, 1), 1, (3, 0)), (192, (1, 7), 1, (0, 3))]),
                PooledBranch(cin, 192)]
    if kind == "D":
        return [_chain(cin, [(192, 1, 1, 0), (320, 3, 2, 0)]),
                _chain(cin, [(192, 1, 1, 0), (192, (1, 7), 1, (0, 3)), (192, (7, 1), 1, (3, 0)),
                             (192, 3, 2, 0)]),
                MaxPoolBranch()]
    if kind == "E":
        return [_chain(cin, [(320, 1, 1, 0)]),
                SplitBranch(cin, [(384, 1, 1, 0)]),
                SplitBranch(cin, [(448, 1, 1, 0), (384, 3, 1, 1)]),
                PooledBranch(cin, 192)]
    raise ValueError(f"module {kind!r} not one of A, B, C, D, E")


OUT_CHANNELS = {"B": lambda cin: 384 + 96 + cin, "C": lambda cin: 768, "D": lambda cin: 320 + 192 + cin,
                "E": lambda cin: 2048}
"""Concatenated output channels of the fixed-width modules (torchvision's branch widths)."""


class InceptionModule(nn.Module):
    """`inception_module`: torchvision's InceptionA-E (`spec["module"]`), branches concatenated;
    with `aux_logits` also the auxiliary classifier on the output (module docstring)."""

    def __init__(self, spec: Mapping[str, Any]):
        super().__init__()
        kind, cin = spec["module"], int(spec["in_channels"])
        self.branches = nn.ModuleList(_branches(kind, cin, spec))
        expected = OUT_CHANNELS[kind](cin) if kind in OUT_CHANNELS else spec["out_channels"]
        if expected != spec["out_channels"]:
            raise ValueError(f"out_channels {spec['out_channels']} but module {kind} on {cin} "
                             f"channels gives {expected}")
        self.aux = (InceptionAux(spec["out_channels"], int(spec["num_classes"]))
                    if spec.get("aux_logits") else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat([branch(x) for branch in self.branches], dim=1)
        if self.aux is not None and self.training:
            out = AuxJoin.apply(out, self.aux(out))
        return out


INCEPTION_BUILDERS: dict[str, type[nn.Module]] = {"inception_module": InceptionModule}
"""Builders of InceptionV3's spec kinds (`validator.models.build_layer_module`)."""


def complete_spec(layer: Layer, num_classes: int | None) -> dict[str, Any]:
    """`layer.spec` with what the zoo's spec leaves out (module docstring): C's `channels_7x7`
    from torchvision by layer name, the auxiliary classifier's `num_classes` from the workload."""
    spec = dict(layer.spec or {})
    if spec.get("module") == "C" and "channels_7x7" not in spec and layer.name in TORCHVISION_CHANNELS_7X7:
        spec["channels_7x7"] = TORCHVISION_CHANNELS_7X7[layer.name]
    if spec.get("aux_logits") and "num_classes" not in spec and num_classes is not None:
        spec["num_classes"] = int(num_classes)
    return spec
