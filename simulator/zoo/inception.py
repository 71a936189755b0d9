"""InceptionV3 (Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", CVPR
2016) in torchvision's layout (`torchvision.models.inception_v3`), as a chain of layers.

Layer granularity: each stem convolution (BasicConv2d = conv without bias, BatchNorm, ReLU; a max
pool merged into the convolution before it) is one layer; each Inception module (A: Mixed_5b-5d,
B: 6a, C: 6b-6e, D: 7a, E: 7b-7c) is one layer, its branches and their concatenation inside it (no
branch crosses a layer boundary); the head is the global average pool + FC (dropout not modelled).
With `aux_logits` (torchvision's default) the auxiliary classifier on Mixed_6e's output (5x5/3 average
pool, 1x1 conv 128, 5x5 conv 768, FC) belongs to the Mixed_6e layer: it forks there and ends in its
own loss. torchvision's `transform_input` (a per-channel affine) is not modelled.

Counts (`simulator.zoo._ops` conventions: conv 2 Cin kh kw Cout Hout Wout, BN 5 and ReLU 1 FLOP
per element, pools kernel area per output element, a global pool 1 per input element): at
299x299 / 1000 classes 27,161,264 parameters with the auxiliary classifier and 23,834,568 without
(torchvision's `Inception_V3_Weights` lists 27,161,264); 5.71 GMACs of convolutions and FC without
the auxiliary head (torchvision's table: "GFLOPS 5.71", counted as multiply-adds).
Saved per module: its input once (every first conv and pool of a branch reads it), each
BasicConv2d's BN input and ReLU output, a pooled branch's pool output (the conv's input), a max
pool's indices; the concatenated output is the next layer's input.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.workload import Layer, Workload
from simulator.zoo._ops import HW, NORM_FLOPS, RELU_FLOPS, Tally, area, conv_out
from simulator.zoo.cnn import classifier_head, conv_block, image_input_spec

Conv = tuple[int, tuple[int, int], int, tuple[int, int]]
"""(out channels, (kh, kw), stride, (pad h, pad w)) of one BasicConv2d."""
ONE = (0, 0)


def _basic_conv(t: Tally, cin: int, conv: Conv, hw: HW) -> HW:
    """BasicConv2d: conv (bias-free) -> BatchNorm -> ReLU; saves the BN input and the ReLU output
    (the conv input is saved by whoever made it)."""
    cout, (kh, kw), stride, (ph, pw) = conv
    out = (conv_out(hw[0], kh, stride, ph), conv_out(hw[1], kw, stride, pw))
    elements = cout * area(out)
    t.flops += 2 * cin * kh * kw * cout * area(out) + (NORM_FLOPS + RELU_FLOPS) * elements
    t.params += cin * kh * kw * cout + 2 * cout
    t.saved += 2 * elements
    return out


def _branch(t: Tally, cin: int, hw: HW, convs: list[Conv], pooled: bool = False) -> tuple[int, HW]:
    """A chain of BasicConv2d [after a 3x3 stride-1 average pool]; returns (channels, hw)."""
    if pooled:
        t.flops += 9 * cin * area(hw)
        t.saved += cin * area(hw)  # the pool's output, the conv's input
    for conv in convs:
        hw = _basic_conv(t, cin, conv, hw)
        cin = conv[0]
    return cin, hw


def _module(name: str, kind: str, cin: int, hw: HW, branches, pool_stride: int = 0,
            split: tuple[int, list[Conv], list[Conv]] | None = None) -> tuple[Layer, int, HW]:
    """One Inception module: `branches` [(pooled, convs)], a 3x3 max pool of the input when
    `pool_stride` (B, D), and for E `split` = (branch index, its two parallel tail convs)."""
    t = Tally()
    t.saved += cin * area(hw)
    width, out = 0, hw
    for index, (pooled, convs) in enumerate(branches):
        channels, out = _branch(t, cin, hw, convs, pooled)
        if split is not None and index in split[0]:
            channels = sum(_branch(t, channels, out, [tail])[0] for tail in split[1])
        width += channels
    if pool_stride:
        out = t.maxpool(cin, hw, 3, pool_stride)
        width += cin
    spec = {"kind": "inception_module", "module": kind, "in_channels": cin, "out_channels": width,
            "input_hw": list(hw), "output_hw": list(out)}
    return t.layer(name, "conv", cin * area(hw), width * area(out), spec), width, out


def _aux_classifier(t: Tally, cin: int, hw: HW, num_classes: int) -> None:
    """torchvision InceptionAux on Mixed_6e's output: avg pool 5/3, BasicConv2d 1x1 128 and 5x5
    768, adaptive average pool, FC."""
    pooled = (conv_out(hw[0], 5, 3, 0), conv_out(hw[1], 5, 3, 0))
    t.flops += 25 * cin * area(pooled)
    t.saved += cin * area(pooled)
    channels, out = _branch(t, cin, pooled, [(128, (1, 1), 1, ONE), (768, (5, 5), 1, ONE)])
    t.avgpool(channels * area(out))
    t.linear(channels, num_classes)


A = [(False, [(64, (1, 1), 1, ONE)]),
     (False, [(48, (1, 1), 1, ONE), (64, (5, 5), 1, (2, 2))]),
     (False, [(64, (1, 1), 1, ONE), (96, (3, 3), 1, (1, 1)), (96, (3, 3), 1, (1, 1))])]
ROW, COL = ((1, 7), (0, 3)), ((7, 1), (3, 0))


def _c(c7: int):
    return [(False, [(192, (1, 1), 1, ONE)]),
            (False, [(c7, (1, 1), 1, ONE), (c7, ROW[0], 1, ROW[1]), (192, COL[0], 1, COL[1])]),
            (False, [(c7, (1, 1), 1, ONE), (c7, COL[0], 1, COL[1]), (c7, ROW[0], 1, ROW[1]),
                     (c7, COL[0], 1, COL[1]), (192, ROW[0], 1, ROW[1])]),
            (True, [(192, (1, 1), 1, ONE)])]


def inception_v3(*, image_size: int = 299, num_classes: int = 1000, aux_logits: bool = True) -> Workload:
    """InceptionV3, torchvision layout (module docstring): 27,161,264 parameters with the auxiliary
    classifier (`aux_logits`, torchvision's default), 23,834,568 without; needs image_size >= 299 with
    the auxiliary classifier (its 5 x 5 / 3 pooling and 5 x 5 convolution need the 17 x 17 map), >= 75
    without it."""
    if image_size < 75:
        raise ValueError(f"image_size {image_size}: InceptionV3 needs at least 75")
    if aux_logits and image_size < 299:
        raise ValueError(f"image_size {image_size}: InceptionV3's auxiliary classifier needs at least 299 "
                         "(set aux_logits: false for smaller images, down to 75)")
    hw: HW = (image_size, image_size)
    layers = []
    for name, cin, cout, k, stride, pad, pool in (("conv1a", 3, 32, 3, 2, 0, None), ("conv2a", 32, 32, 3, 1, 0, None),
                                                  ("conv2b", 32, 64, 3, 1, 1, (3, 2, 0)),
                                                  ("conv3b", 64, 80, 1, 1, 0, None),
                                                  ("conv4a", 80, 192, 3, 1, 0, (3, 2, 0))):
        layer, hw = conv_block(name, cin, cout, k, hw, stride=stride, pad=pad, bias=False, bn=True, pool=pool)
        layers.append(layer)
    channels = 192
    for name, pool_features in (("mixed5b", 32), ("mixed5c", 64), ("mixed5d", 64)):
        layer, channels, hw = _module(name, "A", channels, hw, [*A, (True, [(pool_features, (1, 1), 1, ONE)])])
        layers.append(layer)
    layer, channels, hw = _module("mixed6a", "B", channels, hw, [
        (False, [(384, (3, 3), 2, ONE)]),
        (False, [(64, (1, 1), 1, ONE), (96, (3, 3), 1, (1, 1)), (96, (3, 3), 2, ONE)])], pool_stride=2)
    layers.append(layer)
    for name, c7 in (("mixed6b", 128), ("mixed6c", 160), ("mixed6d", 160), ("mixed6e", 192)):
        layer, channels, hw = _module(name, "C", channels, hw, _c(c7))
        layers.append(layer)
    if aux_logits:
        t = Tally()
        _aux_classifier(t, channels, hw, num_classes)
        layers[-1] = _merged(layer, t.layer("aux", "conv", 0, 0, {}))
    layer, channels, hw = _module("mixed7a", "D", channels, hw, [
        (False, [(192, (1, 1), 1, ONE), (320, (3, 3), 2, ONE)]),
        (False, [(192, (1, 1), 1, ONE), (192, ROW[0], 1, ROW[1]), (192, COL[0], 1, COL[1]),
                 (192, (3, 3), 2, ONE)])], pool_stride=2)
    layers.append(layer)
    for name in ("mixed7b", "mixed7c"):
        tails = [(384, (1, 3), 1, (0, 1)), (384, (3, 1), 1, (1, 0))]
        layer, channels, hw = _module(name, "E", channels, hw, [
            (False, [(320, (1, 1), 1, ONE)]), (False, [(384, (1, 1), 1, ONE)]),
            (False, [(448, (1, 1), 1, ONE), (384, (3, 3), 1, (1, 1))]),
            (True, [(192, (1, 1), 1, ONE)])], split=((1, 2), tails))
        layers.append(layer)
    layers.append(classifier_head("head", channels, hw, num_classes))
    return Workload("inception_v3", tuple(layers), image_input_spec(3, image_size, num_classes))


def _merged(module: Layer, aux: Layer) -> Layer:
    """The Mixed_6e layer with its auxiliary classifier's FLOPs, parameters and saved tensors."""
    return replace(module, forward_flops_per_sample=module.forward_flops_per_sample + aux.forward_flops_per_sample,
                   backward_flops_per_sample=module.backward_flops_per_sample + aux.backward_flops_per_sample,
                   num_params=module.num_params + aux.num_params,
                   saved_elements_per_sample=module.saved_elements_per_sample + aux.saved_elements_per_sample,
                   spec={**module.spec, "aux_logits": True})
