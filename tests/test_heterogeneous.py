"""Heterogeneous clusters and faults: stragglers, mixed GPU types, degraded links."""

import pytest

from simulator import load_scenario, simulate
from simulator.collective_forms import hierarchical_allreduce_time_s, ring_allreduce_time_s
from simulator.costs import AnalyticCosts
from simulator.errors import ScenarioError
from simulator.fabrics import build_topology
from simulator.hardware import resolve_gpu
from simulator.heterogeneity import DeviceCosts
from simulator.scenario import ClusterConfig
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, run_grid, run_plan, toy_workload
from tests.test_engine import collective_plan


def test_a_2x_straggler_in_data_parallel_sets_the_step_to_its_compute():
    alpha, bandwidth = 1e-5, 1e10
    topology = Topology(1, 4, link(alpha, bandwidth), link(alpha, bandwidth))
    topology.slowdowns = {1: 2.0}
    _, spans = run_grid(toy_workload(4, num_params=1_000_000), topology, FixedCosts(1e-3, optimizer_s=1e-4),
                        groups=4, workers=1, batch=8, overlap_backward=False, collective="ring")
    compute_s = 4 * 3 * 1e-3 * 2  # 4 layers, F + B = 3 x 1 ms per sample, 2 samples per replica
    allreduce_s = ring_allreduce_time_s(16e6, 4, alpha, bandwidth)
    assert spans["end_s"].max() == pytest.approx(2 * compute_s + allreduce_s + 2 * 1e-4, rel=1e-9)
    busy = spans[spans["stream"] == "compute"].assign(s=lambda f: f.end_s - f.start_s).groupby("rank")["s"].sum()
    assert busy.to_dict() == pytest.approx({0: compute_s + 1e-4, 1: 2 * (compute_s + 1e-4),
                                            2: compute_s + 1e-4, 3: compute_s + 1e-4})


def test_a_degraded_node_uplink_slows_a_cross_node_ring_to_its_bandwidth():
    intra, inter = link(2e-6, 100e9), link(10e-6, 2e9)
    cluster = ClusterConfig(num_nodes=4, gpus_per_node=1, intra_node_link=intra, inter_node_link=inter,
                            degraded_links={"node2": 0.25})
    spans = run_plan(collective_plan(4, 64e6, "ring"), build_topology(cluster), FixedCosts())
    assert spans["end_s"].max() == pytest.approx(ring_allreduce_time_s(64e6, 4, 12e-6, 0.5e9), rel=1e-9)


def test_a_degraded_uplink_slows_the_cross_node_step_of_a_hierarchical_allreduce():
    intra, inter = link(2e-6, 100e9), link(10e-6, 2e9)
    cluster = ClusterConfig(num_nodes=2, gpus_per_node=4, intra_node_link=intra, inter_node_link=inter,
                            degraded_links={"node1": 0.5})
    spans = run_plan(collective_plan(8, 80e6, "hierarchical"), build_topology(cluster), FixedCosts())
    expected = hierarchical_allreduce_time_s(80e6, 2, 4, 2e-6, 100e9, 12e-6, 1e9)
    assert spans["end_s"].max() == pytest.approx(expected, rel=1e-9)


def test_a_degraded_device_link_slows_a_ring_inside_a_node():
    cluster = ClusterConfig(num_nodes=1, gpus_per_node=4, intra_node_link=link(1e-6, 100e9),
                            degraded_links={"gpu3": 0.1})
    spans = run_plan(collective_plan(4, 40e6, "ring"), build_topology(cluster), FixedCosts())
    assert spans["end_s"].max() == pytest.approx(ring_allreduce_time_s(40e6, 4, 1e-6, 10e9), rel=1e-9)


def stage_sizes(topology, costs, num_layers=6):
    plan, _ = run_grid(toy_workload(num_layers, output_elements=1), topology, costs, groups=1, workers=2, batch=1)
    return plan.meta["partition"]


def test_the_balanced_partition_gives_a_straggler_fewer_layers():
    topology = Topology(1, 2, link(0.0, 1e12), link(0.0, 1e12))
    assert stage_sizes(topology, FixedCosts()) == [3, 3]
    topology.slowdowns = {1: 2.0}  # stage 1: 2 x 2 layers = 4 units of time, stage 0: 4 layers
    assert stage_sizes(topology, FixedCosts()) == [4, 2]
    topology.slowdowns = {0: 5.0}  # stage 0: 1 layer x 5 = 5 units, stage 1: 5 layers
    assert stage_sizes(topology, FixedCosts()) == [1, 5]


def test_a_stage_is_as_slow_as_the_slowest_of_its_replicas():
    # GHP 2 x 2 (group per node): stage 1 lives on devices 1 and 3; device 3 straggles 2x.
    topology = Topology(2, 2, link(0.0, 1e12), link(0.0, 1e12))
    topology.slowdowns = {3: 2.0}
    plan, _ = run_grid(toy_workload(6, output_elements=1), topology, FixedCosts(), groups=2, workers=2, batch=2)
    assert plan.meta["partition"] == [4, 2]


def mixed_scenario(kind="dp", dtype="fp16", **cluster):
    return load_scenario({
        "cluster": {"num_nodes": 2, "gpus_per_node": 2, "gpu": "A100-80GB", "inter_node_link": "ib-hdr",
                    **cluster},
        "model": {"name": "mlp", "params": {"num_hidden_layers": 10, "hidden_dim": 4096}},
        "strategy": {"kind": kind},
        "training": {"global_batch_size": 256, "dtype": dtype},
        "costs": {"model": "analytic"},
    })


def test_mixed_gpu_types_each_device_computes_with_its_kernel_model():
    """With the kernel model each device expands its layers on its own GPU's figures."""
    from simulator.kernel_costs import KernelCosts
    scenario = mixed_scenario(node_gpus={1: "V100"}).model_copy(
        update={"costs": mixed_scenario().costs.model_copy(update={"model": "kernel"})})
    result = simulate(scenario)
    forward = result.spans[(result.spans["kind"] == "F")].set_index("rank")
    for rank, gpu in ((0, "A100-80GB"), (2, "V100")):
        costs = KernelCosts(result.workload, resolve_gpu(gpu), "fp16", "sgd")
        expected = sum(costs.compute_s(i, "F", 64) for i in range(result.workload.num_layers))
        assert forward.loc[rank].end_s - forward.loc[rank].start_s == pytest.approx(expected, rel=1e-12)


def test_mixed_gpu_types_each_device_computes_with_its_own_roofline():
    result = simulate(mixed_scenario(node_gpus={1: "V100"}))
    workload, spans = result.workload, result.spans
    per_gpu = {name: AnalyticCosts(workload, resolve_gpu(name), "fp16", "sgd") for name in ("A100-80GB", "V100")}
    forward = spans[(spans["kind"] == "F")].set_index("rank")
    for rank, gpu in ((0, "A100-80GB"), (1, "A100-80GB"), (2, "V100"), (3, "V100")):
        expected = sum(per_gpu[gpu].compute_s(i, "F", 64) for i in range(workload.num_layers))
        row = forward.loc[rank]
        assert row.end_s - row.start_s == pytest.approx(expected, rel=1e-12)
    assert result.step_time_s > simulate(mixed_scenario()).step_time_s


def test_mixed_gpu_pipeline_balances_stages_by_each_gpu_s_speed():
    # A GPipe pipeline over 2 nodes x 1 GPU (stage j on node j), 12 identical compute-bound layers,
    # tiny activations: the split k minimises max(k t_0, (12 - k) t_1), t_j = F + B time on node j's GPU.
    # (Model parallelism runs its stages one after another, where balance does not matter.)
    row = {"name": "l", "forward_flops_per_sample": 4e9, "num_params": 1_000_000,
           "input_elements_per_sample": 8, "output_elements_per_sample": 8}
    for node_gpus in ({}, {0: "V100"}, {1: "V100"}, {0: "RTX-2080Ti", 1: "V100"}):
        scenario = load_scenario({
            "cluster": {"num_nodes": 2, "gpu": "A100-80GB", "node_gpus": node_gpus},
            "model": {"layers": [row] * 12}, "strategy": {"kind": "gpipe", "num_microbatches": 8},
            "training": {"global_batch_size": 64, "dtype": "fp16"}, "costs": {"model": "analytic"}})
        result = simulate(scenario)
        times = []
        for node in (0, 1):
            costs = AnalyticCosts(result.workload, resolve_gpu(node_gpus.get(node, "A100-80GB")), "fp16", "sgd")
            times.append(costs.compute_s(0, "F", 8) + costs.compute_s(0, "B", 8))
        best = min(range(1, 12), key=lambda k: max(k * times[0], (12 - k) * times[1]))
        assert result.summary["partition"] == [best, 12 - best]
        assert (best > 6) == (times[0] < times[1]) and (best < 6) == (times[0] > times[1])


def test_mixed_gpus_need_analytic_costs_and_a_figure_for_the_dtype():
    topology = Topology(2, 1, link(0.0, 1e9), link(0.0, 1e9))
    topology.node_gpus = {1: resolve_gpu("V100")}
    with pytest.raises(ScenarioError, match="cluster.node_gpus: GPU 'V100' needs a datasheet cost model"):
        DeviceCosts(FixedCosts(), topology).model_of(1)
    fp32_only = {"name": "old", "peak_flops_per_s": {"fp32": "10 TFLOP/s"}, "memory_bytes": "16 GiB",
                 "memory_bandwidth_bytes_per_s": "900 GB/s"}
    with pytest.raises(ScenarioError, match="cluster.node_gpus: GPU 'old' has no figure for training.dtype 'fp16'"):
        simulate(mixed_scenario(node_gpus={1: fp32_only}))


def test_heterogeneous_flag():
    assert not ClusterConfig().heterogeneous
    assert not ClusterConfig(num_nodes=2, gpu="V100", node_gpus={1: "V100"}, stragglers={0: 1.0}).heterogeneous
    assert ClusterConfig(num_nodes=2, stragglers={1: 1.5}).heterogeneous
    assert ClusterConfig(num_nodes=2, degraded_links={"node1": 0.5}).heterogeneous


def test_gpus_named_per_node_behave_as_the_same_gpus_named_for_the_cluster():
    # Every node's GPU given by node_gpus must price as if cluster.gpu named it: its kernels and its
    # SM count, which sets how much NCCL's kernels slow compute during the overlapped allreduce.
    cluster = {"num_nodes": 2, "gpus_per_node": 4, "inter_node_link": "10gbe"}
    rest = {"model": {"name": "resnet50"}, "strategy": {"kind": "dp"}, "training": {"global_batch_size": 256},
            "costs": {"model": "kernel"}}
    named = simulate(load_scenario({"cluster": {**cluster, "gpu": "T4"}, **rest}))
    per_node = simulate(load_scenario({"cluster": {**cluster, "gpu": "A100-80GB", "node_gpus": {0: "T4", 1: "T4"}},
                                       **rest}))
    assert per_node.step_time_s == pytest.approx(named.step_time_s, rel=1e-12)
    assert named.step_time_s != pytest.approx(simulate(load_scenario({"cluster": {**cluster, "gpu": "A100-80GB"},
                                                                      **rest})).step_time_s, rel=1e-3)
