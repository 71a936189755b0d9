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
    assert [row["model"] for row in rows] == [label for label, *_ in check.CONFIGS["cpu"]]
    for row in rows:
        measured, predicted = float(row["measured_step_s"]), float(row["predicted_profile_s"])
        assert measured > 0 and predicted > 0 and float(row["predicted_datasheet_s"]) > 0
        assert float(row["error_profile_pct"]) == 100 * (predicted - measured) / measured
        assert row["model"] in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu"] == "cpu" and summary["parameters"] == dict(profile.parameters)
    assert summary["mape_profile_pct"] == sum(abs(float(r["error_profile_pct"])) for r in rows) / len(rows)
    assert "MAPE: measured kernel profile" in printed


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
