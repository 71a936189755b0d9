"""Bad JSON input files found by a fuzzing pass: nesting deeper than MAX_DEPTH, integers of more
than 4300 digits, Infinity and NaN, absurd per-layer fits and out-of-range kernel parameters, in
calibration profiles, `merge-profiles`, Hugging Face configs and report inputs. Each is one line
on stderr naming the file, the field and the value, exit code 2, no traceback, no output file."""

from __future__ import annotations

import json

import pytest
import yaml

from simulator.errors import ScenarioError
from simulator.kernel_catalogue import MAX_HOST_OVERHEAD_S
from simulator.limits import MAX_DEPTH, MAX_VALUES
from simulator.profile import load_profile
from simulator.profile_merge import merge_profile_files
from simulator.report.inputs import load_report_input
from simulator.yaml_loading import load_json_text
from tests.test_bad_input import SMALL, assert_one_line_error, run_cli
from tests.test_bad_input_cli import A100_MEGATRON, KERNEL_PROFILE
from tests.test_profile import document

HUGE_INTEGER = "7" * 5000
"""More digits than Python converts (sys.get_int_max_str_digits(): 4300)."""


def nested(depth: int) -> dict:
    """A mapping `depth` levels deep."""
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def write_json(path, document_or_text):
    path.write_text(document_or_text if isinstance(document_or_text, str) else json.dumps(document_or_text))
    return path


def profile_text(case: str) -> str:
    """A calibration profile's text, broken as `case` says."""
    doc = document()
    if case == "deep":
        doc["provenance"] = {"notes": nested(MAX_DEPTH + 8)}
    elif case == "very deep":  # deeper than Python's recursion limit
        return json.dumps(doc)[:-1] + ', "provenance": ' + "[" * 5000 + "]" * 5000 + "}"
    elif case == "huge integer":
        return json.dumps(doc).replace('"world_size": 4', f'"world_size": {HUGE_INTEGER}')
    elif case == "infinity":
        doc["layers"][1]["forward"]["per_sample_s"] = float("inf")
    elif case == "huge fit":
        doc["layers"][1]["forward"]["per_sample_s"] = 1e300
    return json.dumps(doc)


EXPECTED = {"deep": ("provenance.notes.a", "nested more than 32 levels deep"),
            "very deep": ("nested more than 32 levels deep",),
            "huge integer": ("an integer of more than 4300 digits", "line 1"),
            "infinity": ("layers.1.forward.per_sample_s", "Infinity is not a finite number"),
            "huge fit": ("layers.1.forward.per_sample_s", "1e+300")}


# ----------------------------------------------------------------------------- 1: the JSON loader

@pytest.mark.parametrize("text, needles", [
    (json.dumps({"x": nested(MAX_DEPTH + 1)}), ("x.a.a", "nested more than 32 levels deep")),
    ("[" * 5000 + "]" * 5000, ("nested more than 32 levels deep",)),
    ('{"n": ' + HUGE_INTEGER + "}", ("line 1, column 7", "an integer of more than 4300 digits")),
    ('{"a": {"b": [1, NaN]}}', ("a.b.1", "NaN is not a finite number")),
    ('{"a": -Infinity}', ("a", "-Infinity is not a finite number")),
    ('{"a": 1e999}', ("a", "1e999 is not a finite number")),
    ('{"a": 1,\n "b": }', ("not valid JSON (line 2, column 7",)),
], ids=["deep", "very deep", "huge integer", "nan", "minus infinity", "overflow", "malformed"])
def test_load_json_text_refuses_in_one_line(text, needles):
    with pytest.raises(ScenarioError) as error:
        load_json_text(text, "in.json")
    message = str(error.value)
    assert message.startswith("in.json: ") and "\n" not in message and len(message) <= 300
    for needle in needles:
        assert needle in message, message


def test_load_json_text_without_the_structure_check_still_refuses_depth_and_infinity():
    many = json.dumps(list(range(MAX_VALUES + 10)))
    assert len(load_json_text(many, "big.json", check=False)) == MAX_VALUES + 10
    with pytest.raises(ScenarioError, match="more than 200000 values"):
        load_json_text(many, "big.json")
    with pytest.raises(ScenarioError, match=r"big.json: x(\.a)+: nested more than 32 levels deep"):
        load_json_text(json.dumps({"x": nested(MAX_DEPTH + 1)}), "big.json", check=False)
    with pytest.raises(ScenarioError, match="big.json: a: Infinity is not a finite number"):
        load_json_text('{"a": Infinity, "b": NaN}', "big.json", check=False, allow_nan=True)
    assert load_json_text('{"b": NaN}', "big.json", check=False, allow_nan=True)["b"] != 0


# ----------------------------------------------------------------------------- 1, 2, 4: calibration profiles

@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_broken_profile_is_one_line_when_simulating(tmp_path, capsys, case):
    profile = write_json(tmp_path / "profile.json", profile_text(case))
    assert_one_line_error(run_cli(capsys, "simulate", SMALL, "--profile", profile), profile, *EXPECTED[case])


@pytest.mark.parametrize("case", list(EXPECTED))
def test_merge_profiles_refuses_a_broken_profile_and_writes_nothing(tmp_path, capsys, case):
    good = write_json(tmp_path / "good.json", document())
    bad = write_json(tmp_path / "bad.json", profile_text(case))
    out = tmp_path / "out" / "pooled.json"
    for first, second in ((bad, good), (good, bad)):
        assert_one_line_error(run_cli(capsys, "merge-profiles", first, second, "--out", out), bad, *EXPECTED[case])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.json", "good.json"]


def test_merge_profiles_never_writes_a_non_finite_number(tmp_path, monkeypatch):
    """Were a pooled number not finite (the mean of numbers near the float limit), nothing is written."""
    import simulator.profile_merge

    def overflowing(documents, names):
        pooled = json.loads(json.dumps(documents[0]))
        pooled["layers"][0]["backward"]["intercept_s"] = float("inf")
        return pooled

    monkeypatch.setattr(simulator.profile_merge, "merge_profiles", overflowing)
    paths = [write_json(tmp_path / name, {**document(), "p2p": {"latency_s": latency_s, "bandwidth_bytes_per_s": 2e9}})
             for name, latency_s in (("a.json", 3e-5), ("b.json", 4e-5))]  # two calibrations, not one twice
    out = tmp_path / "pooled.json"
    with pytest.raises(ScenarioError) as error:
        merge_profile_files(paths, out)
    message = str(error.value)
    assert "layers.0.backward.intercept_s" in message and "inf is not a finite number" in message
    assert "\n" not in message and not out.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.json", "b.json"]


def test_a_good_pooled_profile_is_finite_json(tmp_path):
    paths = [write_json(tmp_path / name, {**document(), "p2p": {"latency_s": latency_s, "bandwidth_bytes_per_s": 2e9}})
             for name, latency_s in (("a.json", 3e-5), ("b.json", 4e-5))]  # two calibrations, not one twice
    merge_profile_files(paths, tmp_path / "pooled.json")
    text = (tmp_path / "pooled.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert load_profile(tmp_path / "pooled.json").world_size == 4


# ----------------------------------------------------------------------------- 1: Hugging Face configs

@pytest.mark.parametrize("text, needles", [
    (json.dumps({"hidden_size": 64, "extra": nested(MAX_DEPTH + 4)}), ("extra.a", "nested more than 32")),
    ("[" * 5000 + "]" * 5000, ("nested more than 32 levels deep",)),
    ('{"hidden_size": ' + HUGE_INTEGER + "}", ("an integer of more than 4300 digits",)),
    ('{"hidden_size": Infinity}', ("hidden_size", "Infinity is not a finite number")),
], ids=["deep", "very deep", "huge integer", "infinity"])
def test_a_broken_hf_config_is_one_line(tmp_path, capsys, monkeypatch, text, needles):
    monkeypatch.chdir(tmp_path)  # short paths: the line (at most 300 characters) keeps the problem
    write_json(tmp_path / "config.json", text)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"model": {"hf_config": "config.json"}, "training": {"global_batch_size": 8}}))
    assert_one_line_error(run_cli(capsys, "simulate", "scenario.yaml"), "model.hf_config", "config.json", *needles)


# ----------------------------------------------------------------------------- 1: report inputs

@pytest.mark.parametrize("text, needles", [
    (json.dumps({"step_time_s": 1.0, "devices": [], "x": nested(MAX_DEPTH + 4)}), ("x.a", "nested more than 32")),
    ("[" * 5000 + "]" * 5000, ("nested more than 32 levels deep",)),
    ('{"step_time_s": ' + HUGE_INTEGER + "}", ("an integer of more than 4300 digits",)),
    ('{"step_time_s": Infinity, "devices": []}', ("step_time_s", "Infinity is not a finite number")),
], ids=["deep", "very deep", "huge integer", "infinity"])
def test_a_broken_report_input_is_one_line_and_no_report(tmp_path, capsys, monkeypatch, text, needles):
    monkeypatch.chdir(tmp_path)
    write_json(tmp_path / "result.json", text)
    assert_one_line_error(run_cli(capsys, "report", "result.json", "--out", "report"), "INPUT: result.json", *needles)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["result.json"]


def test_a_validation_result_with_a_nan_figure_is_still_a_report_input(tmp_path):
    """`ghpsim validate --json` writes NaN for launch_noise_pct with one launch: not refused."""
    row = {"strategy": "dp", "predicted_s": 0.1, "measured_s": 0.11, "error_pct": -9.1,
           "launch_noise_pct": float("nan")}
    path = write_json(tmp_path / "validation.json", {"scenario": "s", "rows": [row]})
    assert load_report_input(path).kind == "validation"


# ----------------------------------------------------------------------------- 3: kernel profile parameters

@pytest.mark.parametrize("name, value", [
    ("gemm_efficiency", 0.0), ("gemm_efficiency", 5.0), ("flash_attention_efficiency", -0.5),
    ("memory_efficiency", 1.01), ("misaligned_gemm_efficiency", 0.0),
    ("launch_overhead_s", -1e-6), ("host_overhead_s", -1.0), ("host_overhead_s", 1e6),
    ("host_overhead_s", MAX_HOST_OVERHEAD_S * 1.5),
])
def test_a_kernel_profile_parameter_out_of_range_is_refused_on_loading(tmp_path, name, value):
    path = write_json(tmp_path / "kernel.json", {**KERNEL_PROFILE, "parameters": {name: value}})
    with pytest.raises(ScenarioError) as error:
        load_profile(path)
    message = str(error.value)
    assert message.startswith(f"{path}: parameters.{name}: {value!r} must be") and "\n" not in message


def test_kernel_profile_parameters_at_their_bounds_are_accepted(tmp_path):
    parameters = {"gemm_efficiency": 1.0, "memory_efficiency": 1e-3, "host_overhead_s": MAX_HOST_OVERHEAD_S,
                  "launch_overhead_s": 0.0}
    profile = load_profile(write_json(tmp_path / "kernel.json", {**KERNEL_PROFILE, "parameters": parameters}))
    assert profile.parameters == parameters


@pytest.mark.parametrize("command", ["simulate", "compare"])
@pytest.mark.parametrize("parameters, needles", [
    ({"gemm_efficiency": 0.0}, ("parameters.gemm_efficiency", "0.0", "(0, 1]")),
    ({"host_overhead_s": 1e6}, ("parameters.host_overhead_s", "1000000.0", "costs.host_overhead_s")),
    ('{"gemm_efficiency": Infinity}', ("parameters.gemm_efficiency", "Infinity is not a finite number")),
])
def test_a_bad_kernel_profile_is_one_line_in_simulate_and_compare(tmp_path, capsys, command, parameters, needles):
    scenario = tmp_path / "megatron.yaml"
    scenario.write_text(yaml.safe_dump(A100_MEGATRON))
    text = (json.dumps({**KERNEL_PROFILE, "parameters": parameters}) if isinstance(parameters, dict) else
            json.dumps(KERNEL_PROFILE).replace(json.dumps(KERNEL_PROFILE["parameters"]), parameters))
    profile = write_json(tmp_path / "kernel.json", text)
    assert_one_line_error(run_cli(capsys, command, scenario, "--profile", profile), profile, *needles)
