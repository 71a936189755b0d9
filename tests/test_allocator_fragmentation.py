"""`training.allocator_fragmentation` (f): tensors fit in the GPU's memory x (1 - f), in the
summary, `rank` and the layout search; the peak reported stays the allocated one."""

import pytest

from ghpsim.cli import main
from simulator.layout_search import search_layouts
from simulator.scenario import load_scenario
from simulator.simulate import simulate

GPT3 = "scenarios/gpt3_175b_dgx_a100_3d.yaml"  # its peak is 0.67 of the A100's 80 GB


def test_fragmentation_shrinks_the_memory_a_run_fits_in_not_its_peak():
    plain = simulate(load_scenario(GPT3)).summary
    tight = simulate(load_scenario(GPT3, ["training.allocator_fragmentation=0.4"])).summary
    capacity = load_scenario(GPT3).cluster.gpu.memory_bytes
    assert tight["memory"]["peak_memory_bytes"] == plain["memory"]["peak_memory_bytes"]
    assert tight["memory"]["capacity_bytes"] == pytest.approx(0.6 * capacity)
    assert plain["fits_in_memory"] and not tight["fits_in_memory"]  # 0.67 fits 1.0, not 0.6
    assert tight["step_time_s"] == plain["step_time_s"]
    assert all(row["fits_in_memory"] == (row["peak_memory_bytes"] <= 0.6 * capacity) for row in tight["devices"])


def test_rank_checks_layouts_against_the_usable_memory():
    scenario = load_scenario(GPT3, ["training.allocator_fragmentation=0.3", "cluster.num_nodes=16"])
    ranking = search_layouts(scenario, kinds=("megatron",), microbatch_sizes=(1,), top=3, workers=1,
                             show_progress=False)
    usable = 0.7 * scenario.cluster.gpu.memory_bytes
    assert ranking.device_memory_bytes == pytest.approx(usable)
    assert ranking.rows and all(row["fits_in_memory"] == (row["peak_memory_bytes"] <= usable) for row in ranking.rows)
    assert ranking.rows[0]["fits_in_memory"] and ranking.rows[0]["peak_memory_bytes"] <= usable


def test_a_fragmentation_out_of_range_is_one_line(tmp_path, capsys):
    assert main(["simulate", GPT3, "--set", "training.allocator_fragmentation=0.6"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "training.allocator_fragmentation" in error[0] and "0.6" in error[0]
