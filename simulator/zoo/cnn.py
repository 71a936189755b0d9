"""Plain CNN building blocks and the VGG-16 / AlexNet models (torchvision layouts).

Layer granularity: each convolution (+ ReLU) is one layer and a max pool is merged into the
convolution layer that precedes it; each fully connected layer (+ ReLU) is one layer, the first
one also holding the adaptive average pool and the flatten.  Dropout is not modelled.
FLOP / saved-activation conventions: see ``simulator/zoo/_ops.py`` and ``README.md``.
"""

from __future__ import annotations

import math

from simulator.workload import Layer, Workload
from simulator.zoo._ops import HW, Tally, area, scale_channels


def image_input_spec(channels: int, image_size: int, num_classes: int) -> dict:
    return {"shape": [channels, image_size, image_size], "num_classes": num_classes,
            "task": "classification"}


def conv_block(name: str, cin: int, cout: int, k: int, hw: HW, *, stride: int = 1, pad: int = 0,
               bias: bool = True, bn: bool = False, relu: bool = True,
               pool: tuple[int, int, int] | None = None) -> tuple[Layer, HW]:
    """conv [-> BN] [-> ReLU] [-> maxpool(kernel, stride, pad)] as one layer."""
    t = Tally()
    conv_hw = t.conv(cin, cout, k, hw, stride=stride, pad=pad, bias=bias)
    elems = cout * area(conv_hw)
    if bn:
        t.norm(cout, elems)
    if relu:
        t.relu(elems, save_output=pool is not None)  # without a pool it is the layer output
    out_hw = t.maxpool(cout, conv_hw, *pool) if pool else conv_hw
    spec = {
        "kind": "conv_block", "in_channels": cin, "out_channels": cout, "kernel_size": k,
        "stride": stride, "padding": pad, "bias": bias, "input_hw": list(hw),
        "conv_output_hw": list(conv_hw), "output_hw": list(out_hw), "batch_norm": bn,
        "activation": "relu" if relu else None,
        "pool": ({"type": "max", "kernel_size": pool[0], "stride": pool[1], "padding": pool[2]}
                 if pool else None),
    }
    return t.layer(name, "conv", cin * area(hw), cout * area(out_hw), spec), out_hw


def fc_layer(name: str, fin: int, fout: int, *, relu: bool, input_shape: list[int] | None = None,
             adaptive_avgpool: HW | None = None) -> Layer:
    """[adaptive avg pool ->] flatten -> Linear(fin, fout, bias) [-> ReLU] as one layer.

    `input_shape` is the incoming activation ([C, H, W] from a conv layer, else [fin]);
    with `adaptive_avgpool` the input is pooled to [C, *adaptive_avgpool] before flattening."""
    input_shape = list(input_shape) if input_shape else [fin]
    in_elems = math.prod(input_shape)
    t = Tally()
    if adaptive_avgpool is not None:
        t.avgpool(in_elems)
    t.linear(fin, fout)
    if relu:
        t.relu(fout, save_output=False)  # the output: counted by the next layer
    spec = {
        "kind": "fc", "in_features": fin, "out_features": fout, "bias": True,
        "activation": "relu" if relu else None, "input_shape": input_shape,
        "adaptive_avgpool": list(adaptive_avgpool) if adaptive_avgpool else None,
    }
    return t.layer(name, "linear", in_elems, fout, spec)


def classifier_head(name: str, channels: int, hw: HW, num_classes: int, *,
                    pre_activation: bool = False) -> Layer:
    """[BN -> ReLU ->] global average pool -> flatten -> Linear(channels, num_classes)."""
    t = Tally()
    elems = channels * area(hw)
    if pre_activation:
        t.norm(channels, elems)
        t.relu(elems)
    else:  # the input is the previous block's final ReLU output, which that ReLU keeps for its
        t.saved += elems  # backward; the global pool (a mean) keeps nothing, so count it here
    t.avgpool(elems)
    t.linear(channels, num_classes)
    spec = {"kind": "classifier_head", "in_channels": channels, "input_hw": list(hw),
            "num_classes": num_classes, "pre_activation": pre_activation}
    return t.layer(name, "linear", elems, num_classes, spec)


def _classifier(prefix: str, cin: int, chw: list[int], pool_hw: HW, hidden: int,
                num_classes: int) -> list[Layer]:
    """torchvision VGG/AlexNet classifier: avgpool + fc-relu, fc-relu, fc."""
    flat = cin * area(pool_hw)
    return [
        fc_layer(f"{prefix}1", flat, hidden, relu=True, input_shape=chw,
                 adaptive_avgpool=pool_hw),
        fc_layer(f"{prefix}2", hidden, hidden, relu=True),
        fc_layer(f"{prefix}3", hidden, num_classes, relu=False),
    ]


VGG16_CONFIG = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def vgg16(*, width_multiplier: float = 1.0, image_size: int = 224,
          num_classes: int = 1000) -> Workload:
    """VGG-16 (configuration D, Simonyan & Zisserman 2015), torchvision layout without BN.

    138,357,544 parameters at 224x224 / 1000 classes (torchvision ``vgg16``); 15.47 GMACs.
    `width_multiplier` scales conv channels and the 4096-wide FC layers alike."""
    hw: HW = (image_size, image_size)
    cin, layers = 3, []
    for stage, widths in enumerate(VGG16_CONFIG, start=1):
        for i, width in enumerate(widths, start=1):
            cout = scale_channels(width, width_multiplier)
            pool = (2, 2, 0) if i == len(widths) else None
            layer, hw = conv_block(f"conv{stage}_{i}", cin, cout, 3, hw, pad=1, pool=pool)
            layers.append(layer)
            cin = cout
    hidden = scale_channels(4096, width_multiplier)
    layers += _classifier("fc", cin, [cin, *hw], (7, 7), hidden, num_classes)
    return Workload("vgg16", tuple(layers), image_input_spec(3, image_size, num_classes))


# (out_channels, kernel, stride, padding, followed by maxpool 3/2)
ALEXNET_CONFIG = ((64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False),
                  (256, 3, 1, 1, False), (256, 3, 1, 1, True))


def alexnet(*, width_multiplier: float = 1.0, image_size: int = 224,
            num_classes: int = 1000) -> Workload:
    """AlexNet in the torchvision layout (the single-GPU variant of Krizhevsky 2014, "One weird
    trick"): 61,100,840 parameters, 0.71 GMACs at 224x224 / 1000 classes.  The original 2012
    two-GPU grouped network (60.97M) is *not* what is modelled.  Needs image_size >= 63."""
    hw: HW = (image_size, image_size)
    cin, layers = 3, []
    for i, (width, k, stride, pad, pooled) in enumerate(ALEXNET_CONFIG, start=1):
        cout = scale_channels(width, width_multiplier)
        layer, hw = conv_block(f"conv{i}", cin, cout, k, hw, stride=stride, pad=pad,
                               pool=(3, 2, 0) if pooled else None)
        layers.append(layer)
        cin = cout
    hidden = scale_channels(4096, width_multiplier)
    layers += _classifier("fc", cin, [cin, *hw], (6, 6), hidden, num_classes)
    return Workload("alexnet", tuple(layers), image_input_spec(3, image_size, num_classes))
