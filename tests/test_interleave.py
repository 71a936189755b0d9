"""Calibration slices between a validation's launch rounds (`validator.interleave`) and the summary
of their pooled prediction (`validator.report.pooled_summary`). The calibration itself is replaced
by a stand-in that writes a scaled copy of a committed profile, so these tests run no ranks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from simulator.errors import ScenarioError
from validator import interleave
from validator.interleave import SLICE_LAYER_PASSES, CalibrationSlices
from validator.report import bracketed_summary, interleaved_summary, pooled_summary

PROFILE = Path(__file__).resolve().parent.parent / "reports" / "profiles" / "mlp_cpu_ws2.json"


@pytest.fixture
def base(tmp_path) -> Path:
    path = tmp_path / "mlp_ws2.json"
    path.write_text(PROFILE.read_text())
    return path


@pytest.fixture
def calibrations(monkeypatch):
    """Replaces `calibrate` in `validator.interleave`: each call writes the committed profile with its
    first layer's forward intercept scaled by 2, 3, ... and is recorded with its keyword arguments."""
    calls = []

    def fake_calibrate(workload, model_params, out_path, **kwargs):
        document = copy.deepcopy(json.loads(PROFILE.read_text()))
        factor = len(calls) + 2
        document["layers"][0]["forward"]["intercept_s"] *= factor
        document["created_utc"] = f"slice {len(calls) + 1}"
        Path(out_path).write_text(json.dumps(document))
        calls.append({"out_path": Path(out_path), **kwargs})
        return document

    monkeypatch.setattr(interleave, "calibrate", fake_calibrate)
    return calls


def test_a_slice_is_calibrated_after_every_nth_round_with_the_base_settings_and_one_sweep(base, calibrations,
                                                                                             tmp_path):
    slices = CalibrationSlices(base, workload=None, model_params={"x": 1}, every_rounds=2, folder=tmp_path)
    for round_index in range(5):
        slices.after_round(round_index)
    assert [call["out_path"].name for call in calibrations] == ["mlp_ws2_slice1.json", "mlp_ws2_slice2.json"]
    recorded = json.loads(PROFILE.read_text())["method"]["settings"]
    for call in calibrations:
        assert call["layer_passes"] == SLICE_LAYER_PASSES == 1
        assert call["world_size"] == 2 and call["device"] == "cpu" and call["verbose"] is False
        assert call["backend"] == "gloo"  # the base profile's, not the device's default
        assert list(call["batch_sizes"]) == recorded["batch_sizes"]
        assert call["jitter_passes"] == recorded["jitter_passes"] and call["repeats"] == recorded["repeats"]
    assert slices.slices == [call["out_path"] for call in calibrations]


def test_the_pooled_profile_averages_the_base_and_every_slice(base, calibrations, tmp_path):
    slices = CalibrationSlices(base, None, {}, every_rounds=1, folder=tmp_path)
    slices.after_round(0)
    slices.after_round(1)  # slices scaled x2 and x3: the pool of x1, x2, x3 is x2
    pooled = json.loads(slices.pooled().read_text())
    intercept_s = json.loads(PROFILE.read_text())["layers"][0]["forward"]["intercept_s"]
    assert pooled["layers"][0]["forward"]["intercept_s"] == pytest.approx(2 * intercept_s)
    assert pooled["merged_from"][1:] == ["slice 1", "slice 2"]
    assert slices.pooled().name == "mlp_ws2_interleaved.json"


def test_a_disturbed_slice_is_named(base, monkeypatch, calibrations, tmp_path):
    monkeypatch.setattr(interleave, "disturbance", lambda document: "steal 40 %")
    slices = CalibrationSlices(base, None, {}, every_rounds=1, folder=tmp_path)
    slices.after_round(0)
    assert slices.disturbed == ["mlp_ws2_slice1.json: steal 40 %"]


def test_bad_settings_and_no_slices_are_errors_naming_the_value(base, calibrations, tmp_path):
    with pytest.raises(ScenarioError, match="every 0 rounds"):
        CalibrationSlices(base, None, {}, every_rounds=0, folder=tmp_path)
    slices = CalibrationSlices(base, None, {}, every_rounds=4, folder=tmp_path)
    slices.after_round(0)
    assert calibrations == []
    with pytest.raises(ScenarioError, match="no slice was calibrated"):
        slices.pooled()
    missing = tmp_path / "missing.json"
    with pytest.raises(ScenarioError, match=f"{missing}: not a readable calibration profile"):
        CalibrationSlices(missing, None, {}, every_rounds=1, folder=tmp_path)


def test_pooled_summary_sets_the_second_prediction_beside_the_first_on_the_same_cases():
    frame = pd.DataFrame({"error_pct": [10.0, -20.0, 30.0], "jitter_error_pct": [5.0, -10.0, 1.0],
                          "interleaved_error_pct": [2.0, -4.0, None],
                          "interleaved_jitter_error_pct": [1.0, 3.0, None]})
    nominal, jittered = interleaved_summary(frame).splitlines()
    assert nominal.startswith("calibration + slices between rounds pooled, nominal (2 cases): MAPE 3.0 %, "
                              "worst 4.0 %, mean signed -1.0 %")
    assert nominal.endswith("alone: MAPE 15.0 %, worst 20.0 %, mean signed -5.0 %")  # the third case left out
    assert "jittered (2 cases): MAPE 2.0 %, worst 3.0 %, mean signed +2.0 %" in jittered
    assert bracketed_summary(frame) == ""
    assert pooled_summary(frame.rename(columns=lambda c: c.replace("interleaved", "x")), "x", "X").startswith("X,")


def test_interleaved_level_summary_scores_the_pooled_prediction_not_the_first():
    import pandas as pd

    from validator.report import calibration_level_summary, interleaved_level_summary
    frame = pd.DataFrame({"model": ["m", "m"], "world_size": [2, 2], "strategy": ["dp", "mp"],
                          "predicted_s": [1.2, 1.2], "measured_s": [1.0, 1.0], "error_pct": [20.0, 20.0],
                          "interleaved_predicted_s": [1.05, 0.95], "interleaved_error_pct": [5.0, -5.0]})
    line = interleaved_level_summary(frame)
    assert line.startswith("interleaved: ") and "+0.0 to +0.0 %" in line  # the pooled level, not +20 %
    assert line != "interleaved: " + calibration_level_summary(frame)
    assert interleaved_level_summary(frame.drop(columns=["interleaved_predicted_s", "interleaved_error_pct"])) == ""


def test_other_predictions_text_lists_each_second_prediction_the_row_has():
    from validator.report import other_predictions_text
    assert other_predictions_text({"predicted_s": 0.01}) == ""
    text = other_predictions_text({"interleaved_predicted_s": 0.0105, "interleaved_error_pct": 5.0,
                                   "interleaved_jitter_error_pct": 4.0})
    assert "interleaved    10.50 ms error    +5.0 %" in text and "(jittered    +4.0 %)" in text
    assert "anchored" not in text and "bracketed" not in text
