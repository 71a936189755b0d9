"""Forward-FLOP measurement of torch code under the analytic zoo's FLOP convention.

`ForwardFlopCounter` is a `TorchDispatchMode` that splits what runs under it into two parts:

* **GEMM FLOPs**: convolutions, mm/addmm/bmm/baddbmm and the fused attention kernels, counted
  with the rules of `torch.utils.flop_counter` (the registry `FlopCounterMode` uses; 1
  multiply-add = 2 FLOPs). Bias additions are folded into the GEMM, as in the zoo.
* **Elementwise FLOPs**: the per-element constants of `simulator/zoo/README.md`
  (`simulator.zoo._ops`): BatchNorm / LayerNorm / GroupNorm 5 per input element, ReLU 1,
  GELU 8, tensor + tensor add 1 per output element, softmax 5, max / average pool
  kernel-area per output element, global / adaptive average pool (`mean`,
  `adaptive_avg_pool2d`) 1 per input element; for the LLaMA family: tensor x tensor multiply
  1 per output element, `pow` 1 per output element, SiLU 5 (so RMSNorm's decomposition x^2,
  mean, x * rstd, * weight is the zoo's 4 per element, rotary's x cos + rotate_half(x) sin its
  3, SwiGLU's silu(gate) * up its 6). Any other op (views, copies, padding, slicing, negation,
  embedding lookups, multiplication by a scalar such as the attention scale, masking, dropout,
  per-row statistics such as RMSNorm's rsqrt) counts 0, as it does in the zoo (the softmax
  constant covers the scale and the mask).

GEMM + elementwise is then comparable to a zoo layer's `forward_flops_per_sample` x batch.
Works on the CPU and on meta tensors. `bucket` attributes counts to a key (the importer sets
it from module hooks to split one traced forward into layers).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Hashable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

NORM_FLOPS = 5
RELU_FLOPS = 1
GELU_FLOPS = 8
ADD_FLOPS = 1
SOFTMAX_FLOPS = 5
MUL_FLOPS = 1
POW_FLOPS = 1
SILU_FLOPS = 5
"""x * sigmoid(x): the zoo's SwiGLU 6 per output element less its gating multiply (Shazeer 2020)."""

_NORMS = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
          "_native_batch_norm_legit_functional", "native_layer_norm", "native_group_norm"}
_PER_OUTPUT = {"relu": RELU_FLOPS, "relu_": RELU_FLOPS, "gelu": GELU_FLOPS, "gelu_": GELU_FLOPS,
               "_softmax": SOFTMAX_FLOPS, "_safe_softmax": SOFTMAX_FLOPS, "silu": SILU_FLOPS,
               "silu_": SILU_FLOPS, "pow": POW_FLOPS}
_ADDS = {"add", "add_"}
_MULS = {"mul", "mul_"}
_WINDOW_POOLS = {"max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
                 "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
                 "avg_pool3d"}
_GLOBAL_POOLS = {"mean", "_adaptive_avg_pool2d", "adaptive_avg_pool2d", "_adaptive_avg_pool3d",
                 "adaptive_avg_pool1d"}
# Queries of tensor metadata that FlopCounterMode also lets through untouched.
_METADATA = {"is_contiguous", "sym_is_contiguous", "size", "sym_size", "stride", "sym_stride",
             "storage_offset", "sym_storage_offset", "numel", "sym_numel", "dim"}


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def elementwise_flops(name: str, args: tuple, out: Any) -> int:
    """Zoo-convention FLOPs of one aten op (by overload-packet name); 0 for ops not listed."""
    result = _first_tensor(out)
    if name in _NORMS:
        return NORM_FLOPS * args[0].numel()
    if name in _PER_OUTPUT:
        return _PER_OUTPUT[name] * (result.numel() if result is not None else 0)
    if name in _ADDS:
        # tensor + tensor only (not the `num_batches_tracked += 1` of BatchNorm, not scalars)
        if (len(args) >= 2 and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor)
                and result is not None and result.dim() > 0):
            return ADD_FLOPS * result.numel()
        return 0
    if name in _MULS:
        # tensor x tensor only (not a tensor scaled by a number such as the attention scale)
        if (len(args) >= 2 and all(isinstance(a, torch.Tensor) and a.dim() > 0 for a in args[:2])
                and result is not None):
            return MUL_FLOPS * result.numel()
        return 0
    if name in _WINDOW_POOLS:
        kernel = args[1]
        kernel = [kernel] if isinstance(kernel, int) else list(kernel)
        dims = int(name.split("pool")[1][0])  # "max_pool2d_with_indices" -> 2
        area = math.prod(kernel) if len(kernel) == dims else kernel[0] ** dims
        return area * (result.numel() if result is not None else 0)
    if name in _GLOBAL_POOLS:
        return args[0].numel() if isinstance(args[0], torch.Tensor) and args[0].is_floating_point() else 0
    return 0


class ForwardFlopCounter(TorchDispatchMode):
    """Counts GEMM FLOPs (torch's flop registry) and zoo-convention elementwise FLOPs.

    Use as a context manager; read `gemm`, `elementwise`, `total` (all buckets) or the per-bucket
    dicts `gemm_by_bucket` / `elementwise_by_bucket`."""

    def __init__(self) -> None:
        super().__init__()
        self.bucket: Hashable = None
        self.gemm_by_bucket: dict[Hashable, int] = defaultdict(int)
        self.elementwise_by_bucket: dict[Hashable, int] = defaultdict(int)

    @property
    def gemm(self) -> int:
        return sum(self.gemm_by_bucket.values())

    @property
    def elementwise(self) -> int:
        return sum(self.elementwise_by_bucket.values())

    @property
    def total(self) -> int:
        return self.gemm + self.elementwise

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        name = packet.__name__
        if name in _METADATA:
            return func(*args, **kwargs)
        if packet in flop_registry:
            out = func(*args, **kwargs)
            self.gemm_by_bucket[self.bucket] += int(flop_registry[packet](*args, **kwargs, out_val=out))
            return out
        flops_known = (name in _NORMS or name in _PER_OUTPUT or name in _ADDS or name in _MULS
                       or name in _WINDOW_POOLS or name in _GLOBAL_POOLS)
        if not flops_known and func is not torch.ops.prim.device.default:
            # like FlopCounterMode: a composite op may hide a GEMM; decompose it under this mode
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if flops_known:
            self.elementwise_by_bucket[self.bucket] += int(elementwise_flops(name, args, out))
        return out
