"""Shared accounting for the analytic model zoo: FLOPs, parameters and saved activations.

Conventions (also in ``simulator/zoo/README.md``); all figures are per sample, in elements:

* GEMM-like ops: conv = 2*Cin/groups*k*k*Cout*Hout*Wout, linear = 2*in*out (per token), batched
  matmul = 2*m*n*k.  Bias additions are folded into this convention (not counted).
* Elementwise ops are counted roughly with the per-element constants below (BatchNorm/LayerNorm 5,
  ReLU 1, GELU 8, residual add 1, softmax 5 incl. scaling and masking, max pool = kernel area per
  output element, average pool 1 per input element).  Dropout is not modelled (p = 0).
* Backward, per *layer*: 2x forward if the layer has weights (input-grad + weight-grad GEMMs),
  1x forward otherwise.
* Saved elements: every distinct tensor autograd keeps for backward, counted once: inputs of
  conv/linear/matmul, inputs of BatchNorm/LayerNorm/GELU, outputs of ReLU/softmax, max-pool
  indices.  The layer's own *output* is never counted (it is the next layer's input, counted
  there; the last layer's output belongs to the loss).  Per-channel/per-row statistics are
  ignored.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from simulator.workload import Layer

NORM_FLOPS = 5
RELU_FLOPS = 1
GELU_FLOPS = 8
ADD_FLOPS = 1
SOFTMAX_FLOPS = 5
RMS_NORM_FLOPS = 4
"""x^2, row sum, x * rstd, * weight (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization")."""
SWIGLU_FLOPS = 6
"""silu(gate) * up per output element: sigmoid 4 (exp, add, divide + negate), 2 multiplies
(Shazeer 2020, "GLU Variants Improve Transformer")."""
ROTARY_FLOPS = 3
"""x * cos + rotate_half(x) * sin per element (Su et al. 2021, "RoFormer")."""

HW = tuple[int, int]


class DimensionError(ValueError):
    """A factory's refusal of its dimensions, worded with the parameters' names ("hidden_size 4096
    not divisible by num_heads 33"); `names_as` words it with other names (a config file's keys)."""

    def __init__(self, template: str, **values: Any) -> None:
        self.template, self.values = template, values
        super().__init__(self.names_as(lambda name: name))

    def names_as(self, rename: Callable[[str], str]) -> str:
        """The message with each parameter called `rename(parameter)`."""
        return self.template.format(**{name: f"{rename(name)} {value}" for name, value in self.values.items()})


def require_positive(**values: Any) -> None:
    """A DimensionError naming the first of `values` (factory keyword -> value) below 1."""
    for name, value in values.items():
        if value < 1:
            raise DimensionError(f"{{{name}}} must be at least 1", **{name: value})


def keyword_signature(function: Callable, defaults: Mapping[str, Any]) -> inspect.Signature:
    """`function`'s keywords but `name`, with `defaults` and evaluated annotations: the signature a
    zoo factory that forwards `**keywords` shows, so `model.params` are checked against it
    (`simulator.model_source`)."""
    signature = inspect.signature(function, eval_str=True)
    keywords = [parameter.replace(default=defaults.get(key, parameter.default))
                for key, parameter in signature.parameters.items() if key != "name"]
    return signature.replace(parameters=keywords)


def conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output extent of a convolution / pooling window (floor mode)."""
    out = (size + 2 * pad - kernel) // stride + 1
    if out < 1:
        raise ValueError(f"spatial size {size} too small for kernel {kernel}, stride {stride}")
    return out


def scale_channels(channels: int, width_multiplier: float) -> int:
    """Channel count scaled by a width multiplier (rounded, at least 1)."""
    if width_multiplier <= 0:
        raise ValueError("width_multiplier must be positive")
    return max(1, int(round(channels * width_multiplier)))


def area(hw: HW) -> int:
    return hw[0] * hw[1]


class Tally:
    """Accumulates forward FLOPs, parameters and saved elements of the ops inside one layer."""

    def __init__(self) -> None:
        self.flops = 0
        self.params = 0
        self.saved = 0

    # --- weighted ops -------------------------------------------------------------------------
    def conv(self, cin: int, cout: int, k: int, hw: HW, *, stride: int = 1, pad: int = 0,
             bias: bool = False, save_input: bool = True) -> HW:
        out = (conv_out(hw[0], k, stride, pad), conv_out(hw[1], k, stride, pad))
        self.flops += 2 * cin * k * k * cout * area(out)
        self.params += cin * k * k * cout + (cout if bias else 0)
        self.saved += cin * area(hw) if save_input else 0
        return out

    def linear(self, fin: int, fout: int, *, tokens: int = 1, bias: bool = True,
               save_input: bool = True, tied: bool = False) -> None:
        """Dense layer over `tokens` rows; a tied weight is not counted (its owner counts it)."""
        self.flops += 2 * fin * fout * tokens
        self.params += (0 if tied else fin * fout) + (fout if bias else 0)
        self.saved += fin * tokens if save_input else 0

    def embedding(self, rows: int, hidden: int, tokens: int, *, save_ids: bool = True) -> None:
        """Table lookup (no FLOPs); saves the `tokens` ids it gathered unless implicit."""
        self.params += rows * hidden
        self.saved += tokens if save_ids else 0

    def norm(self, channels: int, elements: int, *, save_input: bool = True) -> None:
        """BatchNorm or LayerNorm with affine weight and bias over `channels`."""
        self.flops += NORM_FLOPS * elements
        self.params += 2 * channels
        self.saved += elements if save_input else 0

    def rms_norm(self, channels: int, elements: int) -> None:
        """RMSNorm with a weight (no bias) over `channels`; saves its input."""
        self.flops += RMS_NORM_FLOPS * elements
        self.params += channels
        self.saved += elements

    # --- weight-free ops ----------------------------------------------------------------------
    def relu(self, elements: int, *, save_output: bool = True) -> None:
        self.flops += RELU_FLOPS * elements
        self.saved += elements if save_output else 0

    def gelu(self, elements: int) -> None:
        self.flops += GELU_FLOPS * elements
        self.saved += elements

    def swiglu(self, elements: int) -> None:
        """silu(gate) * up over `elements` outputs; saves both inputs (2 x elements)."""
        self.flops += SWIGLU_FLOPS * elements
        self.saved += 2 * elements

    def rotary(self, elements: int) -> None:
        """Rotary position embedding of Q or K: nothing saved (its backward is a rotation)."""
        self.flops += ROTARY_FLOPS * elements

    def add(self, elements: int) -> None:
        self.flops += ADD_FLOPS * elements

    def maxpool(self, channels: int, hw: HW, k: int, stride: int, pad: int = 0) -> HW:
        """Max pool; saves its int64 indices (its input is the preceding ReLU's saved output)."""
        out = (conv_out(hw[0], k, stride, pad), conv_out(hw[1], k, stride, pad))
        self.flops += k * k * channels * area(out)
        self.saved += channels * area(out)
        return out

    def avgpool(self, input_elements: int) -> None:
        """Global / adaptive average pool: one add per input element, nothing saved."""
        self.flops += input_elements

    def attention_core(self, seq: int, hidden: int, heads: int, kv_hidden: int | None = None,
                       keys: int | None = None) -> None:
        """Scores Q K^T, softmax, context P V for all heads over `keys` keys per query (default
        the full s x s, also when causal; a sliding window W: min(s, W), Jiang et al. 2023).

        Saves Q, K, V (s*h + 2*s*kv_hidden; kv_hidden = kv heads x head dim, h without grouped
        queries) and the softmax output (heads*s*keys)."""
        kv_hidden = hidden if kv_hidden is None else kv_hidden
        keys = seq if keys is None else min(seq, keys)
        self.flops += 2 * seq * keys * hidden  # Q K^T
        self.flops += SOFTMAX_FLOPS * heads * seq * keys
        self.flops += 2 * seq * keys * hidden  # P V
        self.saved += seq * hidden + 2 * seq * kv_hidden + heads * seq * keys

    # --- result -------------------------------------------------------------------------------
    def layer(self, name: str, kind: str, input_elements: int, output_elements: int,
              spec: Mapping[str, Any]) -> Layer:
        return make_layer(name, kind, self.flops, self.params, input_elements,
                          output_elements, self.saved, spec)


def make_layer(name: str, kind: str, forward_flops: float, params: int, input_elements: int,
               output_elements: int, saved: int, spec: Mapping[str, Any]) -> Layer:
    """Build a Layer; backward = 2x forward with weights, 1x without (module docstring)."""
    forward = float(forward_flops)
    backward = 2.0 * forward if params > 0 else forward
    return Layer(
        name=name,
        kind=kind,
        forward_flops_per_sample=forward,
        backward_flops_per_sample=backward,
        num_params=int(params),
        input_elements_per_sample=int(input_elements),
        output_elements_per_sample=int(output_elements),
        saved_elements_per_sample=int(saved),
        spec=dict(spec),
    )
