"""The kernel record and its constructors (GEMMs, pointwise kernels, LayerNorm, dropout), shared by
the layer expansions of `simulator.kernels` and `simulator.kernels_cnn`; conventions there."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.kernel_catalogue import gemm_aligned
from simulator.zoo._ops import ADD_FLOPS, NORM_FLOPS, RMS_NORM_FLOPS

PHASES = ("F", "B", "R")
DEFAULT_DROPOUT = 0.1
"""Megatron-LM `--hidden-dropout` / `--attention-dropout` defaults (megatron/arguments.py)."""
MASK_BYTES = 1
INDEX_BYTES = 8  # int64 token ids and max-pool indices
STATS_BYTES = 4  # fp32 per-row statistics (LayerNorm mean / rstd, softmax-loss sums)
MAIN_GRAD_BYTES = 4  # Megatron's fp32 main gradient buffer (DistributedDataParallel grad buffer)


@dataclass(frozen=True)
class Kernel:
    """One kernel launch: FLOPs executed and bytes moved to/from device memory.

    GEMM-like kernels also carry C[m, n] = A[m, k] B[k, n] repeated `batch_count` times;
    `work_fraction` is the share of its tiles a kernel runs (causal flash attention skips the
    tiles above the diagonal: 1/2)."""

    name: str
    kind: str
    flops: float
    bytes_read: float
    bytes_written: float
    m: float = 0.0
    n: float = 0.0
    k: float = 0.0
    batch_count: float = 1.0
    work_fraction: float = 1.0
    aligned: bool = True
    """GEMMs: whether its operands' leading dimensions meet cuBLAS's 16-byte alignment
    (`simulator.kernel_catalogue.ALIGNMENT_BYTES`)."""
    fp8: bool = False
    """GEMMs: FP8 operands at the GPU's FP8 peak (`simulator.kernels_fp8`)."""

    @property
    def bytes_moved(self) -> float:
        return self.bytes_read + self.bytes_written


# --- constructors -------------------------------------------------------------------------------

def gemm(name: str, m: float, n: float, k: float, e: int, *, batch_count: float = 1.0,
         aligned: bool = True) -> Kernel:
    """C[m, n] = A[m, k] B[k, n], `batch_count` times: 2mnk FLOPs each; reads A, B, writes C."""
    return Kernel(name, "gemm", 2.0 * m * n * k * batch_count, (m * k + k * n) * e * batch_count,
                  m * n * e * batch_count, m, n, k, batch_count, aligned=aligned)


def pointwise(name: str, kind: str, elements: float, read_bytes: float, write_bytes: float,
              flops: float = 0.0) -> Kernel:
    """A memory-bound kernel over `elements`: bytes read / written and FLOPs per element."""
    return Kernel(name, kind, flops * elements, read_bytes * elements, write_bytes * elements)


def linear(name: str, m: float, n: float, k: float, e: int, phase: str, *,
           bias_grad: bool = False, input_grad: bool = True) -> list[Kernel]:
    """y[m, n] = x[m, k] W[n, k]^T (bias in the cuBLASLt epilogue). Backward: dx = dy W
    (m, k, n), dW = dy^T x (n, k, m), and db = sum of dy over m (a reduction kernel). The
    leading dimensions of all three are the features n and k (m, the tokens, never is): when
    either misses 16 bytes, all three are misaligned (`simulator.kernel_catalogue.gemm_aligned`)."""
    aligned = gemm_aligned(e, n, k)
    if phase != "B":
        return [gemm(name, m, n, k, e, aligned=aligned)]
    kernels = [gemm(f"{name}.dgrad", m, k, n, e, aligned=aligned)] if input_grad else []
    kernels.append(gemm(f"{name}.wgrad", n, k, m, e, aligned=aligned))
    if bias_grad:
        kernels.append(Kernel(f"{name}.bias_grad", "reduction", 0.0, m * n * e, n * e))
    return kernels


def layer_norm(name: str, rows: float, width: int, e: int, phase: str) -> list[Kernel]:
    """apex fused LayerNorm over `rows` x `width`: one forward kernel (saves fp32 mean / rstd);
    backward = cuComputePartGradGammaBeta + cuComputeGradGammaBeta + cuComputeGradInput."""
    elements = rows * width
    if phase != "B":
        return [Kernel(name, "norm", NORM_FLOPS * elements, elements * e + 2 * width * e,
                       elements * e + 2 * rows * STATS_BYTES)]
    return [Kernel(f"{name}.grad_params_partial", "reduction", 0.0, 2 * elements * e, 0.0),
            Kernel(f"{name}.grad_params", "reduction", 0.0, 0.0, 2 * width * e),
            Kernel(f"{name}.grad_input", "norm", NORM_FLOPS * elements,
                   2 * elements * e + 2 * rows * STATS_BYTES, elements * e)]


def rms_norm(name: str, rows: float, width: int, e: int, phase: str) -> list[Kernel]:
    """Fused RMSNorm (Zhang & Sennrich 2019; apex FusedRMSNorm / Transformer Engine) over `rows` x
    `width`: one forward kernel (saves the fp32 rstd); backward as `layer_norm` with one
    parameter vector (the weight, no bias)."""
    elements = rows * width
    if phase != "B":
        return [Kernel(name, "norm", RMS_NORM_FLOPS * elements, elements * e + width * e,
                       elements * e + rows * STATS_BYTES)]
    return [Kernel(f"{name}.grad_params_partial", "reduction", 0.0, 2 * elements * e, 0.0),
            Kernel(f"{name}.grad_params", "reduction", 0.0, 0.0, width * e),
            Kernel(f"{name}.grad_input", "norm", RMS_NORM_FLOPS * elements,
                   2 * elements * e + rows * STATS_BYTES, elements * e)]


def dropout(name: str, elements: float, e: int, phase: str) -> Kernel:
    """Forward writes output + bool mask; backward reads the gradient and the mask."""
    if phase != "B":
        return pointwise(name, "elementwise", elements, e, e + MASK_BYTES)
    return pointwise(f"{name}.bwd", "elementwise", elements, e + MASK_BYTES, e)


def copy(name: str, elements: float, e: int) -> Kernel:
    """A layout change (permute / transpose + contiguous): read and write every element once."""
    return pointwise(name, "copy", elements, e, e)


def add(name: str, elements: float, e: int) -> Kernel:
    """Residual add, or the gradient accumulation where a tensor fed two consumers."""
    return pointwise(name, "elementwise", elements, 2 * e, e, ADD_FLOPS)


def main_grad_bytes(dtype: str, e: int) -> int:
    """Bytes of a main-gradient element: fp32 under bf16 (Megatron-LM `arguments.py` forces
    `accumulate_allreduce_grads_in_fp32` for bf16), else the model dtype's `e` (fp16 gradients
    accumulate in fp16, as `simulator.zero_config.gradient_element_bytes` reduces them)."""
    return MAIN_GRAD_BYTES if dtype == "bf16" else e


def accumulation_fused(setting: bool | None, kind: str, dtype: str) -> bool:
    """Whether weight-gradient GEMMs accumulate into the main gradient themselves
    (`strategy.gradient_accumulation_fusion`; None: as the framework does). Megatron (kind
    megatron) fuses only into fp32 main gradients: `arguments.py` turns `--gradient-accumulation-fusion`
    off unless `accumulate_allreduce_grads_in_fp32`, which it sets for bf16 alone, so fp16 and fp32
    training add each micro-batch's gradient in a kernel of its own. Every other kind adds none:
    autograd writes a step's first gradient straight into `.grad` (its in-place adds for later
    micro-batches of a pipeline are not priced)."""
    if setting is not None:
        return setting
    return kind != "megatron" or dtype == "bf16"


def main_grad_accumulate(wgrad: Kernel, e: int, main_e: int) -> Kernel:
    """Without gradient accumulation fusion, the weight-gradient GEMM writes a model-dtype gradient
    and Megatron DDP's parameter hook adds it into the main gradient, `param.main_grad.add_(param.grad.data)`:
    one kernel per weight per micro-batch over its m x n elements, reading `main_e` + e bytes and
    writing `main_e` per element (`main_grad_bytes`; with fusion the GEMM accumulates into
    main_grad itself: Megatron's `wgrad_gemm_accum_fp32`)."""
    return pointwise(f"{wgrad.name}.accumulate", "elementwise", wgrad.m * wgrad.n, main_e + e, main_e, ADD_FLOPS)


def unfused_accumulation(kernels, e: int, main_e: int) -> list[Kernel]:
    """`kernels` with each weight-gradient GEMM ("*.wgrad", linear and convolution) followed by
    its main-gradient accumulation kernel (`main_grad_accumulate`)."""
    out = []
    for kernel in kernels:
        out.append(kernel)
        if kernel.kind == "gemm" and kernel.name.endswith(".wgrad"):
            out.append(main_grad_accumulate(kernel, e, main_e))
    return out
