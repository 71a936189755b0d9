"""Compute costs: how long a layer's forward or backward pass takes on a device at a batch size.

Two implementations share the `CostModel` protocol: `AnalyticCosts` (a roofline over datasheet
figures, below) and the calibrated profile of the validator (`simulator.profile_costs`), measured
on real hardware. The engine calls `compute_s`, `optimizer_s`, `weight_pass_s` (asynchronous
pipelines) and `topk_s` (top-k compression), and reads two attributes: `communication` (None: the
engine's flow model prices messages; else an object with `p2p_s(size_bytes)`,
`collective_s(op, size_bytes, num_ranks)` and `message_overheads_s` (LogP's o_s, o_r): measured) and `shared_processors` (None: every
rank has its own device; else ranks share their host's processors, `simulator.host_sharing`).
"""

from __future__ import annotations

from typing import Protocol

from simulator.hardware import GpuSpec
from simulator.memory_activations import core_recompute_flops
from simulator.workload import Workload, dtype_bytes

FORWARD, BACKWARD = "F", "B"

DEFAULT_EFFICIENCY = {
    "conv": 0.50,
    "linear": 0.60,
    "attention": 0.50,
    "embedding": 0.30,
    "norm": 0.30,
    "pool": 0.30,
    "elementwise": 0.30,
}
"""Achieved fraction of dense peak FLOP/s per layer kind: a modelling assumption in the range
cuDNN/cuBLAS training kernels reach on large batches (Megatron-LM reports 40-52% of peak for whole
GPT models, Narayanan et al. SC'21, Table 1). Calibration profiles replace these numbers."""

OPTIMIZER_BYTES_PER_PARAM = {"sgd": 3 * 4, "momentum": 5 * 4, "adam": 7 * 4}
"""fp32 bytes moved per parameter by one update: SGD reads w and g and writes w; momentum also
reads and writes the velocity; Adam reads and writes two moments (Kingma & Ba 2015, Alg. 1)."""

WEIGHT_PASS_WORDS = {"stash": 2, "predict": 3, "repredict": 5, "accumulate": 3, "average": 2,
                     "fsdp_copy_out": 2, "fsdp_copy_in": 2, "fsdp_copy_in_upcast": 3, "fsdp_copy_in_downcast": 1.5}
"""Words moved per parameter by the per-micro-batch weight passes of asynchronous pipelines
(Compute phases of these names, `simulator.strategies.pipeline`): a stash copies the weights
(read w, write the copy: PipeDream, Narayanan et al. SOSP 2019); SpecTrain's prediction
W - s lr v reads w and v and writes the prediction (Chen et al., arXiv 1809.02839); its
staggered re-prediction before a backward ("repredict") also copies that prediction into the
weights the micro-batch's forward ran on (read it, write them: 3 + 2 words); the
accumulation of a micro-batch's weight gradient onto the live one reads both and writes one.
"average": with G > 1 replicas the reduced gradient sum is divided by G in place before the
update (as DDP averages), part of the update's time on replicated stages. PyTorch FSDP2
(`strategy.fsdp_version` 2, `simulator.strategies.zero`) copies on the compute stream: each gathered
unit out of the all-gather buffer into its parameters ("fsdp_copy_out", `split_with_sizes_copy`:
read and write the unit), and each unit's gradients into the reduce-scatter buffer in the reduce
dtype ("fsdp_copy_in", `_chunk_cat` in `foreach_reduce`: read the gradient, write it in the reduce
dtype: 16-bit to fp32 "upcast" 1 + 2 words, fp32 to 16-bit "downcast" 1 + 1/2)."""

TOPK_SELECTION_BYTES_PER_ELEMENT = 16
"""Bytes moved per gradient element by a top-k selection pass with error feedback: residual +=
gradient (read g and r, write r: 12 bytes in fp32) and a threshold filter over r (4 bytes), as in
Deep Gradient Compression (Lin et al., ICLR 2018); an assumption, see `simulator.sparse`."""


def compute_parts(model, layer_index: int, phase: str, batch: float) -> tuple[float, float]:
    """(device seconds, host seconds) of a layer's pass: the host issues the pass's kernels, the
    device runs them (`KernelCosts.compute_parts`); a model without the split runs on its device
    alone: (`compute_s`, 0)."""
    split = getattr(model, "compute_parts", None)
    return split(layer_index, phase, batch) if split is not None else (model.compute_s(layer_index, phase, batch), 0.0)


def pass_parts(model, phase: str, layer_start: int, layer_end: int, batch: float) -> tuple[float, float]:
    """(device seconds, host seconds) of one pass over layers [layer_start, layer_end): its layers'
    `compute_parts` summed."""
    device_s = host_s = 0.0
    for layer in range(layer_start, layer_end):
        layer_device_s, layer_host_s = compute_parts(model, layer, phase, batch)
        device_s, host_s = device_s + layer_device_s, host_s + layer_host_s
    return device_s, host_s


class CostModel(Protocol):
    communication: object | None
    """Measured point-to-point and collective times (`p2p_s`, `collective_s`), or None."""
    shared_processors: object | None
    """A `simulator.profile.SharedProcessors` when ranks share a host's processors, or None."""

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        """Seconds for layer `layer_index`'s forward ("F") or backward ("B") pass on `batch` samples."""

    def optimizer_s(self, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """Seconds for one optimizer update of `num_params` parameters (those of layers
        [start, end) when `layers` is given: a cost model may cost them per layer)."""

    def weight_pass_s(self, name: str, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """Seconds for one pass `name` ("stash", "predict", "repredict",
        "accumulate" or "average", `WEIGHT_PASS_WORDS`)
        over `num_params` weights (of layers [start, end) when given; only asynchronous pipeline
        plans and replicated updates call it)."""

    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        """Seconds for the top-k selection pass (error feedback + selection) over a gradient bucket
        of `num_elements` at density `density` (only plans with top-k compression call it)."""


class AnalyticCosts:
    """Roofline: max(FLOPs / (peak x efficiency), bytes moved / memory bandwidth).

    Williams, Waterman & Patterson, "Roofline", CACM 2009. Bytes moved: forward reads the input
    and weights and writes the output; backward reads the saved input, the output gradient and
    the weights, and writes the input gradient and the weight gradient. `recompute`
    "selective": a transformer block's backward also re-runs its attention core's forward FLOPs
    (`simulator.memory_activations.core_recompute_flops`, heads split over `tp_degree`).
    """

    communication = None
    shared_processors = None

    def __init__(self, workload: Workload, gpu: GpuSpec, dtype: str, optimizer: str,
                 efficiency: dict[str, float] | None = None, recompute: str = "none", tp_degree: int = 1):
        self.workload = workload
        self.recompute, self.tp_degree = recompute, tp_degree
        self.gpu = gpu
        self.dtype = dtype
        self.optimizer = optimizer
        self.efficiency = {**DEFAULT_EFFICIENCY, **(efficiency or {})}
        self._peak_flops_per_s = gpu.peak_for(dtype)
        self._element_bytes = dtype_bytes(dtype)

    def compute_s(self, layer_index: int, phase: str, batch: float) -> float:
        layer = self.workload.layers[layer_index]
        achieved = self._peak_flops_per_s * self.efficiency.get(layer.kind, 0.3)
        if phase == FORWARD:
            flops = layer.forward_flops_per_sample * batch
            elements = batch * (layer.input_elements_per_sample + layer.output_elements_per_sample)
            elements += layer.num_params
        else:
            flops = layer.backward_flops_per_sample * batch
            if self.recompute == "selective":
                flops += core_recompute_flops(layer, self.tp_degree) * batch
            elements = batch * (2 * layer.input_elements_per_sample + layer.output_elements_per_sample)
            elements += 2 * layer.num_params
        memory_s = elements * self._element_bytes / self.gpu.memory_bandwidth_bytes_per_s
        return max(flops / achieved, memory_s)

    def optimizer_s(self, num_params: int, layers: tuple[int, int] | None = None) -> float:
        bytes_moved = num_params * OPTIMIZER_BYTES_PER_PARAM[self.optimizer]
        return bytes_moved / self.gpu.memory_bandwidth_bytes_per_s

    def weight_pass_s(self, name: str, num_params: int, layers: tuple[int, int] | None = None) -> float:
        """Memory-bound: WEIGHT_PASS_WORDS[name] x num_params x element bytes / memory bandwidth
        (e.g. SpecTrain's prediction W_hat = W - s lr v reads W and v and writes W_hat: 3 words)."""
        return WEIGHT_PASS_WORDS[name] * num_params * self._element_bytes / self.gpu.memory_bandwidth_bytes_per_s

    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        """Memory-bound: num_elements x TOPK_SELECTION_BYTES_PER_ELEMENT / memory bandwidth
        (independent of the density: the selected writes are negligible)."""
        return num_elements * TOPK_SELECTION_BYTES_PER_ELEMENT / self.gpu.memory_bandwidth_bytes_per_s


def single_device_step_s(costs: CostModel, workload: Workload, batch: float) -> float:
    """One device running the whole model on the whole batch, as the plain sum of every layer's
    forward and backward `compute_s` and one update: the fallback baseline of "speedup" where the
    single device cannot be simulated (`simulator.simulate.single_device_baseline` simulates it)."""
    total = 0.0
    for index in range(workload.num_layers):
        total += costs.compute_s(index, FORWARD, batch) + costs.compute_s(index, BACKWARD, batch)
    return total + costs.optimizer_s(workload.num_params)


AUTO_FALLBACK_NOTE = ("auto: {gpu} ({family}) is not a GPU of a named family, so the roofline, with no host "
                      "time a kernel; --set costs.model=kernel uses Ampere's ratios (an assumption)")
"""What `costs.model: auto` says when it took the roofline (`simulator.simulate.analytic_costs`
picks the kernel model as `simulator.kernel_catalogue.kernel_model_chosen` says)."""


def describe_compute_model(costs, model_setting: str, gpu: GpuSpec, given: bool, kernel_profile: str | None = None) -> dict:
    """The summary's "compute_model": {"model": "kernel" | "analytic" | "profile", "parameters": the
    catalogue row used, "note": one line on why}. `model_setting`: the scenario's `costs.model`;
    `given`: the caller passed `costs` (`--profile`, a fit) rather than the scenario choosing them;
    `kernel_profile`: the scenario's `costs.kernel_profile`, whose parameters the kernel model took.
    Kernel parameters: `simulator.kernel_catalogue.ARCHITECTURES` (or a profile's); analytic: the
    roofline's efficiencies (`DEFAULT_EFFICIENCY` with `costs.efficiency`) over the datasheet peaks."""
    from dataclasses import asdict

    from simulator.kernel_catalogue import ARCHITECTURES, kernel_model_chosen
    family = (gpu.architecture or "unknown family").lower()
    if hasattr(costs, "parameters") and hasattr(costs, "architecture"):  # KernelCosts
        row = {key: value for key, value in asdict(costs.parameters).items() if key != "measured"}
        parameters = {"architecture": costs.architecture, **row,
                      "measured_tables": costs.parameters.measured is not None,
                      "source": ARCHITECTURES[costs.architecture].source}
        if given:
            note = "kernel model with a profile's parameters (--profile or a fit)"
        elif kernel_profile:
            note = f"kernel model with the parameters of costs.kernel_profile {kernel_profile}"
        elif costs.architecture == "generic":
            note = (f"costs.model {model_setting}: {gpu.name} ({family}) has no kernel figures, Ampere's ratios used "
                    "(an assumption)")
        else:
            note = f"costs.model {model_setting}: {costs.architecture} kernel figures"
        if costs.flash_attention:
            forward, backward = costs.device.flash_slowdown
            parameters["flash_attention_kernel"] = costs.flash_kernel
            note += (f"; flash attention {costs.flash_kernel}" + ("" if costs.flash_kernel == "flash2" else
                     f" ({forward:.3g}x / {backward:.3g}x FlashAttention-2's forward / backward time)"))
        parameters["gradient_accumulation_fusion"] = costs.gradient_accumulation_fusion
        if not costs.gradient_accumulation_fusion:
            note += "; no gradient accumulation fusion: each weight gradient added by a kernel of its own"
        return {"model": "kernel", "parameters": parameters, "note": note}
    if isinstance(costs, AnalyticCosts):
        parameters = {"efficiency": dict(costs.efficiency), "peak_flops_per_s": costs.gpu.peak_for(costs.dtype),
                      "memory_bandwidth_bytes_per_s": costs.gpu.memory_bandwidth_bytes_per_s}
        if model_setting == "auto" and not given and not kernel_model_chosen("auto", gpu):
            note = AUTO_FALLBACK_NOTE.format(gpu=gpu.name, family=family)
        else:
            note = f"costs.model {model_setting}"
        return {"model": "analytic", "parameters": parameters, "note": note}
    profile = getattr(costs, "profile", None)
    parameters = {"cost_model": type(costs).__name__, "source": getattr(profile, "source", None),
                  "world_size": getattr(profile, "world_size", None)}
    return {"model": "profile", "parameters": parameters, "note": "measured costs of a calibration profile (--profile)"}
