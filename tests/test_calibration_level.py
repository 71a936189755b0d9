"""The calibration-level diagnostic of the validation benchmarks (validator.report.calibration_level_summary)."""

import pandas as pd
import pytest

from validator.report import calibration_level_summary


def _rows(errors_by_profile: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    rows = [{"model": model, "world_size": world_size, "predicted_s": 1.0, "predicted_jitter_s": 1.0,
             "measured_s": 1.0, "error_pct": 0.0, "jitter_error_pct": error}
            for (model, world_size), errors in errors_by_profile.items() for error in errors]
    return pd.DataFrame(rows)


def test_a_shared_offset_per_profile_is_removed_and_the_rest_is_reported():
    frame = _rows({("mlp", 2): [-20.0, -24.0], ("mlp", 4): [10.0, 16.0, 13.0]})
    line = calibration_level_summary(frame)
    # levels -22 and +13; residuals 2, 2 and 3, 3, 0: MAPE 2.0, worst 3.0
    assert "-22.0 to +13.0 % over 2 profiles" in line
    assert "MAPE 2.0 %, worst 3.0 % (5 cases)" in line


def test_profiles_with_one_case_are_left_out_of_the_residual():
    frame = _rows({("mlp", 2): [-20.0, -10.0], ("resnet", 2): [40.0]})
    line = calibration_level_summary(frame)
    assert "over 1 profiles" in line and "MAPE 5.0 %, worst 5.0 % (2 cases)" in line


@pytest.mark.parametrize("frame", [
    _rows({("mlp", 2): [5.0], ("mlp", 4): [7.0]}),  # no profile with two cases
    _rows({("mlp", 2): [5.0, 6.0]}).drop(columns=["world_size"]),  # rows without profile keys
])
def test_nothing_to_say_gives_an_empty_line(frame):
    assert calibration_level_summary(frame) == ""


def test_the_nominal_error_is_used_when_rows_have_no_jittered_prediction():
    frame = _rows({("mlp", 2): [0.0, 0.0]}).drop(columns=["predicted_jitter_s"])
    frame["error_pct"] = [30.0, 10.0]
    assert "+20.0 to +20.0 %" in calibration_level_summary(frame)
    assert "MAPE 10.0 %" in calibration_level_summary(frame)
