"""Symmetric runs (strategy.symmetry auto): one rank per stage simulated, expanded to every device;
equal to the full simulation where replicas do not contend, refused where symmetry breaks."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate


MOE = {"name": "moe", "params": {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "seq_len": 128,
                                 "vocab_size": 1000, "num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 256}}


def scenario(symmetry="auto", topology="fat_tree", nodes=4, gpus=4, tp=2, pp=2, cluster=None, model=None, **strategy):
    return load_scenario({
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus, "gpu": "A100-80GB",
                    "intra_node_link": "nvlink3-a100", "inter_node_link": "ib-hdr",
                    "nics_per_node": gpus if topology != "two_tier" else 1, "topology": topology, **(cluster or {})},
        "model": model or {"name": "transformer", "params": {"num_layers": 4, "hidden_size": 256, "num_heads": 4,
                                                              "seq_len": 128, "vocab_size": 1000}},
        "strategy": {"kind": "megatron", "tp_degree": tp, "pp_degree": pp, "num_microbatches": 4,
                     "symmetry": symmetry, **strategy},
        "training": {"global_batch_size": 32, "dtype": "bf16", "optimizer": "adam"},
    })


PER_DEVICE = ("rank", "device", "node", "group", "stage", "dp_rank", "tp_rank", "compute_s", "comm_s", "idle_s",
              "peak_memory_bytes")


@pytest.mark.parametrize("topology,options", [
    ("fat_tree", {}),
    ("fat_tree", {"sequence_parallel": True, "zero_stage": 1}),
    ("fat_tree", {"num_virtual_stages": 2}),
    ("rail_optimized", {}),
    ("two_tier", {}),
])
def test_symmetric_run_equals_full_run(topology, options):
    """DP 4 x PP 2 x TP 2 on 16 GPUs: the 2 simulated ranks give every device's figures."""
    assert_fold_equals_full(*(simulate(scenario(mode, topology, **options)) for mode in ("auto", "off")))


@pytest.mark.parametrize("topology,options", [
    ("fat_tree", {"ep_degree": 4}),  # each EP group's all-to-all across the 4 nodes
    ("fat_tree", {"ep_degree": 2, "zero_stage": 1}),  # expert gradients reduce-scattered among d / e = 2
    ("rail_optimized", {"ep_degree": 4, "zero_stage": 1}),
    ("two_tier", {"ep_degree": 2}),  # one NIC a node shared by the all-to-alls, rings and transfers
    ("torus_2d", {"ep_degree": 4, "zero_stage": 1}),
])
def test_expert_parallel_run_folds_to_the_full_run(topology, options):
    """A mixture of 4 experts, DP 4 x PP 2 x TP 2 (sequence parallel) with EP 2 or 4: the representative
    of each stage plays every EP group's all-to-alls and every expert-data-parallel group's collectives
    at once, on the full topology, as the data-parallel rings are."""
    assert_fold_equals_full(*(simulate(scenario(mode, topology, model=MOE, sequence_parallel=True, **options))
                              for mode in ("auto", "off")))


@pytest.mark.parametrize("topology", ["fat_tree", "rail_optimized", "two_tier", "torus_2d"])
@pytest.mark.parametrize("tp,microbatches", [(2, 4), (1, 2)])
def test_hybrid_sharded_run_folds_to_the_full_run(topology, tp, microbatches):
    """ZeRO-3 hybrid_shard (HSDP): units gathered and gradients reduce-scattered within each node's
    shard group, then allreduced among the groups; the representative plays every group's at once."""
    runs = [simulate(scenario(mode, topology, tp=tp, pp=1, zero_stage=3, num_microbatches=microbatches,
                              fsdp_sharding="hybrid_shard")) for mode in ("auto", "off")]
    assert_fold_equals_full(*runs, ranks=(1, 16))


def assert_fold_equals_full(reduced, full, ranks=(2, 16)):
    assert reduced.summary["tensor"]["symmetry"]["used"] is True
    assert full.summary["tensor"]["symmetry"]["used"] is False
    assert (reduced.plan.num_ranks, full.plan.num_ranks) == ranks
    assert reduced.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    assert reduced.summary["num_gpus"] == full.summary["num_gpus"] == 16
    for tier in ("intra", "inter"):
        assert reduced.summary["bytes_per_tier"][tier] == pytest.approx(full.summary["bytes_per_tier"][tier])
    assert reduced.summary["memory"]["peak_memory_bytes"] == pytest.approx(full.summary["memory"]["peak_memory_bytes"])
    for row, row_full in zip(reduced.summary["devices"], full.summary["devices"]):
        for key in PER_DEVICE:
            assert row[key] == pytest.approx(row_full[key], rel=1e-9, abs=1e-15), key
    assert reduced.summary["mfu"] == pytest.approx(full.summary["mfu"], rel=1e-12)
    assert reduced.summary["collective_algorithms"] == full.summary["collective_algorithms"]  # every group's
    assert reduced.summary["num_events"] < full.summary["num_events"] / 4


def test_straggler_refuses_symmetry():
    slow = simulate(scenario(cluster={"stragglers": {5: 1.5}}))
    decision = slow.summary["tensor"]["symmetry"]
    assert decision["used"] is False and "heterogeneous" in decision["reason"]
    assert slow.plan.num_ranks == 16
    assert slow.step_time_s > simulate(scenario()).step_time_s


def test_memory_walks_shared_by_alike_ranks_equal_a_walk_of_every_rank(monkeypatch):
    """With a straggler the replicas it does not slow walk alike: each distinct walk is made once
    and copied, and every device's figures equal those of walking each rank."""
    import simulator.memory as memory
    from simulator.strategies.tensor_summary import alike_memory_report, memory_view
    slow = simulate(scenario(cluster={"stragglers": {5: 1.5}}))
    plan, workload, spans = memory_view(slow.plan, None, slow.span_records)
    config = memory.memory_config(slow.scenario)
    every = memory.memory_report(plan, workload, spans, config)
    walked, walk = [], memory.rank_memory
    monkeypatch.setattr(memory, "rank_memory", lambda *args: walked.extend(args[4]) or walk(*args))
    assert alike_memory_report(plan, workload, spans, config) == every
    straggler = plan.rank_to_device.index(5)  # its timeline is its own: walked, not copied
    assert straggler >= plan.workers_per_group and straggler in walked and len(walked) < plan.num_ranks / 2


def test_replicas_sharing_a_link_fold_with_its_multiplicity():
    """Two replicas whose pipeline transfers cross the same node uplink (two-tier, stages on
    different nodes): the representative's transfer counts both copies on that link, so the reduced
    run has the full run's contention (tests/test_symmetry_shared_links.py)."""
    shared, full = (simulate(scenario(mode, topology="two_tier", nodes=2, gpus=2, tp=1, pp=2,
                                      placement=[0, 2, 1, 3])) for mode in ("auto", "off"))
    assert shared.summary["tensor"]["symmetry"]["used"] is True
    assert shared.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)


def test_symmetry_off_in_yaml_means_full():
    assert scenario(symmetry=False).strategy.symmetry == "off"  # YAML 1.1 reads a bare off as false


def test_plans_of_one_layout_on_one_topology_share_their_fold():
    """A long pipeline compiled twice on one topology (its played micro-batches, then every one when
    its cycle has not settled) reuses the fold and the send phases it worked out."""
    from simulator.fabrics import build_topology
    from simulator.model_source import resolve_workload
    from simulator.simulate import analytic_costs
    from simulator.strategies import compile_plan
    case = scenario()
    workload = resolve_workload(case.model)
    costs = analytic_costs(case, workload)
    topology = build_topology(case.cluster)
    first, again = (compile_plan(case, workload, topology, costs) for _ in range(2))
    other_topology = build_topology(case.cluster)
    other = compile_plan(case, workload, other_topology, costs)
    fold = first.meta["symmetry"]
    assert again.meta["symmetry"] is fold and other.meta["symmetry"] is not fold
    phase = fold.send_phase(topology, 0, 1, 1e6)
    assert fold.send_phase(topology, 0, 1, 1e6) is phase
    assert other.meta["symmetry"].send_phase(other_topology, 0, 1, 1e6) == phase


def test_data_parallel_rings_keep_the_links_the_expert_all_to_alls_cross():
    """A folded data-parallel collective drops the links no other flow crosses but its tightest
    (`Symmetry.prune`); the EP groups' all-to-alls cross the other replicas' links, so none of those is
    dropped (fat-tree, EP 4 across the 4 nodes: 47 of them a stage)."""
    from types import SimpleNamespace

    from simulator.collectives import collective_phases
    from simulator.fabrics import build_topology
    result = simulate(scenario("auto", "fat_tree", model=MOE, sequence_parallel=True, ep_degree=4, zero_stage=1))
    fold, topology = result.plan.meta["symmetry"], build_topology(result.scenario.cluster)
    for stage in range(2):
        phases = collective_phases(topology, fold.dp_groups[stage], "reduce_scatter", 1e6, "ring")
        alltoall = {link for phase in collective_phases(topology, fold.blocks(stage, 4), "alltoall", 1e6, "pairwise")
                    for link, _ in phase.usage}
        reduction = SimpleNamespace(ranks=(stage,), key=("reduce_scatter", stage, 0))  # the stage's representative
        shared = [(link, kept) for phase, kept in zip(phases, fold.prune(topology, reduction, phases))
                  for link, _ in phase.usage if link in alltoall]
        assert len({link for link, _ in shared}) > 10
        assert all(link in {kept_link for kept_link, _ in kept.usage} for link, kept in shared)
