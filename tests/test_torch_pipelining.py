"""gpipe and 1f1b through torch.distributed.pipelining (`--pipeline-runtime torch`, gloo on CPU):
- after 2 steps the parameters equal single-process full-batch training (GHP Proposition 1,
  1e-5 relative) at 2 stages, and with G = 2 replicas x 2 stages at 4 ranks;
- spans: one "schedule" compute span per rank, and with G = 2 one replica allreduce of exactly
  the stage's parameters (num_params x 4 bytes);
- kinds without a torch schedule are refused with one line naming --pipeline-runtime (exit 2)."""

import pytest

torch = pytest.importorskip("torch")

from simulator import load_scenario, simulate  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.measure import RunOptions, reference_training, run_rank  # noqa: E402
from validator.torch_pipelining import check_pipeline_runtime  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

STEPS, BATCH, LR = 2, 8, 0.05
MLP = {"name": "mlp", "params": {"input_dim": 16, "hidden_dim": 24, "num_hidden_layers": 3, "num_classes": 10}}
CASES = {  # name -> (kind, ranks, strategy fields)
    "gpipe p=2 m=4": ("gpipe", 2, {"num_microbatches": 4}),
    "1f1b p=2 m=4": ("1f1b", 2, {"num_microbatches": 4}),
    "1f1b G=2 x p=2 m=2": ("1f1b", 4, {"num_microbatches": 2, "num_groups": 2}),
}


def case_plan(name: str):
    kind, ranks, strategy = CASES[name]
    scenario = load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": ranks, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": MLP,
        "strategy": {"kind": kind, "symmetry": "off", **strategy},  # every rank's plan: each runs for real
        "training": {"global_batch_size": BATCH, "optimizer": "momentum"},
    })
    result = simulate(scenario)
    return result.plan, result.workload


def run_cases(rank: int, cases: list) -> list:
    options = RunOptions(steps=STEPS, warmup=0, optimizer="momentum", learning_rate=LR, return_state=True,
                         pipeline_runtime="torch")
    return [run_rank(rank, plan, workload, options) for plan, workload in cases]


@pytest.fixture(scope="module")
def measured() -> dict:
    """Case name -> (plan, workload, per-rank results); one launch per world size."""
    plans = {name: case_plan(name) for name in CASES}
    results = {}
    for world_size in (2, 4):
        names = [name for name, (plan, _) in plans.items() if plan.num_ranks == world_size]
        ranks = spawn(run_cases, ([plans[name] for name in names],), LaunchConfig(world_size, timeout_s=120))
        for index, name in enumerate(names):
            results[name] = (*plans[name], [rank[index] for rank in ranks])
    return results


def relative_error(actual, expected) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("name", list(CASES))
def test_torch_schedules_equal_full_batch_training(name, measured):
    plan, workload, ranks = measured[name]
    assert plan.strategy == CASES[name][0] and plan.num_groups == CASES[name][2].get("num_groups", 1)
    parameters: dict = {}
    for rank in ranks:
        for key, array in rank["state"].items():
            tensor = torch.from_numpy(array)
            parameters.setdefault(key, tensor)
            assert relative_error(tensor, parameters[key]) <= 1e-6, f"replicas disagree on {key}"
    expected = reference_training(workload, BATCH, STEPS, "momentum", LR)
    assert set(parameters) == set(expected)
    assert max(relative_error(parameters[k], expected[k]) for k in expected) <= 1e-5
    initial = reference_training(workload, BATCH, 0, "momentum", LR)
    assert max(relative_error(expected[k], initial[k]) for k in expected) > 1e-3, "training must move the weights"


@pytest.mark.parametrize("name", list(CASES))
def test_spans_cover_the_schedule_call_and_the_replica_allreduce(name, measured):
    plan, _, ranks = measured[name]
    for rank in ranks:
        spans = rank["spans"]
        schedule = [s for s in spans if s[1] == "compute" and s[2] == "schedule"]
        assert len(schedule) == 1 and schedule[0][4] == 0.0 and schedule[0][5] > 0.0
        reductions = [s for s in spans if s[1] == "comm"]
        if plan.num_groups == 1:
            assert reductions == []
        else:
            (reduction,) = reductions
            stage = plan.grid_position(rank["rank"])[1]
            assert reduction[3] == "allreduce" and reduction[6] == 4 * plan.stages[stage].num_params
            assert reduction[4] >= schedule[0][5]
        assert all(0.0 <= s[4] <= s[5] for s in spans)


@pytest.mark.parametrize("kind", ["pipedream", "spectrain", "interleaved_1f1b", "dp", "ghp"])
def test_kinds_without_a_torch_schedule_are_refused(kind):
    with pytest.raises(ScenarioError, match=f"--pipeline-runtime torch: strategy kind '{kind}'"):
        check_pipeline_runtime(kind, "torch")
    check_pipeline_runtime(kind, "own")
    check_pipeline_runtime("1f1b", "torch")


def test_cli_rejects_torch_runtime_for_pipedream(capsys, tmp_path):
    from ghpsim.cli import main
    code = main(["validate", "scenarios/validation/mlp_cpu.yaml", "--profile", str(tmp_path / "none.json"),
                 "--strategies", "gpipe:4,pipedream:4", "--pipeline-runtime", "torch",
                 "--out", str(tmp_path / "out")])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "--pipeline-runtime" in error and "pipedream" in error
    assert not (tmp_path / "out").exists(), "refused before anything runs"
