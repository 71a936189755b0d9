"""Real gloo runs of DP, MP and GHP plans end with the parameters of single-process training on
the full batch (GHP paper, Proposition 1), to 1e-5 relative, at world sizes 2 and 4."""

import pytest

torch = pytest.importorskip("torch")

from simulator.grid_symmetry import every_rank  # noqa: E402
from simulator import load_scenario, simulate  # noqa: E402
from simulator.compare import with_strategy  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.measure import RunOptions, reference_training, run_rank  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

STEPS = 3


def cpu_scenario(world_size: int, model: dict) -> object:
    return load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": world_size, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": model,
        "strategy": {"kind": "dp", "bucket_size_bytes": 20_000},
        "training": {"global_batch_size": 8, "optimizer": "momentum"},
    })


MLP = {"name": "mlp", "params": {"input_dim": 32, "hidden_dim": 48, "num_hidden_layers": 3, "num_classes": 10}}
TRANSFORMER = {"name": "transformer", "params": {"num_layers": 3, "hidden_size": 32, "num_heads": 4,
                                                  "seq_len": 8, "vocab_size": 64}}


def relative_error(actual, expected) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("world_size, kind, groups, model", [
    (2, "dp", None, MLP), (2, "mp", None, MLP),
    (4, "dp", None, MLP), (4, "mp", None, MLP), (4, "ghp", 2, MLP),
    (4, "ghp", 2, TRANSFORMER),
])
def test_distributed_parameters_equal_single_process_training(world_size, kind, groups, model):
    scenario = with_strategy(cpu_scenario(world_size, model), kind, groups)
    result = simulate(every_rank(scenario))
    options = RunOptions(steps=STEPS, warmup=0, optimizer="momentum", learning_rate=0.05, return_state=True)
    ranks = spawn(run_rank, (result.plan, result.workload, options), LaunchConfig(world_size, timeout_s=120))
    reference = reference_training(result.workload, 8, STEPS, "momentum", 0.05)
    measured: dict = {}
    for rank in ranks:
        for name, array in rank["state"].items():
            tensor = torch.from_numpy(array)
            measured.setdefault(name, tensor)  # peers hold identical copies; checked below
            assert relative_error(tensor, measured[name]) <= 1e-6, f"peers disagree on {name}"
    assert set(measured) == set(reference)
    worst = max(relative_error(measured[name], reference[name]) for name in reference)
    assert worst <= 1e-5
    changed = max(relative_error(reference[name], initial) for name, initial in
                  reference_training(result.workload, 8, 0, "momentum", 0.05).items())
    assert changed > 1e-3, "training must actually move the parameters for the check to mean anything"
