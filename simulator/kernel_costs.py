"""Kernel-level compute costs: a layer's pass = the sum of its kernels' times on one GPU.

Per kernel (`kernel_s`), with every knob in `simulator.kernel_catalogue.ARCHITECTURES` (one row
per GPU architecture family, each figure with its source) and nothing per model or configuration:

* GEMM-like (gemm, flash_attention): launch + max(compute, memory). Compute is tile / wave
  quantised: tiles = ceil(m / tile_m) ceil(n / tile_n) batch_count, waves = ceil(tiles / SMs),
  compute_s = waves x 2 tile_m tile_n k / (peak / SMs x efficiency) (the wave model of NVIDIA's
  "Matrix Multiplication Background User's Guide", sec. "Wave quantization"); a GPU without an SM
  count is costed without quantisation: FLOPs / (peak x efficiency). A GEMM whose feature
  dimensions miss cuBLAS's 16-byte alignment runs at no more than the misaligned ceiling
  (`KernelParameters.misaligned_gemm_efficiency`), where the catalogue or a profile has one.
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
from dataclasses import dataclass, replace

from simulator.costs import TOPK_SELECTION_BYTES_PER_ELEMENT, WEIGHT_PASS_WORDS
from simulator.errors import ScenarioError
from simulator.host_sharing import sm_sharing
from simulator.kernel_catalogue import (
    ARCHITECTURES,
    FLASH3_ARCHITECTURES,
    FLASH_KERNEL_SLOWDOWNS,
    KernelParameters,
    conv_algorithm,
    conv_dtype,
    gpu_architecture,
)
from simulator.kernel_ops import accumulation_fused
from simulator.kernel_tables import Axes, interpolate_log
from simulator.kernels_attention import FLASH_BACKWARD_KERNEL, core_recompute_kernels
from simulator.kernels_fp8 import check_fp8_workload
from simulator.kernels import (
    Kernel,
    layer_kernels,
    multi_tensor_launches,
    num_param_tensors,
    optimizer_kernels,
)
from simulator.memory_activations import is_block
from simulator.nccl import NCCL_DEFAULT_NUM_CHANNELS, collective_channels
from simulator.workload import Workload, dtype_bytes

BACKWARD, RECOMPUTE = "B", "R"
CONV_KINDS = frozenset({"conv_block", "basic_block", "bottleneck_block"})
"""Layer kinds made of cuDNN convolutions (`simulator.kernels_cnn`), priced in `conv_dtype`."""
RECOMPUTE_MODES = ("none", "selective", "full")
MEGATRON_VOCAB_MULTIPLE = 128
"""Megatron-LM pads the vocabulary to a multiple of `--make-vocab-size-divisible-by` (default 128) x
the tensor-parallel size (`_vocab_size_with_padding`, megatron/training/tokenizer/tokenizer.py):
its embedding and logits GEMMs see the padded size (GPT-2's 50,257 -> 50,304 at TP 1)."""

INPUT_GRADIENT_KERNELS = {"conv_block": "conv.dgrad", "fc": "fc.dgrad"}
"""The kernel computing a layer's input gradient, by spec kind. The model's first layer does not
launch it: its input, the data batch, needs no gradient, and autograd computes only the gradients
an input requires (PyTorch's `convolution_backward` and `addmm` backward take an output mask)."""


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
    flash_slowdown: tuple[float, float] = (1.0, 1.0)
    """The flash-attention implementation's forward and backward time over FlashAttention-2's
    (`simulator.kernel_catalogue.FLASH_KERNEL_SLOWDOWNS`)."""
    fp8: Device | None = None
    """The same GPU at its FP8 peak, for FP8 GEMMs (`training.fp8_recipe`, `simulator.kernels_fp8`)."""


def device_for(gpu, dtype: str, parameters: KernelParameters | None = None, flash_kernel: str = "flash2") -> Device:
    """A `Device` from a `GpuSpec` (or any object with its fields) and the architecture table;
    `flash_kernel`: the flash-attention implementation (`FLASH_KERNEL_SLOWDOWNS`)."""
    family = gpu_architecture(gpu)
    if flash_kernel == "flash3" and family not in FLASH3_ARCHITECTURES:
        raise ScenarioError(f"costs.flash_attention_kernel: 'flash3' runs on Hopper GPUs only "
                            f"(GPU {getattr(gpu, 'name', gpu)!r} is {family})")
    arch = ARCHITECTURES[family]
    parameters = parameters or arch.parameters_for(dtype)
    grid = parameters.measured.gemm_grid(dtype) if parameters.measured is not None else None
    return Device(gpu.peak_for(dtype), gpu.memory_bandwidth_bytes_per_s, gpu.num_sms, arch.tile_m,
                  arch.tile_n, arch.memory_latency_s, parameters, grid, FLASH_KERNEL_SLOWDOWNS[flash_kernel])


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
    if kernel.fp8 and device.fp8 is not None:
        device = device.fp8
    p = device.parameters
    moved = memory_s(kernel.bytes_moved, device)
    if kernel.kind == "gemm":
        efficiency = p.gemm_efficiency if device.gemm_grid is None else interpolate_log(
            *device.gemm_grid, (kernel.m * kernel.batch_count, kernel.n, kernel.k))
        if not kernel.aligned and p.misaligned_gemm_efficiency is not None:
            efficiency = min(efficiency, p.misaligned_gemm_efficiency)
        compute = tiled_compute_s(kernel.m, kernel.n, kernel.k, kernel.batch_count, device, efficiency,
                                  work_fraction=kernel.work_fraction)
    elif kernel.kind == "flash_attention":
        slowdown = device.flash_slowdown[kernel.name == FLASH_BACKWARD_KERNEL]  # < 1: faster, never past peak
        compute = tiled_compute_s(kernel.m, kernel.n, kernel.k, kernel.batch_count, device,
                                  min(1.0, p.flash_attention_efficiency / slowdown), tile_n=kernel.n,
                                  work_fraction=kernel.work_fraction, split_k=False)
    elif kernel.kind == "generic":
        compute = kernel.flops / (device.peak_flops_per_s * p.gemm_efficiency)
    else:
        compute = 0.0
    return p.launch_overhead_s + max(compute, moved)


def kernels_parts(kernels, device: Device) -> tuple[float, float]:
    """A pass (kernels in one stream): (the sum of its kernel times on the GPU, its kernels x the
    host's time to issue one, `host_overhead_s`)."""
    gpu_s, last, last_s = 0, None, 0.0
    for kernel in kernels:  # a multi-tensor pass repeats one kernel object: timed once
        if kernel is not last:
            last, last_s = kernel, kernel_s(kernel, device)
        gpu_s += last_s
    return gpu_s, len(kernels) * device.parameters.host_overhead_s


def kernels_s(kernels, device: Device) -> float:
    """A pass alone: max(GPU, host) of `kernels_parts`, the GPU running behind an asynchronous host
    that issues one kernel per `host_overhead_s` (the engine carries the host's lead from pass to
    pass instead: `simulator.engine`)."""
    return max(kernels_parts(kernels, device))


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
    for it, `simulator.memory_activations.recompute_ranges`). `parameters` replaces the architecture
    table's `KernelParameters`.
    `comm_sm_contention`: compute slows while a collective's NCCL kernels hold SMs on the same GPU
    (`shared_processors`, `simulator.host_sharing.sm_sharing`), `comm_channels` of them (NCCL's channel
    count on the node's link, `simulator.nccl.collective_channels`). `gradient_accumulation_fusion`
    False: each weight-gradient GEMM is followed by its main-gradient accumulation kernel.
    `vocab_multiple` > 1: vocabularies padded to a multiple of it x `tp_degree` (Megatron's
    `MEGATRON_VOCAB_MULTIPLE`; 1: the model's own size, as eager frameworks run it).
    `memory_format`: the convolutions' activation layout (`conv_algorithm`); `cudnn_allow_tf32`: fp32
    convolutions on TF32 tensor cores where the GPU has them (`conv_dtype`). `flash_kernel`: the
    flash-attention implementation (`simulator.kernel_catalogue.FLASH_KERNEL_SLOWDOWNS`)."""

    communication = None
    shared_processors = None

    def __init__(self, workload: Workload, gpu, dtype: str, optimizer: str, *, tp_degree: int = 1,
                 flash_attention: bool = False, sequence_parallel: bool = False, recompute: str = "none",
                 parameters: KernelParameters | None = None, comm_sm_contention: bool = True,
                 gradient_accumulation_fusion: bool = True, vocab_multiple: int = 1, memory_format: str = "nchw",
                 flash_kernel: str = "flash2", comm_channels: int = NCCL_DEFAULT_NUM_CHANNELS,
                 cudnn_allow_tf32: bool = True, fp8_recipe: str | None = None):
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
        self.vocab_multiple = vocab_multiple
        self.memory_format = memory_format
        self.flash_kernel = flash_kernel
        self.comm_channels = comm_channels
        self.cudnn_allow_tf32 = cudnn_allow_tf32
        self.fp8_recipe = fp8_recipe
        self.conv_dtype = conv_dtype(gpu, dtype, cudnn_allow_tf32)
        self.conv_algorithm = conv_algorithm(gpu, self.conv_dtype, memory_format)
        self.shared_processors = sm_sharing(gpu.num_sms, comm_channels) if comm_sm_contention else None
        self.architecture = gpu_architecture(gpu)
        self.device = device_for(gpu, dtype, parameters, flash_kernel)
        if fp8_recipe is not None:  # the same knobs at the FP8 peak (`simulator.kernels_fp8`)
            self.device = replace(self.device, fp8=device_for(gpu, "fp8", self.device.parameters, flash_kernel))
        self.parameters = self.device.parameters
        self._conv_options = ((self.conv_algorithm, self.device),)  # (cuDNN algorithm, device) pairs to try
        if self.conv_dtype == "tf32":  # TF32 tensor cores, or the fp32 algorithms (CUDA cores, Winograd)
            self._conv_options = tuple((conv_algorithm(gpu, math_dtype, memory_format), self.device if math_dtype == dtype else
                                        device_for(gpu, math_dtype, replace(self.parameters, gemm_efficiency=ARCHITECTURES[
                                            self.architecture].parameters_for(math_dtype).gemm_efficiency), flash_kernel))
                                       for math_dtype in ("tf32", "fp32"))
        self._choices: dict[tuple, tuple[tuple[Kernel, ...], Device]] = {}
        self._element_bytes = dtype_bytes(dtype)
        self._cache: dict[tuple, tuple[float, float]] = {}
        self._pass_cache: dict[tuple, tuple[float, float]] = {}

    @classmethod
    def for_scenario(cls, scenario, workload: Workload, parameters: KernelParameters | None = None) -> "KernelCosts":
        """The kernel model of a scenario's GPU, dtype, optimizer and cost switches (`costs.*`,
        `strategy.gradient_accumulation_fusion`); `parameters` replace the architecture's, and
        `costs.host_overhead_s` replaces theirs."""
        training, costs = scenario.training, scenario.costs
        check_fp8_workload(workload, training.fp8_recipe)
        if costs.host_overhead_s is not None:
            parameters = replace(parameters or device_for(scenario.cluster.gpu, training.dtype).parameters,
                                 host_overhead_s=costs.host_overhead_s)
        return cls(workload, scenario.cluster.gpu, training.dtype, training.optimizer,
                   flash_attention=costs.flash_attention, parameters=parameters,
                   recompute="selective" if training.recompute == "selective" else "none",
                   comm_sm_contention=costs.comm_sm_contention,
                   gradient_accumulation_fusion=accumulation_fused(
                       scenario.strategy.gradient_accumulation_fusion, scenario.strategy.kind, training.dtype),
                   vocab_multiple=MEGATRON_VOCAB_MULTIPLE if scenario.strategy.kind == "megatron" else 1,
                   memory_format=training.memory_format, flash_kernel=costs.flash_attention_kernel,
                   comm_channels=collective_channels(scenario.cluster.intra_node_link.kind),
                   cudnn_allow_tf32=training.cudnn_allow_tf32, fp8_recipe=training.fp8_recipe)

    def with_changes(self, **changes) -> "KernelCosts":
        """The same model with some constructor arguments replaced (another GPU, TP degree, ...)."""
        settings = {name: getattr(self, name) for name in (
            "workload", "gpu", "dtype", "optimizer", "tp_degree", "flash_attention", "sequence_parallel",
            "recompute", "parameters", "comm_sm_contention", "gradient_accumulation_fusion", "vocab_multiple",
            "memory_format", "flash_kernel", "comm_channels", "cudnn_allow_tf32", "fp8_recipe")}
        return KernelCosts(**(settings | changes))

    def with_tensor_parallel(self, tp_degree: int, sequence_parallel: bool) -> "KernelCosts":
        """The same model for one rank of a `tp_degree`-way tensor-parallel group."""
        if (tp_degree, sequence_parallel) == (self.tp_degree, self.sequence_parallel):
            return self
        return self.with_changes(tp_degree=tp_degree, sequence_parallel=sequence_parallel)

    def kernels(self, layer_index: int, phase: str, batch: float) -> tuple[Kernel, ...]:
        """The kernels of a pass; "B" with full recompute is the recompute forward + backward, with
        selective recompute a block's attention-core forward + backward. A convolution layer whose
        convolutions may run in TF32 (`conv_dtype`) takes the faster of that and its fp32 algorithms,
        as cudnn.benchmark's search does."""
        return self._pass(layer_index, phase, batch)[0]

    def _pass(self, layer_index: int, phase: str, batch: float) -> tuple[tuple[Kernel, ...], Device]:
        key = (layer_index, phase, batch)
        found = self._choices.get(key)
        if found is None:
            options = self._conv_options if self.workload.layers[layer_index].spec.get("kind") in CONV_KINDS \
                else ((self.conv_algorithm, self.device),)
            built = [(self._pass_kernels(layer_index, phase, batch, algorithm), device) for algorithm, device in options]
            found = self._choices[key] = min(built, key=lambda pair: max(self._parts(*pair)))
        return found

    def _pass_kernels(self, layer_index: int, phase: str, batch: float, algorithm: str) -> tuple[Kernel, ...]:
        if phase == BACKWARD and self.recompute == "full":
            return self._expand(layer_index, RECOMPUTE, batch, algorithm) + self._expand(layer_index, BACKWARD, batch, algorithm)
        layer = self.workload.layers[layer_index]
        if phase == BACKWARD and self.recompute == "selective" and is_block(layer) and batch > 0:
            core = core_recompute_kernels(layer.spec, batch, self._element_bytes, self.tp_degree,
                                          self.flash_attention)
            return tuple(core) + self._expand(layer_index, BACKWARD, batch, algorithm)
        return self._expand(layer_index, phase, batch, algorithm)

    def _expand(self, layer_index: int, phase: str, batch: float, algorithm: str) -> tuple[Kernel, ...]:
        layer = self.workload.layers[layer_index]
        vocab = layer.spec.get("vocab_size")
        if vocab and self.vocab_multiple > 1:
            multiple = self.vocab_multiple * self.tp_degree
            layer = replace(layer, spec={**layer.spec, "vocab_size": math.ceil(vocab / multiple) * multiple})
        kernels = layer_kernels(layer, phase, batch, dtype=self.dtype, tp_degree=self.tp_degree,
                                flash_attention=self.flash_attention, sequence_parallel=self.sequence_parallel,
                                gradient_accumulation_fusion=self.gradient_accumulation_fusion,
                                conv_algorithm=algorithm, fp8_recipe=self.fp8_recipe)
        skipped = INPUT_GRADIENT_KERNELS.get(layer.spec.get("kind")) if layer_index == 0 and phase == BACKWARD else None
        return kernels if skipped is None else tuple(  # the GEMM and its layout copies
            kernel for kernel in kernels if kernel.name != skipped and not kernel.name.startswith(f"{skipped}."))

    def compute_parts(self, layer_index: int, phase: str, batch: float) -> tuple[float, float]:
        """(GPU seconds, host seconds) of a pass (`kernels_parts`)."""
        key = (layer_index, phase, batch)
        if key not in self._cache:
            self._cache[key] = self._parts(*self._pass(layer_index, phase, batch))
        return self._cache[key]

    def _parts(self, kernels: tuple[Kernel, ...], device: Device) -> tuple[float, float]:
        key = (kernels, device is self.device)
        parts = self._pass_cache.get(key)
        if parts is None:  # identical blocks expand to equal kernels: timed once
            parts = self._pass_cache[key] = kernels_parts(kernels, device)
        return parts

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        """A pass alone: max(GPU, host) (`kernels_s`)."""
        return max(self.compute_parts(layer_index, phase, batch))

    def breakdown(self, layer_index: int, phase: str, batch: float) -> dict[str, float]:
        """GPU seconds of a pass per kernel kind, launch overheads apart (`time_breakdown`)."""
        return time_breakdown(*self._pass(layer_index, phase, batch))

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
        kernels = optimizer_kernels(self.optimizer, num_params, self._num_tensors(num_params, layers), self.dtype,
                                    self.fp8_recipe)
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
