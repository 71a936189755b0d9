"""benchmarks/bench_published_cnn.py: the ResNet-50 rows become valid scenarios of their published
setting, and the benchmark scores them."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_published_cnn import COST_MODELS, RUNS, main, run_scenario  # noqa: E402

from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402


@pytest.mark.parametrize("run", RUNS, ids=lambda run: f"{run[0]}x{run[1]}-{run[3]}")
def test_each_row_is_resnet50_data_parallel_on_one_node(run):
    gpu, num_gpus, batch, dtype, _ = run
    scenario = scenario_from_dict(run_scenario(gpu, num_gpus, batch, dtype, "auto"))
    assert (scenario.num_gpus, scenario.cluster.num_nodes, scenario.strategy.kind) == (num_gpus, 1, "dp")
    assert scenario.training.global_batch_size == batch * num_gpus and scenario.training.dtype == dtype
    assert round(resolve_workload(scenario.model, scenario.base_dir).num_params / 1e6, 1) == 25.6  # ResNet-50


def test_the_benchmark_scores_every_row_with_each_cost_model(capsys):
    assert main(["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["rows"]) == len(RUNS) and set(result["summary"]) == set(COST_MODELS)
    for row in result["rows"]:
        measured = row["batch"] * row["gpus"] / next(r[4] for r in RUNS if r[:4] == (row["gpu"], row["gpus"],
                                                                                        row["batch"], row["dtype"]))
        assert row["measured_s"] == pytest.approx(measured)
        for model in COST_MODELS:
            assert row[f"{model}_error_pct"] == pytest.approx(100 * (row[f"{model}_s"] / measured - 1))
    # on Ampere, auto is the kernel model
    ampere = [row for row in result["rows"] if row["gpu"].startswith("A100")]
    assert all(row["auto_s"] == row["kernel_s"] for row in ampere)
