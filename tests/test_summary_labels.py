"""What `ghpsim simulate` prints means what it says: "speedup over one device" is against the same
engine's single device (1.0x on a one-GPU cluster), a "bubble" is idle time waiting for work with
exposed communication apart, "in flight" counts micro-batches (chunk passes apart), and the summary
names the compute model and why `costs.model: auto` chose it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator.costs import describe_compute_model, single_device_step_s
from simulator.errors import ScenarioError
from simulator.kernel_catalogue import HOST_OVERHEAD_S
from simulator.scenario import load_scenario
from simulator.simulate import simulate, single_device_scenario
from simulator.tables import device_noun, fabric_label, kernel_pass_line
from simulator.units import format_seconds

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "scenarios" / "small_fast_dp_wins.yaml"
LLAMA_70B = ROOT / "scenarios" / "llama3_70b_fsdp_h100.yaml"
LLAMA_8B = ROOT / "scenarios" / "llama3_8b_dgx_h100.yaml"
GPT2_3D = ROOT / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"
VGG_PIPELINE = ROOT / "scenarios" / "pipeline_vgg16_1f1b_pcie.yaml"
RESNET50 = ROOT / "scenarios" / "resnet50_dp_a100.yaml"
DEMO = ROOT / "scenarios" / "demo.yaml"
MLP_CPU = ROOT / "scenarios" / "validation" / "mlp_cpu.yaml"
ONE_GPU = ["cluster.num_nodes=1", "cluster.gpus_per_node=1", "cluster.nics_per_node=1"]


def _summary(path, *overrides):
    return simulate(load_scenario(path, list(overrides))).summary


def _printed(capsys, path, *overrides) -> str:
    assert main(["simulate", str(path), *[item for value in overrides for item in ("--set", value)]]) == 0
    return capsys.readouterr().out


# ----------------------------------------------------------------------------- speedup baseline

@pytest.mark.parametrize("path, overrides", [(SMALL, ONE_GPU[1:2]), (LLAMA_70B, ONE_GPU)],
                         ids=["resnet20 dp", "llama3-70b fsdp"])
def test_a_one_gpu_cluster_is_exactly_as_fast_as_one_device(path, overrides):
    summary = _summary(path, *overrides)
    assert summary["single_device_step_s"] == summary["step_time_s"]
    assert summary["speedup"] == 1.0


@pytest.mark.parametrize("path", [SMALL, LLAMA_70B], ids=["resnet20 dp on 4", "llama3-70b fsdp on 64"])
def test_the_baseline_is_the_engine_s_single_device_step_on_the_whole_batch(path):
    scenario = load_scenario(path)
    result = simulate(scenario)
    alone = single_device_scenario(scenario)
    assert (alone.num_gpus, alone.strategy.kind, alone.training) == (1, "dp", scenario.training)
    expected_s = simulate(alone, workload=result.workload).step_time_s
    assert result.summary["single_device_step_s"] == pytest.approx(expected_s, rel=1e-12)
    assert result.summary["speedup"] == pytest.approx(expected_s / result.step_time_s, rel=1e-12)
    assert result.summary["single_device_baseline"].startswith("simulated")
    summed_s = single_device_step_s(_costs(scenario, result), result.workload, scenario.training.global_batch_size)
    assert abs(summed_s - expected_s) > 1e-3 * expected_s  # the plain sum of passes (the old baseline) differs


def _costs(scenario, result):
    from simulator.simulate import analytic_costs
    return analytic_costs(scenario, result.workload)


def test_a_baseline_that_cannot_be_simulated_falls_back_to_the_sum_of_passes_and_says_so(monkeypatch, capsys):
    def refuse(scenario):
        raise ScenarioError("no single device here")
    monkeypatch.setattr(importlib.import_module("simulator.simulate"), "single_device_scenario", refuse)
    scenario = load_scenario(SMALL)
    result = simulate(scenario)
    summed_s = single_device_step_s(_costs(scenario, result), result.workload, scenario.training.global_batch_size)
    assert result.summary["single_device_step_s"] == pytest.approx(summed_s, rel=1e-12)
    assert "not simulated (no single device here)" in result.summary["single_device_baseline"]
    assert "speedup baseline: sum of the layers' passes" in _printed(capsys, SMALL)


# ----------------------------------------------------------------------------- bubble and in flight

def test_tensor_parallel_communication_is_exposed_comm_not_a_bubble(capsys):
    # one pipeline stage, TP 8: before, a 41.6 % "bubble" (1 - compute / step)
    summary = _summary(LLAMA_8B)
    stage, = summary["pipeline"]["stages"]
    device = summary["devices"][0]
    assert stage["bubble_fraction"] == pytest.approx(0.0, abs=1e-9)
    assert stage["exposed_comm_fraction"] == pytest.approx(device["comm_s"] / summary["step_time_s"], rel=1e-9)
    assert stage["exposed_comm_fraction"] > 0.3
    out = _printed(capsys, LLAMA_8B)
    assert "exposed comm" in out and "41.6%" in out and "bubble" in out


def test_bubble_and_exposed_comm_add_up_to_the_stage_s_idle_compute():
    summary = _summary(VGG_PIPELINE)
    step_s = summary["step_time_s"]
    for row in summary["pipeline"]["stages"]:
        device = next(d for d in summary["devices"] if d["stage"] == row["stage"])
        assert row["bubble_fraction"] == pytest.approx(device["idle_s"] / step_s, rel=1e-9)
        assert row["bubble_fraction"] + row["exposed_comm_fraction"] == pytest.approx(
            1 - device["compute_s"] / step_s, rel=1e-9)
    assert any(row["exposed_comm_fraction"] > 0.005 for row in summary["pipeline"]["stages"])


@pytest.mark.parametrize("path, overrides", [
    (GPT2_3D, ["strategy.num_virtual_stages=2"]),
    (VGG_PIPELINE, ["strategy.kind=interleaved_1f1b", "strategy.num_virtual_stages=2"])],
    ids=["megatron", "pipeline"])
def test_in_flight_counts_micro_batches_and_chunk_passes_apart(path, overrides, capsys):
    # the 405B run (p 16, v 4, m 32) printed 79 micro-batches "in flight": chunk passes
    summary = _summary(path, *overrides)
    pipeline = summary["pipeline"]
    m = pipeline["num_microbatches"]
    microbatches = [row["microbatches_in_flight"] for row in pipeline["stages"]]
    passes = [row["chunk_passes_in_flight"] for row in pipeline["stages"]]
    assert all(count <= m for count in microbatches)
    assert all(a <= b <= 2 * a for a, b in zip(microbatches, passes)) and passes[0] > microbatches[0]
    if path == VGG_PIPELINE:  # p 4, m 8, v 2: `ghpsim schedule`'s grid holds 11, 9, 7, 5 chunk passes
        assert (microbatches, passes) == ([8, 8, 7, 5], [11, 9, 7, 5])
    assert "chunk passes in flight" in _printed(capsys, path, *overrides)


def test_without_interleaving_micro_batches_and_chunk_passes_are_one_count():
    summary = _summary(VGG_PIPELINE)
    assert [(row["microbatches_in_flight"], row["chunk_passes_in_flight"]) for row in summary["pipeline"]["stages"]] \
        == [(4, 4), (3, 3), (2, 2), (1, 1)]


# ----------------------------------------------------------------------------- compute model

def test_auto_prices_every_gpu_family_on_the_kernel_model_and_names_an_assumed_row(capsys):
    """GPUs compare on one model: a family without figures takes the generic row (Ampere's ratios)
    and says so; CPUs and specs of no named family keep the roofline."""
    b200 = _summary(RESNET50, "cluster.gpu=B200")
    model = b200["compute_model"]
    assert model["model"] == "kernel" and model["parameters"]["architecture"] == "generic"
    assert "costs.model auto: B200 (blackwell) has no kernel figures, Ampere's ratios used" in model["note"]
    assert b200["step_time_s"] == _summary(RESNET50, "cluster.gpu=B200", "costs.model=kernel")["step_time_s"]
    h100, l40s = (_summary(GPT2_3D, f"cluster.gpu={gpu}")["step_time_s"] for gpu in ("H100-SXM", "L40S"))
    assert l40s > h100  # on the roofline without host time the L40S came out faster than an H100
    cpu = _summary(MLP_CPU)["compute_model"]
    assert cpu["model"] == "analytic" and "not a GPU of a named family" in cpu["note"]
    out = _printed(capsys, MLP_CPU)
    assert "compute model: analytic (auto: cpu (cpu) is not a GPU of a named family" in out


def test_kernel_model_names_its_catalogue_row(capsys):
    model = _summary(RESNET50, "cluster.gpu=H100-SXM")["compute_model"]
    assert model["model"] == "kernel" and model["parameters"]["architecture"] == "hopper"
    assert model["parameters"]["host_overhead_s"] == pytest.approx(HOST_OVERHEAD_S)
    assert model["note"] == "costs.model auto: hopper kernel figures"
    forced = _summary(RESNET50, "cluster.gpu=B200", "costs.model=kernel")["compute_model"]
    assert forced["model"] == "kernel" and forced["parameters"]["architecture"] == "generic"
    assert "Ampere's ratios used (an assumption)" in forced["note"]
    assert "compute model: kernel (costs.model auto: hopper kernel figures)" in _printed(
        capsys, RESNET50, "cluster.gpu=H100-SXM")


def test_the_kernel_model_names_its_flash_attention_implementation(capsys):
    llama = ROOT / "scenarios" / "llama3_8b_dgx_h100.yaml"
    model = _summary(llama)["compute_model"]
    assert model["parameters"]["flash_attention_kernel"] == "flash2"
    assert model["note"] == "costs.model auto: hopper kernel figures; flash attention flash2"
    triton = _summary(llama, "costs.flash_attention_kernel=triton")
    assert triton["compute_model"]["note"].endswith(
        "; flash attention triton (1.4x / 2x FlashAttention-2's forward / backward time)")
    assert triton["step_time_s"] > _summary(llama)["step_time_s"]
    assert "flash_attention_kernel" not in _summary(RESNET50)["compute_model"]["parameters"]


def test_measured_costs_are_named_a_profile():
    class Measured:
        communication = shared_processors = None
    gpu = load_scenario(SMALL).cluster.gpu
    assert describe_compute_model(Measured(), "auto", gpu, given=True)["model"] == "profile"


# ----------------------------------------------------------------------------- what the text adds up to

def test_exposed_offload_time_is_printed_and_the_rows_add_up_to_the_step(capsys):
    overrides = ("training.offload_activations=true", "costs.host_bandwidth_bytes_per_s=1e9")
    summary = _summary(RESNET50, *overrides)
    offload_s = summary["memory"]["offload_exposed_s"]
    assert offload_s > 0.5 * summary["step_time_s"]
    for row in summary["devices"]:
        assert row["compute_s"] + row["comm_s"] + row["idle_s"] == pytest.approx(summary["step_time_s"])
        assert row["comm_s"] >= offload_s
    out = _printed(capsys, RESNET50, *overrides)
    assert f"offload: {format_seconds(offload_s)} of host transfers not hidden by compute (added to the step, and to each device's comm above)" in out
    assert "offload:" not in _printed(capsys, RESNET50)


def test_huge_and_tiny_figures_are_printed_in_readable_units(capsys):
    # before, on a 100 bit/s link: "step time 37719183389.425 ms | 0.0 samples/s | speedup 0.00x ... 0.0 TFLOP/s"
    slow = "cluster.inter_node_link={latency_s: 2 us, bandwidth_bytes_per_s: 100 b/s}"
    summary = _summary(DEMO, slow)
    out = _printed(capsys, DEMO, slow)
    step_line = next(line for line in out.splitlines() if line.startswith("step time"))
    assert step_line.startswith(f"step time {format_seconds(summary['step_time_s'])} | ")
    assert " h | " in step_line and re.search(r"\d{7}", step_line) is None
    assert f"{summary['throughput_samples_per_s']:.2e} samples/s" in step_line and "0.0 samples/s" not in step_line
    assert f"speedup {summary['speedup']:.2e}x" in step_line
    assert f"intra {summary['bytes_per_tier']['intra'] / 1e9:.1f} GB" in step_line
    assert "kFLOP/s per GPU" in out and "0.0 TFLOP/s" not in out
    assert "per device (h)" in out


def test_kernel_line_rounds_the_host_time_and_counts_in_the_singular():
    report = {"num_layers": 1, "batch": 1, "host_overhead_s": 32.7848e-6,
              "forward": {"total_s": 2e-3, "host_wait_s": 0.0, "gpu_s": {"gemm": 1e-3, "launch": 1e-5}}}
    line = kernel_pass_line(report)
    assert line.startswith("kernels of rank 0's first micro-batch (1 layer, 1 sample): forward 2.000 ms")
    assert line.endswith("; host 32.8 us a kernel")
    assert "(82 layers, 4 samples)" in kernel_pass_line({**report, "num_layers": 82, "batch": 4})
    assert "layers priced from" not in line
    counted = {**report, "forward": {**report["forward"], "gpu_s": {"generic": 4e-3, "elementwise": 1e-3}}}
    assert "(GEMM 0.000, layers priced from their counts 4.000, memory-bound 1.000," in kernel_pass_line(counted)


def test_one_node_is_singular(capsys):
    out = _printed(capsys, SMALL, *ONE_GPU)
    assert "cluster: 1 node x 1 V100;" in out and "1 nodes" not in out
    assert "cluster: 4 nodes x 2 V100;" in _printed(capsys, SMALL, "cluster.num_nodes=4", "cluster.gpus_per_node=2")


def test_a_cpu_cluster_is_counted_per_cpu_not_per_gpu(capsys):
    out = _printed(capsys, MLP_CPU, "cluster.gpus_per_node=2")
    assert "cluster: 1 node x 2 cpu;" in out
    assert "GFLOP/s per CPU | MFU" in out and "per GPU" not in out
    cluster = load_scenario(MLP_CPU).cluster
    assert (device_noun(cluster), device_noun(load_scenario(SMALL).cluster)) == ("CPU", "GPU")
    mixed = cluster.model_copy(update={"num_nodes": 2, "node_gpus": {1: load_scenario(SMALL).cluster.gpu}})
    assert device_noun(mixed) == "device"


def test_the_cluster_line_names_the_fabric_and_the_parameter_count_keeps_its_digits(capsys):
    out = _printed(capsys, GPT2_3D)
    assert "(1.6B params, 50 layers)" in out and "inter ib-hdr (fat tree)" in out
    two_tier = _printed(capsys, GPT2_3D, "cluster.topology=two_tier")
    assert "inter ib-hdr\n" in two_tier and "(fat tree)" not in two_tier
    assert "(5.8M params, 7 layers)" in _printed(capsys, MLP_CPU)
    cluster = load_scenario(SMALL).cluster.model_copy(update={"topology": "graph_file", "topology_file": "/x/ring.json"})
    assert fabric_label(cluster) == "links from the graph file ring.json"


def test_the_header_gives_a_transformer_s_tokens_per_sample(capsys):
    # an hf_config model's sequence defaults to max_position_embeddings: the header shows it
    assert main(["simulate", str(LLAMA_8B), "--set", "model.params.seq_len=2048"]) == 0
    assert "(8.0B params, 34 layers), batch 8 x 2,048 tokens bf16" in capsys.readouterr().out.splitlines()[0]
    assert main(["simulate", str(DEMO)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("(138.4M params, 16 layers), batch 64 fp32")


def test_an_mfu_over_100_percent_says_why(capsys):
    """VGG16 in fp32 on one V100 runs its 3 x 3 convolutions as Winograd (2.25x fewer multiplies
    than the model's FLOPs count), so its MFU reads over 100 %; the line says why. The demo's 5.8 %
    carries no such note."""
    out = _printed(capsys, DEMO, *ONE_GPU, "strategy.kind=dp")
    mfu = float(re.search(r"MFU ([0-9.]+)%", out).group(1))
    assert mfu > 100 and "over 100 %: Winograd, causal flash kernels or dropped MoE tokens skip counted FLOPs" in out
    out = _printed(capsys, DEMO)
    assert float(re.search(r"MFU ([0-9.]+)%", out).group(1)) < 100 and "over 100 %" not in out


def test_counts_of_one_are_singular(capsys):
    """"m=1 micro-batch", "the 1 GPU": never "1 micro-batches" or "1 GPUs"."""
    out = _printed(capsys, DEMO, "cluster.num_nodes=1", "cluster.gpus_per_node=2", "strategy.kind=gpipe",
                   "strategy.num_groups=1", "strategy.num_microbatches=1")
    assert "m=1 micro-batch of 64," in out
    with pytest.raises(ScenarioError, match=r"strategy.num_groups: 8 does not divide the 1 GPU \("):
        load_scenario(DEMO, ONE_GPU)
