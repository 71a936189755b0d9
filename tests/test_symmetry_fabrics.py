"""Folded (symmetric) against full runs on every preset fabric (issue 73): where a megatron run is
folded to one rank per stage, its step time, per-device figures and bytes per tier equal the full
simulation's to 1e-9; where symmetry breaks, the summary says why and every rank is simulated."""

from __future__ import annotations

import pytest

from simulator import simulate
from tests.test_symmetry import PER_DEVICE, scenario

FABRICS = ("two_tier", "fat_tree", "rail_optimized", "torus_2d")
LAYOUTS = {  # 16 GPUs, one replica per node; 32 GPUs, a replica's stages on two nodes
    "one node per replica": dict(nodes=4, gpus=4, tp=2, pp=2),
    "two nodes per replica": dict(nodes=8, gpus=4, tp=4, pp=2),
}


def assert_same_run(folded, full) -> None:
    assert folded.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert folded.summary["num_gpus"] == full.summary["num_gpus"] == full.plan.num_ranks
    for tier in ("intra", "inter"):
        assert folded.summary["bytes_per_tier"][tier] == pytest.approx(full.summary["bytes_per_tier"][tier], rel=1e-9)
    for row, row_full in zip(folded.summary["devices"], full.summary["devices"]):
        for key in PER_DEVICE:
            assert row[key] == pytest.approx(row_full[key], rel=1e-9, abs=1e-15), key


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("fabric", FABRICS)
def test_folded_equals_full_or_says_why(fabric, layout):
    folded, full = (simulate(scenario(mode, fabric, **LAYOUTS[layout])) for mode in ("auto", "off"))
    decision = folded.summary["tensor"]["symmetry"]
    stages = LAYOUTS[layout]["pp"]
    if decision["used"]:
        assert folded.plan.num_ranks == stages < full.plan.num_ranks
        assert_same_run(folded, full)
    else:  # refused: the reason names what breaks it, and the run is the full one
        assert "meets other loads than the folded run's on link" in decision["reason"]
        assert folded.plan.num_ranks == full.plan.num_ranks
        assert folded.step_time_s == full.step_time_s


@pytest.mark.parametrize("fabric", FABRICS)
def test_every_preset_fabric_folds_an_aligned_layout(fabric):
    """One replica per node: no two replicas share a link on any preset fabric, so the run folds."""
    assert simulate(scenario("auto", fabric, **LAYOUTS["one node per replica"])).summary["tensor"]["symmetry"]["used"]


def test_misaligned_fat_tree_refuses_with_the_shared_link():
    """32 NICs on a k = 6 fat-tree (given explicitly): 3 NICs on an edge switch and 9 in a pod, a
    replica has 8, so replicas sit differently under the switches: replica 3's transfer crosses a
    core link where others' meet other loads (`simulator.symmetry_check`)."""
    run = simulate(scenario("auto", "fat_tree", nodes=8, gpus=4, tp=4, pp=2, cluster={"fat_tree_k": 6}))
    decision = run.summary["tensor"]["symmetry"]
    assert decision == {"used": False, "reason": decision["reason"]}
    assert decision["reason"].startswith("copy 3 of the pipeline transfer stage 0 -> 1 meets other loads than the "
                                         "folded run's on link agg2.1->core1.0")


def test_the_default_fat_tree_keeps_nodes_whole_under_edge_switches_so_replicas_fold():
    """The same 32 NICs with the default k: the smallest even k with k^3/4 >= 32 and k/2 a multiple
    of the 4 NICs of a node is 8, so every node sits under one edge switch and the run folds."""
    run = simulate(scenario("auto", "fat_tree", nodes=8, gpus=4, tp=4, pp=2))
    assert run.plan.meta["symmetry_decision"]["used"] and run.summary["tensor"]["symmetry"]["used"]
    assert run.summary["num_gpus"] == 32 and run.plan.num_ranks == 2


def _fold_refusal(fat_tree_k: int | None) -> str:
    """`simulator.symmetry_check.fold_refusal` of LLaMA-3 405B as Meta laid it out (TP 8 x PP 16 x
    DP 128: each replica 16 whole nodes) on a fat-tree of 2,048 nodes with 8 NICs each."""
    from simulator.fabrics import build_topology
    from simulator.scenario import load_scenario
    from simulator.strategies.tensor import tensor_config
    from simulator.symmetry_check import fold_refusal
    sets = ["cluster.num_nodes=2048", "strategy.cp_degree=1", "strategy.num_microbatches=16",
            "cluster.topology=fat_tree", f"cluster.fat_tree_k={'null' if fat_tree_k is None else fat_tree_k}"]
    scenario_16k = load_scenario("scenarios/llama3_405b_4d_h100.yaml", sets)
    topology = build_topology(scenario_16k.cluster)
    return fold_refusal(tensor_config(scenario_16k), topology), topology.fat_tree_k


def test_the_default_fat_tree_puts_a_power_of_two_of_nodes_under_each_edge_switch():
    """16,384 NICs: k = 48 (the smallest with whole nodes, 3 a switch) straddles the 16-node
    replicas, whose pipeline transfers then meet unlike loads; the default k = 64 (4 nodes a switch,
    128 a pod) keeps every replica alike, so the run folds."""
    refusal, k = _fold_refusal(48)
    assert k == 48 and "meets other loads than the folded run's on link edge" in refusal
    refusal, k = _fold_refusal(None)
    assert k == 64 and refusal == ""


@pytest.mark.parametrize("cluster,why", [
    ({"degraded_links": {"node1": 0.5}}, "heterogeneous"),
    ({"node_gpus": {2: "H100-SXM"}}, "heterogeneous"),
    ({"stragglers": {3: 1.2}}, "heterogeneous"),
])
def test_broken_symmetry_is_named_and_simulated_in_full(cluster, why):
    run = simulate(scenario("auto", "rail_optimized", cluster=cluster))
    decision = run.summary["tensor"]["symmetry"]
    assert decision["used"] is False and why in decision["reason"]
    assert run.plan.num_ranks == run.summary["num_gpus"] == 16


@pytest.mark.parametrize("fabric, layout, separate", [
    ("two_tier", dict(nodes=4, gpus=4, tp=2, pp=2), True),      # one replica per node
    ("rail_optimized", dict(nodes=8, gpus=4, tp=4, pp=2), True),  # a replica's stages on two nodes
    ("two_tier", dict(nodes=2, gpus=8, tp=2, pp=2), False),     # two replicas share each node's uplink
    ("fat_tree", dict(nodes=4, gpus=4, tp=2, pp=2), False),     # edge and core links are shared
    ("torus_2d", dict(nodes=4, gpus=4, tp=2, pp=2), False),     # routes cross other nodes' links
])
def test_replicas_on_separate_nodes_of_node_private_fabrics_skip_the_link_check(fabric, layout, separate):
    from simulator.fabrics import build_topology
    from simulator.strategies.tensor import tensor_config
    from simulator.symmetry_check import replicas_on_separate_nodes
    run = scenario("auto", fabric, **layout)
    assert replicas_on_separate_nodes(tensor_config(run), build_topology(run.cluster)) is separate
    folded, full = simulate(run), simulate(scenario("off", fabric, **layout))
    if folded.summary["tensor"]["symmetry"]["used"]:
        assert folded.plan.meta["symmetry"].private_links is separate
        assert_same_run(folded, full)


def test_separate_nodes_by_block_arithmetic_equals_the_device_walk():
    """Contiguous copies (no explicit placement, no CP): the closed form equals walking every device."""
    import itertools
    from dataclasses import replace as with_fields
    from types import SimpleNamespace

    from simulator.strategies.tensor import tensor_config
    from simulator.symmetry_check import replicas_on_separate_nodes
    base = tensor_config(scenario("auto", "two_tier", nodes=4, gpus=4, tp=2, pp=2))
    for per_node, dp, pp, tp in itertools.product((1, 2, 4, 8), (1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 4, 8)):
        topology = SimpleNamespace(kind="two_tier", gpus_per_node=per_node, node_of=lambda d, g=per_node: d // g)
        config = with_fields(base, dp=dp, pp=pp, tp=tp)
        walked = with_fields(config, placement=tuple(range(dp * pp * tp)))
        assert (replicas_on_separate_nodes(config, topology)
                == replicas_on_separate_nodes(walked, topology)), (per_node, dp, pp, tp)
