"""The kernel model's hardware catalogue: `KernelParameters` (the physical knobs `ghpsim fit` and
`ghpsim calibrate --kernels` may replace) and one `Architecture` row per GPU family, every figure
with its source. `simulator.kernel_costs` prices kernels with them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from simulator.kernel_tables import MeasuredTables

ALIGNMENT_BYTES = 16
"""cuBLAS's tensor-core GEMM kernels read their operands in 16-byte vectors: a matrix whose
leading dimension is not a multiple of 16 bytes (8 fp16/bf16 or 4 fp32 elements) gets a slower
kernel (cuBLAS documentation, "Tensor Core Usage": the 16-byte alignment conditions; NVIDIA
"Matrix Multiplication Background User's Guide", "Tensor Core Requirements"). On an H200 under
cuBLAS 13 such a GEMM ran as a Turing-era `cutlass_75_..._align1` kernel (reports/gpu/h200_kernels)."""


def gemm_aligned(element_bytes: int, *features: float) -> bool:
    """Whether a GEMM whose leading dimensions are `features` meets `ALIGNMENT_BYTES`."""
    step = max(1, ALIGNMENT_BYTES // element_bytes)
    return all(float(size) % step == 0 for size in features)


@dataclass(frozen=True)
class KernelParameters:
    """The physical knobs of the kernel model (what `ghpsim fit` may fit), per architecture."""

    gemm_efficiency: float
    """Fraction of the per-SM dense peak a full GEMM tile sustains (large-GEMM ceiling)."""
    flash_attention_efficiency: float
    """The same for a flash-attention tile (query block x head dim)."""
    memory_efficiency: float
    """Fraction of the datasheet memory bandwidth a large streaming kernel reaches."""
    launch_overhead_s: float
    """Per-kernel launch + scheduling time added to every kernel on the GPU."""
    host_overhead_s: float = 0.0
    """Host (framework + driver) time to issue one kernel: a pass lasts at least its kernel count
    x this (the GPU idles when the host issues slower than it executes). 0 is the GPU-bound limit;
    the table rows carry `HOST_OVERHEAD_S`, `costs.host_overhead_s` or a fit replaces it."""
    measured: MeasuredTables | None = None
    """Not fitted: the tables of `ghpsim calibrate --kernels`, used in place of gemm_efficiency and
    memory_efficiency where they cover a kernel (`MeasuredTables`)."""
    misaligned_gemm_efficiency: float | None = None
    """The ceiling (tile efficiency) of a GEMM whose feature dimensions miss `ALIGNMENT_BYTES`, as
    `ghpsim calibrate --kernels` measures it; None: no figure, such a GEMM is priced as aligned."""

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "flash_attention_efficiency", "memory_efficiency",
                     "misaligned_gemm_efficiency"):
            value = getattr(self, name)
            if value is None and name == "misaligned_gemm_efficiency":
                continue
            if not 0 < value <= 1:
                raise ValueError(f"KernelParameters.{name}: {value!r} must be in (0, 1]")
        for name in ("launch_overhead_s", "host_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"KernelParameters.{name}: {getattr(self, name)!r} must be >= 0")


@dataclass(frozen=True)
class Architecture:
    """Structural figures of a GPU family (not fitted) and its default `KernelParameters`."""

    tile_m: int
    tile_n: int
    memory_latency_s: float
    parameters: KernelParameters
    source: str
    gemm_efficiency_by_dtype: Mapping[str, float] = field(default_factory=dict)
    """A dtype's own sourced GEMM ceiling (CUDA-core fp32); the others take `parameters`'."""
    misaligned_gemm_efficiency_by_dtype: Mapping[str, float] = field(default_factory=dict)
    """A dtype's measured misaligned-GEMM ceiling (`KernelParameters.misaligned_gemm_efficiency`)."""

    def parameters_for(self, dtype: str) -> KernelParameters:
        """The catalogue's parameters for GEMMs in `dtype` (its own ceilings where the row has them)."""
        ceiling = self.gemm_efficiency_by_dtype.get(dtype, self.parameters.gemm_efficiency)
        misaligned = self.misaligned_gemm_efficiency_by_dtype.get(dtype, self.parameters.misaligned_gemm_efficiency)
        return replace(self.parameters, gemm_efficiency=ceiling, misaligned_gemm_efficiency=misaligned)


LAUNCH_OVERHEAD_S = 5e-6
LAUNCH_SOURCE = ("launch 5 us: NVIDIA, 'Getting Started with CUDA Graphs' (A. Gray, 2019): a 2.9 us kernel took "
                 "9.6 us per launch+sync on V100, i.e. ~6.7 us launch latency, 3.8 us when queued back to back; "
                 "5 us is the commonly quoted 3-7 us range's middle, one value for every CUDA family")
HOST_OVERHEAD_S = 55e-6
MAX_HOST_OVERHEAD_S = 1e-2
"""Largest host (or launch) time per kernel a scenario (`costs.host_overhead_s`) or kernel profile may give."""
HOST_SOURCE = ("host 55 us a kernel: no vendor publishes a training framework's per-kernel host time, so it is "
               "the one parameter chosen on measurements, by 5-fold cross-validation (`ghpsim fit`) on 1,440 "
               "published Megatron-DeepSpeed iteration times on an 8xA100 node (Bang et al., vTrain, MICRO 2024), "
               "with the engine's asynchronous host: every fold chose 55 us, held-out MAPE 6.9 % against 24.3 % "
               "with none; host-bound eager PyTorch steps on an H200 spent 42-45 us a kernel "
               "(reports/gpu/h200_kernels); a host figure, used for every family")
LATENCY_SOURCE = ("memory latency 0.6 us: HBM load latency is several hundred ns on V100/A100/H100 (pointer-chase "
                  "microbenchmarks: Jia et al. 2018, arXiv:1804.06826; Abdelkhalik et al. 2022, arXiv:2208.11174); "
                  "an order-of-magnitude figure, the least certain entry here")
TILE_SOURCE = ("tile 128x128: the CTA tile of cuBLAS's usual 16-bit tensor-core GEMM kernels on Volta/Ampere/Hopper "
               "(kernel names ..._128x128_... e.g. ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn) and "
               "CUTLASS's SIMT default GemmShape<128, 128, 8>; CUTLASS's sm80 tensor-op default is 128x256x64")

FLASH_KERNEL_SLOWDOWNS: dict[str, tuple[float, float]] = {
    "flash2": (1.0, 1.0), "flash1": (2.0, 2.0), "xformers": (2.0, 2.0), "triton": (1.4, 2.0),
    "flash3": (1 / 1.75, 1 / 1.625)}
"""Time of a flash-attention implementation's forward and backward kernels relative to
FlashAttention-2's CUDA kernels, whose rate the catalogue's `flash_attention_efficiency` is
(`costs.flash_attention_kernel`). Dao, "FlashAttention-2", ICLR 2024, sec. 4.1 (A100):
FlashAttention-2 is "around 2x faster than FlashAttention and FlashAttention in xformers (the
'cutlass' implementation)" (`flash1`, `xformers`) and "around 1.3-1.5x faster than FlashAttention
in Triton in the forward pass and around 2x faster in the backward pass" (`triton`: flash-attn's
`flash_attn_triton.py`, LLM Foundry's `attn_impl: triton`; 1.4, the range's middle). Shah et al.,
"FlashAttention-3", NeurIPS 2024, sec. 4.1 (H100, 16-bit): FlashAttention-3 is "around 1.5-2.0x
faster than FlashAttention-2 in the forward pass and 1.5-1.75x faster in the backward pass"
(`flash3`, the ranges' middles; Hopper only, `FLASH3_ARCHITECTURES`). One figure for every family
the kernel runs on."""
FLASH3_ARCHITECTURES = ("hopper",)
"""FlashAttention-3 uses Hopper's WGMMA and TMA instructions: it runs on sm90 only."""


def check_flash_kernel(costs) -> None:
    """A scenario's `costs` section: an implementation other than FlashAttention-2 needs the fused kernel on."""
    if costs.flash_attention_kernel != "flash2" and not costs.flash_attention:
        raise ValueError(f"costs.flash_attention_kernel: {costs.flash_attention_kernel!r} needs costs.flash_attention: true")

HOPPER_MISALIGNED_SOURCE = (
    "misaligned-GEMM ceilings (an odd n or k) bf16 0.147, fp16 0.148, fp32 0.774: `ghpsim calibrate --kernels` on "
    "an H200 (torch 2.11, CUDA 13.0; reports/gpu/h200_kernels/kernel_profile.json), the median of four 8192 x "
    "8191/8192 x 1023-4096 shapes, the same GH100 chip as the H100-SXM; no published figure")

ARCHITECTURES: dict[str, Architecture] = {
    "ampere": Architecture(128, 128, 0.6e-6, KernelParameters(
        gemm_efficiency=256.5 / 312, flash_attention_efficiency=179.5 / 312,
        memory_efficiency=1.70 / 2.039, launch_overhead_s=LAUNCH_OVERHEAD_S, host_overhead_s=HOST_OVERHEAD_S),
        source="A100-SXM4-80GB, data/published/gpu_microbenchmarks.csv (Azure AI-benchmarking-guide): cuBLASLt "
               "fp16 GEMM 16384^3 256.5 TFLOP/s / 312 = 0.822; flash_attention_2 179.5 / 312 = 0.575; HBM triad "
               f"1.70 TB/s / 2.039 = 0.834. {TILE_SOURCE}. {LATENCY_SOURCE}. {LAUNCH_SOURCE}. {HOST_SOURCE}"),
    "hopper": Architecture(128, 128, 0.6e-6, KernelParameters(
        gemm_efficiency=1377.3 / 1979, flash_attention_efficiency=(327.9 + 329.3) / 2 / 989.5,
        memory_efficiency=(2.97 / 3.35 + 4.15 / 4.8) / 2, launch_overhead_s=LAUNCH_OVERHEAD_S,
        host_overhead_s=HOST_OVERHEAD_S),
        source="H100-SXM / H200, data/published/gpu_microbenchmarks.csv: cuBLASLt GEMM 16384^3 1377.3 TFLOP/s "
               "/ 1979 = 0.696, measured in FP8 only (no 16-bit figure published there: applied to every dtype, "
               f"an assumption); {HOPPER_MISALIGNED_SOURCE}; flash_attention_2 (328, 329 TFLOP/s) / 989.5 = 0.332; HBM triad H100 "
               f"2.97/3.35, H200 4.15/4.8, mean 0.876. {TILE_SOURCE}. {LATENCY_SOURCE}. {LAUNCH_SOURCE}. {HOST_SOURCE}",
        misaligned_gemm_efficiency_by_dtype={"bf16": 0.147, "fp16": 0.148, "fp32": 0.774}),
}
VOLTA_GEMM_EFFICIENCY, VOLTA_SGEMM_EFFICIENCY = 95 / 125, 14 / 15.7
"""V100: PyTorch's matmul of 8192 x 8192 matrices (cuBLAS) at 95 TFLOP/s in fp16 on the tensor cores and
14 in fp32 on the CUDA cores, of 125 and 15.7 (`VOLTA_SOURCE`)."""
VOLTA_MEMORY_EFFICIENCY = 0.098e12 * 8 / 900e9
"""V100: an element-wise multiply of fp32 vectors at 0.098 TFLOP/s, 8 bytes an element: 784 GB/s of 900."""
VOLTA_SOURCE = ("V100 16 GB, mli/transformers-benchmarks (README, micro-benchmark table; NGC PyTorch 22.07, CUDA "
                "11.7): square matmul up to 8192 at 95 TFLOP/s fp16 of 125 = 0.760 and 14 fp32 of 15.7 = 0.892 (fp32, and "
                "tf32, which Volta runs as fp32, on CUDA cores), vector multiply 784 GB/s of 900 = 0.871; flash "
                "attention: Ampere's flash / GEMM ratio 0.70, an assumption (FlashAttention itself needs sm80+). "
                "These replace Markidis et al. 2018's cuBLAS of CUDA 9 (83 TFLOP/s fp16, 11.9 fp32)")
ARCHITECTURES["volta"] = Architecture(128, 128, 0.6e-6, KernelParameters(
        gemm_efficiency=VOLTA_GEMM_EFFICIENCY, flash_attention_efficiency=VOLTA_GEMM_EFFICIENCY * (179.5 / 256.5),
        memory_efficiency=VOLTA_MEMORY_EFFICIENCY, launch_overhead_s=LAUNCH_OVERHEAD_S, host_overhead_s=HOST_OVERHEAD_S),
        source=f"{VOLTA_SOURCE}. {TILE_SOURCE}. {LATENCY_SOURCE}. {LAUNCH_SOURCE}. {HOST_SOURCE}",
        gemm_efficiency_by_dtype={"fp32": VOLTA_SGEMM_EFFICIENCY, "tf32": VOLTA_SGEMM_EFFICIENCY})
ARCHITECTURES["generic"] = replace(
    ARCHITECTURES["ampere"],
    source="no published figures for this family in the project's data: Ampere's row is used (an assumption)")

CUDNN_ARCHITECTURES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
"""NVIDIA families of the kernel model, whose convolutions are cuDNN's (`conv_algorithm`)."""
WINOGRAD_MULTIPLY_SAVING = 36 / 16
"""Winograd F(2x2, 3x3): a 2 x 2 output tile of a 3 x 3 convolution costs 16 multiplies instead of 36
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016)."""


def conv_algorithm(gpu, dtype: str, memory_format: str) -> str:
    """How cuDNN runs a model's convolutions (`simulator.kernels_cnn.conv`):
    - `implicit_gemm_nchw`: `dtype` on tensor cores (its dense peak above fp32's) with NCHW
      activations: tensor-core convolutions run in NHWC, so cuDNN copies each call's activations in
      and out of NHWC (NVIDIA Deep Learning Performance documentation, "Convolutional Layers User's
      Guide", tensor layouts; PyTorch's channels_last, `memory_format: nhwc`, avoids the copies);
    - `winograd`: on CUDA cores, a 3 x 3 stride-1 convolution runs cuDNN's Winograd algorithms
      (CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, BWD_DATA_ALGO_WINOGRAD, BWD_FILTER_ALGO_WINOGRAD_NONFUSED:
      3 x 3 filters, stride 1), the fastest there, so what cudnn.benchmark's search picks; priced as
      F(2x2, 3x3) at the GEMM ceiling (`WINOGRAD_MULTIPLY_SAVING`);
    - `implicit_gemm`: otherwise (NHWC on tensor cores, a non-cuDNN family)."""
    if (gpu.architecture or "").lower() not in CUDNN_ARCHITECTURES:
        return "implicit_gemm"
    try:
        tensor_cores = gpu.peak_for(dtype) > gpu.peak_for("fp32")
    except KeyError:
        return "implicit_gemm"
    if not tensor_cores:
        return "winograd"
    return "implicit_gemm_nchw" if memory_format == "nchw" else "implicit_gemm"


def conv_dtype(gpu, dtype: str, allow_tf32: bool = True) -> str:
    """The dtype a model's convolutions compute in: `dtype`, except fp32 on a cuDNN family whose TF32
    rate is above its fp32 one (Ampere and later), where PyTorch lets cuDNN run them on TF32 tensor
    cores by default (`torch.backends.cudnn.allow_tf32 = True`; PyTorch docs, "TensorFloat-32 (TF32)
    on Ampere (and later) devices"; its matmuls default to fp32, `torch.backends.cuda.matmul.allow_tf32`)."""
    if dtype != "fp32" or not allow_tf32 or (gpu.architecture or "").lower() not in CUDNN_ARCHITECTURES:
        return dtype
    try:
        return "tf32" if gpu.peak_for("tf32") > gpu.peak_for("fp32") else dtype
    except KeyError:
        return dtype


def gpu_architecture(gpu) -> str:
    """The GPU's architecture family (`GpuSpec.architecture`) if it has a row here, else "generic"."""
    named = (gpu.architecture or "").lower()
    return named if named in ARCHITECTURES else "generic"


def kernel_model_chosen(setting: str, gpu) -> bool:
    """Whether `costs.model` `setting` prices `gpu` with the kernel model: `kernel` always; `auto` for
    every GPU of a named family, its own row or the generic one (Ampere's ratios, an assumption), so
    that GPUs compare on one model; the roofline for CPUs and specs of no named family."""
    family = (gpu.architecture or "").lower()
    return setting == "kernel" or (setting == "auto" and family not in ("", "cpu"))
