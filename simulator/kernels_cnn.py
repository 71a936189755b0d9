"""Convolutional layers as the kernels PyTorch and cuDNN launch: convolutions as implicit GEMMs
(M = batch x out_h x out_w, N = out channels, K = in channels x kh x kw), cuDNN batch norm (one
kernel per pass), ReLU, pooling and the classifier; conventions in `simulator.kernels`."""

from __future__ import annotations

import math

from simulator.kernel_catalogue import WINOGRAD_MULTIPLY_SAVING
from simulator.kernel_ops import INDEX_BYTES, Kernel, add, copy, linear, pointwise
from simulator.zoo._ops import NORM_FLOPS, RELU_FLOPS

# --- convolutional networks (PyTorch + cuDNN) ---------------------------------------------------

def conv(name: str, b: float, cin: int, cout: int, k: int, in_hw, out_hw, e: int, phase: str,
         *, bias: bool = False, input_grad: bool = True, algorithm: str = "implicit_gemm") -> list[Kernel]:
    """Implicit GEMM (cuDNN): forward M = b Ho Wo, N = Cout, K = Cin k^2; data gradient
    M = b Hi Wi, N = Cin, K = Cout k^2 Ho Wo / (Hi Wi) (same FLOPs); weight gradient
    M = Cout, N = Cin k^2, K = b Ho Wo. Bytes are the tensors (no im2col buffer); a bias is a
    separate add (forward) / reduction (backward), as PyTorch runs it after cuDNN. `algorithm`
    (`simulator.kernel_catalogue.conv_algorithm`): `implicit_gemm_nchw`, each cuDNN call also copies
    its activation operands to NHWC and its activation result back to NCHW; `winograd`, a 3 x 3
    stride-1 convolution's three GEMMs do `WINOGRAD_MULTIPLY_SAVING` times fewer multiplies (K / it)."""
    in_area, out_area = in_hw[0] * in_hw[1], out_hw[0] * out_hw[1]
    x_el, y_el = b * cin * in_area, b * cout * out_area  # activation elements
    x, y, w = x_el * e, y_el * e, cout * cin * k * k * e
    m, n, kk = b * out_area, cout, cin * k * k
    transposes = algorithm == "implicit_gemm_nchw"
    saving = WINOGRAD_MULTIPLY_SAVING if algorithm == "winograd" and k == 3 and tuple(in_hw) == tuple(out_hw) else 1.0

    def nhwc(kernel: Kernel, operands: tuple[tuple[str, float], ...], result: tuple[str, float] | None) -> list[Kernel]:
        if not transposes:
            return [kernel]
        into = [copy(f"{kernel.name}.{label}_to_nhwc", elements, e) for label, elements in operands]
        return into + [kernel] + ([copy(f"{kernel.name}.{result[0]}_to_nchw", result[1], e)] if result else [])

    flops = 2.0 * m * n * kk / saving
    if phase != "B":
        kernels = nhwc(Kernel(name, "gemm", flops, x + w, y, m, n, kk / saving), (("x", x_el),), ("y", y_el))
        return kernels + ([pointwise(f"{name}.bias", "elementwise", b * cout * out_area, e, e)] if bias else [])
    kernels = nhwc(Kernel(f"{name}.dgrad", "gemm", flops, y + w, x, b * in_area, cin,
                          cout * k * k * out_area / in_area / saving), (("dy", y_el),), ("dx", x_el)) if input_grad else []
    kernels += nhwc(Kernel(f"{name}.wgrad", "gemm", flops, x + y, w, cout, kk, m / saving),
                    (("x", x_el), ("dy", y_el)), None)
    if bias:
        kernels.append(Kernel(f"{name}.bias_grad", "reduction", 0.0, y, cout * e))
    return kernels


def batch_norm(name: str, elements: float, e: int, phase: str) -> Kernel:
    """cuDNN batch norm, training: one kernel per pass sweeping its input twice (statistics,
    then normalise; backward: the two reductions, then the input gradient)."""
    if phase != "B":
        return pointwise(name, "norm", elements, 2 * e, e, NORM_FLOPS)
    return pointwise(f"{name}.bwd", "norm", elements, 4 * e, e, NORM_FLOPS)


def relu(name: str, elements: float, e: int, phase: str) -> Kernel:
    if phase != "B":
        return pointwise(name, "elementwise", elements, e, e, RELU_FLOPS)
    return pointwise(f"{name}.bwd", "elementwise", elements, 2 * e, e, RELU_FLOPS)


def _area(hw) -> int:
    return hw[0] * hw[1]


def conv_block_kernels(spec, b: float, e: int, phase: str, algorithm: str = "implicit_gemm") -> list[Kernel]:
    """conv [-> BN] [-> ReLU] [-> max pool (writes int64 indices)]."""
    cout, conv_hw = spec["out_channels"], spec["conv_output_hw"]
    elements = b * cout * _area(conv_hw)
    kernels = conv("conv", b, spec["in_channels"], cout, spec["kernel_size"], spec["input_hw"],
                   conv_hw, e, phase, bias=spec.get("bias", False), algorithm=algorithm)
    kernels += [batch_norm("bn", elements, e, phase)] if spec.get("batch_norm") else []
    kernels += [relu("relu", elements, e, phase)] if spec.get("activation") else []
    pool = spec.get("pool")
    if pool:
        pooled = b * cout * _area(spec["output_hw"])
        area = pool["kernel_size"] ** 2
        kernels.append(Kernel("maxpool", "pool", area * pooled, elements * e, pooled * (e + INDEX_BYTES))
                       if phase != "B" else
                       Kernel("maxpool.bwd", "pool", area * pooled, pooled * (e + INDEX_BYTES), elements * e))
    return kernels if phase != "B" else kernels[::-1]


def _avgpool(name: str, in_elements: float, out_elements: float, e: int, phase: str) -> Kernel:
    if phase != "B":
        return Kernel(name, "pool", in_elements, in_elements * e, out_elements * e)
    return Kernel(f"{name}.bwd", "pool", in_elements, out_elements * e, in_elements * e)


def fc_kernels(spec, b: float, e: int, phase: str, t: int) -> list[Kernel]:
    """[adaptive avg pool ->] Linear (column-parallel: N / tp, bias in the epilogue) [-> ReLU]."""
    fin, fout = spec["in_features"], spec["out_features"]
    kernels = []
    if spec.get("adaptive_avgpool"):
        in_elements = b * math.prod(spec["input_shape"])
        kernels.append(_avgpool("avgpool", in_elements, b * fin, e, phase))
    kernels += linear("fc", b, fout / t, fin, e, phase, bias_grad=spec.get("bias", True))
    kernels += [relu("relu", b * fout / t, e, phase)] if spec.get("activation") else []
    return kernels if phase != "B" else kernels[::-1]


def classifier_head_kernels(spec, b: float, e: int, phase: str, t: int) -> list[Kernel]:
    """[BN -> ReLU ->] global average pool -> Linear (N / tp)."""
    channels, classes = spec["in_channels"], spec["num_classes"]
    elements = b * channels * _area(spec["input_hw"])
    kernels = [batch_norm("bn", elements, e, phase), relu("relu", elements, e, phase)] \
        if spec.get("pre_activation") else []
    kernels += [_avgpool("avgpool", elements, b * channels, e, phase),
                *linear("fc", b, classes / t, channels, e, phase, bias_grad=True)]
    return kernels if phase != "B" else kernels[::-1]


def basic_block_kernels(spec, b: float, e: int, phase: str, algorithm: str = "implicit_gemm") -> list[Kernel]:
    """conv3x3-BN-ReLU-conv3x3-BN, + identity or option-A (subsample + zero-pad) shortcut, ReLU."""
    cin, cout, in_hw, out_hw = spec["in_channels"], spec["out_channels"], spec["input_hw"], spec["output_hw"]
    elements = b * cout * _area(out_hw)
    kernels = [*conv("conv1", b, cin, cout, 3, in_hw, out_hw, e, phase, algorithm=algorithm),
               batch_norm("bn1", elements, e, phase), relu("relu1", elements, e, phase),
               *conv("conv2", b, cout, cout, 3, out_hw, out_hw, e, phase, algorithm=algorithm),
               batch_norm("bn2", elements, e, phase), relu("relu_out", elements, e, phase)]
    if spec.get("shortcut") == "pad":
        kernels.append(pointwise("shortcut_pad" + (".bwd" if phase == "B" else ""), "copy", elements, e, e))
    kernels.append(add("residual" if phase != "B" else "input.grad_accumulate",
                       elements if phase != "B" else b * cin * _area(in_hw), e))
    return kernels if phase != "B" else kernels[::-1]


def bottleneck_block_kernels(spec, b: float, e: int, phase: str, algorithm: str = "implicit_gemm") -> list[Kernel]:
    """Post-activation (v1.5): 1x1-BN-ReLU, 3x3(stride)-BN-ReLU, 1x1-BN [+ 1x1 projection-BN],
    add, ReLU. Pre-activation: BN-ReLU before each conv, projection without BN, no final ReLU."""
    cin, mid, cout = spec["in_channels"], spec["mid_channels"], spec["out_channels"]
    in_hw, out_hw, preact = spec["input_hw"], spec["output_hw"], spec.get("preact", False)
    in_el, mid_in, mid_out, out_el = (b * cin * _area(in_hw), b * mid * _area(in_hw),
                                      b * mid * _area(out_hw), b * cout * _area(out_hw))

    def norm_act(i: int, elements: float) -> list[Kernel]:
        return [batch_norm(f"bn{i}", elements, e, phase), relu(f"relu{i}", elements, e, phase)]

    kernels = norm_act(0, in_el) if preact else []
    kernels += conv("conv1", b, cin, mid, 1, in_hw, in_hw, e, phase, algorithm=algorithm)
    kernels += norm_act(1, mid_in) + conv("conv2", b, mid, mid, 3, in_hw, out_hw, e, phase, algorithm=algorithm)
    kernels += norm_act(2, mid_out) + conv("conv3", b, mid, cout, 1, out_hw, out_hw, e, phase, algorithm=algorithm)
    kernels += [] if preact else [batch_norm("bn3", out_el, e, phase)]
    if spec.get("shortcut") == "conv":
        kernels += conv("projection", b, cin, cout, 1, in_hw, out_hw, e, phase, algorithm=algorithm)
        kernels += [] if preact else [batch_norm("bn_projection", out_el, e, phase)]
    kernels += [] if preact else [relu("relu_out", out_el, e, phase)]
    kernels.append(add("residual" if phase != "B" else "input.grad_accumulate",
                       out_el if phase != "B" else in_el, e))
    return kernels if phase != "B" else kernels[::-1]
