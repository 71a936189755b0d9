"""Real gloo runs of the simulator's pipeline plans (2 and 4 processes, several micro-batches in
flight):
- gpipe, 1f1b and interleaved_1f1b end with the parameters of single-process full-batch training
  (GHP Proposition 1, 1e-5 relative) at 2 and 4 stages and with G = 2 replicas x 2 stages;
- pipedream (stash), the no-stash schedule and spectrain (both prediction variants) end with the
  parameters of the single-process emulation of the same weight versions
  (`validator.pipeline_reference`), so the runtime implements exactly the schedule's staleness.
All cases of one world size run in one launch (process start-up dominates on a small host)."""

import pytest

torch = pytest.importorskip("torch")

from simulator import load_scenario, simulate  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.measure import RunOptions, reference_training, run_rank  # noqa: E402
from validator.pipeline_reference import emulate  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

STEPS, BATCH, LR = 3, 8, 0.05
MLP = {"name": "mlp", "params": {"input_dim": 32, "hidden_dim": 48, "num_hidden_layers": 3, "num_classes": 10}}
TRANSFORMER = {"name": "transformer", "params": {"num_layers": 2, "hidden_size": 32, "num_heads": 4,
                                                  "seq_len": 8, "vocab_size": 64}}


def pipeline_scenario(kind: str, world_size: int, model: dict = MLP, **strategy):
    return load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": world_size, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": model,
        "strategy": {"kind": kind, "num_microbatches": 4, "bucket_size_bytes": 8_000,
                     "symmetry": "off", **strategy},  # every rank's plan: each runs for real
        "training": {"global_batch_size": BATCH, "optimizer": "momentum"},
    })


SYNCHRONOUS_CASES = {
    "gpipe M=2": ("gpipe", 2, {}), "1f1b M=2": ("1f1b", 2, {}), "1f1b M=4": ("1f1b", 4, {}),
    "gpipe M=4 m=2": ("gpipe", 4, {"num_microbatches": 2}),
    "interleaved M=2 v=2": ("interleaved_1f1b", 2, {"num_virtual_stages": 2}),
    "1f1b G=2 x M=2": ("1f1b", 4, {"num_groups": 2, "num_microbatches": 2}),
    "gpipe G=2 x M=2 transformer": ("gpipe", 4, {"num_groups": 2, "num_microbatches": 2, "model": TRANSFORMER}),
}
ASYNCHRONOUS_CASES = {
    "pipedream stash M=4": ("pipedream", 4, {"weight_stashing": True}),
    "no-stash M=4": ("pipedream", 4, {"weight_stashing": False}),
    "spectrain staggered M=4": ("spectrain", 4, {"weight_prediction": "staggered"}),
    "spectrain forward M=2": ("spectrain", 2, {"weight_prediction": "forward"}),
    "no-stash M=2 transformer": ("pipedream", 2, {"weight_stashing": False, "model": TRANSFORMER}),
    "pipedream stash G=2 x M=2": ("pipedream", 4, {"num_groups": 2, "num_microbatches": 2}),
}


def relative_error(actual, expected) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


def case_plan(name: str):
    kind, world_size, options = {**SYNCHRONOUS_CASES, **ASYNCHRONOUS_CASES}[name]
    options = dict(options)
    model = options.pop("model", MLP)
    result = simulate(pipeline_scenario(kind, world_size, model, **options))
    return result.plan, result.workload


def run_cases(rank: int, cases: list) -> list:
    """One rank of several plans in a row."""
    options = RunOptions(steps=STEPS, warmup=0, optimizer="momentum", learning_rate=LR, return_state=True)
    return [run_rank(rank, plan, workload, options) for plan, workload in cases]


@pytest.fixture(scope="module")
def measured() -> dict:
    """Case name -> parameters after STEPS real steps (checked equal across replicas)."""
    plans = {name: case_plan(name) for name in [*SYNCHRONOUS_CASES, *ASYNCHRONOUS_CASES]}
    results = {}
    for world_size in (2, 4):
        names = [name for name, (plan, _) in plans.items() if plan.num_ranks == world_size]
        ranks = spawn(run_cases, ([plans[name] for name in names],), LaunchConfig(world_size, timeout_s=240))
        for index, name in enumerate(names):
            results[name] = parameters([rank[index] for rank in ranks])
    return results


def parameters(ranks: list) -> dict:
    measured: dict = {}
    for rank in ranks:
        assert rank["spans"], "every rank records spans"
        for name, array in rank["state"].items():
            tensor = torch.from_numpy(array)
            measured.setdefault(name, tensor)  # replicas hold identical copies
            assert relative_error(tensor, measured[name]) <= 1e-6, f"replicas disagree on {name}"
    return measured


def worst_error(measured: dict, expected: dict) -> float:
    assert set(measured) == set(expected)
    return max(relative_error(measured[name], expected[name]) for name in expected)


@pytest.mark.parametrize("name", list(SYNCHRONOUS_CASES))
def test_synchronous_pipelines_equal_full_batch_training(name, measured):
    workload = case_plan(name)[1]
    reference = reference_training(workload, BATCH, STEPS, "momentum", LR)
    assert worst_error(measured[name], reference) <= 1e-5
    initial = reference_training(workload, BATCH, 0, "momentum", LR)
    assert worst_error(reference, initial) > 1e-3, "training must move the parameters for the check to mean anything"


@pytest.mark.parametrize("name", list(ASYNCHRONOUS_CASES))
def test_asynchronous_pipelines_equal_the_reference_emulation(name, measured):
    plan, workload = case_plan(name)
    expected = emulate(plan, workload, STEPS, "momentum", LR).state
    assert worst_error(measured[name], expected) <= 1e-5
    full_batch = reference_training(workload, BATCH, STEPS, "momentum", LR)
    assert worst_error(expected, full_batch) > 1e-3, "staleness must change the result for the check to mean anything"


def test_validate_runs_a_pipeline_plan_end_to_end(tmp_path):
    """`validator.validate` of `1f1b:2` at 2 ranks: calibrate, predict, run, one positive row."""
    from simulator.model_source import resolve_workload
    from simulator.scenario import load_scenario
    from validator.calibrate import calibrate
    from validator.validate import validate

    scenario = load_scenario("scenarios/validation/mlp_cpu.yaml", [
        "cluster.gpus_per_node=2", "model.params.hidden_dim=64", "model.params.num_hidden_layers=3"])
    profile = tmp_path / "profile.json"
    calibrate(resolve_workload(scenario.model, scenario.base_dir), dict(scenario.model.params), profile,
              world_size=2, batch_sizes=(4, 16), repeats=3, layer_passes=1, verbose=False)
    (row,) = validate(scenario, str(profile), [("1f1b:2", None)], RunOptions(steps=2, warmup=1))["rows"]
    assert row["kind"] == "1f1b:2" and row["world_size"] == 2 and row["workers_per_group"] == 2
    assert row["measured_s"] > 0 and row["predicted_s"] > 0
