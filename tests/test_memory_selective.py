"""Activation memory and recompute cost of transformer blocks against Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models" (MLSys 2023): eq. 1-2 and 4 (bytes a layer
keeps: sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/(ht)) with TP, sbh(34/t + 5as/(ht))
with TP and sequence parallelism), Table 2 (selective: sbh(10 + 24/t), 34sbh/t with SP; full: 2sbh),
sec. 5 (selective recompute adds 2.7 % of the forward FLOPs for GPT-3 175B, 1.6 % for MT-NLG 530B;
full recompute a whole forward, a third of the step's model FLOPs)."""

from __future__ import annotations

import pytest

from simulator.costs import AnalyticCosts
from simulator.hardware import GPUS
from simulator.kernel_costs import KernelCosts, kernel_s
from simulator.memory import memory_config, rank_memory
from simulator.memory_activations import Sharding, core_recompute_flops, kept_bytes, saved_bytes
from simulator.scenario import scenario_from_dict
from simulator.simulate import simulate
from simulator.memory_activations import recompute_ranges
from simulator.strategies.tensor_layers import shard_layer
from simulator.workload import Workload
from simulator.zoo import build_model
from simulator.zoo.transformer import transformer_block

S, T, E = 2048, 8, 2  # Table 3: sequence 2048, t = 8, 16-bit activations
TABLE_3 = {"22B": (6144, 64), "175B": (12288, 96), "530B": (20480, 128), "1T": (25600, 160)}
"""hidden size h and heads a of the paper's Table 3 models."""


def block(h: int, a: int):
    return transformer_block("block", h, a, S, 4 * h, causal=True, pre_norm=True)


def paper_bytes(h: int, a: int, t: int, sp: bool, mode: str) -> float:
    """Per layer, per sample (b = 1): the paper's closed forms."""
    sbh, core = S * h, 5 * a * S / (h * t)
    if mode == "full":
        return 2 * sbh / (t if sp else 1)
    kept = 34 / t if sp else 10 + 24 / t
    return sbh * (kept + (core if mode == "none" else 0.0))


@pytest.mark.parametrize("model", TABLE_3)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_bytes_a_layer_keeps_match_the_papers_closed_forms(model, sp, mode):
    h, a = TABLE_3[model]
    layer = shard_layer(block(h, a), T, sp)
    kept = kept_bytes(layer, mode, E, Sharding(T, sp), checkpoint=True)
    assert kept == pytest.approx(paper_bytes(h, a, T, sp, mode), rel=1e-12)


def test_without_parallelism_a_layer_keeps_sbh_34_plus_5as_over_h():
    h, a = TABLE_3["175B"]
    assert saved_bytes(block(h, a), E, Sharding()) == pytest.approx(S * h * (34 + 5 * a * S / h), rel=1e-12)


def test_selective_keeps_a_fifth_of_none_for_gpt3_with_sequence_parallelism():
    """Sec. 5: with TP 8 + SP, selective recompute cuts GPT-3's activations to 34/(34 + 5as/h) of
    none's: 5as/h = 80 at a = 96, s = 2048, h = 12288, so 30 %."""
    h, a = TABLE_3["175B"]
    layer, sharding = shard_layer(block(h, a), T, True), Sharding(T, True)
    ratio = kept_bytes(layer, "selective", E, sharding, True) / kept_bytes(layer, "none", E, sharding, True)
    assert ratio == pytest.approx(34 / (34 + 80), rel=1e-12)


def test_flash_attention_keeps_no_score_matrix_so_selective_equals_none():
    h, a = TABLE_3["22B"]
    layer, flash = shard_layer(block(h, a), T, True), Sharding(T, True, flash_attention=True)
    none = kept_bytes(layer, "none", E, flash, True)
    assert kept_bytes(layer, "selective", E, flash, True) == none
    assert none == pytest.approx(S * h * 34 / T + 4 * a * S / T)  # + the fp32 logsumexp


@pytest.mark.parametrize(("model", "paper_pct"), [("175B", 2.7), ("530B", 1.6)])
def test_selective_recompute_adds_the_papers_share_of_the_forward_flops(model, paper_pct):
    """Sec. 5: the recomputed core (Q K^T, softmax, P V) is 2.7 % (GPT-3) and 1.6 % (MT-NLG) of
    the forward FLOPs; a third of a step's forward + backward is what full recompute adds."""
    layer = block(*TABLE_3[model])
    share = core_recompute_flops(layer) / layer.forward_flops_per_sample
    assert share * 100 == pytest.approx(paper_pct, rel=0.05)  # the paper gives two digits
    assert share * layer.forward_flops_per_sample / layer.flops_per_sample < 0.01  # vs full: 1/3
    assert layer.forward_flops_per_sample / layer.flops_per_sample == pytest.approx(1 / 3, rel=1e-9)


def test_the_kernel_model_reruns_only_the_attention_core_in_the_backward():
    """GPT-3 175B block, TP 8 + SP, micro-batch 1 on an A100: selective recompute adds 2-4 % to the
    layer's forward + backward time (its core is memory-bound: softmax and dropout over a s^2 / t),
    full recompute a whole forward, about a third (the paper's sec. 5 / Table 4 contrast)."""
    workload, gpu = Workload("one_block", (block(*TABLE_3["175B"]),)), GPUS["A100-80GB"]

    def costs(recompute, flash=False):
        return KernelCosts(workload, gpu, "fp16", "adam", tp_degree=T, sequence_parallel=True,
                           flash_attention=flash, recompute=recompute)

    plain, selective, full = costs("none"), costs("selective"), costs("full")
    extra = [k for k in selective.kernels(0, "B", 1) if k.name.startswith("recompute.")]
    assert {k.name for k in extra} == {"recompute.attn.score", "recompute.attn.softmax", "recompute.attn.dropout",
                                       "recompute.attn.value", "recompute.attn.context_permute"}
    forward_s, backward_s = plain.compute_s(0, "F", 1), plain.compute_s(0, "B", 1)
    assert selective.compute_s(0, "B", 1) == pytest.approx(backward_s + sum(kernel_s(k, plain.device) for k in extra))
    assert selective.compute_s(0, "F", 1) == forward_s
    assert 0.02 < (selective.compute_s(0, "B", 1) - backward_s) / (forward_s + backward_s) < 0.04
    assert 0.33 < (full.compute_s(0, "B", 1) - backward_s) / (forward_s + backward_s) < 0.36
    assert costs("selective", flash=True).kernels(0, "B", 1) == costs("none", flash=True).kernels(0, "B", 1)


def test_the_analytic_model_adds_the_cores_forward_flops_to_the_backward():
    h, a = TABLE_3["22B"]
    layer = shard_layer(block(h, a), T, False)
    workload, gpu = Workload("one_block", (layer,)), GPUS["A100-80GB"]
    plain = AnalyticCosts(workload, gpu, "fp16", "adam")
    selective = AnalyticCosts(workload, gpu, "fp16", "adam", recompute="selective", tp_degree=T)
    achieved = gpu.peak_for("fp16") * plain.efficiency["attention"]
    core = (4 * S * S * h + 5 * a * S * S) / T
    assert selective.compute_s(0, "B", 4) - plain.compute_s(0, "B", 4) == pytest.approx(4 * core / achieved)


def test_plans_emit_no_recompute_action_for_a_blocks_selective_recompute():
    workload = build_model("transformer", num_layers=4, hidden_size=256, num_heads=4, seq_len=128, vocab_size=1000)
    assert recompute_ranges(workload, 0, workload.num_layers, "selective") == []
    assert recompute_ranges(workload, 0, workload.num_layers, "full") == [(0, workload.num_layers)]


H, A, B = 6144, 48, 8  # the 18.4B GPT of Narayanan et al. SC'21 (Table 1), TP 8, micro-batch 8


def _activations_at_peak(num_layers: int, recompute: str, sp: bool, flash: bool = False) -> float:
    document = {
        "name": "gpt_tp8",
        "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100",
                    "inter_node_link": "ib-hdr"},
        "model": {"name": "transformer", "params": {"num_layers": num_layers, "hidden_size": H, "num_heads": A,
                                                    "seq_len": S, "vocab_size": 51200}},
        "strategy": {"kind": "megatron", "tp_degree": T, "pp_degree": 1, "num_microbatches": 1,
                     "sequence_parallel": sp},
        "training": {"global_batch_size": B, "dtype": "fp16", "optimizer": "adam", "recompute": recompute},
        "costs": {"flash_attention": flash},
    }
    result = simulate(scenario_from_dict(document))
    _, categories = rank_memory(result.plan, result.workload, result.spans, memory_config(result.scenario))[0].peak()
    return categories["activations"]


@pytest.mark.parametrize(("recompute", "sp"), [("none", False), ("selective", False), ("selective", True)])
def test_each_more_layer_adds_the_papers_bytes_at_the_peak(recompute, sp):
    """The simulated rank's activations at its peak grow by the paper's per-layer bytes x b."""
    more = _activations_at_peak(8, recompute, sp) - _activations_at_peak(4, recompute, sp)
    assert more == pytest.approx(4 * B * paper_bytes(H, A, T, sp, recompute), rel=1e-6)


def test_with_flash_attention_selective_changes_nothing_in_the_walk():
    assert _activations_at_peak(4, "selective", True, flash=True) == _activations_at_peak(4, "none", True, flash=True)


def test_a_llama_block_keeps_the_zoos_saved_elements_and_selective_drops_its_softmax_output():
    """LLaMA has no dropout: no masks, and the core's s x s tensor is the softmax output alone."""
    layer = build_model("llama3-8b", num_layers=1, seq_len=S).layers[1]
    a = layer.spec["num_heads"]
    none = kept_bytes(layer, "none", E, Sharding(), True)
    assert none == layer.saved_elements_per_sample * E
    assert none - kept_bytes(layer, "selective", E, Sharding(), True) == a * S * S * E
    sp = shard_layer(layer, T, True)
    assert kept_bytes(sp, "none", E, Sharding(T, True), True) == pytest.approx(none / T, rel=1e-12)
