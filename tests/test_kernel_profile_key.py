"""`costs.kernel_profile`: a kernel profile kept in the scenario prices it as `simulate --profile`
does, and `rank --profile` prices every layout (and every layout's step-time bound) with it."""

from __future__ import annotations

import json
from pathlib import Path

from ghpsim.cli import main
from tests.test_fit import BASE

FAST = {"format": "ghpsim-profile/2", "kind": "kernel", "architecture": "ampere",
        "parameters": {"host_overhead_s": 0.0, "gemm_efficiency": 0.95}}
"""Faster than the catalogue (no host time, a higher GEMM ceiling): a bound priced on the catalogue
would exceed the simulated steps."""


def _files(tmp_path, profile=FAST, costs: str = "costs: {kernel_profile: k.json}\n"):
    (tmp_path / "k.json").write_text(json.dumps(profile))
    (tmp_path / "keyed.yaml").write_text(BASE + costs)
    (tmp_path / "plain.yaml").write_text(BASE)


def _step_s(capsys, *argv) -> float:
    assert main(["simulate", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["step_time_s"]


def test_the_key_prices_the_scenario_as_the_profile_flag_does(tmp_path, capsys):
    _files(tmp_path)
    assert main(["simulate", str(tmp_path / "keyed.yaml"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["compute_model"]["note"].startswith("kernel model with the parameters of costs.kernel_profile k.json")
    assert summary["compute_model"]["parameters"]["gemm_efficiency"] == 0.95
    keyed = _step_s(capsys, tmp_path / "keyed.yaml")  # relative to the scenario's folder, not the current one
    assert keyed == _step_s(capsys, tmp_path / "plain.yaml", "--profile", tmp_path / "k.json")
    assert keyed < _step_s(capsys, tmp_path / "plain.yaml")


def test_rank_prices_every_layout_and_its_bound_with_the_profile(tmp_path, capsys):
    _files(tmp_path)
    assert main(["rank", str(tmp_path / "plain.yaml"), "--json", "--workers", "1", "--exhaustive"]) == 0
    catalogue = json.loads(capsys.readouterr().out)["rows"]
    assert main(["rank", str(tmp_path / "plain.yaml"), "--json", "--workers", "1", "--exhaustive",
                 "--profile", str(tmp_path / "k.json")]) == 0
    fitted = json.loads(capsys.readouterr().out)["rows"]
    assert len(fitted) == len(catalogue) > 1
    assert all(row["bound_s"] <= row["step_time_s"] for row in fitted)
    steps = {row["label"]: row["step_time_s"] for row in catalogue}
    assert all(row["step_time_s"] < steps[row["label"]] for row in fitted)
    best = fitted[0]
    assert f"costs.kernel_profile={tmp_path / 'k.json'}" in best["set"]
    assert _step_s(capsys, tmp_path / "plain.yaml", *(part for item in best["set"] for part in ("--set", item))) \
        == best["step_time_s"]


def test_a_calibration_profile_or_the_roofline_is_refused_in_one_line(tmp_path, capsys):
    _files(tmp_path, profile={"format": "ghpsim-profile/2", "kind": "kernel", "architecture": "hopper",
                              "parameters": {}})
    assert main(["simulate", str(tmp_path / "keyed.yaml")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "costs.kernel_profile: " in error[0] and "fitted on 'hopper' GPUs" in error[0]
    _files(tmp_path, costs="costs: {kernel_profile: k.json, model: analytic}\n")
    assert main(["simulate", str(tmp_path / "keyed.yaml")]) == 2
    assert "costs.kernel_profile: 'k.json' needs the kernel model" in capsys.readouterr().err
    assert main(["rank", str(tmp_path / "plain.yaml"), "--profile",
                 str(Path(__file__).resolve().parents[1] / "reports/profiles/mlp_cpu_ws2.json")]) == 2
    assert "a calibration profile (one model at one world size), not a kernel profile" in capsys.readouterr().err
