"""`simulator.layout_search.searched_recompute_modes`: selective recompute is left out of the search
only where it is the same plan as none (kernel model, flash attention, every attention layer a block)."""

import pytest

from simulator.layout_search import searched_recompute_modes
from simulator.model_source import resolve_workload
from simulator.scenario import load_scenario
from simulator.simulate import simulate


def llama(flash: bool, recompute: str = "none", model: str = "auto") -> dict:
    return {"name": "tiny_llama",
            "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100"},
            "model": {"name": "llama", "params": {"num_layers": 2, "hidden_size": 256, "num_heads": 8,
                                                  "num_kv_heads": 4, "seq_len": 512, "vocab_size": 1024,
                                                  "ffn_hidden_size": 512}},
            "strategy": {"kind": "megatron", "tp_degree": 2, "sequence_parallel": True, "num_microbatches": 2},
            "training": {"global_batch_size": 4, "dtype": "bf16", "optimizer": "adam", "recompute": recompute},
            "costs": {"flash_attention": flash, "model": model}}


def modes(raw: dict) -> tuple[str, ...]:
    scenario = load_scenario(raw)
    return searched_recompute_modes(scenario, resolve_workload(scenario.model, scenario.base_dir))


def test_with_flash_attention_selective_is_the_plan_of_none_and_is_not_searched():
    assert modes(llama(flash=True)) == ("none", "full")
    none, selective = (simulate(load_scenario(llama(True, mode))).summary for mode in ("none", "selective"))
    assert selective["step_time_s"] == none["step_time_s"]
    assert selective["memory"]["peak_memory_bytes"] == none["memory"]["peak_memory_bytes"]


@pytest.mark.parametrize("raw", [llama(flash=False), llama(flash=True, model="analytic")],
                         ids=["unfused attention", "analytic roofline"])
def test_selective_is_searched_where_it_differs_from_none(raw):
    assert modes(raw) == ("none", "selective", "full")
    none, selective = (simulate(load_scenario({**raw, "training": {**raw["training"], "recompute": mode}})).summary
                       for mode in ("none", "selective"))
    assert selective["step_time_s"] > none["step_time_s"]  # the core's forward again in the backward


def test_a_model_without_attention_has_no_core_to_recompute_so_selective_is_not_searched():
    scenario = load_scenario("scenarios/demo.yaml")  # VGG16 on V100s, the analytic roofline
    assert modes(scenario.model_dump(mode="json") | {"name": "demo"}) == ("none", "full")
    pipeline = ["strategy.kind=megatron", "strategy.num_groups=null", "strategy.placement=group_per_node",
                "strategy.pp_degree=4"]
    none, selective = (simulate(load_scenario("scenarios/demo.yaml", [*pipeline, f"training.recompute={mode}"])).summary
                       for mode in ("none", "selective"))
    assert selective["step_time_s"] == none["step_time_s"]


def test_a_selective_candidate_is_bounded_on_the_partition_it_runs():
    """Selective recompute's costs move the balanced partition; the bound must be taken on the
    partition the simulation plays (it read 1.779 s for a 1.685 s step when priced without it)."""
    from simulator.layout_search import candidate_scenario, megatron_space, scenario_for_gpus
    from simulator.scenario import scenario_from_dict
    from simulator.search_bounds import bound_model
    scenario = scenario_for_gpus(load_scenario("scenarios/gpt2_1.5b_dgx_a100_3d.yaml"), 16)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    model = bound_model(scenario, workload)
    chosen = [c for c in megatron_space(scenario, workload) if (c.tp_degree, c.workers_per_group, c.data_parallel,
              c.num_microbatches, c.sequence_parallel, c.num_virtual_stages) == (2, 8, 1, 64, True, 2)
              and c.recompute in ("none", "selective")]
    assert len(chosen) == 2
    for candidate in chosen:
        step_s = simulate(scenario_from_dict(candidate_scenario(scenario, candidate))).summary["step_time_s"]
        assert 0.95 * step_s < model.bound(candidate).step_s <= step_s, candidate.label
