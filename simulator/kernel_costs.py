"""Kernel-level compute costs: a layer's pass = the sum of its kernels' times on one GPU.

Per kernel (`kernel_s`), with every knob in `ARCHITECTURES` (one row per GPU architecture family,
each figure with its source) and nothing per model or configuration:

* GEMM-like (gemm, flash_attention): launch + max(compute, memory). Compute is tile / wave
  quantised: tiles = ceil(m / tile_m) ceil(n / tile_n) batch_count, waves = ceil(tiles / SMs),
  compute_s = waves x 2 tile_m tile_n k / (peak / SMs x efficiency) (the wave model of NVIDIA's
  "Matrix Multiplication Background User's Guide", sec. "Wave quantization"); a GPU without an SM
  count is costed without quantisation: FLOPs / (peak x efficiency).
* memory-bound (everything else): launch + bytes / bw(bytes), with the saturation curve
  bw(S) = B x S / (S + S_half), B = peak bandwidth x stream efficiency. S_half = latency x B is
  the bytes that must be in flight to cover the memory latency (Little's law), so the time is
  latency + S / B: a small kernel pays the latency, a large one streams at B.
* generic (a layer without kernel expansion): launch + max(FLOPs / (peak x GEMM efficiency),
  bytes / bw(bytes)), a roofline (Williams et al. 2009).

Measured tables (`MeasuredTables`, `ghpsim calibrate --kernels`) replace the GEMM ceiling and
bw(bytes) by interpolated measurements where present.

`KernelCosts` implements the `simulator.costs.CostModel` protocol on top of
`simulator.kernels.layer_kernels`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from simulator.costs import TOPK_SELECTION_BYTES_PER_ELEMENT, WEIGHT_PASS_WORDS
from simulator.host_sharing import sm_sharing
from simulator.kernel_tables import Axes, MeasuredTables, interpolate_log
from simulator.kernels_attention import core_recompute_kernels
from simulator.kernels import (
    Kernel,
    layer_kernels,
    multi_tensor_launches,
    num_param_tensors,
    optimizer_kernels,
)
from simulator.memory_activations import is_block
from simulator.workload import Workload, dtype_bytes

FORWARD, BACKWARD, RECOMPUTE = "F", "B", "R"
RECOMPUTE_MODES = ("none", "selective", "full")
TILED_KINDS = ("gemm", "flash_attention")

INPUT_GRADIENT_KERNELS = {"conv_block": "conv.dgrad", "fc": "fc.dgrad"}
"""The kernel computing a layer's input gradient, by spec kind. The model's first layer does not
launch it: its input, the data batch, needs no gradient, and autograd computes only the gradients
an input requires (PyTorch's `convolution_backward` and `addmm` backward take an output mask)."""


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

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "flash_attention_efficiency", "memory_efficiency"):
            value = getattr(self, name)
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

    def parameters_for(self, dtype: str) -> KernelParameters:
        """The catalogue's parameters for GEMMs in `dtype` (its own ceiling if the row has one)."""
        ceiling = self.gemm_efficiency_by_dtype.get(dtype)
        return self.parameters if ceiling is None else replace(self.parameters, gemm_efficiency=ceiling)


LAUNCH_OVERHEAD_S = 5e-6
LAUNCH_SOURCE = ("launch 5 us: NVIDIA, 'Getting Started with CUDA Graphs' (A. Gray, 2019): a 2.9 us kernel took "
                 "9.6 us per launch+sync on V100, i.e. ~6.7 us launch latency, 3.8 us when queued back to back; "
                 "5 us is the commonly quoted 3-7 us range's middle, one value for every CUDA family")
HOST_OVERHEAD_S = 52.5e-6
HOST_SOURCE = ("host 52.5 us a kernel: no vendor publishes a training framework's per-kernel host time, so it is "
               "the one parameter chosen on measurements, by 5-fold cross-validation (`ghpsim fit`) on 1,440 "
               "published Megatron-DeepSpeed iteration times on an 8xA100 node (Bang et al., vTrain, MICRO 2024): "
               "every fold chose 52.5 us, held-out MAPE 6.3 % against 25.4 % with none; eager PyTorch spends "
               "5-25 us of CPU per operator, more under a framework's module hooks; a host figure, used for every family")
LATENCY_SOURCE = ("memory latency 0.6 us: HBM load latency is several hundred ns on V100/A100/H100 (pointer-chase "
                  "microbenchmarks: Jia et al. 2018, arXiv:1804.06826; Abdelkhalik et al. 2022, arXiv:2208.11174); "
                  "an order-of-magnitude figure, the least certain entry here")
TILE_SOURCE = ("tile 128x128: the CTA tile of cuBLAS's usual 16-bit tensor-core GEMM kernels on Volta/Ampere/Hopper "
               "(kernel names ..._128x128_... e.g. ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn) and "
               "CUTLASS's SIMT default GemmShape<128, 128, 8>; CUTLASS's sm80 tensor-op default is 128x256x64")

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
               "an assumption); flash_attention_2 (328, 329 TFLOP/s) / 989.5 = 0.332; HBM triad H100 2.97/3.35, "
               f"H200 4.15/4.8, mean 0.876. {TILE_SOURCE}. {LATENCY_SOURCE}. {LAUNCH_SOURCE}. {HOST_SOURCE}"),
}
VOLTA_SGEMM_EFFICIENCY = 83 / 7 / 15.7  # Markidis et al.: tensor cores 83 TFLOP/s, 7x fp32 (of 15.7 peak)
ARCHITECTURES["volta"] = Architecture(128, 128, 0.6e-6, KernelParameters(
        gemm_efficiency=83 / 125, flash_attention_efficiency=83 / 125 * (179.5 / 256.5),
        memory_efficiency=1.70 / 2.039, launch_overhead_s=LAUNCH_OVERHEAD_S, host_overhead_s=HOST_OVERHEAD_S),
        source="V100-SXM2: cuBLAS mixed-precision GEMM 'up to 83 Tflops/s' of the 125 peak = 0.664 (Markidis et al., "
               "'NVIDIA Tensor Core Programmability, Performance & Precision', IPDPSW 2018), for the 16-bit dtypes; "
               "fp32 (and tf32, which Volta runs as fp32) on CUDA cores: the same paper's 83 / 7 = 11.9 of 15.7 = "
               "0.755; memory and flash-attention efficiencies: Ampere's ratios (HBM triad 0.834; flash / "
               "GEMM 0.70), assumptions, no Volta figure in the project's data (FlashAttention itself needs sm80+). "
               f"{TILE_SOURCE}. {LATENCY_SOURCE}. {LAUNCH_SOURCE}. {HOST_SOURCE}",
        gemm_efficiency_by_dtype={"fp32": VOLTA_SGEMM_EFFICIENCY, "tf32": VOLTA_SGEMM_EFFICIENCY})
ARCHITECTURES["generic"] = replace(
    ARCHITECTURES["ampere"],
    source="no published figures for this family in the project's data: Ampere's row is used (an assumption)")

def gpu_architecture(gpu) -> str:
    """The GPU's architecture family (`GpuSpec.architecture`) if it has a row here, else "generic"."""
    named = (gpu.architecture or "").lower()
    return named if named in ARCHITECTURES else "generic"


def has_kernel_tables(gpu) -> bool:
    """Whether the GPU's own family has measured figures here (what `costs.model: auto` asks)."""
    return (gpu.architecture or "").lower() in ARCHITECTURES and gpu.architecture.lower() != "generic"


@dataclass(frozen=True)
class Device:
    """What `kernel_s` needs of a GPU and a dtype."""

    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    num_sms: int | None
    tile_m: int
    tile_n: int
    memory_latency_s: float
    parameters: KernelParameters
    gemm_grid: tuple[Axes, tuple[float, ...]] | None = None
    """The measured GEMM tile efficiencies of this dtype (`MeasuredTables.gemm_grid`), or None."""


def device_for(gpu, dtype: str, parameters: KernelParameters | None = None) -> Device:
    """A `Device` from a `GpuSpec` (or any object with its fields) and the architecture table."""
    arch = ARCHITECTURES[gpu_architecture(gpu)]
    parameters = parameters or arch.parameters_for(dtype)
    grid = parameters.measured.gemm_grid(dtype) if parameters.measured is not None else None
    return Device(gpu.peak_for(dtype), gpu.memory_bandwidth_bytes_per_s, gpu.num_sms, arch.tile_m,
                  arch.tile_n, arch.memory_latency_s, parameters, grid)


# --- per-kernel times ---------------------------------------------------------------------------

def memory_s(size_bytes: float, device: Device) -> float:
    """bytes / bw(bytes) with bw(S) = B S / (S + latency B): latency + S / B (Little's law)."""
    if size_bytes <= 0:
        return 0.0
    measured = device.parameters.measured
    if measured is not None and measured.memory_sizes_bytes:
        return measured.stream_s(size_bytes, device.memory_bandwidth_bytes_per_s)
    stream = device.memory_bandwidth_bytes_per_s * device.parameters.memory_efficiency
    return device.memory_latency_s + size_bytes / stream


SPLIT_K_MIN_K = 256
"""The least reduction length one slice of a split-K GEMM keeps: four 64-deep main-loop
iterations of a 16-bit tensor-core tile (CUTLASS's split-K "parallel reduction" and cuBLAS's
heuristics split K when M x N gives fewer tiles than SMs, e.g. convolution weight gradients with
K = batch x H x W; Kerr et al., "CUTLASS", GTC 2018)."""


def tiled_compute_s(m: float, n: float, k: float, batch_count: float, device: Device, efficiency: float,
                    tile_n: float | None = None, work_fraction: float = 1.0, split_k: bool = True) -> float:
    """Wave-quantised GEMM time: ceil(tiles / SMs) waves of one tile's 2 tile_m tile_n k FLOPs at
    the per-SM peak x efficiency; where the tiles leave SMs idle and K is long, K is split into
    up to SMs / tiles slices of at least SPLIT_K_MIN_K (`SPLIT_K_MIN_K`). No SM count:
    2 m n k batch_count / (peak x efficiency)."""
    peak = device.peak_flops_per_s * efficiency
    if not device.num_sms:
        return 2.0 * m * n * k * batch_count * work_fraction / peak
    tile_m, tile_n = device.tile_m, tile_n or device.tile_n
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n) * math.ceil(batch_count)
    split = max(1, min(device.num_sms // tiles, int(k // SPLIT_K_MIN_K))) if split_k else 1
    waves = math.ceil(tiles * split / device.num_sms)
    return waves * 2.0 * tile_m * tile_n * (k / split) * work_fraction / (peak / device.num_sms)


def kernel_s(kernel: Kernel, device: Device) -> float:
    """Seconds for one kernel (module docstring; measured tables: `MeasuredTables`). Flash attention
    tiles are (tile_m queries x the whole head dimension n), one CTA per query block and head
    (Dao 2023, FlashAttention-2)."""
    p = device.parameters
    moved = memory_s(kernel.bytes_moved, device)
    if kernel.kind == "gemm":
        efficiency = p.gemm_efficiency if device.gemm_grid is None else interpolate_log(
            *device.gemm_grid, (kernel.m * kernel.batch_count, kernel.n, kernel.k))
        compute = tiled_compute_s(kernel.m, kernel.n, kernel.k, kernel.batch_count, device, efficiency,
                                  work_fraction=kernel.work_fraction)
    elif kernel.kind == "flash_attention":
        compute = tiled_compute_s(kernel.m, kernel.n, kernel.k, kernel.batch_count, device,
                                  p.flash_attention_efficiency, tile_n=kernel.n, work_fraction=kernel.work_fraction,
                                  split_k=False)
    elif kernel.kind == "generic":
        compute = kernel.flops / (device.peak_flops_per_s * p.gemm_efficiency)
    else:
        compute = 0.0
    return p.launch_overhead_s + max(compute, moved)


def kernels_s(kernels, device: Device) -> float:
    """A pass (kernels in one stream): max(sum of kernel times, kernels x host overhead), the GPU
    running behind an asynchronous host that issues one kernel per `host_overhead_s`."""
    gpu_s, last, last_s = 0, None, 0.0
    for kernel in kernels:  # a multi-tensor pass repeats one kernel object: timed once
        if kernel is not last:
            last, last_s = kernel, kernel_s(kernel, device)
        gpu_s += last_s
    return max(gpu_s, len(kernels) * device.parameters.host_overhead_s)


def time_breakdown(kernels, device: Device) -> dict[str, float]:
    """GPU seconds per kernel kind with the launch overheads apart (key "launch"); a host-bound
    pass (`kernels_s`) lasts longer than their sum."""
    shares: dict[str, float] = defaultdict(float)
    for kernel in kernels:
        shares["launch"] += device.parameters.launch_overhead_s
        shares[kernel.kind] += kernel_s(kernel, device) - device.parameters.launch_overhead_s
    return dict(shares)


# --- the cost model -----------------------------------------------------------------------------

class KernelCosts:
    """`CostModel` summing kernel times (`simulator.kernels`) on one GPU.

    `tp_degree`, `flash_attention`, `sequence_parallel`: how each layer is expanded (the costs
    of one tensor-parallel rank's share; `workload` is the whole model, not a rank's shard).
    `recompute="full"`: a layer's backward includes its recompute forward (activation
    checkpointing; Korthikanti et al. 2022), for plans that do not emit recompute actions
    themselves. `recompute="selective"`: a transformer block's backward includes its attention
    core's forward (`simulator.kernels_attention.core_recompute_kernels`; the plans emit no action
    for it, `simulator.strategies.ghp.recompute_ranges`). `parameters` replaces the architecture table's `KernelParameters`.
    `comm_sm_contention`: compute slows while a collective's NCCL kernels hold SMs on the same GPU
    (`shared_processors`, `simulator.host_sharing.sm_sharing`). `gradient_accumulation_fusion`
    False: each weight-gradient GEMM is followed by its fp32 main-gradient accumulation kernel."""

    communication = None
    shared_processors = None

    def __init__(self, workload: Workload, gpu, dtype: str, optimizer: str, *, tp_degree: int = 1,
                 flash_attention: bool = False, sequence_parallel: bool = False, recompute: str = "none",
                 parameters: KernelParameters | None = None, comm_sm_contention: bool = True,
                 gradient_accumulation_fusion: bool = True):
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute {recompute!r}: expected one of {', '.join(RECOMPUTE_MODES)}")
        self.workload = workload
        self.gpu = gpu
        self.dtype = dtype
        self.optimizer = optimizer
        self.tp_degree = tp_degree
        self.flash_attention = flash_attention
        self.sequence_parallel = sequence_parallel
        self.recompute = recompute
        self.comm_sm_contention = comm_sm_contention
        self.gradient_accumulation_fusion = gradient_accumulation_fusion
        self.shared_processors = sm_sharing(gpu.num_sms) if comm_sm_contention else None
        self.architecture = gpu_architecture(gpu)
        self.device = device_for(gpu, dtype, parameters)
        self.parameters = self.device.parameters
        self._element_bytes = dtype_bytes(dtype)
        self._cache: dict[tuple, float] = {}
        self._pass_cache: dict[tuple, float] = {}

    @classmethod
    def for_scenario(cls, scenario, workload: Workload, parameters: KernelParameters | None = None) -> "KernelCosts":
        """The kernel model of a scenario's GPU, dtype, optimizer and cost switches (`costs.*`,
        `strategy.gradient_accumulation_fusion`); `parameters` replace the architecture's, and
        `costs.host_overhead_s` replaces theirs."""
        training, costs = scenario.training, scenario.costs
        if costs.host_overhead_s is not None:
            parameters = replace(parameters or device_for(scenario.cluster.gpu, training.dtype).parameters,
                                 host_overhead_s=costs.host_overhead_s)
        return cls(workload, scenario.cluster.gpu, training.dtype, training.optimizer,
                   flash_attention=costs.flash_attention, parameters=parameters,
                   recompute="selective" if training.recompute == "selective" else "none",
                   comm_sm_contention=costs.comm_sm_contention,
                   gradient_accumulation_fusion=scenario.strategy.gradient_accumulation_fusion)

    def with_tensor_parallel(self, tp_degree: int, sequence_parallel: bool) -> "KernelCosts":
        """The same model for one rank of a `tp_degree`-way tensor-parallel group."""
        if (tp_degree, sequence_parallel) == (self.tp_degree, self.sequence_parallel):
            return self
        return KernelCosts(self.workload, self.gpu, self.dtype, self.optimizer, tp_degree=tp_degree,
                           flash_attention=self.flash_attention, sequence_parallel=sequence_parallel,
                           recompute=self.recompute, parameters=self.parameters, comm_sm_contention=self.comm_sm_contention,
                           gradient_accumulation_fusion=self.gradient_accumulation_fusion)

    def kernels(self, layer_index: int, phase: str, batch: float) -> tuple[Kernel, ...]:
        """The kernels of a pass; "B" with full recompute is the recompute forward + backward, with
        selective recompute a block's attention-core forward + backward."""
        if phase == BACKWARD and self.recompute == "full":
            return self._expand(layer_index, RECOMPUTE, batch) + self._expand(layer_index, BACKWARD, batch)
        layer = self.workload.layers[layer_index]
        if phase == BACKWARD and self.recompute == "selective" and is_block(layer) and batch > 0:
            core = core_recompute_kernels(layer.spec, batch, self._element_bytes, self.tp_degree,
                                          self.flash_attention)
            return tuple(core) + self._expand(layer_index, BACKWARD, batch)
        return self._expand(layer_index, phase, batch)

    def _expand(self, layer_index: int, phase: str, batch: float) -> tuple[Kernel, ...]:
        layer = self.workload.layers[layer_index]
        kernels = layer_kernels(layer, phase, batch, dtype=self.dtype, tp_degree=self.tp_degree,
                                flash_attention=self.flash_attention, sequence_parallel=self.sequence_parallel,
                                gradient_accumulation_fusion=self.gradient_accumulation_fusion)
        skipped = INPUT_GRADIENT_KERNELS.get(layer.spec.get("kind")) if layer_index == 0 and phase == BACKWARD else None
        return kernels if skipped is None else tuple(kernel for kernel in kernels if kernel.name != skipped)

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        key = (layer_index, phase, batch)
        if key not in self._cache:
            kernels = self.kernels(layer_index, phase, batch)
            seconds = self._pass_cache.get(kernels)
            if seconds is None:  # identical blocks expand to equal kernels: timed once
                seconds = self._pass_cache[kernels] = kernels_s(kernels, self.device)
            self._cache[key] = seconds
        return self._cache[key]

    def breakdown(self, layer_index: int, phase: str, batch: float) -> dict[str, float]:
        """GPU seconds of a pass per kernel kind, launch overheads apart (`time_breakdown`)."""
        return time_breakdown(self.kernels(layer_index, phase, batch), self.device)

    def _num_tensors(self, num_params: float, layers: tuple[int, int] | None) -> int:
        if layers is not None:
            return max(1, sum(num_param_tensors(layer) for layer in self.workload.layers[layers[0]:layers[1]]))
        total = sum(num_param_tensors(layer) for layer in self.workload.layers)
        share = num_params / self.workload.num_params if self.workload.num_params else 1.0
        return max(1, math.ceil(total * share))

    def optimizer_s(self, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """Fused multi-tensor update kernels (`simulator.kernels.optimizer_kernels`)."""
        if num_params <= 0:
            return 0.0
        kernels = optimizer_kernels(self.optimizer, num_params, self._num_tensors(num_params, layers), self.dtype)
        return kernels_s(kernels, self.device)

    def weight_pass_s(self, name: str, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """WEIGHT_PASS_WORDS[name] x num_params words in the model dtype, as multi-tensor launches."""
        if num_params <= 0:
            return 0.0
        words = WEIGHT_PASS_WORDS[name]
        launches = multi_tensor_launches(num_params, self._num_tensors(num_params, layers), words)
        per_launch = Kernel(name, "optimizer", 0.0, words * num_params * self._element_bytes / launches, 0.0)
        return launches * kernel_s(per_launch, self.device)

    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        """Error feedback (one elementwise kernel) + threshold selection (one kernel), together
        TOPK_SELECTION_BYTES_PER_ELEMENT bytes per element (`simulator.costs`)."""
        if num_elements <= 0:
            return 0.0
        feedback = Kernel("topk.error_feedback", "elementwise", num_elements, 8 * num_elements, 4 * num_elements)
        select = Kernel("topk.select", "reduction", 0.0,
                        (TOPK_SELECTION_BYTES_PER_ELEMENT - 12) * num_elements, 0.0)
        return kernels_s((feedback, select), self.device)
