"""validator.reproducibility and benchmarks/bench_measurement_floor.py: one run's measurements as
the prediction of another's, on hand-made runs whose errors are known."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from validator.reproducibility import measured_against_measured, model_figures, share_within

ROOT = Path(__file__).resolve().parent.parent


def run(measured_s: dict[tuple[str, str], float], error_pct: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame([{"model": model, "strategy": strategy, "measured_s": seconds,
                          "jitter_error_pct": error_pct} for (model, strategy), seconds in measured_s.items()])


A = run({("mlp", "gpipe"): 0.10, ("mlp", "1f1b"): 0.20, ("resnet", "gpipe"): 0.40}, error_pct=5.0)
B = run({("mlp", "gpipe"): 0.11, ("mlp", "1f1b"): 0.16, ("resnet", "pipedream"): 0.30}, error_pct=-30.0)


def test_one_runs_measurements_score_anothers_over_their_common_cases():
    pairs = measured_against_measured({"a": A, "b": B}).set_index(["predictor_run", "measured_run"])
    a_for_b = pairs.loc[("a", "b")]
    assert a_for_b["cases"] == 2                        # resnet's cases differ: left out
    errors = [100 * (0.10 / 0.11 - 1), 100 * (0.20 / 0.16 - 1)]   # -9.09 %, +25 %
    assert a_for_b["mape_pct"] == pytest.approx(sum(abs(e) for e in errors) / 2)
    assert a_for_b["worst_pct"] == pytest.approx(25.0)
    assert a_for_b["mean_signed_pct"] == pytest.approx(sum(errors) / 2)
    b_for_a = pairs.loc[("b", "a")]                      # the other direction is its own figure
    assert b_for_a["worst_pct"] == pytest.approx(20.0)   # 0.16 for 0.20


def test_a_case_that_measured_nothing_is_left_out():
    unmeasured = B.assign(measured_s=[0.11, float("nan"), 0.30])
    pairs = measured_against_measured({"a": A, "b": unmeasured}).set_index(["predictor_run", "measured_run"])
    assert pairs.loc[("a", "b"), "cases"] == 1 and pairs.loc[("a", "b"), "worst_pct"] == pytest.approx(100 / 11)


def test_shares_count_the_rows_meeting_each_target():
    figures = model_figures({"a": A, "b": B}, "jitter_error_pct")
    share = share_within(figures, mape_target_pct=10.0, worst_target_pct=20.0)
    assert share == {"rows": 2, "mape_met_share": 0.5, "worst_met_share": 0.5,
                     "median_mape_pct": pytest.approx(17.5), "median_worst_pct": pytest.approx(17.5)}


@pytest.mark.parametrize("runs, message", [
    ({"a": A}, "at least two runs"),
    ({"a": A, "b": A.drop(columns="strategy")}, "lacks the column(s) strategy"),
    ({"a": A, "b": pd.concat([A, A.head(1)])}, "appears twice"),
    ({"a": A.head(1), "b": B.tail(1)}, "measured no case in common"),
])
def test_bad_runs_are_named(runs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        measured_against_measured(runs)


def test_the_benchmark_prints_the_model_beside_the_replay(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_measurement_floor

    paths = []
    for name, frame in (("run_a", A), ("run_b", B)):
        (tmp_path / name).mkdir()
        frame.assign(predicted_jitter_s=1.0).to_csv(tmp_path / name / "v.csv", index=False)
        paths.append(str(tmp_path / name / "v.csv"))
    assert bench_measurement_floor.main(paths) == 0
    out = capsys.readouterr().out
    run_b = next(line for line in out.splitlines() if line.startswith("run_b"))
    assert run_b.split()[1:3] == ["30.0%", "30.0%"]      # the model's own error on run_b
    assert "25.0-25.0" in run_b                          # run_a's measurements as its prediction


def test_the_benchmark_refuses_bad_runs_in_one_line(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_measurement_floor

    for name in ("run_a", "run_b", "empty"):
        (tmp_path / name).mkdir()
    A.assign(predicted_jitter_s=1.0).to_csv(tmp_path / "run_a" / "v.csv", index=False)
    B.assign(predicted_jitter_s=1.0).drop(columns="jitter_error_pct").to_csv(tmp_path / "run_b" / "v.csv", index=False)
    (tmp_path / "empty" / "v.csv").write_text("")
    good = str(tmp_path / "run_a" / "v.csv")
    for other, message in ((tmp_path / "gone" / "v.csv", "no validation CSV at"),
                           (tmp_path / "empty" / "v.csv", "is not a readable CSV"),
                           (tmp_path / "run_b" / "v.csv", "run run_b has no column jitter_error_pct")):
        assert bench_measurement_floor.main([good, str(other)]) == 2
        error = capsys.readouterr().err.strip()
        assert message in error and len(error.splitlines()) == 1
