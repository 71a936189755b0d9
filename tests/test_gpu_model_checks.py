"""The committed single-GPU checks of the kernel and memory models (reports/gpu/h200_kernels,
measured on an H200 by benchmarks/gpu_model_checks.sh) are what this simulator predicts: every
predicted figure is reproduced here from the committed kernel profile, and the peak-memory target
(issue: within 10 % of `torch.cuda.max_memory_allocated`) holds. After a model change,
`python benchmarks/gpu_kernel_check.py --repredict reports/gpu/h200_kernels` rewrites the step
predictions; the memory rows are re-predicted by `gpu_memory_check.predicted_peak`."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from simulator.profile import KernelProfile, load_profile

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "reports" / "gpu" / "h200_kernels"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(name: str) -> list[dict]:
    with (FOLDER / name).open() as handle:
        return list(csv.DictReader(handle))


def test_the_profile_is_an_h200_kernel_calibration_with_a_misaligned_ceiling():
    profile = load_profile(FOLDER / "kernel_profile.json")
    assert isinstance(profile, KernelProfile) and profile.measured.gpu == "H200"
    assert len(profile.measured.misaligned_gemm) == 12 and profile.measured.framework is not None
    framework = profile.measured.framework  # the profile's host time: a tiny eager step's time per kernel
    assert profile.parameters["host_overhead_s"] == pytest.approx(framework.step_s / framework.kernels)
    assert framework.gpu_busy_s < 0.5 * framework.step_s
    assert 0 < profile.parameters["misaligned_gemm_efficiency"] < profile.parameters["gemm_efficiency"] <= 1


def test_every_step_prediction_is_reproduced_from_the_profile():
    check = load("gpu_kernel_check")
    steps = rows("steps.csv")
    assert {(row["model"], row["recipe"]) for row in steps} == {
        (label, recipe) for label, *_ in check.CONFIGS["cuda"] for recipe in check.RECIPES}
    for row in steps:
        with_profile, datasheet = check.predict(row["model"], row["recipe"], "H200", row["dtype"], row["optimizer"],
                                                FOLDER / "kernel_profile.json")
        measured = float(row["measured_step_s"])
        assert float(row["predicted_profile_s"]) == pytest.approx(with_profile, rel=1e-9), row["model"]
        assert float(row["predicted_datasheet_s"]) == pytest.approx(datasheet, rel=1e-9), row["model"]
        assert float(row["error_profile_pct"]) == pytest.approx(100 * (with_profile - measured) / measured)
        assert 0 < float(row["measured_gpu_busy_s"]) <= measured * 1.05 and int(row["measured_kernels"]) > 0
    summary = json.loads((FOLDER / "summary.json").read_text())
    assert summary["mape_profile_pct"] == pytest.approx(
        sum(abs(float(row["error_profile_pct"])) for row in steps) / len(steps))


def test_peak_memory_is_reproduced_and_within_ten_percent_of_the_measured():
    memory = load("gpu_memory_check")
    measured_rows = rows("memory.csv")
    assert {row["model"] for row in measured_rows} == {label for label, *_ in memory.CONFIGS["cuda"]}
    assert any("llama" in row["model"] for row in measured_rows) and any("gpt" in row["model"] for row in measured_rows)
    for row in measured_rows:
        predicted = memory.predicted_peak(row["model"], "H200")["peak_memory_bytes"]
        measured = float(row["measured_peak_bytes"])
        assert float(row["predicted_peak_bytes"]) == pytest.approx(predicted, rel=1e-9), row["model"]
        assert abs(predicted - measured) <= 0.10 * measured, row["model"]
        assert float(row["measured_persistent_bytes"]) == pytest.approx(float(row["predicted_persistent_bytes"]),
                                                                         rel=1e-3)


def test_the_memory_check_runs_the_megatron_recipe_on_cpu(tmp_path, capsys):
    memory = load("gpu_memory_check")
    assert memory.main(["--device", "cpu", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    measured_rows = list(csv.DictReader((tmp_path / "memory.csv").open()))
    assert [row["model"] for row in measured_rows] == [label for label, *_ in memory.CONFIGS["cpu"]]
    for row in measured_rows:  # the persistent buffers are the recipe's, byte for byte
        assert float(row["measured_persistent_bytes"]) == float(row["predicted_persistent_bytes"])
        assert float(row["measured_peak_bytes"]) > float(row["measured_persistent_bytes"])
        assert row["model"] in printed
    assert "peak memory: mean |error|" in printed


def test_fused_attention_matches_the_written_out_core_and_is_scoped():
    import torch

    from validator import attention_core
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 16, 4, generator=generator)
    k, v = (torch.randn(2, 2, 16, 4, generator=generator) for _ in range(2))
    for causal in (True, False):
        written = attention_core.attention(q, k, v, causal=causal)
        with attention_core.fused_attention():
            fused = attention_core.attention(q, k, v, causal=causal)
        assert torch.allclose(written, fused, atol=1e-5)
    assert attention_core._FUSED == [False]
