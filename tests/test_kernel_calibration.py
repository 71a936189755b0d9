"""`ghpsim calibrate --kernels` (validator/kernel_bench.py, validator.calibrate.calibrate_kernels): the
kernel profile derived from timings, its measured tables in the kernel model
(simulator.kernel_tables.MeasuredTables) and the command line."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.hardware import GPUS
from simulator.kernel_catalogue import ARCHITECTURES
from simulator.kernel_costs import device_for, kernel_s, tiled_compute_s
from simulator.kernel_tables import MeasuredTables, interpolate_log
from simulator.kernel_ops import Kernel, gemm
from simulator.model_source import resolve_workload
from simulator.profile import KernelProfile, load_profile, profile_document, profile_from_dict
from simulator.profile_costs import scenario_profile_costs
from simulator.scenario import load_scenario, scenario_from_dict
from validator import kernel_bench

H200 = GPUS["H200"]
LAUNCH_S, HOST_S = 3e-6, 6e-6
SIZES = (1024, 8192)
BANDWIDTH = H200.memory_bandwidth_bytes_per_s


MISALIGNED = {(8192, 8191, 1024): 0.1, (8192, 8192, 1023): 0.14, (8192, 8191, 4096): 0.12}


def true_tile_efficiency(m: int, n: int, k: int) -> float:
    return 0.7 if (m, n, k) == (8192, 8192, 8192) else 0.5


def synthetic_raw() -> dict:
    """Timings an H200 would give if its GEMM tiles ran at `true_tile_efficiency` and its large
    streams at 90 % of the datasheet bandwidth (small ones 1 us slower)."""
    device = device_for(H200, "fp16")
    gemm_rows = [{"dtype": "fp16", "m": m, "n": n, "k": k,
                  "time_s": LAUNCH_S + tiled_compute_s(m, n, k, 1, device, 1.0) / true_tile_efficiency(m, n, k)}
                 for m in SIZES for n in SIZES for k in SIZES]
    sizes = [3 * 4096 * 4 ** j for j in range(8)]
    memory_rows = [{"size_bytes": size, "time_s": LAUNCH_S + (1e-6 if size < 2**20 else 0.0) + size / (0.9 * BANDWIDTH)}
                   for size in sizes]
    misaligned_rows = [{"dtype": "fp16", "m": m, "n": n, "k": k,
                        "time_s": LAUNCH_S + tiled_compute_s(m, n, k, 1, device, 1.0) / efficiency}
                       for (m, n, k), efficiency in MISALIGNED.items()]
    return {"dtypes": ["fp16"], "gemm": gemm_rows, "memory": memory_rows, "misaligned_gemm": misaligned_rows,
            "launch": {"kernel_s": LAUNCH_S, "host_issue_s": HOST_S}}


DEVICE = {"kind": "cuda", "name": "NVIDIA H200", "num_threads": 1}


def synthetic_profile(tmp_path) -> tuple[dict, str]:
    notes: list[str] = []
    document = kernel_bench.kernel_profile_document(synthetic_raw(), H200, DEVICE, notes)
    path = tmp_path / "h200_kernels.json"
    path.write_text(json.dumps(profile_document(profile_from_dict(document))))
    return document, str(path)


def h200_scenario(dtype: str = "fp16"):
    return scenario_from_dict({
        "name": "one_h200", "cluster": {"num_nodes": 1, "gpus_per_node": 1, "gpu": "H200"},
        "model": {"name": "transformer", "params": {"num_layers": 2, "hidden_size": 256, "num_heads": 4,
                                                    "seq_len": 128, "vocab_size": 1000}},
        "training": {"global_batch_size": 4, "dtype": dtype, "optimizer": "adam"},
        "costs": {"model": "kernel"}})


# --- the derivation ------------------------------------------------------------------------------

def test_parameters_are_derived_from_the_timings():
    notes: list[str] = []
    document = kernel_bench.kernel_profile_document(synthetic_raw(), H200, DEVICE, notes)
    assert document["architecture"] == "hopper" and notes == []
    parameters = document["parameters"]
    assert parameters["gemm_efficiency"] == pytest.approx(0.7)  # the largest GEMM's tile efficiency
    assert parameters["memory_efficiency"] == pytest.approx(0.9)  # the large streams
    assert parameters["launch_overhead_s"] == LAUNCH_S
    assert parameters["misaligned_gemm_efficiency"] == pytest.approx(0.12)  # the median of the misaligned
    # not timed: the catalogue's stays; the bare launch's host time is no framework's per-kernel host time
    assert "flash_attention_efficiency" not in parameters and "host_overhead_s" not in parameters
    assert document["measured"]["launch"]["host_issue_s"] == HOST_S
    for row in document["measured"]["gemm"]:
        flops = 2.0 * row["m"] * row["n"] * row["k"]
        assert row["tile_efficiency"] == pytest.approx(true_tile_efficiency(row["m"], row["n"], row["k"]))
        assert row["efficiency"] == pytest.approx(flops / row["time_s"] / 989.5e12)
        assert row["achieved_flops_per_s"] == pytest.approx(flops / row["time_s"])
    big = document["measured"]["memory"][-1]
    assert big["efficiency"] == pytest.approx(0.9)
    assert big["bandwidth_bytes_per_s"] == pytest.approx(big["size_bytes"] / big["time_s"])


def test_a_ceiling_above_the_datasheet_is_capped_with_a_note():
    raw = synthetic_raw()
    for row in raw["memory"]:
        row["time_s"] = LAUNCH_S + row["size_bytes"] / (2.0 * BANDWIDTH)
    notes: list[str] = []
    document = kernel_bench.kernel_profile_document(raw, H200, DEVICE, notes)
    assert document["parameters"]["memory_efficiency"] == 1.0
    assert notes == ["memory_efficiency: measured 2.000 x the datasheet figure (above it); capped at 1"]
    assert document["measured"]["memory"][-1]["efficiency"] == pytest.approx(2.0)  # the table keeps it


# --- the measured tables in the kernel model -----------------------------------------------------

def test_interpolation_is_multilinear_in_log_space_and_clamped():
    axes, values = ((1.0, 4.0), (10.0, 1000.0)), (1.0, 2.0, 3.0, 6.0)
    assert interpolate_log(axes, values, (4.0, 10.0)) == pytest.approx(3.0)
    assert interpolate_log(axes, values, (2.0, 100.0)) == pytest.approx(3.0)  # the log-midpoint: the mean
    assert interpolate_log(axes, values, (0.5, 1e6)) == pytest.approx(2.0)    # clamped to (1, 1000)
    assert interpolate_log(((1.0, 100.0),), (1.0, 3.0), (10.0,)) == pytest.approx(2.0)


def test_the_kernel_model_reproduces_every_measured_gemm_and_stream(tmp_path):
    document, path = synthetic_profile(tmp_path)
    scenario = h200_scenario()
    costs = scenario_profile_costs(path, scenario, resolve_workload(scenario.model))
    device = costs.device
    assert costs.parameters.launch_overhead_s == LAUNCH_S
    assert costs.parameters.host_overhead_s == ARCHITECTURES["hopper"].parameters.host_overhead_s
    assert costs.parameters.gemm_efficiency == pytest.approx(0.7) and device.gemm_grid is not None
    for row in document["measured"]["gemm"]:
        assert kernel_s(gemm("g", row["m"], row["n"], row["k"], 2), device) == pytest.approx(row["time_s"], rel=1e-9)
    for row in document["measured"]["memory"]:
        stream = Kernel("triad", "elementwise", 0.0, 2 * row["size_bytes"] / 3, row["size_bytes"] / 3)
        assert kernel_s(stream, device) == pytest.approx(row["time_s"], rel=1e-9)
    smallest = document["measured"]["memory"][0]
    tiny = Kernel("tiny", "elementwise", 0.0, 8.0, 0.0)
    assert kernel_s(tiny, device) == pytest.approx(smallest["time_s"])  # the latency floor


def test_a_misaligned_gemm_runs_at_the_measured_misaligned_ceiling(tmp_path):
    _, path = synthetic_profile(tmp_path)
    scenario = h200_scenario()
    device = scenario_profile_costs(path, scenario, resolve_workload(scenario.model)).device
    assert device.parameters.misaligned_gemm_efficiency == pytest.approx(0.12)
    shape = (8192, 8191, 4096)  # the median row: its own time back
    expected = LAUNCH_S + tiled_compute_s(*shape, 1, device, 1.0) / 0.12
    assert kernel_s(gemm("g", *shape, 2, aligned=False), device) == pytest.approx(expected, rel=1e-9)
    assert kernel_s(gemm("g", *shape, 2), device) < expected / 3  # the same shape priced as aligned


def test_a_dtype_without_rows_takes_its_stand_in_or_the_ceiling(tmp_path):
    _, path = synthetic_profile(tmp_path)
    for dtype, has_grid in (("bf16", True), ("fp32", False)):
        scenario = h200_scenario(dtype)
        costs = scenario_profile_costs(path, scenario, resolve_workload(scenario.model))
        assert (costs.device.gemm_grid is not None) is has_grid
        assert costs.compute_s(1, "F", 4) > 0


def test_tables_follow_tensor_parallel_ranks(tmp_path):
    _, path = synthetic_profile(tmp_path)
    scenario = h200_scenario()
    costs = scenario_profile_costs(path, scenario, resolve_workload(scenario.model))
    assert costs.with_tensor_parallel(2, False).parameters.measured is costs.parameters.measured


def test_tables_from_rows_keep_k_fastest():
    rows = [("fp16", m, n, k, float(100 * m + 10 * n + k)) for m in (1, 2) for n in (1, 2) for k in (1, 2, 4)]
    tables = MeasuredTables.from_rows(reversed(rows), [(30.0, 0.5), (10.0, 0.25)])
    axes, values = tables.gemm_grid("fp16")
    assert axes == ((1, 2), (1, 2), (1, 2, 4)) and values == tuple(row[4] for row in rows)
    assert tables.memory_sizes_bytes == (10.0, 30.0) and tables.memory_efficiencies == (0.25, 0.5)


# --- the profile format --------------------------------------------------------------------------

def test_a_gemm_table_that_is_not_a_full_grid_is_refused(tmp_path):
    document, _ = synthetic_profile(tmp_path)
    document["measured"]["gemm"] = document["measured"]["gemm"][:-1]
    with pytest.raises(ScenarioError, match="measured: gemm: the fp16 rows are not one full grid"):
        profile_from_dict(document)


def test_a_fitted_kernel_profile_still_loads_without_measured():
    fitted = {"format": "ghpsim-profile/2", "kind": "kernel", "architecture": "ampere",
              "parameters": {"host_overhead_s": 1e-5, "gemm_efficiency": 0.8}, "fit": {"runs": 3}}
    profile = profile_from_dict(fitted)
    assert isinstance(profile, KernelProfile) and profile.measured is None
    assert "measured" not in profile_document(profile)


def test_a_profile_is_refused_for_another_architecture(tmp_path, capsys):
    _, path = synthetic_profile(tmp_path)
    assert main(["simulate", "scenarios/validation/transformer_cpu.yaml", "--profile", path]) == 2
    assert "architecture: measured on 'hopper' GPUs, but cluster.gpu 'cpu'" in capsys.readouterr().err


# --- catalogue GPU -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, entry", [("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-SXM"),
                                         ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
                                         ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A10", "A10"),
                                         ("NVIDIA L40S", "L40S"), ("Tesla T4", "T4"),
                                         ("Tesla V100-SXM2-16GB", "V100-16GB")])
def test_the_cuda_device_name_finds_its_catalogue_entry(monkeypatch, name, entry):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: name)
    assert kernel_bench.catalogue_gpu("cuda").name == entry
    assert all(target in GPUS for _, target in kernel_bench.GPU_NAMES)


def test_an_unknown_cuda_device_asks_for_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Mystery Accelerator 9000")
    with pytest.raises(ScenarioError, match="--gpu: cannot tell which catalogue GPU 'Mystery Accelerator 9000'"):
        kernel_bench.catalogue_gpu("cuda")
    assert kernel_bench.catalogue_gpu("cuda", "h200").name == "H200"
    assert kernel_bench.catalogue_gpu("cpu").name == "cpu"


# --- the command line ----------------------------------------------------------------------------

def test_the_help_quotes_the_default_dtypes():
    from ghpsim import arguments
    assert arguments.KERNEL_DTYPES == kernel_bench.DEFAULT_DTYPES


def test_calibrate_kernels_on_cpu_writes_a_profile_that_simulate_uses(tmp_path, capsys):
    out = tmp_path / "cpu_kernels.json"
    assert main(["calibrate", "--kernels", "--device", "cpu", "--quick", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    profile = load_profile(out)
    assert isinstance(profile, KernelProfile) and printed["parameters"] == dict(profile.parameters)
    assert profile.architecture == "cpu" and profile.measured.device.kind == "cpu"
    assert profile.measured.gpu == "cpu" and len(profile.measured.gemm) == 27
    assert len(profile.measured.misaligned_gemm) == 2 and profile.parameters["host_overhead_s"] == 0
    assert any("stands in for this CPU's peak" in note for note in profile.provenance["notes"])
    assert profile.provenance["settings"]["num_threads"] == 1
    assert set(profile.parameters) == {"gemm_efficiency", "memory_efficiency", "launch_overhead_s",
                                       "host_overhead_s", "misaligned_gemm_efficiency"}
    scenario_path = "scenarios/validation/transformer_cpu.yaml"
    scenario = load_scenario(scenario_path)
    costs = scenario_profile_costs(out, scenario, resolve_workload(scenario.model))
    assert costs.parameters.launch_overhead_s == profile.parameters["launch_overhead_s"]
    assert costs.parameters.measured is not None and costs.device.gemm_grid is not None
    assert main(["simulate", scenario_path, "--profile", str(out), "--json"]) == 0
    step_s = json.loads(capsys.readouterr().out)["step_time_s"]
    assert math.isfinite(step_s) and step_s > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line_and_writes_nothing(tmp_path, capsys):
    assert main(["calibrate", "--kernels", "--device", "cuda", "--out", str(tmp_path / "k.json")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no GPU" in error and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["--out", "{tmp}/p.json"], "--scenario: required (the model to profile), unless --kernels"),
    (["--kernels", "--scenario", "scenarios/validation/mlp_cpu.yaml", "--out", "{tmp}/p.json"],
     "--scenario: not used with --kernels"),
    (["--scenario", "scenarios/validation/mlp_cpu.yaml", "--quick", "--out", "{tmp}/p.json"],
     "--quick: only with --kernels"),
    (["--kernels", "--dtypes", "fp8", "--out", "{tmp}/p.json"], "--dtypes: 'fp8' is not one of"),
    (["--kernels", "--gpu", "Z9000", "--out", "{tmp}/p.json"], "--gpu: unknown GPU preset 'Z9000'"),
])
def test_bad_kernel_calibration_settings_are_one_line_errors(tmp_path, capsys, argv, message):
    assert main(["calibrate", *(part.format(tmp=tmp_path) for part in argv)]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_the_framework_host_time_per_kernel_is_a_tiny_steps_wall_time_over_its_launches():
    calls = []
    timed = kernel_bench.framework_host(lambda: calls.append(1), lambda: [{"ts": 0.0, "dur": 2.0}] * 4,
                                        lambda: None, steps=10, repeats=3)
    assert timed["kernels"] == 4 and timed["gpu_busy_s"] == pytest.approx(2e-6) and timed["step_s"] > 0
    assert len(calls) == 3 + 3 * 10  # warm-up, then three blocks of ten
    assert kernel_bench.framework_host(lambda: None, lambda: [], lambda: None, 10, 3) is None  # no trace


def test_a_cuda_profile_takes_its_host_time_from_the_framework_step():
    raw = {**synthetic_raw(), "framework": {"step_s": 3e-3, "kernels": 100, "gpu_busy_s": 1e-4}}
    notes: list[str] = []
    document = kernel_bench.kernel_profile_document(raw, H200, DEVICE, notes)
    assert document["parameters"]["host_overhead_s"] == pytest.approx(30e-6) and notes == []
    assert profile_from_dict(document).measured.framework.kernels == 100
    busy = {**raw, "framework": {"step_s": 3e-3, "kernels": 100, "gpu_busy_s": 2e-3}}
    kernel_bench.kernel_profile_document(busy, H200, DEVICE, notes)
    assert notes and "upper bound" in notes[0]
