"""benchmarks/bench_sweep_cache.py and sweep_whatif.py: the stage split, the measurement's shape,
and the what-if's scaling of backward costs only."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_sweep_cache  # noqa: E402
import sweep_whatif  # noqa: E402


def test_two_stages_split_all_but_the_loss_layer_in_contiguous_halves():
    assert bench_sweep_cache.two_stages(7) == [[0, 1, 2], [3, 4, 5]]
    assert bench_sweep_cache.two_stages(4) == [[0], [1, 2]]


def test_measure_times_every_layer_of_both_halves():
    rows = bench_sweep_cache.measure("mlp_cpu", 4, trials=2)
    assert [row["stage"] for row in rows] == ["L0-2", "L3-5"]
    for row in rows:
        assert row["forward_ratio"] > 0 and row["backward_ratio"] > 0 and row["tight_backward_ms"] > 0
        low, high = row["backward_ratio_p10_p90"]
        assert low <= high
    assert sorted(layer for row in rows for layer in row["layer_backward_ratios"]) == list(range(6))


class _Costs:
    def compute_s(self, layer_index, phase, batch):
        return 1.0 + layer_index


def test_backward_scaled_multiplies_the_backward_of_listed_layers_only():
    costs = sweep_whatif.backward_scaled(_Costs(), {1: 1.5})
    assert costs.compute_s(1, "B", 8) == pytest.approx(3.0)
    assert costs.compute_s(1, "F", 8) == pytest.approx(2.0)
    assert costs.compute_s(0, "B", 8) == pytest.approx(1.0)


def test_whatif_refuses_a_folder_without_the_run(tmp_path):
    completed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_whatif.py"), str(tmp_path)],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().endswith("mlp_cpu.csv: no such file")
