"""Top-k sparse gradient exchange: allgather closed form, plan rewrite, sparse vs dense crossover."""

import math

import pytest

from simulator.collective_forms import ring_allgather_time_s, ring_allreduce_time_s
from simulator.engine import Engine
from simulator.plan import Collective, Compute, Plan, Stage
from simulator.records import span_table
from simulator.sparse import (INDEX_BYTES, SELECTION_PHASE, TOPK_SELECTION_BYTES_PER_ELEMENT, compression_summary,
                              sparse_payload_bytes, topk_count)
from simulator.strategies.ghp import apply_training_options
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, run_grid, run_plan, toy_workload


class TopkCosts(FixedCosts):
    """FixedCosts plus a top-k selection of `per_element_s` per element (records the densities asked)."""

    def __init__(self, forward_s_per_sample: float = 1.0, per_element_s: float = 0.0):
        super().__init__(forward_s_per_sample)
        self.per_element_s, self.densities = per_element_s, set()

    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        self.densities.add(density)
        return self.per_element_s * num_elements


def _allgather_plan(num_ranks: int, per_rank_bytes: float) -> Plan:
    ranks = tuple(range(num_ranks))
    actions = tuple((Collective(id=0, op="allgather", ranks=ranks, size_bytes=per_rank_bytes, key=("ag",)),)
                    for _ in ranks)
    return Plan("test", num_ranks, 1, (Stage(0, 0, 1, 0),), ranks, actions, 1.0)


@pytest.mark.parametrize("num_ranks", [2, 3, 4, 8])
def test_ring_allgather_in_the_engine_matches_the_closed_form(num_ranks):
    alpha, bandwidth, size = 5e-6, 10e9, 3e6
    topology = Topology(1, num_ranks, link(alpha, bandwidth), link(1e-6, 1e9))
    spans = run_plan(_allgather_plan(num_ranks, size), topology, FixedCosts())
    expected = (num_ranks - 1) * (alpha + size / bandwidth)
    assert spans["end_s"].max() == pytest.approx(expected, rel=1e-9)
    assert ring_allgather_time_s(size, num_ranks, alpha, bandwidth) == pytest.approx(expected, rel=1e-12)
    assert set(spans["kind"]) == {"allgather"}


def test_payload_is_k_values_plus_k_indices():
    assert topk_count(1000, 0.01) == 10 and topk_count(1001, 0.01) == 11 and topk_count(5, 1e-6) == 1
    assert sparse_payload_bytes(4000, 0.01, 4) == 10 * (4 + INDEX_BYTES)
    assert sparse_payload_bytes(2000, 0.01, 2) == 10 * (2 + INDEX_BYTES)


def _dp_plan(num_ranks=4, layers=4, params=1_000_000, bandwidth=1e9):
    workload = toy_workload(layers, num_params=params, output_elements=10)
    topology = Topology(1, num_ranks, link(0.0, bandwidth), link(0.0, bandwidth))
    plan, spans = run_grid(workload, topology, FixedCosts(1e-9), num_ranks, 1, num_ranks,
                           bucket_size_bytes=float("inf"))
    return workload, topology, plan, spans


def test_topk_rewrites_each_allreduce_into_selection_then_allgather():
    workload, _, plan, _ = _dp_plan()
    sparse = apply_training_options(plan, workload, gradient_compression="topk", compression_density=0.01,
                                    optimizer="sgd")
    actions = sparse.actions[0]
    allgathers = [a for a in actions if isinstance(a, Collective)]
    assert [a.op for a in allgathers] == ["allgather"]
    dense_bytes = 4 * 1_000_000 * 4
    assert allgathers[0].size_bytes == math.ceil(0.01 * 4_000_000) * (4 + INDEX_BYTES)
    selection = actions[allgathers[0].deps[0]]
    assert isinstance(selection, Compute) and selection.phase == SELECTION_PHASE == "topk"
    assert selection.num_params == 4_000_000  # the bucket's gradient elements
    assert sparse.meta["selection_actions"][0] == [selection.id]
    assert list(sparse.meta["topk"]["dense_bytes"].values()) == [dense_bytes]
    optimizer = actions[-1]
    assert optimizer.phase == "opt" and allgathers[0].id in optimizer.deps


@pytest.mark.parametrize("density, sparse_wins", [(0.2, True), (0.3, False)])
def test_sparse_beats_dense_only_while_density_times_ranks_is_below_one(density, sparse_wins):
    """fp32 values + int32 indices: (p-1) 2 rho S against 2 (p-1)/p S, crossover at rho = 1/p = 0.25."""
    workload, topology, plan, dense_spans = _dp_plan()
    sparse = apply_training_options(plan, workload, gradient_compression="topk", compression_density=density)
    sparse_spans = span_table(Engine(sparse, topology, TopkCosts(1e-9)).run().spans)
    size = 4 * 1_000_000 * 4
    sparse_comm = sparse_spans[sparse_spans["kind"] == "allgather"]["duration_s"].max()
    dense_comm = dense_spans[dense_spans["kind"] == "allreduce"]["duration_s"].max()
    assert dense_comm == pytest.approx(ring_allreduce_time_s(size, 4, 0.0, 1e9))
    assert sparse_comm == pytest.approx(ring_allgather_time_s(sparse_payload_bytes(size, density, 4), 4, 0.0, 1e9))
    assert (sparse_comm < dense_comm) == sparse_wins
    summary = compression_summary(sparse, topology, memory_bandwidth_bytes_per_s=1e30)
    assert summary["allgather_s"] == pytest.approx(sparse_comm) and summary["dense_s"] == pytest.approx(dense_comm)
    assert summary["sparse_faster"] == sparse_wins


def test_selection_is_timed_by_topk_s_at_the_plan_density():
    """One bucket: backward (2 x 4 layers x 1 sample x 1 s), selection n x 1e-9 s, allgather, update."""
    workload, topology, plan, _ = _dp_plan(num_ranks=2)
    sparse = apply_training_options(plan, workload, gradient_compression="topk", compression_density=0.05)
    costs = TopkCosts(1.0, per_element_s=1e-9)
    spans = span_table(Engine(sparse, topology, costs).run().spans)
    selection = spans[(spans["rank"] == 0) & (spans["kind"] == "topk")]
    assert len(selection) == 1 and selection["duration_s"].iloc[0] == pytest.approx(4_000_000 * 1e-9)
    assert costs.densities == {0.05}
    payload = sparse_payload_bytes(16e6, 0.05, 4)
    allgather = spans[(spans["rank"] == 0) & (spans["kind"] == "allgather")]
    assert allgather["start_s"].iloc[0] == pytest.approx(selection["end_s"].iloc[0])
    assert allgather["duration_s"].iloc[0] == pytest.approx(ring_allgather_time_s(payload, 2, 0.0, 1e9))


def _profile_document(with_sparse: bool) -> dict:
    from tests.test_profile import document
    doc = document()  # mlp 64-64-64-10 calibrated at world size 4, gloo
    doc["compute_slowdown"] = {"1": 1.0, "2": 1.5, "4": 2.0}
    doc.pop("allgather")
    doc.pop("topk")
    if with_sparse:
        doc["allgather"] = {"2": {"latency_s": 7e-5, "bandwidth_bytes_per_s": 4e8}}
        doc["topk"] = {"0.1": {"intercept_s": 3e-5, "per_element_s": 2e-8}}
    return doc


def _profiled_dp_spans(doc: dict, density: float = 0.1):
    from simulator.profile import profile_from_dict
    from simulator.profile_costs import ProfileCosts
    from tests.test_profile import workload
    profile = profile_from_dict(doc, "p.json")
    work = workload()
    costs = ProfileCosts(profile, work, concurrent_ranks=2)
    topology = Topology(1, 2, link(0.0, 1e9), link(0.0, 1e9))
    plan, _ = run_grid(work, topology, costs, 2, 1, 8, bucket_size_bytes=float("inf"))
    sparse = apply_training_options(plan, work, gradient_compression="topk", compression_density=density)
    return work, span_table(Engine(sparse, topology, costs).run().spans)


def test_a_profile_times_allgather_and_selection_by_their_own_fits():
    work, spans = _profiled_dp_spans(_profile_document(with_sparse=True))
    n = work.num_params
    selection = spans[(spans["rank"] == 0) & (spans["kind"] == "topk")]["duration_s"].iloc[0]
    assert selection == pytest.approx((3e-5 + 2e-8 * n) * 1.5 / 2.0)  # scaled from 4 to 2 ranks at once
    allgather = spans[(spans["rank"] == 0) & (spans["kind"] == "allgather")]["duration_s"].iloc[0]
    assert allgather == pytest.approx(7e-5 + sparse_payload_bytes(4 * n, 0.1, 4) / 4e8)


@pytest.mark.parametrize("with_sparse, density, field", [(False, 0.1, "topk"), (True, 0.2, "topk")])
def test_a_profile_without_the_fits_is_a_one_line_error_naming_them(with_sparse, density, field):
    from simulator.errors import ScenarioError
    with pytest.raises(ScenarioError) as error:
        _profiled_dp_spans(_profile_document(with_sparse), density)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"p.json: {field}:") and f"density {density}" in message


def test_a_profile_without_an_allgather_fit_cannot_time_one():
    from simulator.errors import ScenarioError
    from simulator.profile import profile_from_dict
    from simulator.profile_costs import ProfileCosts
    from tests.test_profile import workload
    costs = ProfileCosts(profile_from_dict(_profile_document(with_sparse=False), "p.json"), workload())
    with pytest.raises(ScenarioError, match=r"^p.json: allgather: no fit for a group of 2 ranks"):
        costs.collective_s("allgather", 1e6, 2)
    assert costs.collective_s("allreduce", 1e6, 2) > 0  # the dense path is unaffected


def test_analytic_selection_is_a_memory_bound_pass():
    from simulator.costs import AnalyticCosts
    from simulator.hardware import GpuSpec
    gpu = GpuSpec(name="g", peak_flops_per_s={"fp32": 1e13}, memory_bytes=1e9, memory_bandwidth_bytes_per_s=1e11)
    costs = AnalyticCosts(toy_workload(1), gpu, "fp32", "sgd")
    assert costs.topk_s(1e6, 0.01) == pytest.approx(1e6 * TOPK_SELECTION_BYTES_PER_ELEMENT / 1e11)
    assert TOPK_SELECTION_BYTES_PER_ELEMENT == 16  # 12 (residual += g) + 4 (threshold filter), fp32
