"""Kernel cost model (simulator/kernel_costs.py): closed forms of the wave-quantised GEMM, the
saturating memory bandwidth and the launch overhead; published cuBLAS figures; the CostModel
protocol of `KernelCosts`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from simulator.errors import ScenarioError
from simulator.hardware import GPUS, GpuSpec
from simulator.heterogeneity import _costs_for_gpu as costs_for_gpu
from simulator.kernel_catalogue import (ARCHITECTURES, HOST_OVERHEAD_S, KernelParameters, conv_algorithm,
                                        gpu_architecture)
from simulator.kernel_costs import (
    Device,
    KernelCosts,
    device_for,
    kernel_s,
    kernels_s,
    memory_s,
    tiled_compute_s,
)
from simulator.kernel_ops import gemm
from simulator.kernels import Kernel, layer_kernels, optimizer_kernels
from simulator.scenario import scenario_from_dict
from simulator.workload import Workload
from simulator.zoo import build_model
from simulator.zoo.transformer import transformer_block

A100 = GPUS["A100-80GB"]
AMPERE = ARCHITECTURES["ampere"].parameters
GPU_BOUND = replace(AMPERE, host_overhead_s=0.0)
"""The kernel model with a host that never holds the GPU back: the GPU-side times alone."""


@dataclass(frozen=True)
class FutureGpu:
    """A GpuSpec with the fields hardware.py is gaining (architecture, num_sms)."""

    name: str = "future"
    peak_flops_per_s: dict = field(default_factory=lambda: {"fp16": 1e15})
    memory_bandwidth_bytes_per_s: float = 4e12
    architecture: str = "hopper"
    num_sms: int = 100

    def peak_for(self, dtype: str) -> float:
        return self.peak_flops_per_s[dtype]


def a100(**overrides) -> Device:
    return replace(device_for(A100, "fp16"), **overrides)


def no_launch(device: Device) -> Device:
    return replace(device, parameters=replace(device.parameters, launch_overhead_s=0.0))


# --- GEMM: tiles and waves ----------------------------------------------------------------------

def test_one_tile_more_than_a_full_wave_doubles_the_compute_time():
    device = a100()  # 108 SMs, 128 x 128 tiles
    full = tiled_compute_s(128 * 12, 128 * 9, 4096, 1, device, AMPERE.gemm_efficiency)   # 108 tiles
    spill = tiled_compute_s(128 * 12 + 1, 128 * 9, 4096, 1, device, AMPERE.gemm_efficiency)
    assert spill == pytest.approx(2 * full)
    per_sm = device.peak_flops_per_s / 108 * AMPERE.gemm_efficiency
    assert full == pytest.approx(2 * 128 * 128 * 4096 / per_sm)


def test_batched_gemm_tiles_multiply_by_the_batch_count():
    device = a100()
    one = tiled_compute_s(128, 128, 64, 108, device, 0.8)
    assert tiled_compute_s(128, 128, 64, 109, device, 0.8) == pytest.approx(2 * one)


def test_a_huge_gemm_approaches_peak_times_the_ceiling():
    device = no_launch(a100())
    n = 32768
    achieved = 2 * n**3 / kernel_s(gemm("big", n, n, n, 2), device)
    assert achieved == pytest.approx(312e12 * AMPERE.gemm_efficiency, rel=0.01)


def test_without_an_sm_count_a_gemm_is_not_quantised():
    device = a100(num_sms=None)
    assert tiled_compute_s(129, 129, 1000, 1, device, 0.5) == pytest.approx(2 * 129 * 129 * 1000 / (312e12 * 0.5))


@pytest.mark.parametrize("m, n, k, published_tflops", [
    (8192, 8192, 8192, 253.7), (16384, 16384, 16384, 256.5), (6144, 12288, 12288, 250.8), (4096, 4096, 4096, 228.0)])
def test_a100_fp16_gemm_throughput_matches_published_cublaslt(m, n, k, published_tflops):
    """Azure AI-benchmarking-guide cuBLASLt figures (data/published/gpu_microbenchmarks.csv); the
    small cubes (1024^3: 119.4, 2048^3: 221.8 TFLOP/s) come out at -6 % and -14 %."""
    seconds = kernel_s(gemm("g", m, n, k, 2), a100())
    assert 2 * m * n * k / seconds / 1e12 == pytest.approx(published_tflops, rel=0.06)


# --- memory-bound kernels, launch overhead -------------------------------------------------------

def test_a_tiny_kernel_costs_about_the_launch_overhead():
    tiny = Kernel("tiny", "elementwise", 1024, 2048, 2048)
    seconds = kernel_s(tiny, a100())
    assert AMPERE.launch_overhead_s < seconds < 1.2 * AMPERE.launch_overhead_s


def test_a_large_stream_approaches_bandwidth_times_stream_efficiency():
    size = 20e9
    stream = A100.memory_bandwidth_bytes_per_s * AMPERE.memory_efficiency
    assert kernel_s(Kernel("copy", "copy", 0, size / 2, size / 2), a100()) == pytest.approx(size / stream, rel=1e-3)


def test_memory_time_is_latency_plus_streaming_littles_law():
    device = a100()
    stream = device.memory_bandwidth_bytes_per_s * device.parameters.memory_efficiency
    half = device.memory_latency_s * stream  # bytes in flight at half the bandwidth
    assert half / memory_s(half, device) == pytest.approx(stream / 2)
    assert memory_s(0, device) == 0.0


def test_gemm_time_is_the_larger_of_compute_and_memory():
    device = no_launch(a100())
    skinny = gemm("gemv-like", 65536, 8, 65536, 2)  # 8 GB of A, almost no FLOPs per byte
    assert kernel_s(skinny, device) == pytest.approx(memory_s(skinny.bytes_moved, device))


def test_a_pass_is_host_bound_when_the_host_issues_slower_than_the_gpu_runs():
    tiny = [Kernel("t", "elementwise", 0, 64, 64)] * 10
    device = a100()
    assert device.parameters.host_overhead_s == HOST_OVERHEAD_S > kernel_s(tiny[0], device)
    assert kernels_s(tiny, device) == pytest.approx(10 * HOST_OVERHEAD_S)
    gpu_bound = replace(device, parameters=replace(device.parameters, host_overhead_s=0.0))
    assert kernels_s(tiny, gpu_bound) == pytest.approx(10 * kernel_s(tiny[0], device))


def test_costs_host_overhead_s_replaces_the_catalogue_figure_on_every_gpu_of_the_cluster():
    document = {"cluster": {"num_nodes": 2, "gpus_per_node": 1, "gpu": "A100-80GB", "node_gpus": {1: "H100-SXM"}},
                "model": {"name": "resnet50"}, "training": {"global_batch_size": 8, "dtype": "fp16"}}
    default = KernelCosts.for_scenario(scenario_from_dict(document), build_model("resnet50"))
    assert default.parameters.host_overhead_s == HOST_OVERHEAD_S
    document["costs"] = {"host_overhead_s": 0}
    scenario = scenario_from_dict(document)
    costs = KernelCosts.for_scenario(scenario, build_model("resnet50"))
    assert costs.parameters.host_overhead_s == 0.0
    assert costs_for_gpu(costs, scenario.cluster.node_gpus[1]).parameters.host_overhead_s == 0.0
    assert costs.compute_s(0, "F", 1) < default.compute_s(0, "F", 1)
    document["costs"] = {"host_overhead_s": -1e-6}
    with pytest.raises(ScenarioError, match=r"costs.host_overhead_s: .*greater than or equal to 0"):
        scenario_from_dict(document)


# --- parameters and architectures ----------------------------------------------------------------

def test_presets_resolve_to_their_architecture_and_sm_count():
    assert (gpu_architecture(A100), A100.num_sms) == ("ampere", 108)
    assert (gpu_architecture(GPUS["H200"]), GPUS["H200"].num_sms) == ("hopper", 132)
    custom = GpuSpec(peak_flops_per_s={"fp16": 1e14}, memory_bytes=1e10, memory_bandwidth_bytes_per_s=1e12)
    assert (gpu_architecture(custom), custom.num_sms) == ("generic", None)


def test_the_gpus_own_fields_win():
    device = device_for(FutureGpu(), "fp16")
    assert device.num_sms == 100
    assert device.parameters == ARCHITECTURES["hopper"].parameters_for("fp16")


def test_every_architecture_row_names_its_sources():
    for name, arch in ARCHITECTURES.items():
        assert len(arch.source) > 80, name
        assert 0 < arch.parameters.gemm_efficiency <= 1
        assert all(0 < value <= 1 for value in arch.gemm_efficiency_by_dtype.values()), name


def test_volta_fp32_gemms_take_the_cuda_core_ceiling_and_16_bit_ones_the_tensor_core_one():
    v100 = GPUS["V100"]  # PyTorch's 8192^3 matmul on a V100: 95 TFLOP/s on tensor cores, 14 in fp32
    assert device_for(v100, "fp16").parameters.gemm_efficiency == pytest.approx(95 / 125)
    assert device_for(v100, "fp32").parameters.gemm_efficiency == pytest.approx(14 / 15.7)
    assert device_for(v100, "tf32").parameters == device_for(v100, "fp32").parameters  # no TF32 on Volta
    fp32 = device_for(v100, "fp32")
    big = gemm("g", 80 * 128, 8192, 8192, 4)  # whole waves of 128 x 128 tiles on 80 SMs
    assert big.flops / (kernel_s(big, fp32) - fp32.parameters.launch_overhead_s) == pytest.approx(14e12)
    fitted = replace(ARCHITECTURES["volta"].parameters, gemm_efficiency=0.6)  # a fit or a profile wins
    assert device_for(v100, "fp32", fitted).parameters.gemm_efficiency == 0.6
    assert device_for(A100, "fp32").parameters == ARCHITECTURES["ampere"].parameters  # no fp32 figure there


def test_parameters_are_validated():
    with pytest.raises(ValueError, match="gemm_efficiency"):
        replace(AMPERE, gemm_efficiency=1.5)
    with pytest.raises(ValueError, match="launch_overhead_s"):
        KernelParameters(0.8, 0.5, 0.8, -1.0)


# --- KernelCosts ----------------------------------------------------------------------------------------

def gpt_block_workload(hidden=768, heads=12, seq=1024) -> Workload:
    return Workload("one-block", (transformer_block("b", hidden, heads, seq, 4 * hidden, causal=True, pre_norm=True),))


def test_costs_follow_the_cost_model_protocol():
    costs = KernelCosts(build_model("gpt2-small"), A100, "fp16", "adam")
    assert costs.communication is None  # the engine's flow model prices messages
    assert costs.shared_processors.per_device  # NCCL's kernels take SMs (tests/test_overlap_sm_contention.py)
    assert costs.compute_s(1, "B", 4) > costs.compute_s(1, "F", 4) > 0
    assert costs.compute_s(1, "F", 0) == 0.0
    assert costs.optimizer_s(124_439_808) > 0 and costs.optimizer_s(0) == 0.0
    assert costs.weight_pass_s("stash", 1_000_000) > 0
    assert costs.topk_s(1e6, 0.01) > 0


def test_full_recompute_puts_the_forward_into_the_backward():
    workload = gpt_block_workload()
    plain = KernelCosts(workload, A100, "fp16", "adam")
    recompute = KernelCosts(workload, A100, "fp16", "adam", recompute="full")
    assert recompute.compute_s(0, "F", 2) == plain.compute_s(0, "F", 2)
    assert recompute.compute_s(0, "B", 2) == pytest.approx(plain.compute_s(0, "B", 2) + plain.compute_s(0, "F", 2))
    with pytest.raises(ValueError, match="recompute 'partial'"):
        KernelCosts(workload, A100, "fp16", "adam", recompute="partial")


def test_compute_s_is_the_sum_of_its_kernels_when_the_host_keeps_up():
    workload = gpt_block_workload()
    costs = KernelCosts(workload, A100, "fp16", "adam", tp_degree=2, parameters=GPU_BOUND)
    expected = sum(kernel_s(k, costs.device) for k in layer_kernels(workload.layers[0], "B", 2, dtype="fp16",
                                                                      tp_degree=2))
    assert costs.compute_s(0, "B", 2) == pytest.approx(expected)


def test_small_blocks_pay_launch_overhead_and_large_ones_run_gemms():
    """GPT-2-size block (h 768, 12 heads, s 1024) on A100, forward + backward."""
    costs = KernelCosts(gpt_block_workload(), A100, "fp16", "adam")

    def shares(batch):
        total: dict[str, float] = {}
        for phase in "FB":
            for kind, seconds in costs.breakdown(0, phase, batch).items():
                total[kind] = total.get(kind, 0.0) + seconds
        return {kind: seconds / sum(total.values()) for kind, seconds in total.items()}

    assert shares(1)["launch"] > 0.2
    assert shares(8)["gemm"] > 0.5 and shares(8)["launch"] < 0.1


def test_more_tensor_parallelism_is_less_than_proportionally_faster():
    """Quantisation and launches do not shrink with tp: 8-way TP is far from 8x faster."""
    workload = gpt_block_workload(1024, 16)
    time = {tp: KernelCosts(workload, A100, "fp16", "adam", tp_degree=tp, parameters=GPU_BOUND).compute_s(0, "F", 1)
            for tp in (1, 8)}
    assert time[1] / 8 < time[8] < time[1]


def test_parameters_override_the_table():
    workload = gpt_block_workload()
    default = KernelCosts(workload, A100, "fp16", "adam", parameters=GPU_BOUND)
    slow = KernelCosts(workload, A100, "fp16", "adam", parameters=replace(GPU_BOUND, launch_overhead_s=1e-3))
    kernel_count = len(default.kernels(0, "F", 1))
    assert slow.compute_s(0, "F", 1) - default.compute_s(0, "F", 1) == pytest.approx(
        kernel_count * (1e-3 - AMPERE.launch_overhead_s))


def test_optimizer_step_is_memory_bound_over_fp32_state():
    """Adam with fp32 master weights in fp16 training: zero grads 4, unscale 8, norm 4, Adam 28,
    copy to fp16 params 6 bytes per parameter, streamed, plus each launch's fixed cost."""
    workload = build_model("gpt2-small")
    costs = KernelCosts(workload, A100, "fp16", "adam")
    params = 1_000_000_000
    launches = len(optimizer_kernels("adam", params, costs._num_tensors(params, None), "fp16"))
    stream = A100.memory_bandwidth_bytes_per_s * AMPERE.memory_efficiency
    fixed = ARCHITECTURES["ampere"].memory_latency_s + AMPERE.launch_overhead_s
    assert costs.optimizer_s(params) == pytest.approx(50 * params / stream + launches * fixed)
    assert 100 < launches < 300  # ~48 launches of 320 chunks of 65536 elements per pass


@pytest.mark.parametrize("model", ["resnet50", "mlp"])
def test_the_first_layer_computes_no_gradient_for_the_data(model):
    """Autograd skips the input gradient of a layer whose input needs none: the model's first layer
    launches its weight gradient only; the next layer (which could start a pipeline stage) both."""
    workload = build_model(model)
    costs = KernelCosts(workload, A100, "fp16", "momentum", parameters=GPU_BOUND)
    names = [kernel.name for kernel in costs.kernels(0, "B", 8)]
    assert not any(".dgrad" in name for name in names) and any(name.endswith(".wgrad") for name in names)
    assert any(kernel.name.endswith(".dgrad") for kernel in costs.kernels(1, "B", 8))
    expanded = layer_kernels(workload.layers[0], "B", 8, dtype="fp16", conv_algorithm=costs.conv_algorithm)
    dgrad = [k for k in expanded if ".dgrad" in k.name]  # the GEMM, and on NCHW tensor cores its layout copies
    assert len(dgrad) == (3 if costs.conv_algorithm == "implicit_gemm_nchw" and model == "resnet50" else 1)
    assert costs.compute_s(0, "B", 8) == pytest.approx(  # the expansion has them; layer 0 drops them
        sum(kernel_s(k, costs.device) for k in expanded if k not in dgrad))


@pytest.mark.parametrize("gpu, dtype, memory_format, algorithm", [
    ("A100-80GB", "fp16", "nchw", "implicit_gemm_nchw"), ("A100-80GB", "tf32", "nchw", "implicit_gemm_nchw"),
    ("A100-80GB", "bf16", "nhwc", "implicit_gemm"), ("A100-80GB", "fp32", "nchw", "winograd"),  # CUDA cores
    ("V100", "fp16", "nchw", "implicit_gemm_nchw"), ("V100", "tf32", "nhwc", "winograd"),  # Volta: tf32 as fp32
    ("P100-SXM2", "fp32", "nchw", "implicit_gemm"), ("cpu", "fp16", "nchw", "implicit_gemm"),
    ("MI300X", "bf16", "nchw", "implicit_gemm"),  # not cuDNN
])
def test_cudnn_convolution_algorithm_by_gpu_dtype_and_layout(gpu, dtype, memory_format, algorithm):
    assert conv_algorithm(GPUS[gpu], dtype, memory_format) == algorithm


def test_a_scenarios_memory_format_reaches_the_convolutions_and_its_heterogeneous_devices():
    document = {"cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100"},
                "model": {"name": "resnet50"}, "strategy": {"kind": "dp"},
                "training": {"global_batch_size": 64, "dtype": "fp16", "optimizer": "momentum"}}
    workload = build_model("resnet50")
    nchw = KernelCosts.for_scenario(scenario_from_dict(document), workload)
    channels_last = KernelCosts.for_scenario(
        scenario_from_dict({**document, "training": {**document["training"], "memory_format": "nhwc"}}), workload)
    assert (nchw.conv_algorithm, channels_last.conv_algorithm) == ("implicit_gemm_nchw", "implicit_gemm")
    assert nchw.compute_s(4, "F", 32) > 1.2 * channels_last.compute_s(4, "F", 32)  # memory-bound copies of fp16 maps
    assert costs_for_gpu(nchw, GPUS["H100-SXM"]).conv_algorithm == "implicit_gemm_nchw"
    assert costs_for_gpu(channels_last, GPUS["H100-SXM"]).conv_algorithm == "implicit_gemm"
    assert nchw.with_tensor_parallel(2, False).memory_format == "nchw"
    with pytest.raises(Exception, match="memory_format"):
        scenario_from_dict({**document, "training": {**document["training"], "memory_format": "chw"}})


@pytest.mark.parametrize("gpu, faster", [("A100-80GB", True), ("H100-SXM", True), ("V100", False), ("L4", False)])
def test_fp32_convolutions_take_tf32_where_pytorch_lets_cudnn_and_it_is_faster(gpu, faster):
    """PyTorch's `cudnn.allow_tf32` defaults to True: fp32 convolutions on Ampere and later may run on
    TF32 tensor cores; each conv layer's pass takes the faster of that and the fp32 algorithms (as
    cudnn.benchmark picks), so the default is never slower than `cudnn_allow_tf32: false`, and on a
    GPU without TF32 (Volta) or where Winograd on CUDA cores wins (L4's 300 GB/s) they are equal."""
    document = {"cluster": {"num_nodes": 1, "gpus_per_node": 1, "gpu": gpu}, "model": {"name": "resnet50"},
                "strategy": {"kind": "dp"}, "training": {"global_batch_size": 64, "dtype": "fp32", "optimizer": "momentum"}}
    workload = build_model("resnet50")
    allowed = KernelCosts.for_scenario(scenario_from_dict(document), workload)
    strict = KernelCosts.for_scenario(scenario_from_dict(
        {**document, "training": {**document["training"], "cudnn_allow_tf32": False}}), workload)
    assert allowed.conv_dtype == ("tf32" if gpu != "V100" else "fp32") and strict.conv_dtype == "fp32"
    passes = [(i, phase) for i in range(len(workload.layers)) for phase in ("F", "B")]
    default_s, strict_s = (sum(costs.compute_s(i, phase, 256) for i, phase in passes) for costs in (allowed, strict))
    assert default_s < 0.8 * strict_s if faster else default_s == pytest.approx(strict_s)
    assert all(allowed.compute_s(i, phase, 256) <= strict.compute_s(i, phase, 256) for i, phase in passes)
    classifier = len(workload.layers) - 1  # the fc layer's matmul stays fp32 (`matmul.allow_tf32` is False)
    assert allowed.compute_s(classifier, "F", 256) == strict.compute_s(classifier, "F", 256)
    assert allowed.with_tensor_parallel(2, False).cudnn_allow_tf32 and not strict.with_tensor_parallel(2, False).cudnn_allow_tf32
