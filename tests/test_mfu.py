"""Achieved TFLOP/s per GPU and model FLOPs utilisation (simulator/flops.py) on hand-computed cases."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.flops import peak_flops_per_s
from simulator.hardware import GPUS

TOY_GPU = {"name": "toy", "peak_flops_per_s": {"fp32": "100 TFLOP/s"}, "memory_bytes": "16 GiB",
           "memory_bandwidth_bytes_per_s": "1 TB/s"}


def test_mfu_of_one_gpu_one_linear_layer():
    """Forward 2 GFLOP x 100 samples at 50 TFLOP/s (peak 100, efficiency 0.5) = 4 ms, backward 8 ms,
    SGD update of 1000 fp32 parameters = 12 kB / 1 TB/s = 12 ns. Model FLOPs 3 x 2e9 x 100 = 6e11."""
    result = simulate(load_scenario({
        "cluster": {"gpu": TOY_GPU},
        "model": {"layers": [{"name": "fc", "kind": "linear", "forward_flops_per_sample": 2e9, "num_params": 1000,
                              "input_elements_per_sample": 1000, "output_elements_per_sample": 1000}]},
        "strategy": {"kind": "dp"},
        "training": {"global_batch_size": 100},
        "costs": {"efficiency": {"linear": 0.5}},
    }))
    step_s = 0.004 + 0.008 + 12e-9
    summary = result.summary
    assert summary["step_time_s"] == pytest.approx(step_s, rel=1e-12)
    assert summary["model_flops_per_step"] == 6e11
    assert summary["achieved_tflops_per_gpu"] == pytest.approx(6e11 / step_s / 1e12, rel=1e-12)
    assert summary["mfu"] == pytest.approx(6e11 / step_s / 100e12, rel=1e-12)  # just under 0.5


def test_mfu_excludes_recomputation_and_counts_every_gpu():
    def run(recompute):
        return simulate(load_scenario({
            "cluster": {"num_nodes": 1, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100"},
            "model": {"name": "transformer", "params": {"num_layers": 4, "hidden_size": 256, "num_heads": 4,
                                                         "seq_len": 128, "vocab_size": 1000}},
            "strategy": {"kind": "megatron", "tp_degree": 2, "pp_degree": 2, "num_microbatches": 4},
            "training": {"global_batch_size": 8, "dtype": "bf16", "optimizer": "adam", "recompute": recompute},
        })).summary

    plain, full = run("none"), run("full")
    assert full["model_flops_per_step"] == plain["model_flops_per_step"]
    assert full["step_time_s"] > plain["step_time_s"]
    assert full["mfu"] / plain["mfu"] == pytest.approx(plain["step_time_s"] / full["step_time_s"], rel=1e-12)
    peak = GPUS["A100-80GB"].peak_for("bf16")
    assert plain["mfu"] == pytest.approx(plain["model_flops_per_step"] / plain["step_time_s"] / 4 / peak, rel=1e-12)


def test_peak_of_mixed_gpus_is_the_device_mean():
    scenario = load_scenario({
        "cluster": {"num_nodes": 2, "gpus_per_node": 2, "gpu": "A100-80GB", "node_gpus": {1: "V100"}},
        "model": {"name": "mlp"}, "training": {"global_batch_size": 8, "dtype": "fp16"}})
    expected = (GPUS["A100-80GB"].peak_for("fp16") + GPUS["V100"].peak_for("fp16")) / 2
    assert peak_flops_per_s(scenario.cluster, "fp16") == pytest.approx(expected)


def test_moe_capacity_padding_is_executed_work_not_model_flops():
    """A capacity factor c pads every expert to c x its share of the k copies of each token: the step
    computes the padding, but model FLOPs count each token's top-k expert work once (PaLM app. B).
    Before, c = 4 made the Mixtral step 3x slower and *raised* MFU (model FLOPs 8.71e16 -> 3e17)."""
    def run(capacity):
        scenario = load_scenario({
            "cluster": {"gpu": "A100-80GB"},
            "model": {"name": "moe", "params": {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "seq_len": 128,
                                                "vocab_size": 1000, "num_experts": 8, "top_k": 2,
                                                "expert_ffn_hidden_size": 512, "capacity_factor": capacity}},
            "training": {"global_batch_size": 8, "dtype": "bf16"},
            "costs": {"host_overhead_s": 0}})  # GPU-bound: the kernels' time, not the host's, sets the step
        result = simulate(scenario)
        return result.summary, result.workload

    (one, balanced), (four, padded) = run(1.0), run(4.0)
    assert one["model_flops_per_step"] == balanced.flops_per_sample * 8  # c = 1: nothing padded, nothing taken off
    assert four["model_flops_per_step"] == pytest.approx(one["model_flops_per_step"], rel=1e-12)
    assert padded.flops_per_sample > 1.5 * balanced.flops_per_sample  # the executed work the step is timed on
    assert four["step_time_s"] > one["step_time_s"] and four["mfu"] < one["mfu"]
    assert four["mfu"] / one["mfu"] == pytest.approx(one["step_time_s"] / four["step_time_s"], rel=1e-12)
