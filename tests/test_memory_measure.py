"""Measured peak memory of a real 2-rank run against the prediction, within the issue's 15 % target
(the full figures come from benchmarks/bench_memory.py)."""

import pytest

pytest.importorskip("torch")

from simulator.scenario import load_scenario  # noqa: E402
from validator.memory_measure import measure_memory  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`

SMALL = ["cluster.gpus_per_node=2", "model.params.hidden_dim=256", "model.params.num_hidden_layers=3"]


def test_measured_peak_memory_of_dp_and_mp_is_close_to_the_prediction():
    scenario = load_scenario("scenarios/validation/mlp_cpu.yaml", SMALL)
    rows = measure_memory(scenario, [("dp", None), ("mp", None)], timeout_s=120)
    assert [row["rank"] for row in rows] == [0, 1, 0, 1]
    params = 512 * 256 + 256 + 2 * (256 * 256 + 256) + 256 * 10 + 10
    dp = rows[0]
    assert dp["measured_bytes"] >= 2 * params * 4  # at least weights and gradients
    for row in rows:
        assert abs(row["error_pct"]) < 15, row
