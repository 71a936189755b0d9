"""Residual networks: CIFAR ResNets (basic and pre-activation bottleneck) and ImageNet ResNets.

Layer granularity: the stem is one layer, every residual block is one layer (no skip connection
crosses a layer boundary), the head (global average pool + FC) is one layer.
FLOP / saved-activation conventions: see ``simulator/zoo/_ops.py`` and ``README.md``.

Published parameter counts (10 classes for CIFAR, 1000 for ImageNet):

* ResNet-20/56/110 (He et al., "Deep Residual Learning", CVPR 2016, Table 6): 0.27M / 0.85M /
  1.7M, option-A (parameter-free, zero-padding) shortcuts.  Exact counts 269,722 / 853,018 /
  1,727,962 (e.g. akamaster/pytorch_resnet_cifar10) are what this module reproduces.
* ResNet-1001 (He et al., "Identity Mappings in Deep Residual Networks", ECCV 2016, Table 2 /
  the 1001-layer CIFAR experiments): 10.2M.  Pre-activation bottleneck blocks (BN-ReLU-conv1x1,
  BN-ReLU-conv3x3, BN-ReLU-conv1x1), 3 stages x 111 blocks, widths 16/32/64 (x4 out), 1x1
  projection shortcuts where the shape changes.  This module counts 10,327,706 parameters,
  identical to osmr/imgclsmob's ``preresnet1001_cifar10``; the paper's 10.2M is 1.25% lower
  (it matches the count without the ~149K BatchNorm affine parameters, 10.18M).
* ResNet-50 / ResNet-101 (torchvision, v1.5: stride on the 3x3 conv): 25,557,032 / 44,549,160
  parameters, 4.09 / 7.80 GMACs at 224x224.
"""

from __future__ import annotations

from simulator.workload import Layer, Workload
from simulator.zoo._ops import HW, Tally, area, scale_channels
from simulator.zoo.cnn import classifier_head, conv_block, image_input_spec


def basic_block(name: str, cin: int, cout: int, stride: int, hw: HW) -> tuple[Layer, HW]:
    """conv3x3-BN-ReLU-conv3x3-BN + shortcut, ReLU; option-A shortcut when the shape changes."""
    t = Tally()
    out_hw = t.conv(cin, cout, 3, hw, stride=stride, pad=1)
    elems = cout * area(out_hw)
    t.norm(cout, elems)
    t.relu(elems)
    t.conv(cout, cout, 3, out_hw, pad=1, save_input=False)  # input = saved ReLU output
    t.norm(cout, elems)
    t.add(elems)
    t.relu(elems, save_output=False)  # the block output: counted by the next layer
    shortcut = "identity" if stride == 1 and cin == cout else "pad"
    spec = {"kind": "basic_block", "in_channels": cin, "out_channels": cout, "stride": stride,
            "input_hw": list(hw), "output_hw": list(out_hw), "shortcut": shortcut}
    return t.layer(name, "conv", cin * area(hw), elems, spec), out_hw


def bottleneck_block(name: str, cin: int, mid: int, cout: int, stride: int,
                     hw: HW) -> tuple[Layer, HW]:
    """Post-activation bottleneck (ResNet v1.5): 1x1-BN-ReLU, 3x3(stride)-BN-ReLU, 1x1-BN,
    + identity or 1x1-conv-BN projection shortcut, ReLU."""
    t = Tally()
    t.conv(cin, mid, 1, hw)  # saves the block input (shared with the projection)
    t.norm(mid, mid * area(hw))
    t.relu(mid * area(hw))
    out_hw = t.conv(mid, mid, 3, hw, stride=stride, pad=1, save_input=False)
    t.norm(mid, mid * area(out_hw))
    t.relu(mid * area(out_hw))
    t.conv(mid, cout, 1, out_hw, save_input=False)
    elems = cout * area(out_hw)
    t.norm(cout, elems)
    projection = stride != 1 or cin != cout
    if projection:
        t.conv(cin, cout, 1, hw, stride=stride, save_input=False)
        t.norm(cout, elems)
    t.add(elems)
    t.relu(elems, save_output=False)
    return t.layer(name, "conv", cin * area(hw), elems,
                   _bottleneck_spec(cin, mid, cout, stride, hw, out_hw, projection, False)), out_hw


def preact_bottleneck_block(name: str, cin: int, mid: int, cout: int, stride: int,
                            hw: HW) -> tuple[Layer, HW]:
    """Pre-activation bottleneck: BN-ReLU-1x1, BN-ReLU-3x3(stride), BN-ReLU-1x1, + shortcut.
    The projection shortcut (1x1 conv, no BN) takes the pre-activated input."""
    t = Tally()
    in_elems = cin * area(hw)
    t.norm(cin, in_elems)  # saves the block input
    t.relu(in_elems)  # saves the pre-activation (input of conv1 and of the projection)
    t.conv(cin, mid, 1, hw, save_input=False)
    t.norm(mid, mid * area(hw))
    t.relu(mid * area(hw))
    out_hw = t.conv(mid, mid, 3, hw, stride=stride, pad=1, save_input=False)
    t.norm(mid, mid * area(out_hw))
    t.relu(mid * area(out_hw))
    t.conv(mid, cout, 1, out_hw, save_input=False)
    projection = stride != 1 or cin != cout
    if projection:
        t.conv(cin, cout, 1, hw, stride=stride, save_input=False)
    elems = cout * area(out_hw)
    t.add(elems)
    return t.layer(name, "conv", in_elems, elems,
                   _bottleneck_spec(cin, mid, cout, stride, hw, out_hw, projection, True)), out_hw


def _bottleneck_spec(cin: int, mid: int, cout: int, stride: int, hw: HW, out_hw: HW,
                     projection: bool, preact: bool) -> dict:
    return {"kind": "bottleneck_block", "in_channels": cin, "mid_channels": mid,
            "out_channels": cout, "stride": stride, "input_hw": list(hw),
            "output_hw": list(out_hw), "shortcut": "conv" if projection else "identity",
            "preact": preact}


def _cifar_blocks_per_stage(depth: int, variant: str) -> int:
    per_block = {"basic": 6, "preact_bottleneck": 9}.get(variant)
    if per_block is None:
        raise ValueError(f"unknown CIFAR ResNet variant {variant!r}")
    if depth < per_block + 2 or (depth - 2) % per_block:
        raise ValueError(f"{variant} CIFAR ResNet depth must be {per_block}n+2, got {depth}")
    return (depth - 2) // per_block


def resnet_cifar(*, depth: int = 20, variant: str = "basic", width_multiplier: float = 1.0,
                 image_size: int = 32, num_classes: int = 10, name: str | None = None) -> Workload:
    """CIFAR ResNet of any depth: ``variant="basic"`` (depth 6n+2, He et al. 2016) or
    ``"preact_bottleneck"`` (depth 9n+2, He et al. "Identity Mappings" 2016)."""
    n = _cifar_blocks_per_stage(depth, variant)
    preact = variant == "preact_bottleneck"
    c0 = scale_channels(16, width_multiplier)
    hw: HW = (image_size, image_size)
    stem, hw = conv_block("stem", 3, c0, 3, hw, pad=1, bias=False, bn=not preact,
                          relu=not preact)
    layers, cin = [stem], c0
    for stage, base in enumerate((16, 32, 64)):
        width = scale_channels(base, width_multiplier)
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            block_name = f"stage{stage + 1}.block{i}"
            if preact:
                layer, hw = preact_bottleneck_block(block_name, cin, width, 4 * width, stride, hw)
                cin = 4 * width
            else:
                layer, hw = basic_block(block_name, cin, width, stride, hw)
                cin = width
            layers.append(layer)
    layers.append(classifier_head("head", cin, hw, num_classes, pre_activation=preact))
    default = f"resnet{depth}" if not preact else f"preact_resnet{depth}"
    return Workload(name or default, tuple(layers),
                    image_input_spec(3, image_size, num_classes))


def resnet20(*, width_multiplier: float = 1.0, image_size: int = 32,
             num_classes: int = 10) -> Workload:
    """ResNet-20 for CIFAR (0.27M published; 269,722 counted)."""
    return resnet_cifar(depth=20, width_multiplier=width_multiplier, image_size=image_size,
                        num_classes=num_classes, name="resnet20")


def resnet56(*, width_multiplier: float = 1.0, image_size: int = 32,
             num_classes: int = 10) -> Workload:
    """ResNet-56 for CIFAR (0.85M published; 853,018 counted)."""
    return resnet_cifar(depth=56, width_multiplier=width_multiplier, image_size=image_size,
                        num_classes=num_classes, name="resnet56")


def resnet110(*, width_multiplier: float = 1.0, image_size: int = 32,
              num_classes: int = 10) -> Workload:
    """ResNet-110 for CIFAR (1.7M published; 1,727,962 counted)."""
    return resnet_cifar(depth=110, width_multiplier=width_multiplier, image_size=image_size,
                        num_classes=num_classes, name="resnet110")


def resnet1001(*, width_multiplier: float = 1.0, image_size: int = 32,
               num_classes: int = 10) -> Workload:
    """Pre-activation bottleneck ResNet-1001 for CIFAR (He et al., "Identity Mappings in Deep
    Residual Networks", ECCV 2016): 10.2M published, 10,327,706 counted (module docstring)."""
    return resnet_cifar(depth=1001, variant="preact_bottleneck",
                        width_multiplier=width_multiplier, image_size=image_size,
                        num_classes=num_classes, name="resnet1001")


def resnet_imagenet(name: str, blocks: tuple[int, ...], *, width_multiplier: float = 1.0,
                    image_size: int = 224, num_classes: int = 1000) -> Workload:
    """ImageNet bottleneck ResNet (torchvision v1.5 layout) with `blocks` per stage."""
    c0 = scale_channels(64, width_multiplier)
    hw: HW = (image_size, image_size)
    stem, hw = conv_block("stem", 3, c0, 7, hw, stride=2, pad=3, bias=False, bn=True,
                          pool=(3, 2, 1))
    layers, cin = [stem], c0
    for stage, count in enumerate(blocks):
        mid = scale_channels(64 * 2 ** stage, width_multiplier)
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            layer, hw = bottleneck_block(f"stage{stage + 1}.block{i}", cin, mid, 4 * mid,
                                         stride, hw)
            layers.append(layer)
            cin = 4 * mid
    layers.append(classifier_head("head", cin, hw, num_classes))
    return Workload(name, tuple(layers), image_input_spec(3, image_size, num_classes))


def resnet50(*, width_multiplier: float = 1.0, image_size: int = 224,
             num_classes: int = 1000) -> Workload:
    """ResNet-50 (He et al. 2016; torchvision v1.5): 25,557,032 parameters, 4.09 GMACs."""
    return resnet_imagenet("resnet50", (3, 4, 6, 3), width_multiplier=width_multiplier,
                           image_size=image_size, num_classes=num_classes)


def resnet101(*, width_multiplier: float = 1.0, image_size: int = 224,
              num_classes: int = 1000) -> Workload:
    """ResNet-101 (He et al. 2016; torchvision v1.5): 44,549,160 parameters, 7.80 GMACs."""
    return resnet_imagenet("resnet101", (3, 4, 23, 3), width_multiplier=width_multiplier,
                           image_size=image_size, num_classes=num_classes)
