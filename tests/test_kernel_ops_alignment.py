"""cuBLAS's 16-byte alignment in the kernel expansion: a linear layer whose feature dimensions miss
it launches misaligned GEMMs, which the kernel model prices at the misaligned ceiling."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.hardware import GPUS
from simulator.kernel_catalogue import ARCHITECTURES, gemm_aligned
from simulator.kernel_costs import device_for, kernel_s
from simulator.kernel_ops import linear


@pytest.mark.parametrize("element_bytes, features, aligned", [
    (2, (768, 50304), True), (2, (768, 50257), False), (2, (1600, 6400), True), (2, (1604, 768), False),
    (4, (50260, 768), True), (4, (50258, 768), False), (1, (768, 50264), False), (1, (768, 50304), True)])
def test_alignment_is_sixteen_bytes_of_each_feature_dimension(element_bytes, features, aligned):
    assert gemm_aligned(element_bytes, *features) is aligned


def test_every_gemm_of_a_misaligned_linear_layer_is_misaligned_whatever_the_token_count():
    for phase, count in (("F", 1), ("B", 2)):
        odd_vocab = [k for k in linear("head", 8191, 50257, 768, 2, phase) if k.kind == "gemm"]
        padded = [k for k in linear("head", 8191, 50304, 768, 2, phase) if k.kind == "gemm"]
        assert len(odd_vocab) == count and not any(k.aligned for k in odd_vocab)
        assert all(k.aligned for k in padded)  # 8191 tokens are never a leading dimension


def test_the_misaligned_ceiling_slows_a_gemm_only_where_the_catalogue_has_one():
    hopper = device_for(GPUS["H200"], "bf16")
    forward = linear("head", 8192, 50257, 768, 2, "F")[0]
    aligned = replace(forward, aligned=True)
    assert kernel_s(forward, hopper) > 3 * kernel_s(aligned, hopper)
    without = device_for(GPUS["H200"], "bf16", replace(hopper.parameters, misaligned_gemm_efficiency=None))
    assert kernel_s(forward, without) == kernel_s(aligned, without)
    for family, row in ARCHITECTURES.items():
        figure = row.parameters_for("bf16").misaligned_gemm_efficiency
        assert figure is None or 0 < figure < row.parameters_for("bf16").gemm_efficiency, family


def _costs(kind: str, tp: int = 1):
    from simulator.kernel_costs import KernelCosts
    from simulator.model_source import resolve_workload
    from simulator.scenario import scenario_from_dict
    scenario = scenario_from_dict({
        "name": "gpt", "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM"},
        "model": {"name": "transformer", "params": {"num_layers": 2, "hidden_size": 768, "num_heads": 12,
                                                    "seq_len": 128, "vocab_size": 50257}},
        "strategy": {"kind": kind, **({"tp_degree": tp} if kind == "megatron" else {})},
        "training": {"global_batch_size": 8, "dtype": "bf16", "optimizer": "adam"}, "costs": {"model": "kernel"}})
    costs = KernelCosts.for_scenario(scenario, resolve_workload(scenario.model))
    return costs.with_tensor_parallel(tp, False) if tp > 1 else costs


@pytest.mark.parametrize("kind, tp, columns", [("dp", 1, 50257), ("megatron", 1, 50304), ("megatron", 8, 6400)])
def test_megatron_pads_the_vocabulary_eager_frameworks_do_not(kind, tp, columns):
    costs = _costs(kind, tp)
    head = len(costs.workload.layers) - 1
    logits = next(k for k in costs.kernels(head, "F", 1.0) if k.kind == "gemm")
    assert logits.n == columns and logits.aligned is (columns % 8 == 0)
