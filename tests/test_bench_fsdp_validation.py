"""benchmarks/bench_fsdp_validation.py: its cases are the FSDP2 / DDP layouts it names, its summary
is the median over runs per case, the committed run's predicted peaks are the current model's (and
within 10 % of the measured ones), and bad arguments are one line and exit 2."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_fsdp_validation import ZERO_STAGES, case_scenario, main, predicted_peak_bytes, summarise  # noqa: E402

from validator.fsdp_runtime import runnable_sharding  # noqa: E402


@pytest.mark.parametrize("zero_stage,sharding", [(0, "no_shard"), (2, "shard_grad_op"), (3, "full_shard")])
def test_each_case_is_a_runnable_megatron_layout_on_two_ranks(zero_stage, sharding):
    scenario = case_scenario(zero_stage)
    strategy = scenario.strategy
    assert scenario.num_gpus == 2 and strategy.kind == "megatron" and strategy.zero_stage == zero_stage
    assert runnable_sharding(strategy.tp_degree, strategy.pp_degree, strategy.zero_stage,
                             strategy.fsdp_sharding, strategy.cp_degree) == sharding


def test_summary_is_the_median_over_runs_per_case():
    rows = []
    for run, (ddp, grad_op, full) in enumerate([(4.0, -30.0, 10.0), (-2.0, -10.0, 30.0), (6.0, -20.0, 20.0)]):
        for (stage, name), error in zip(ZERO_STAGES.items(), (ddp, grad_op, full)):
            rows.append({"run": run, "case": name, "zero_stage": stage, "error_pct": error,
                         "memory_error_pct": 5.0 + run})
    summary = summarise(rows)
    cases = summary["cases"]
    assert [case["median_error_pct"] for case in cases.values()] == [4.0, -20.0, 20.0]
    assert all(case["runs"] == 3 and case["median_memory_error_pct"] == 6.0 for case in cases.values())
    assert summary["mape_pct"] == pytest.approx((4 + 20 + 20) / 3) and summary["worst_pct"] == 20.0


def test_the_committed_peaks_are_the_current_models_and_within_10_percent_of_the_measured():
    import pandas as pd
    frame = pd.read_csv(Path(__file__).resolve().parents[1] / "reports" / "validation_fsdp_cpu.csv")
    assert set(frame["zero_stage"]) == set(ZERO_STAGES)
    for stage, group in frame.groupby("zero_stage"):
        assert list(group["predicted_peak_bytes"]) == pytest.approx([predicted_peak_bytes(stage)] * len(group), rel=1e-12)
        errors = (group["predicted_peak_bytes"] - group["measured_peak_bytes"]) / group["measured_peak_bytes"]
        assert errors.abs().max() <= 0.10, (ZERO_STAGES[stage], list(errors))


def test_repredicting_a_missing_csv_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--repredict-memory", "--out", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.csv" in err[0]


@pytest.mark.parametrize("field", ["runs", "launches", "steps"])
def test_a_count_below_one_is_one_line_and_exit_2(field, capsys):
    assert main([f"--{field}", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--{field}" in err[0] and "0" in err[0]
