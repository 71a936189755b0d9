"""benchmarks/gpu_kernel_check.py on the CPU at tiny sizes: the kernel calibration, the measured
whole-model steps and the predictions with the measured profile land in --out."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from simulator.profile import KernelProfile, load_profile

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_kernel_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_kernel_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_calibrates_measures_and_predicts_on_cpu(tmp_path, capsys):
    check = load_script()
    out = tmp_path / "check"
    assert check.main(["--device", "cpu", "--quick", "--repeats", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    profile = load_profile(out / "kernel_profile.json")
    assert isinstance(profile, KernelProfile) and profile.measured.device.kind == "cpu"
    with (out / "steps.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["model"], row["recipe"]) for row in rows] == [
        (label, recipe) for label, *_ in check.CONFIGS["cpu"] for recipe in check.RECIPES]
    for row in rows:
        measured, predicted = float(row["measured_step_s"]), float(row["predicted_profile_s"])
        assert measured > 0 and predicted > 0 and float(row["predicted_datasheet_s"]) > 0
        assert float(row["error_profile_pct"]) == 100 * (predicted - measured) / measured
        assert row["model"] in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu"] == "cpu" and summary["parameters"] == dict(profile.parameters)
    assert summary["mape_profile_pct"] == pytest.approx(
        sum(abs(float(r["error_profile_pct"])) for r in rows) / len(rows), rel=1e-12)
    assert "MAPE: measured kernel profile" in printed
    assert set(summary["mape_by_recipe_pct"]) == set(check.RECIPES)
    assert not (out / "kernels.csv").exists()  # kernel traces are CUDA's


def test_the_check_reuses_a_profile_and_refuses_a_model_profile(tmp_path, capsys):
    check = load_script()
    first = tmp_path / "first"
    assert check.main(["--device", "cpu", "--quick", "--repeats", "1", "--out", str(first)]) == 0
    again = tmp_path / "again"
    profile = first / "kernel_profile.json"
    assert check.main(["--device", "cpu", "--repeats", "1", "--profile", str(profile), "--out", str(again)]) == 0
    assert not (again / "kernel_profile.json").exists()
    assert json.loads((again / "summary.json").read_text())["profile"] == str(profile)
    capsys.readouterr()
    model_profile = str(ROOT / "reports" / "profiles" / "mlp_cpu_ws2.json")
    assert check.main(["--device", "cpu", "--profile", model_profile, "--out", str(again)]) == 2
    assert "not a kernel profile from `ghpsim calibrate --kernels`" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_the_check_on_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    assert load_script().main(["--device", "cuda", "--out", str(tmp_path / "check")]) == 2
    error = capsys.readouterr().err
    assert error == "gpu_kernel_check: error: --device cuda: torch sees no GPU on this machine\n"


def test_busy_time_is_the_union_of_kernel_intervals_and_totals_go_by_name():
    check = load_script()
    kernels = [{"name": "gemm", "ts": 0.0, "dur": 10.0}, {"name": "add", "ts": 5.0, "dur": 10.0},
               {"name": "gemm", "ts": 30.0, "dur": 5.0}, {"name": "tiny", "ts": 31.0, "dur": 1.0}]
    assert check.busy_s(kernels) == pytest.approx(20e-6)  # [0, 15] and [30, 35]
    totals = check.kernel_totals("m", "eager", kernels)
    assert [(row["kernel"], row["count"]) for row in totals] == [("gemm", 2), ("add", 1), ("tiny", 1)]
    assert totals[0]["total_s"] == pytest.approx(15e-6)


def test_unknown_recipes_are_refused_in_one_line(tmp_path, capsys):
    check = load_script()
    with pytest.raises(SystemExit) as exit_info:
        check.main(["--device", "cpu", "--recipes", "eager,jit", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "--recipes: jit" in capsys.readouterr().err
