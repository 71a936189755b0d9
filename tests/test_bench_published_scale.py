"""benchmarks/bench_published_scale.py: the SC'21 Table 1 runs are transcribed consistently, each
becomes a valid scenario of its published layout, and a small one is predicted and scored."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_published_scale import RUNS, main, predict_s, run_scenario, score  # noqa: E402

from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import scenario_from_dict  # noqa: E402


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.label)
def test_each_row_agrees_with_its_own_columns(run):
    # the table's aggregate column is TFLOP/s x GPUs, both rounded (TFLOP/s to the unit, PFLOP/s to
    # 0.1): a mistyped figure breaks this
    assert run.tflops_per_gpu * run.gpus / 1000 == pytest.approx(run.aggregate_pflops, abs=0.5 * run.gpus / 1000 + 0.05)
    scenario = scenario_from_dict(run_scenario(run), ".")
    strategy = scenario.strategy
    data_parallel = run.gpus // (run.tp * run.pp)
    assert scenario.num_gpus == run.gpus and data_parallel * run.tp * run.pp == run.gpus
    assert run.global_batch // (strategy.num_microbatches * data_parallel) == run.micro_batch
    assert strategy.num_virtual_stages * run.pp * (run.layers_per_virtual_stage or run.layers // run.pp) == run.layers
    # the model of the row has the published parameter count (the table rounds to 0.1 B)
    workload = resolve_workload(scenario.model, scenario.base_dir)
    assert round(workload.num_params / 1e9, 1) == run.params_billion


def test_measured_time_follows_eq_3():
    trillion = RUNS[-1]  # 1T on 3,072 GPUs at 163 TFLOP/s: about 103 s an iteration
    assert trillion.measured_s() == pytest.approx(
        96 * 3072 * 2048 * 128 * 25600 ** 2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
        / (3072 * 163e12))
    assert 100 < trillion.measured_s() < 105


def test_the_smallest_run_is_predicted_and_scored():
    predicted, peak_bytes, fits, _wall_s = predict_s((RUNS[0], None))
    assert isinstance(predicted, float) and 0.5 * RUNS[0].measured_s() < predicted < 2 * RUNS[0].measured_s()
    assert 0 < peak_bytes < 80e9 and fits  # the published run trained on 80 GB A100s
    rows = [{"run": "a", "error_pct": -10.0}, {"run": "b", "error_pct": 4.0}, {"run": "c", "error_pct": None}]
    assert score(rows) == {"runs": 2, "mape_pct": 7.0, "mean_signed_pct": -3.0, "worst_pct": 10.0, "worst_run": "a"}


def test_a_missing_profile_is_one_line_and_exit_2(capsys):
    assert main(["--profile", "no/such/profile.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no/such/profile.json" in err[0]
