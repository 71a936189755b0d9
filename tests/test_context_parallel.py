"""Context parallelism in the megatron kind: the ring attention bytes' closed form, the plan's ring
transfers and gradient groups (d x c), FLOPs and activations per rank / c, and the errors."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.plan import BACKWARD, FORWARD, Collective, Compute, Recv, Send
from tests.test_symmetry import scenario as symmetry_scenario
from tests.test_symmetry_fabrics import FABRICS, assert_same_run

MODEL = {"num_layers": 4, "hidden_size": 256, "num_heads": 4, "num_kv_heads": 2, "seq_len": 128,
         "vocab_size": 1000, "ffn_hidden_size": 512}
KV_HIDDEN = 256 * 2 / 4  # h g / a
E = 2  # bf16


def scenario(cp=2, gpus=2, tp=1, pp=1, batch=4, model="llama", params=None, link="nvlink4-h100", costs=None,
             **strategy):
    return load_scenario({"costs": costs or {},
        "cluster": {"num_nodes": 1, "gpus_per_node": gpus, "gpu": "H100-SXM", "intra_node_link": link},
        "model": {"name": model, "params": MODEL if params is None else params},
        "strategy": {"kind": "megatron", "tp_degree": tp, "pp_degree": pp, "cp_degree": cp,
                     "bucket_size_bytes": "1 GiB", "symmetry": "off", **strategy},  # every rank's plan
        "training": {"global_batch_size": batch, "dtype": "bf16", "optimizer": "adam"}})


def ring_sends(actions, phase):
    return [a for a in actions if isinstance(a, Send) and a.label == f"cp ring {phase}"]


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_bytes_per_pass_are_c_minus_1_kv_blocks_forward_and_twice_backward(cp):
    plan = simulate(scenario(cp=cp, gpus=cp)).plan
    per_layer = (cp - 1) * 2 * 4 * (128 / cp) * KV_HIDDEN * E  # (c-1) x (K, V) x b s / c x kv_hidden x dtype
    for rank, actions in enumerate(plan.actions):
        (forward,) = ring_sends(actions, FORWARD)
        (backward,) = ring_sends(actions, BACKWARD)
        assert forward.size_bytes == 4 * per_layer  # the 4 attention layers of the pass
        assert backward.size_bytes == 2 * 4 * per_layer
        assert forward.dst == (rank + 1) % cp
        assert {a.src for a in actions if isinstance(a, Recv)} == {(rank - 1) % cp}


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_each_ring_step_pays_the_link_latency(cp):
    """Ring attention's c - 1 steps per layer each wait for the previous hop (Liu et al. 2023): on an
    alpha-beta link the forward ring of L layers takes L (c - 1) (alpha + 2 (b s / c) kv_hidden e / B)."""
    alpha_s, bandwidth = 20e-6, 10e9
    link = {"name": "eth", "kind": "ethernet", "latency_s": alpha_s, "bandwidth_bytes_per_s": bandwidth}
    plan_result = simulate(scenario(cp=cp, gpus=cp, batch=1, link=link, costs={"model": "analytic"}))
    for actions in plan_result.plan.actions:
        assert ring_sends(actions, FORWARD)[0].messages == 4 * (cp - 1)
        assert ring_sends(actions, BACKWARD)[0].messages == 2 * 4 * (cp - 1)  # K, V and dK, dV a step
    spans = plan_result.spans
    (duration_s,) = spans[(spans["rank"] == 0) & (spans["name"] == f"cp ring {FORWARD}")]["duration_s"]
    step_bytes = 2 * (128 / cp) * KV_HIDDEN * E
    assert duration_s == pytest.approx(4 * (cp - 1) * (alpha_s + step_bytes / bandwidth), rel=1e-9)


@pytest.mark.parametrize("cp, window, halo", [
    (2, 32, 32),   # L = 32: rank 0's chunk 3 takes 32 keys of chunk 2 (rank 1's), rank 1's chunk 1 32 of chunk 0
    (4, 16, 32),   # L = 16: rank 1's chunks 1 and 6 each take a whole chunk from ranks 0 and 2
    (4, 8, 16),    # half a chunk before each of rank 1's chunks; rank 3's chunk 4 reads its own chunk 3
])
def test_a_causal_window_moves_each_rank_s_halo_instead_of_the_ring(cp, window, halo):
    """Chunks of L = s / 2c tokens, rank r holding r and 2c - 1 - r: a query of chunk a sees the
    W keys before a L at most, so the rank receives the part of them other ranks hold, forward,
    and returns their dK, dV backward (module docstring of simulator.strategies.context)."""
    from simulator.strategies.context import halo_sources, halo_tokens
    assert halo_tokens(128, cp, window) == halo
    assert halo_sources(128, cp, window) == min(cp - 1, 2)  # rank 1 of 4 hears from ranks 0 and 2, not 3
    plan = simulate(scenario(cp=cp, gpus=cp, params={**MODEL, "sliding_window": window})).plan
    per_layer = halo * 2 * 4 * KV_HIDDEN * E  # halo keys x (K, V) x b x kv_hidden x dtype
    for actions in plan.actions:
        assert ring_sends(actions, FORWARD)[0].size_bytes == ring_sends(actions, BACKWARD)[0].size_bytes == 4 * per_layer
        assert ring_sends(actions, FORWARD)[0].messages == 4 * min(cp - 1, 2)  # one message per source and layer


def test_a_window_wider_than_c_minus_1_chunks_keeps_the_ring():
    from simulator.strategies.context import halo_tokens
    assert halo_tokens(128, 2, 33) is None  # L = 32: the halo would reach past the other rank's chunk
    plan = simulate(scenario(cp=2, gpus=2, params={**MODEL, "sliding_window": 33})).plan
    assert ring_sends(plan.actions[0], FORWARD)[0].size_bytes == 4 * 1 * 2 * 4 * 64 * KV_HIDDEN * E


def test_ring_with_tensor_parallelism_sends_the_rank_s_kv_heads_to_its_cp_neighbour():
    plan = simulate(scenario(cp=2, gpus=4, tp=2)).plan
    per_layer = 1 * 2 * 4 * 64 * KV_HIDDEN / 2 * E
    # plan rank = (d' t + tp) p + pp; CP peers share tp: ranks 0 <-> 2 and 1 <-> 3
    assert [a.dst for a in ring_sends(plan.actions[0], FORWARD)] == [2]
    assert [a.dst for a in ring_sends(plan.actions[1], FORWARD)] == [3]
    assert ring_sends(plan.actions[0], FORWARD)[0].size_bytes == 4 * per_layer
    assert plan.rank_to_device == (0, 1, 2, 3)  # tp fastest, then cp: CP peers on devices 0 and 2 (tp 0)


def test_rank_layout_is_tp_fastest_then_cp_then_pp_then_dp():
    plan = simulate(scenario(cp=2, gpus=16, tp=2, pp=2, batch=8, num_microbatches=2)).plan
    # plan rank (d' t + tp) p + pp with d' = replica c + cp; device ((replica p + pp) c + cp) t + tp
    for replica in range(2):
        for cp in range(2):
            for tp in range(2):
                for pp in range(2):
                    rank = ((replica * 2 + cp) * 2 + tp) * 2 + pp
                    assert plan.rank_to_device[rank] == ((replica * 2 + pp) * 2 + cp) * 2 + tp


def test_gradients_are_reduced_over_d_times_c_ranks():
    plan = simulate(scenario(cp=2, gpus=4, batch=8)).plan
    groups = {a.ranks for actions in plan.actions for a in actions if isinstance(a, Collective)}
    assert groups == {(0, 1, 2, 3)}
    assert plan.meta["tensor"]["dp_degree"] == 2 and plan.meta["tensor"]["cp_degree"] == 2


def forward_flops(plan, rank):
    layers = plan.meta["rank_workload"].layers
    return sum(a.batch * sum(layer.forward_flops_per_sample for layer in layers[a.layer_start:a.layer_end])
               for a in plan.actions[rank] if isinstance(a, Compute) and a.phase == FORWARD)


@pytest.mark.parametrize("cp", [2, 4])
def test_each_cp_rank_computes_one_cth_of_the_model_s_flops(cp):
    whole, split = simulate(scenario(cp=1, gpus=1)).plan, simulate(scenario(cp=cp, gpus=cp)).plan
    assert forward_flops(whole, 0) == pytest.approx(4 * whole.meta["rank_workload"].flops_per_sample / 3, rel=0.05)
    for rank in range(cp):
        assert forward_flops(split, rank) == pytest.approx(forward_flops(whole, 0) / cp, rel=1e-12)


def test_activation_memory_per_rank_is_over_c_and_the_weights_unchanged():
    whole, split = simulate(scenario(cp=1, gpus=1)), simulate(scenario(cp=2, gpus=2))
    a, b = (run.summary["devices"][0]["memory_breakdown_bytes"] for run in (whole, split))
    assert b["activations"] == pytest.approx(a["activations"] / 2, rel=1e-12)
    assert b["weights"] == a["weights"] and b["optimizer_state"] == a["optimizer_state"]


def test_zero1_shards_the_optimizer_state_over_d_times_c():
    plain, sharded = simulate(scenario(cp=2, gpus=2)), simulate(scenario(cp=2, gpus=2, zero_stage=1))
    a, b = (run.summary["devices"][0]["memory_breakdown_bytes"] for run in (plain, sharded))
    assert b["optimizer_state"] == pytest.approx(a["optimizer_state"] / 2, rel=1e-12)


def test_cp2_on_nvlink_runs_a_compute_bound_model_in_about_half_the_time():
    params = {**MODEL, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 8, "ffn_hidden_size": 8192,
              "seq_len": 4096, "num_layers": 2}
    gpu_bound = {"host_overhead_s": 0}  # the GPU's work alone: a host issuing kernels as fast as they run
    whole = simulate(scenario(cp=1, gpus=1, batch=2, params=params, costs=gpu_bound)).summary["step_time_s"]
    split = simulate(scenario(cp=2, gpus=2, batch=2, params=params, costs=gpu_bound)).summary["step_time_s"]
    assert 0.5 <= split / whole < 0.65  # half the compute, plus the pair's fp32 gradient allreduce


CP_LAYOUTS = {  # 16 GPUs: a CP group inside a node; 32 GPUs: CP peers on two nodes
    "CP in a node": dict(nodes=4, gpus=4, tp=2, pp=2, cp_degree=2),
    "CP across nodes": dict(nodes=8, gpus=4, tp=4, pp=2, cp_degree=2),
}


@pytest.mark.parametrize("layout", sorted(CP_LAYOUTS))
@pytest.mark.parametrize("fabric", FABRICS)
def test_a_folded_cp_run_equals_the_full_one_or_says_why(fabric, layout):
    """The representative's ring hop, a send to itself, stands for every CP rank's hop
    (`simulator.symmetry`): the folded run gives the full run's figures, or names the shared link."""
    folded, full = (simulate(symmetry_scenario(mode, fabric, **CP_LAYOUTS[layout])) for mode in ("auto", "off"))
    decision = folded.summary["tensor"]["symmetry"]
    if decision["used"]:
        assert folded.plan.num_ranks == 2 < full.plan.num_ranks
        hops = ring_sends(folded.plan.actions[0], FORWARD)
        assert hops and all(a.dst == 0 for a in hops)  # one a micro-batch, each to the representative itself
        assert_same_run(folded, full)
    else:
        assert "meets other loads than the folded run's on link" in decision["reason"]
        assert folded.step_time_s == full.step_time_s


def test_cp_runs_fold_on_an_aligned_layout():
    run = simulate(symmetry_scenario("auto", "rail_optimized", **CP_LAYOUTS["CP across nodes"]))
    assert run.summary["tensor"]["symmetry"]["used"] and run.plan.num_ranks == 2


def test_a_cp_ring_mixing_hops_inside_and_between_nodes_is_not_folded():
    """TP 4 x CP 4 on 8-GPU nodes: CP ranks 0, 1 share a node, 2, 3 the next, so hops 0 -> 1 run on
    NVLink and 1 -> 2 on the network: the ranks differ and every rank is simulated."""
    run = simulate(symmetry_scenario("auto", "two_tier", nodes=8, gpus=8, tp=4, pp=2, cp_degree=4))
    decision = run.summary["tensor"]["symmetry"]
    assert decision["used"] is False and "CP ring hops cross different kinds of links" in decision["reason"]
    assert run.plan.num_ranks == 64


@pytest.mark.parametrize("change, message", [
    ({"cp": 3, "gpus": 3}, "strategy.cp_degree: 3 does not split the sequence length 128 into 2 x 3"),
    ({"cp": 2, "gpus": 2, "model": "mlp", "params": {"hidden_dim": 64}},
     "strategy.cp_degree: 2 needs a transformer model"),
    ({"cp": 2, "gpus": 2, "zero_stage": 2}, "strategy.zero_stage: 2 with cp_degree 2 is not modelled"),
])
def test_bad_context_parallel_settings_name_the_field_and_value(change, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
        simulate(scenario(**change))


def test_cp_degree_must_divide_the_gpus_and_needs_megatron():
    with pytest.raises(ValueError, match="strategy.cp_degree 2 does not divide the 2 GPUs"):
        scenario(cp=2, gpus=2, tp=2)
    with pytest.raises(ValueError, match="strategy.cp_degree: 2 applies to kind megatron only"):
        load_scenario({"cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "H100-SXM"},
                       "model": {"name": "llama", "params": MODEL},
                       "strategy": {"kind": "dp", "cp_degree": 2},
                       "training": {"global_batch_size": 4}})


@pytest.mark.parametrize("tp", [1, 2])
def test_dependencies_per_action_do_not_grow_with_the_micro_batches(tp):
    """Each compute waits for the ring exchanges of the pass before it, not for every earlier one (the
    former ones are behind that pass's compute already): the widest dependency list is the same at 4
    and 32 micro-batches, so plans stay linear in the passes (a 405B search once ran out of memory)."""
    from simulator.model_source import resolve_workload
    from simulator.simulate import analytic_costs
    from simulator.strategies import compile_plan
    from simulator.fabrics import cached_topology

    def widest(batch):
        sc = scenario(cp=2, gpus=4, tp=tp, pp=2 if tp == 1 else 1, batch=batch, num_microbatches=batch)
        workload = resolve_workload(sc.model, sc.base_dir)
        plan = compile_plan(sc, workload, cached_topology(sc.cluster.model_dump_json()), analytic_costs(sc, workload))
        return max(len(getattr(action, "deps", ())) for actions in plan.actions for action in actions)

    assert widest(32) == widest(4) <= 8


@pytest.mark.parametrize("seq_len, message", [(8191, "tp_degree x cp_degree = 8"), (3, "sequence length 3")])
def test_sequence_parallelism_needs_the_sequence_divisible_by_the_tp_ranks(seq_len, message):
    """Megatron splits the sequence over the TP ranks under sequence parallelism (it asserts
    seq_length % tp == 0); the search leaves such layouts out."""
    from simulator.layout_search import megatron_space
    from simulator.planner import _workload
    import json
    overrides = [f"model.params.seq_len={seq_len}"]
    bad = load_scenario("scenarios/llama3_8b_dgx_h100.yaml", overrides)
    with pytest.raises(ScenarioError, match=f"strategy.sequence_parallel: .*{message}"):
        simulate(bad)
    workload = _workload(json.dumps(bad.model.model_dump(mode="json"), sort_keys=True), bad.base_dir)
    candidates = megatron_space(bad, workload, (1,), context=False)
    assert candidates and not any(c.sequence_parallel and c.tp_degree > 1 for c in candidates)
    assert simulate(load_scenario("scenarios/llama3_8b_dgx_h100.yaml", ["model.params.seq_len=8192"])).step_time_s > 0
