"""Megatron tensor parallelism (strategy.kind megatron): closed forms of TP passes, sequence
parallelism, 3D = pipeline closed form with compute / t, per-rank shares, ZeRO-1 memory."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.collective_forms import ring_allgather_time_s, ring_allreduce_time_s, ring_reduce_scatter_time_s
from simulator.errors import ScenarioError
from simulator.strategies.tensor_layers import pass_collectives, rank_workload, shard_layer
from simulator.zoo import build_model

PEAK = 100e12       # toy GPU: 100 TFLOP/s fp32, 1 TB/s memory
EFFICIENCY = 0.5
MEMORY_BW = 1e12
INTRA_LATENCY, INTRA_BW = 2e-6, 100e9
FLOPS = 4e12        # forward FLOPs per sample of one toy block (compute bound by far)
PARAMS = 1_000_000
ELEMENTS = 1_000_000


def toy(tp=4, pp=1, nodes=1, gpus=4, batch=8, micro=1, layers=1, free=False, **strategy):
    link = ({"latency_s": 0, "bandwidth_bytes_per_s": 1e30} if free else
            {"latency_s": INTRA_LATENCY, "bandwidth_bytes_per_s": INTRA_BW})
    rows = [{"name": f"block{i}", "kind": "attention", "forward_flops_per_sample": FLOPS, "num_params": PARAMS,
             "input_elements_per_sample": ELEMENTS, "output_elements_per_sample": ELEMENTS} for i in range(layers)]
    return load_scenario({
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus,
                    "gpu": {"peak_flops_per_s": {"fp32": PEAK}, "memory_bytes": "80 GiB",
                            "memory_bandwidth_bytes_per_s": MEMORY_BW},
                    "intra_node_link": link, "inter_node_link": link},
        "model": {"layers": rows},
        "strategy": {"kind": "megatron", "tp_degree": tp, "pp_degree": pp, "num_microbatches": micro, **strategy},
        "training": {"global_batch_size": batch, "optimizer": "sgd"},
        "costs": {"efficiency": {"attention": EFFICIENCY}},
    })


def rank0(result, kind):
    spans = result.spans
    return spans[(spans["rank"] == 0) & (spans["kind"] == kind)].sort_values("start_s")


def test_tp_forward_of_one_block_is_compute_over_t_plus_two_allreduces():
    t, batch = 4, 8
    result = simulate(toy(tp=t, batch=batch))
    forward = rank0(result, "F").iloc[0]
    tp_comm = rank0(result, "allreduce").iloc[0]
    compute_s = FLOPS * batch / t / (PEAK * EFFICIENCY)
    allreduce_s = ring_allreduce_time_s(ELEMENTS * batch * 4, t, INTRA_LATENCY, INTRA_BW)
    assert forward["duration_s"] == pytest.approx(compute_s, rel=1e-12)
    assert tp_comm["start_s"] == pytest.approx(forward["end_s"], rel=1e-12)
    assert tp_comm["duration_s"] == pytest.approx(2 * allreduce_s, rel=1e-9)
    backward = rank0(result, "B").iloc[0]  # backward: 2 x compute (weights) + 2 allreduces, then the update
    assert backward["start_s"] == pytest.approx(compute_s + 2 * allreduce_s, rel=1e-9)
    assert backward["duration_s"] == pytest.approx(2 * compute_s, rel=1e-12)
    update_s = PARAMS / t * 12 / MEMORY_BW
    assert result.step_time_s == pytest.approx(3 * compute_s + 4 * allreduce_s + update_s, rel=1e-9)
    assert result.summary["num_gpus"] == t and len(result.summary["devices"]) == t


def test_sequence_parallel_moves_the_bytes_of_the_allreduces_and_gathers_again_in_backward():
    plain, sequence = simulate(toy()), simulate(toy(sequence_parallel=True))
    # forward: an allgather + reduce-scatter pair per allreduce (the same bytes); backward: the same,
    # and each column-parallel GEMM's input gathered again for its weight gradient (2 per block):
    # 4 allreduces' bytes + 2 half-allreduces
    assert sequence.summary["bytes_per_tier"]["intra"] == pytest.approx(1.25 * plain.summary["bytes_per_tier"]["intra"])
    assert sequence.summary["bytes_per_tier"]["intra"] > 0
    shard_bytes = ELEMENTS * 8 * 4 / 4  # batch 8, fp32, over t = 4
    regather_s = ring_allgather_time_s(shard_bytes, 4, INTRA_LATENCY, INTRA_BW)
    assert sequence.step_time_s == pytest.approx(plain.step_time_s + 2 * regather_s, rel=1e-9)
    assert set(sequence.summary["collective_algorithms"]) == {"ring_allgather", "ring_reduce_scatter"}
    size, p = 1e8, 8
    assert (ring_reduce_scatter_time_s(size, p, 1e-6, 1e10) + ring_allgather_time_s(size / p, p, 1e-6, 1e10)
            == pytest.approx(ring_allreduce_time_s(size, p, 1e-6, 1e10)))


@pytest.mark.parametrize("tp,pp,dp,micro,virtual", [(2, 2, 2, 4, 1), (4, 2, 1, 2, 1), (2, 4, 1, 8, 1),
                                                     (2, 2, 2, 4, 2)])
def test_3d_with_free_links_is_the_pipeline_closed_form_with_compute_over_t(tp, pp, dp, micro, virtual):
    layers = 8
    gpus = tp * pp * dp
    batch = dp * micro * 2
    result = simulate(toy(tp=tp, pp=pp, gpus=gpus, batch=batch, micro=micro, layers=layers, free=True,
                          num_virtual_stages=virtual, partition="uniform"))  # equal chunks, as the closed form has
    b = batch / (dp * micro)
    per_layer_s = 3 * FLOPS * b / tp / (PEAK * EFFICIENCY)           # forward + backward of one layer, / t
    chunk_s = per_layer_s * layers / (pp * virtual)
    update_s = PARAMS * layers / pp / tp * 12 / MEMORY_BW
    if virtual == 1:  # 1F1B flush: (m + p - 1) (t_f + t_b) (Narayanan et al. SC'21, sec. 2.2)
        expected = (micro + pp - 1) * chunk_s + update_s
    else:             # interleaved: bubble (p - 1) / v chunks: (m v + p - 1) chunk times
        expected = (micro * virtual + pp - 1) * chunk_s + update_s
    assert result.step_time_s == pytest.approx(expected, rel=1e-9)


def test_block_share_follows_korthikanti():
    """Per TP rank of a GPT block: parameters 12h^2/t + ..., saved activations (elements, no dropout
    masks) 4sh + (12sh + as^2)/t, with sequence parallelism (16sh + as^2)/t."""
    gpt = build_model("transformer", num_layers=1, hidden_size=64, num_heads=4, seq_len=32, vocab_size=100)
    block, s, h, a, t = gpt.layers[1], 32, 64, 4, 4
    assert block.saved_elements_per_sample == 16 * s * h + a * s * s
    plain, sequence = shard_layer(block, t, False), shard_layer(block, t, True)
    assert plain.saved_elements_per_sample == 4 * s * h + (12 * s * h + a * s * s) / t
    assert sequence.saved_elements_per_sample == (16 * s * h + a * s * s) / t
    assert plain.num_params == (12 * h * h + 7 * h) / t + 6 * h
    replicated = 12 * s * h  # two LayerNorms (5 s h each) and two residual adds
    assert plain.forward_flops_per_sample == (block.forward_flops_per_sample - replicated) / t + replicated
    assert sequence.forward_flops_per_sample == block.forward_flops_per_sample / t
    assert plain.backward_flops_per_sample == pytest.approx(2 * plain.forward_flops_per_sample)
    assert (plain.input_elements_per_sample, sequence.input_elements_per_sample) == (s * h, s * h / t)
    head = rank_workload(gpt, t, False).layers[-1]
    assert head.output_elements_per_sample == s * 100 / t  # vocab-parallel logits
    assert rank_workload(gpt, 1, True) is gpt


def test_tp_collectives_per_pass():
    gpt = build_model("transformer", num_layers=3, hidden_size=64, num_heads=4, seq_len=32, vocab_size=100)
    sh = 32 * 64
    # embedding (1 forward allreduce) + 3 blocks (2 each) ; head: 1 backward allreduce
    assert pass_collectives(gpt, 0, 5, "F", False) == [("allreduce", 7, sh)]
    assert pass_collectives(gpt, 0, 5, "B", False) == [("allreduce", 7, sh)]
    assert pass_collectives(gpt, 1, 4, "F", True) == [("allgather", 6, sh), ("reduce_scatter", 6, sh)]
    assert pass_collectives(gpt, 4, 5, "F", True) == [("allgather", 1, sh)]
    # backward with SP: each column-parallel GEMM (QKV, fc1, the head) gathers its input again
    assert pass_collectives(gpt, 1, 4, "B", True) == [("allgather", 12, sh), ("reduce_scatter", 6, sh)]
    assert pass_collectives(gpt, 4, 5, "B", True) == [("allgather", 1, sh), ("reduce_scatter", 1, sh)]


def test_zero1_shards_master_weights_and_optimizer_state_over_replicas():
    def run(zero):
        scenario = load_scenario({
            "cluster": {"num_nodes": 2, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100",
                        "inter_node_link": "ib-hdr"},
            "model": {"name": "transformer", "params": {"num_layers": 4, "hidden_size": 256, "num_heads": 4,
                                                         "seq_len": 64, "vocab_size": 1000}},
            "strategy": {"kind": "megatron", "tp_degree": 2, "pp_degree": 2, "num_microbatches": 2,
                         "zero_stage": zero},
            "training": {"global_batch_size": 8, "dtype": "bf16", "optimizer": "adam"}})
        return simulate(scenario)

    plain, zero = run(0), run(1)
    dp = 2
    for row, row0 in zip(zero.summary["devices"], plain.summary["devices"]):
        params = zero.plan.stages[row["stage"]].num_params  # this TP rank's share of its stage
        breakdown, breakdown0 = row["memory_breakdown_bytes"], row0["memory_breakdown_bytes"]
        assert breakdown0["optimizer_state"] == pytest.approx(params * 4 * 2)   # two fp32 Adam moments
        assert breakdown0["master_weights"] == pytest.approx(params * 4)       # fp32 master copy (bf16)
        assert breakdown["optimizer_state"] == pytest.approx(params * 4 * 2 / dp)
        assert breakdown["master_weights"] == pytest.approx(params * 4 / dp)
        assert breakdown["weights"] == pytest.approx(params * 2)
    algorithms = {label.split("/")[0] for label in zero.summary["collective_algorithms"]}
    assert algorithms >= {"ring_reduce_scatter", "ring_allgather"}
    assert "ring_reduce_scatter" not in {label.split("/")[0] for label in plain.summary["collective_algorithms"]}
    assert zero.summary["memory"]["peak_memory_bytes"] < plain.summary["memory"]["peak_memory_bytes"]


def test_megatron_layout_is_tp_fastest_then_pp_then_dp():
    scenario = toy(tp=2, pp=2, gpus=8, batch=8, micro=2, layers=4, symmetry="off")
    rows = simulate(scenario).summary["devices"]
    by_device = {row["device"]: (row["dp_rank"], row["stage"], row["tp_rank"]) for row in rows}
    assert [by_device[d] for d in range(8)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                                                (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]


@pytest.mark.parametrize("change,field", [
    ({"tp_degree": 3}, "strategy.tp_degree"),
    ({"num_microbatches": 3}, "strategy.num_microbatches"),
    ({"num_groups": 2}, "strategy.num_groups"),
    ({"placement": "stage_per_node"}, "strategy.placement"),
    ({"pp_degree": 4, "num_virtual_stages": 2}, "strategy.pp_degree"),
])
def test_bad_megatron_settings_name_the_field(change, field):
    with pytest.raises(ScenarioError, match=field):
        simulate(toy(**{"tp": 2, "pp": 1, "gpus": 4, "batch": 8, "micro": 2, "layers": 4, **change}))
