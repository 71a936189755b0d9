"""The summary's `kernel_passes` (simulator.kernel_report): where rank 0's first micro-batch spends
its compute time under the kernel cost model, and the line `simulate` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator import load_scenario, simulate
from simulator.kernel_catalogue import HOST_OVERHEAD_S

ROOT = Path(__file__).resolve().parent.parent
RESNET = ROOT / "scenarios" / "resnet50_dp_a100.yaml"


def test_a_small_batch_waits_on_the_host_and_the_figures_add_up():
    result = simulate(load_scenario(RESNET))
    report, workload = result.summary["kernel_passes"], result.workload
    assert report["num_layers"] == workload.num_layers and report["batch"] == 32
    assert report["host_overhead_s"] == HOST_OVERHEAD_S
    from simulator.kernel_costs import KernelCosts
    costs = KernelCosts.for_scenario(result.scenario, workload)
    for name, phase in (("forward", "F"), ("backward", "B")):
        figures = report[name]
        actions = [a for a in result.plan.actions[0] if getattr(a, "phase", None) == phase and a.microbatch == 0]
        alone = 0.0  # each action alone: max(its kernels' GPU time, their issue on the host)
        for action in actions:
            parts = [costs.compute_parts(i, phase, 32) for i in range(action.layer_start, action.layer_end)]
            alone += max(sum(device for device, _ in parts), sum(host for _, host in parts))
        assert figures["total_s"] == pytest.approx(alone)
        assert figures["total_s"] <= sum(costs.compute_s(i, phase, 32) for i in range(workload.num_layers))
        assert figures["host_wait_s"] > 0
        assert figures["total_s"] == pytest.approx(figures["host_wait_s"] + sum(figures["gpu_s"].values()))
    gpu_bound = simulate(load_scenario(RESNET, ["costs.host_overhead_s=0"])).summary["kernel_passes"]
    for name in ("forward", "backward"):
        assert gpu_bound[name]["host_wait_s"] == 0
        assert gpu_bound[name]["gpu_s"] == pytest.approx(report[name]["gpu_s"])
        assert gpu_bound[name]["total_s"] < report[name]["total_s"]


def test_full_recompute_is_counted_in_the_backward():
    path = ROOT / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"
    plain = simulate(load_scenario(path, ["training.recompute=none"])).summary["kernel_passes"]
    full = simulate(load_scenario(path, ["training.recompute=full"])).summary["kernel_passes"]
    assert full["forward"]["total_s"] == pytest.approx(plain["forward"]["total_s"])
    assert full["backward"]["total_s"] == pytest.approx(plain["backward"]["total_s"] + plain["forward"]["total_s"])


def test_other_cost_models_have_no_kernel_passes_and_the_cli_prints_the_line(capsys):
    roofline = load_scenario(ROOT / "scenarios" / "demo.yaml", ["costs.model=analytic"])
    assert "kernel_passes" not in simulate(roofline).summary
    assert main(["simulate", str(RESNET)]) == 0
    out = capsys.readouterr().out
    assert "kernels of rank 0's first micro-batch (18 layers, 32 samples)" in out and "waiting on the host" in out
