"""Top-k sparse allreduce with error feedback in the real runtime (2 gloo ranks, issue 6):
with rho = 1 it is the dense run; with rho < 1 it ends with the parameters of the single-process
reference (validator.sparse_reference), whose selection is written independently."""

import pytest

torch = pytest.importorskip("torch")

from simulator import load_scenario, simulate  # noqa: E402
from simulator.plan import Collective  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.measure import RunOptions, run_rank  # noqa: E402
from validator.runtime import densify, sparsify  # noqa: E402
from validator.sparse_reference import plan_buckets, select, sparse_training  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

STEPS, BATCH, LR = 4, 8, 0.05
MLP = {"name": "mlp", "params": {"input_dim": 32, "hidden_dim": 48, "num_hidden_layers": 3, "num_classes": 10}}


def dp_result(density: float | None):
    strategy = {"kind": "dp", "bucket_size_bytes": 8_000, "symmetry": "off"}  # every rank runs for real
    if density is not None:
        strategy.update(gradient_compression="topk", compression_density=density)
    return simulate(load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": MLP, "strategy": strategy,
        "training": {"global_batch_size": BATCH, "optimizer": "momentum"}}))


def run_plans(rank, plans, workload, options):
    """Several plans one after the other in one process group (one spawn for the whole test)."""
    return [run_rank(rank, plan, workload, options) for plan in plans]


def relative_error(actual, expected) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


def worst_error(state: dict, reference: dict) -> float:
    assert set(state) == set(reference)
    return max(relative_error(state[name], reference[name]) for name in reference)


def test_sparsify_keeps_the_largest_magnitudes_and_the_rest_as_residual():
    flat = torch.tensor([0.5, -3.0, 1.0, 2.0, -0.25])
    residual = torch.tensor([0.0, 0.0, 1.5, 0.0, 0.0])
    payload = sparsify(flat, residual, 2)
    values, indices = payload[:2], payload[2:].view(torch.int32)
    assert sorted(zip(indices.tolist(), values.tolist())) == [(1, -3.0), (2, 2.5)]
    assert residual.tolist() == [0.5, 0.0, 0.0, 2.0, -0.25]
    other = sparsify(torch.tensor([1.0, 0.0, 0.0, 0.0, 4.0]), torch.zeros(5), 1)
    assert densify([payload, other], 5).tolist() == [0.0, -3.0, 2.5, 0.0, 4.0]
    assert select(torch.tensor([0.5, -3.0, 2.5, 2.0]), 2).tolist() == [0.0, -3.0, 2.5, 0.0]


def test_topk_runs_equal_dense_at_full_density_and_the_reference_below_it():
    dense, full, sparse = dp_result(None), dp_result(1.0), dp_result(0.05)
    workload = dense.workload
    buckets = plan_buckets(sparse.plan)
    assert len(buckets) >= 2, "several buckets, each with its own residual"
    options = RunOptions(steps=STEPS, warmup=0, optimizer="momentum", learning_rate=LR, return_state=True)
    ranks = spawn(run_plans, ([dense.plan, full.plan, sparse.plan], workload, options),
                  LaunchConfig(2, timeout_s=120))
    states = [{name: torch.from_numpy(array) for name, array in ranks[0][i]["state"].items()} for i in range(3)]
    for i in range(3):  # peers hold the same parameters
        assert worst_error({k: torch.from_numpy(v) for k, v in ranks[1][i]["state"].items()}, states[i]) <= 1e-6
    dense_state, full_state, sparse_state = states

    assert worst_error(full_state, dense_state) <= 1e-5

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks
    try:
        reference = sparse_training(workload, 2, buckets, 0.05, STEPS, BATCH, "momentum", LR)
    finally:
        torch.set_num_threads(threads)
    assert worst_error(sparse_state, reference.state) <= 1e-5
    assert worst_error(sparse_state, dense_state) > 1e-3, "sparsification must change the result"
    without_feedback = sparse_training(workload, 2, buckets, 0.05, STEPS, BATCH, "momentum", LR,
                                       error_feedback=False)
    assert worst_error(sparse_state, without_feedback.state) > 1e-3, "the residual must matter"
    dense_reference = sparse_training(workload, 2, buckets, None, STEPS, BATCH, "momentum", LR)
    assert worst_error(dense_state, dense_reference.state) <= 1e-5

    # the runtime's exchange is the plan's: one allgather of k values + k indices per bucket
    planned = sorted(a.size_bytes for a in sparse.plan.actions[0] if isinstance(a, Collective))
    spans = ranks[0][2]["spans"]
    assert sorted(s[6] for s in spans if s[3] == "allgather") == planned
    assert sum(1 for s in spans if s[3] == "topk") == len(buckets)


def test_ghp_topk_equals_the_reference_with_one_reference_rank_per_group():
    """G = 2 groups of M = 2 stages: each stage's G peers exchange its buckets; the groups are the
    reference's ranks (Proposition 1: a group's gradients are those of its slice of the batch)."""
    result = simulate(load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 4, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": MLP, "strategy": {"kind": "ghp", "num_groups": 2, "bucket_size_bytes": 8_000,
                                   "gradient_compression": "topk", "compression_density": 0.05},
        "training": {"global_batch_size": BATCH, "optimizer": "momentum"}}))
    options = RunOptions(steps=STEPS, warmup=0, optimizer="momentum", learning_rate=LR, return_state=True)
    ranks = spawn(run_rank, (result.plan, result.workload, options), LaunchConfig(4, timeout_s=120))
    state = {}
    for rank in ranks[:2]:  # group 0's two stages hold the whole model
        state.update({name: torch.from_numpy(array) for name, array in rank["state"].items()})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reference = sparse_training(result.workload, 2, plan_buckets(result.plan), 0.05, STEPS, BATCH,
                                    "momentum", LR)
    finally:
        torch.set_num_threads(threads)
    assert worst_error(state, reference.state) <= 1e-5
