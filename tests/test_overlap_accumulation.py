"""Gradient accumulation fusion (Megatron `--gradient-accumulation-fusion`, `strategy.gradient_accumulation_fusion`):
off, every weight-gradient GEMM of a backward is followed by one main-gradient add kernel (fp32 under
bf16, the model dtype otherwise); by default as Megatron does it, fused only into fp32 main gradients."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.kernel_costs import KernelCosts, device_for, kernel_s
from simulator.kernel_ops import accumulation_fused
from simulator.kernels import layer_kernels
from simulator.scenario import load_scenario
from simulator.simulate import analytic_costs, engine_costs, simulate
from simulator.strategies import compile_plan
from simulator.fabrics import build_topology
from simulator.zoo import build_model

ROOT = Path(__file__).resolve().parent.parent
GPT = build_model("gpt2-small")
BLOCK = next(layer for layer in GPT.layers if layer.spec.get("kind") == "transformer_block")


@pytest.mark.parametrize("tp", [1, 2])
def test_unfused_backward_adds_one_accumulation_per_weight_gemm(tp):
    fused = layer_kernels(BLOCK, "B", 4, dtype="bf16", tp_degree=tp)
    unfused = layer_kernels(BLOCK, "B", 4, dtype="bf16", tp_degree=tp, gradient_accumulation_fusion=False)
    added = Counter(unfused) - Counter(fused)
    assert not Counter(fused) - Counter(unfused)  # nothing removed
    h, f = BLOCK.spec["hidden_size"], BLOCK.spec["ffn_hidden_size"]
    weights = {"qkv": 3 * h / tp * h, "proj": h * h / tp, "fc1": f / tp * h, "fc2": h * f / tp}
    assert sorted(kernel.name for kernel in added) == sorted(f"{name}.wgrad.accumulate" for name in weights)
    for kernel in added:
        elements = weights[kernel.name.split(".")[0]]
        assert (kernel.bytes_read, kernel.bytes_written) == (elements * (4 + 2), elements * 4)
        assert kernel.kind == "elementwise"
    names = [kernel.name for kernel in unfused]
    for name in weights:  # right after its GEMM
        assert names[names.index(f"{name}.wgrad") + 1] == f"{name}.wgrad.accumulate"


def test_forward_and_recompute_are_unchanged():
    for phase in ("F", "R"):
        assert layer_kernels(BLOCK, phase, 4, dtype="bf16") == layer_kernels(
            BLOCK, phase, 4, dtype="bf16", gradient_accumulation_fusion=False)


def test_the_backward_time_grows_by_exactly_the_added_kernels():
    gpu = load_scenario(ROOT / "scenarios/resnet50_dp_a100.yaml").cluster.gpu
    gpu_bound = replace(device_for(gpu, "bf16").parameters, host_overhead_s=0.0)  # kernel times alone
    fused = KernelCosts(GPT, gpu, "bf16", "adam", parameters=gpu_bound)
    unfused = KernelCosts(GPT, gpu, "bf16", "adam", gradient_accumulation_fusion=False, parameters=gpu_bound)
    index = GPT.layers.index(BLOCK)
    added = Counter(unfused.kernels(index, "B", 4)) - Counter(fused.kernels(index, "B", 4))
    extra_s = sum(kernel_s(kernel, fused.device) * count for kernel, count in added.items())
    assert extra_s > 0
    assert unfused.compute_s(index, "B", 4) - fused.compute_s(index, "B", 4) == pytest.approx(extra_s, rel=1e-12)
    assert unfused.compute_s(index, "F", 4) == fused.compute_s(index, "F", 4)


def test_fp16_gradients_accumulate_in_fp16():
    """Without fp32 main gradients (fp16 training), the add reads two fp16 tensors and writes one."""
    unfused = layer_kernels(BLOCK, "B", 4, dtype="fp16", gradient_accumulation_fusion=False)
    qkv = next(kernel for kernel in unfused if kernel.name == "qkv.wgrad.accumulate")
    elements = 3 * BLOCK.spec["hidden_size"] ** 2
    assert (qkv.bytes_read, qkv.bytes_written) == (elements * (2 + 2), elements * 2)


@pytest.mark.parametrize("setting, kind, dtype, fused", [
    (None, "megatron", "bf16", True),    # accumulate_allreduce_grads_in_fp32 forced: fusion on
    (None, "megatron", "fp16", False),   # arguments.py turns fusion off without fp32 accumulation
    (None, "megatron", "fp32", False),
    (None, "dp", "fp16", True),          # eager PyTorch: no separate kernel
    (True, "megatron", "fp16", True),    # an explicit setting wins
    (False, "megatron", "bf16", False)])
def test_the_default_follows_megatrons_rule(setting, kind, dtype, fused):
    assert accumulation_fused(setting, kind, dtype) is fused


def test_an_fp16_megatron_scenario_pays_the_accumulation_by_default():
    path = ROOT / "scenarios/runs/megatron_gpt_a100_node.yaml"
    default, fused = load_scenario(path), load_scenario(path, ["strategy.gradient_accumulation_fusion=true"])
    assert default.training.dtype == "fp16" and default.strategy.gradient_accumulation_fusion is None
    unfused_run, fused_run = simulate(default), simulate(fused)
    assert unfused_run.step_time_s > fused_run.step_time_s
    model = unfused_run.summary["compute_model"]  # the summary says so
    assert model["parameters"]["gradient_accumulation_fusion"] is False and "no gradient accumulation fusion" in model["note"]
    assert "accumulation" not in fused_run.summary["compute_model"]["note"]


def test_the_strategy_key_reaches_the_tensor_parallel_costs_the_engine_plays():
    path = ROOT / "scenarios/gpt2_1.5b_dgx_a100_3d.yaml"
    on, off = load_scenario(path), load_scenario(path, ["strategy.gradient_accumulation_fusion=false"])
    assert on.training.dtype == "bf16"  # fused by default
    for scenario, expected in ((on, True), (off, False)):
        workload = build_model(scenario.model.name, **scenario.model.params)
        costs = analytic_costs(scenario, workload)
        plan = compile_plan(scenario, workload, build_topology(scenario.cluster), costs)
        played = engine_costs(plan, costs)
        assert played.tp_degree == scenario.strategy.tp_degree > 1
        assert played.gradient_accumulation_fusion is expected
    assert simulate(off).step_time_s > simulate(on).step_time_s
