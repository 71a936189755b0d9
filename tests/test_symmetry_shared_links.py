"""Folding replicas that share links (issue 73): each link of a representative's flow counts every
replica's copy crossing it, so where the copies meet the same loads the folded run equals the full
one to 1e-9 on every preset fabric; where copies meet different loads (a fat-tree whose edge
switches straddle replicas) it refuses, names the link, and the forced fold would indeed be wrong."""

from __future__ import annotations

import pytest

import simulator.symmetry as symmetry
from simulator import load_scenario, simulate
from simulator.collectives import pairs_phase
from simulator.fabrics import build_topology
from simulator.layout_geometry import megatron_placement
from simulator.strategies.tensor import tensor_config
from tests.test_symmetry_fabrics import assert_same_run


def scenario(mode, topology, nodes, gpus, tp, pp, cluster=None, order="tp_dp_pp", micro=4):
    """A small transformer, megatron t x p x d; `tp_dp_pp` puts a stage's replicas side by side,
    so their pipeline transfers leave a node (or NIC) together and share its links."""
    d = nodes * gpus // (tp * pp)
    placement = megatron_placement(order, tp, pp, d)
    return load_scenario({
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100",
                    "inter_node_link": "ib-hdr", "topology": topology, **(cluster or {})},
        "model": {"name": "transformer", "params": {"num_layers": 4, "hidden_size": 256, "num_heads": 4,
                                                     "seq_len": 128, "vocab_size": 1000}},
        "strategy": {"kind": "megatron", "tp_degree": tp, "pp_degree": pp, "num_microbatches": micro,
                     "symmetry": mode, "placement": placement if isinstance(placement, str) else list(placement)},
        "training": {"global_batch_size": 2 * micro * d, "dtype": "bf16", "optimizer": "adam"},
        "costs": {"host_overhead_s": 0},  # the GPU's work alone: the small passes would all be host-bound
    })


def replicas_share_a_link(run_scenario) -> bool:
    """Two replicas' pipeline transfers cross one link (what the fold used to refuse)."""
    config, topology = tensor_config(run_scenario), build_topology(run_scenario.cluster)
    owner: dict[int, int] = {}
    for e in range(config.dp):
        for j in range(config.pp - 1):
            for i in range(config.tp):
                for link in topology.route(config.device_of(e, j, i), config.device_of(e, j + 1, i)):
                    if owner.setdefault(link, e) != e:
                        return True
    return False


SHARED = {  # fabric, cluster, nodes, GPUs per node, tp, pp: every replica's transfers share links with another's
    "fat_tree, one NIC per node, k = 6: 12 of 27 ports, core links shared":
        ("fat_tree", {"nics_per_node": 1, "fat_tree_k": 6}, 12, 4, 2, 4),
    "fat_tree, one NIC per node, default k": ("fat_tree", {"nics_per_node": 1}, 12, 2, 1, 3),
    "fat_tree, two NICs per node": ("fat_tree", {"nics_per_node": 2}, 4, 4, 1, 4),
    "rail_optimized, one NIC per node": ("rail_optimized", {"nics_per_node": 1}, 8, 4, 2, 4),
    "torus_2d, 3 x 4 nodes": ("torus_2d", {}, 12, 4, 2, 3),
    "two_tier": ("two_tier", {}, 8, 4, 2, 4),
}


@pytest.mark.parametrize("case", sorted(SHARED))
def test_replicas_sharing_links_fold_and_equal_the_full_run(case):
    fabric, cluster, nodes, gpus, tp, pp = SHARED[case]
    folded, full = (simulate(scenario(mode, fabric, nodes, gpus, tp, pp, cluster)) for mode in ("auto", "off"))
    assert replicas_share_a_link(folded.scenario)
    assert folded.summary["tensor"]["symmetry"]["used"] is True, folded.summary["tensor"]["symmetry"]["reason"]
    assert folded.plan.num_ranks == pp < full.plan.num_ranks
    assert_same_run(folded, full)


def test_shared_uplink_halves_each_copys_rate():
    """Two replicas on two nodes of two GPUs, both stage 0 ranks on node 0: both transfers cross node
    0's uplink, so the representative's transfer of S bytes takes its latency + S / (bandwidth / 2)."""
    run, full = (simulate(scenario(mode, "two_tier", 2, 2, 1, 2)) for mode in ("auto", "off"))
    assert run.summary["tensor"]["symmetry"]["used"] is True
    topology = build_topology(run.scenario.cluster)
    phase = pairs_phase(topology, ((0, 2),), 1.0)
    uplink = min(topology.links[link].bandwidth_bytes_per_s for link, _ in phase.usage)
    first, first_full = (result.spans[result.spans.stream == "send"].sort_values("start_s").iloc[0]
                         for result in (run, full))
    assert first.end_s - first.start_s == pytest.approx(phase.latency_s + first.size_bytes / (uplink / 2), rel=1e-12)
    assert first_full.end_s - first_full.start_s == pytest.approx(first.end_s - first.start_s, rel=1e-12)


def test_misaligned_fat_tree_refuses_and_the_fold_would_be_wrong(monkeypatch):
    """32 NICs on a k = 6 fat-tree (3 NICs per edge switch, 9 per pod): replicas sit differently
    under the switches, so copies of a transfer meet different loads. The run refuses, naming the
    link; folding it anyway gives another step time than the full run."""
    misaligned = scenario("auto", "fat_tree", 8, 4, 2, 2, {"nics_per_node": 4, "fat_tree_k": 6})
    run = simulate(misaligned)
    decision = run.summary["tensor"]["symmetry"]
    assert decision["used"] is False
    assert "copy 1 of the pipeline transfer stage 0 -> 1 meets other loads" in decision["reason"]
    assert " on link " in decision["reason"] and "->" in decision["reason"]
    assert run.plan.num_ranks == 32
    monkeypatch.setattr(symmetry, "cached_fold_refusal", lambda cluster, config, topology: "")
    forced = simulate(misaligned)
    assert forced.summary["tensor"]["symmetry"]["used"] is True
    assert abs(forced.step_time_s / run.step_time_s - 1) > 1e-4


@pytest.mark.parametrize("cluster,why", [
    ({"degraded_links": {"node1": 0.5}}, "heterogeneous"),
    ({"node_gpus": {1: "H100-SXM"}}, "heterogeneous"),
    ({"stragglers": {3: 1.2}}, "heterogeneous"),
])
def test_broken_symmetry_on_shared_links_is_named_and_simulated_in_full(cluster, why):
    run = simulate(scenario("auto", "two_tier", 8, 4, 2, 4, cluster))
    decision = run.summary["tensor"]["symmetry"]
    assert decision["used"] is False and why in decision["reason"]
    assert run.plan.num_ranks == run.summary["num_gpus"] == 32
