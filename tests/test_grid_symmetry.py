"""Symmetric replicas (simulator/grid_symmetry.py): a DP run simulated as rank 0 alone, and G
replicas of a pipeline (GHP, the pipeline kinds) as replica 0's ranks, give the full run's summary
on every preset fabric and with every DP option; where the symmetry breaks the run is simulated in
full and the summary says why."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.profile_costs import profile_costs

UNCOMPARED = ("wall_s", "num_events", "symmetry")
"""Summary keys that differ by design: the folded run handles fewer events."""


def same_figures(folded, full) -> bool:
    """Equal summaries, floats to 1e-12: the full run's replicas may differ from replica 0 in the last
    bit (their flows' rates summed in another order), and a step measured over every rank's spans sees it."""
    if isinstance(full, dict):
        return folded.keys() == full.keys() and all(same_figures(folded[key], full[key]) for key in full)
    if isinstance(full, (list, tuple)):
        return len(folded) == len(full) and all(same_figures(a, b) for a, b in zip(folded, full))
    if isinstance(full, float) and not isinstance(full, bool):
        return folded == pytest.approx(full, rel=1e-12, abs=1e-15)
    return folded == full


def dp_scenario(symmetry="auto", topology="two_tier", nodes=4, gpus=4, model="resnet50", cluster=None,
                training=None, **strategy) -> dict:
    nics = {} if topology == "two_tier" else {"nics_per_node": gpus}
    return {
        "name": "dp_fold",
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100",
                    "inter_node_link": "ib-hdr", "topology": topology, **nics, **(cluster or {})},
        "model": {"name": model},
        "strategy": {"kind": "dp", "symmetry": symmetry, **strategy},
        "training": {"global_batch_size": 16 * nodes * gpus, "optimizer": "momentum", **(training or {})},
    }


def folded_and_full(raw: dict):
    folded = simulate(load_scenario(raw))
    full = simulate(load_scenario({**raw, "strategy": {**raw["strategy"], "symmetry": "off"}}))
    return folded, full


@pytest.mark.parametrize("topology, strategy, training", [
    ("two_tier", {}, {}),
    ("fat_tree", {}, {}),
    ("fat_tree", {"collective": "ring", "bucket_size_bytes": 4e6}, {"recompute": "full"}),
    ("rail_optimized", {}, {"dtype": "bf16", "optimizer": "adam"}),
    ("torus_2d", {}, {}),
    ("two_tier", {"gradient_fusion": "horovod"}, {}),
    ("two_tier", {"dp_sync": "parameter_server", "num_parameter_servers": 2}, {}),
    ("two_tier", {"overlap_backward": False}, {}),
])
def test_folded_data_parallelism_equals_the_full_run(topology, strategy, training):
    folded, full = folded_and_full(dp_scenario(topology=topology, training=training, **strategy))
    assert folded.summary["symmetry"] == {"used": True, "reason": "rank 0 stands for the 16 data-parallel replicas"}
    assert full.summary["symmetry"]["used"] is False
    assert folded.plan.num_ranks == 1 and full.plan.num_ranks == 16
    assert folded.summary["num_events"] < full.summary["num_events"] / 4
    for key in full.summary:
        if key not in UNCOMPARED:
            assert same_figures(folded.summary[key], full.summary[key]), key  # every figure
    assert len(folded.summary["devices"]) == 16


@pytest.mark.parametrize("change, reason", [
    ({"cluster": {"stragglers": {"3": 1.5}}}, "heterogeneous cluster"),
    ({"strategy": {"gradient_compression": "topk"}}, "gradient compression"),
])
def test_broken_symmetry_runs_in_full_and_says_why(change, reason):
    raw = dp_scenario(nodes=2, gpus=2, model="resnet50")
    for section, values in change.items():
        raw[section] = {**raw[section], **values}
    result = simulate(load_scenario(raw))
    assert result.summary["symmetry"]["used"] is False and reason in result.summary["symmetry"]["reason"]
    assert result.plan.num_ranks == 4


def test_a_calibration_profile_is_simulated_rank_by_rank():
    scenario = load_scenario("scenarios/validation/mlp_cpu.yaml", ["cluster.gpus_per_node=2", "strategy.num_groups=2"])
    workload = resolve_workload(scenario.model, scenario.base_dir)
    result = simulate(scenario, costs=profile_costs("reports/profiles/mlp_cpu_ws2.json", workload), workload=workload)
    assert result.summary["symmetry"] == {"used": False,
                                          "reason": "a calibration profile prices each collective by its ranks"}
    assert result.plan.num_ranks == 2


def test_one_replica_has_nothing_to_fold():
    result = simulate(load_scenario({**dp_scenario(nodes=2, gpus=2, model="resnet50"),
                                     "strategy": {"kind": "gpipe", "num_groups": 1, "num_microbatches": 2}}))
    assert "symmetry" not in result.summary and result.plan.num_ranks == 4


def test_a_folded_run_is_sized_by_its_one_rank(monkeypatch):
    import simulator.limits as limits
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 2**17)  # 128 KiB: too little for 16 ranks
    raw = dp_scenario(nodes=2, gpus=8, model="resnet50")
    assert simulate(load_scenario(raw)).summary["num_gpus"] == 16
    with pytest.raises(ScenarioError, match="16 ranks"):
        simulate(load_scenario({**raw, "strategy": {**raw["strategy"], "symmetry": "off"}}))


@pytest.mark.parametrize("topology", ["two_tier", "fat_tree", "rail_optimized", "torus_2d"])
@pytest.mark.parametrize("kind, strategy", [
    ("ghp", {"num_groups": 4}),
    ("ghp", {"num_groups": 4, "placement": "stage_per_node", "overlap_backward": False}),
    ("gpipe", {"num_groups": 4, "num_microbatches": 4}),
    ("1f1b", {"num_groups": 4, "num_microbatches": 4, "placement": "stage_per_node"}),
    ("interleaved_1f1b", {"num_groups": 4, "num_microbatches": 4, "num_virtual_stages": 2}),
    ("pipedream", {"num_groups": 4, "num_microbatches": 4}),
    ("spectrain", {"num_groups": 4, "num_microbatches": 2, "placement": "stage_per_node"}),
    ("delayed_gradient", {"num_groups": 2, "num_microbatches": 2}),
])
def test_folded_pipeline_replicas_equal_the_full_run(topology, kind, strategy):
    """G replicas of an M-stage pipeline folded onto replica 0's M ranks (each stage's allreduce over
    its G peers, transfers counted by multiplicity): the full run's summary (`same_figures`), wherever the
    fold check lets it fold; elsewhere the full run with the link that differs named."""
    raw = dp_scenario(topology=topology, model="vgg16", kind=kind, **strategy)
    folded, full = folded_and_full(raw)
    groups = strategy["num_groups"]
    stages = 16 // groups
    assert full.summary["symmetry"]["used"] is False and full.plan.num_ranks == 16
    if not folded.summary["symmetry"]["used"]:
        assert "meets other loads" in folded.summary["symmetry"]["reason"] and folded.plan.num_ranks == 16
        return
    assert folded.summary["symmetry"]["reason"] == (f"the {stages} stage ranks of replica 0 each stand for "
                                                    f"their {groups} copies")
    assert folded.plan.num_ranks == stages and folded.summary["num_events"] < full.summary["num_events"]
    for key in full.summary:
        if key not in UNCOMPARED:
            assert same_figures(folded.summary[key], full.summary[key]), key  # every figure
    assert len(folded.summary["devices"]) == 16


@pytest.mark.parametrize("topology, strategy", [
    ("two_tier", {"kind": "ghp", "gradient_fusion": "horovod"}),
    ("fat_tree", {"kind": "ghp", "collective": "tree"}),
    ("fat_tree", {"kind": "ghp", "collective": "hierarchical"}),
    ("two_tier", {"kind": "ghp", "partition": "pipedream"}),
    ("rail_optimized", {"kind": "pipedream", "num_microbatches": 4, "weight_stashing": False}),
])
def test_folded_pipeline_replicas_equal_the_full_run_with_each_option(topology, strategy):
    folded, full = folded_and_full(dp_scenario(topology=topology, model="vgg16", num_groups=4, **strategy))
    assert folded.summary["symmetry"]["used"] and folded.plan.num_ranks == 4
    assert [key for key in full.summary if key not in UNCOMPARED and folded.summary[key] != full.summary[key]] == []


def test_pipeline_replicas_with_a_parameter_server_run_in_full():
    raw = dp_scenario(model="vgg16", kind="ghp", num_groups=4, dp_sync="parameter_server")
    result = simulate(load_scenario(raw))
    assert result.summary["symmetry"] == {
        "used": False, "reason": "parameter-server synchronisation of pipeline stages is simulated rank by rank"}
    assert result.plan.num_ranks == 16
