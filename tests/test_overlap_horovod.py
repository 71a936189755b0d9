"""Horovod-style tensor fusion (`strategy.gradient_fusion: horovod`, simulator/strategies/fusion.py):
gradients ready by the same tick of the background thread, up to the fusion threshold, go in one
allreduce, which starts at that tick."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.fusion import horovod_groups, horovod_segments
from tests.helpers import FixedCosts, Topology, link, run_grid, toy_workload

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def test_tensors_ready_by_one_tick_fuse_up_to_the_threshold():
    ready_ms = [0.2, 0.5, 0.9, 1.1, 1.5, 2.5, 2.6]  # ticks (1 ms cycle): 1, 1, 1, 2, 2, 3, 3
    ready_s = [t * 1e-3 for t in ready_ms]
    sizes = [40 * MiB] * 7
    assert horovod_groups(ready_s, sizes, 1e-3, 100 * MiB) == [[0, 1], [2], [3, 4], [5, 6]]
    assert horovod_groups(ready_s, sizes, 1e-3, 1024 * MiB) == [[0, 1, 2], [3, 4], [5, 6]]
    assert horovod_groups(ready_s, sizes, 5e-3, 1024 * MiB) == [list(range(7))]
    assert len(horovod_groups(ready_s, sizes, 1e-3, 0)) == 7  # threshold 0: fusion off
    assert len(horovod_groups(ready_s, sizes, 0.0, 1024 * MiB)) == 7  # no cycle: each at its own time
    # a tensor above the threshold goes alone, its neighbours still fuse
    assert horovod_groups([1e-4] * 4, [10, 500, 10, 10], 1e-3, 100) == [[0], [1], [2, 3]]
    # a gradient ready exactly on a tick belongs to that tick
    assert horovod_groups([1e-3, 1e-3 + 1e-8, 2e-3], [1, 1, 1], 1e-3, 10) == [[0], [1, 2]]


def test_segments_follow_the_backward_last_layer_first():
    workload = toy_workload(6)  # 4 MB of fp32 gradient per layer
    # backward of 2 ms per layer from 6 ms: layer 5 ready at 8 ms, 4 at 10, ..., 0 at 18 ms;
    # 5 ms ticks: 10 ms (layers 5, 4), 15 ms (3, 2), 20 ms (1, 0)
    segments = horovod_segments(workload, 0, 6, 4, 6e-3, lambda layer: 2e-3, 5e-3, 1024 * MiB)
    assert segments == [(4, 6, 8e6), (2, 4, 8e6), (0, 2, 8e6)]


def test_the_engine_starts_each_fused_allreduce_at_its_tick():
    workload = toy_workload(6)
    topology = Topology(1, 2, link(1e-6, 1e10), link(1e-6, 1e10))
    options = dict(gradient_fusion="horovod", horovod_cycle_time_s=5e-3, horovod_fusion_threshold_bytes=128 * MiB)
    _, spans = run_grid(workload, topology, FixedCosts(1e-3), 2, 1, 2, **options)  # 1 ms forward per layer
    allreduces = spans[(spans["rank"] == 0) & (spans["kind"] == "allreduce")]
    assert list(allreduces["size_bytes"]) == [8e6, 8e6, 8e6]
    assert list(allreduces["start_s"]) == pytest.approx([10e-3, 15e-3, 20e-3])
    _, unfused = run_grid(workload, topology, FixedCosts(1e-3), 2, 1, 2,
                          **{**options, "horovod_fusion_threshold_bytes": 4e6})
    assert (unfused[(unfused["rank"] == 0)]["kind"] == "allreduce").sum() == 6


def test_allreduces_of_one_tick_run_back_to_back_in_that_cycle():
    """Horovod's background loop runs every response of a tick in that cycle, one after another: an
    allreduce waits for the previous one, not for a later tick (Sergeev & Del Balso 2018, sec. 4)."""
    workload = toy_workload(6)  # gradients ready at 8, 10 | 12, 14 | 16, 18 ms: 5 ms ticks 10, 15, 20
    topology = Topology(1, 2, link(1e-6, 1e9), link(1e-6, 1e9))  # 4 ms an allreduce of 4 MB
    options = dict(gradient_fusion="horovod", horovod_cycle_time_s=5e-3, horovod_fusion_threshold_bytes=4e6)
    _, spans = run_grid(workload, topology, FixedCosts(1e-3), 2, 1, 2, **options)  # one layer per allreduce
    allreduces = spans[(spans["rank"] == 0) & (spans["kind"] == "allreduce")]
    starts, ends = list(allreduces["start_s"]), list(allreduces["end_s"])
    assert ends[0] - starts[0] > 3e-3
    expected = [10e-3, ends[0], max(15e-3, ends[1]), ends[2], max(20e-3, ends[3]), ends[4]]
    assert starts == pytest.approx(expected, rel=1e-12)


def test_scenario_keys_reach_the_plan():
    path = ROOT / "scenarios/resnet50_dp_a100.yaml"
    result = simulate(load_scenario(path, ["strategy.gradient_fusion=horovod", "strategy.horovod_cycle_time_s=0.002"]))
    allreduces = result.spans[(result.spans["rank"] == 0) & (result.spans["kind"] == "allreduce")]
    assert len(allreduces) >= 1
    ticks = allreduces["start_s"] / 2e-3
    assert ticks.round().sub(ticks).abs().max() < 1e-6  # every allreduce starts on a 2 ms tick


@pytest.mark.parametrize("kind", ["megatron", "1f1b"])
def test_only_grid_kinds_take_horovod_fusion(kind):
    path = ROOT / "scenarios/gpt2_1.5b_dgx_a100_3d.yaml"
    sets = [f"strategy.kind={kind}", "strategy.gradient_fusion=horovod"]
    if kind != "megatron":
        sets += ["strategy.tp_degree=1", "strategy.pp_degree=1", "strategy.num_virtual_stages=1"]
    with pytest.raises(ScenarioError, match="gradient_fusion: horovod applies to kinds dp, mp and ghp"):
        simulate(load_scenario(path, sets))
