"""The nccl path on several GPUs: DP and GHP runs equal single-process training (skips without GPUs)."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs 2 or more CUDA GPUs (nccl needs one GPU per rank)")


@pytest.mark.parametrize("kind, groups", [("dp", None), ("mp", None)])
def test_nccl_runs_match_single_process_training(kind, groups):
    from simulator import simulate
    from simulator.compare import with_strategy
    from tests.test_runtime_correctness import MLP, cpu_scenario, relative_error
    from validator.launch import LaunchConfig, spawn
    from validator.measure import RunOptions, reference_training, run_rank

    scenario = with_strategy(cpu_scenario(2, MLP), kind, groups)
    result = simulate(scenario)
    options = RunOptions(steps=2, warmup=0, optimizer="momentum", learning_rate=0.05, return_state=True,
                         device="cuda")
    ranks = spawn(run_rank, (result.plan, result.workload, options),
                  LaunchConfig(2, backend="nccl", device="cuda", timeout_s=180))
    reference = reference_training(result.workload, 8, 2, "momentum", 0.05)
    measured = {name: torch.from_numpy(array) for rank in ranks for name, array in rank["state"].items()}
    assert max(relative_error(measured[name], reference[name]) for name in reference) <= 1e-4
