"""`simulate --memory-plot` draws what the summary counts: for megatron plans the ranks' shares,
ZeRO's sharded states and timed transients, so each drawn rank's peak is its summary row's."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import load_scenario, simulate
from simulator.memory import memory_config
from simulator.memory_plot import write_memory_plot
from simulator.memory_timeline import memory_timeline
from simulator.records import span_table
from simulator.strategies.tensor_summary import tensor_rank_memory

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path, overrides", [
    ("scenarios/llama3_70b_fsdp_h100.yaml", []),                               # ZeRO-3, FSDP2
    ("scenarios/gpt3_175b_dgx_a100_3d.yaml", []),                              # TP x PP x DP, ZeRO-1
    ("scenarios/gpt2_1.5b_dgx_a100_3d.yaml", ["strategy.zero_stage=2", "strategy.pp_degree=1"]),  # ZeRO-2
])
def test_each_drawn_ranks_peak_is_its_summary_rows(path, overrides):
    result = simulate(load_scenario(ROOT / path, overrides))
    spans = result.spans if result.played_spans is None else span_table(result.played_spans)
    walks = tensor_rank_memory(result.plan, spans, memory_config(result.scenario))
    assert len(walks) == result.plan.num_ranks
    for walk in walks[:4]:
        drawn = memory_timeline(walk, float(spans["end_s"].max()))["total_bytes"].max()
        assert drawn == pytest.approx(result.summary["devices"][walk.rank]["peak_memory_bytes"], rel=1e-9)


def test_the_plot_of_a_sharded_run_is_written(tmp_path):
    result = simulate(load_scenario(ROOT / "scenarios/llama3_70b_fsdp_h100.yaml"))
    written = write_memory_plot(result, tmp_path / "memory.png")
    assert written.stat().st_size > 10_000


@pytest.mark.parametrize("peak_bytes, capacity_bytes, unit, line", [
    (20 * 2**20, 24 * 2**30, "MiB", False),   # a CPU host's 24 GiB beside a 20 MiB step: named, not drawn
    (60 * 2**30, 80 * 2**30, "GiB", True),    # an 80 GB GPU at 60 GiB: the line is drawn
])
def test_the_capacity_line_keeps_the_steps_scale(peak_bytes, capacity_bytes, unit, line):
    import matplotlib.pyplot as plt
    import pandas as pd

    from simulator.memory_plot import plot_memory_timeline
    frame = pd.DataFrame({"time_s": [0.0, 1.0, 2.0], "activations": [0.0, peak_bytes, 0.0],
                          "total_bytes": [0.0, peak_bytes, 0.0]})
    figure, axis = plt.subplots()
    try:
        plot_memory_timeline(frame, axis, capacity_bytes)
        labels = axis.get_legend_handles_labels()[1]
        assert axis.get_ylabel() == unit
        assert ("capacity" in labels) == line
        assert any(label.startswith("capacity") and "off the scale" in label for label in labels) == (not line)
        assert axis.get_ylim()[1] < (2 * capacity_bytes if line else capacity_bytes) / (2**30 if unit == "GiB" else 2**20)
    finally:
        plt.close(figure)


def test_a_category_has_one_colour_in_every_figure_and_the_peak_none_of_theirs():
    import matplotlib.pyplot as plt
    import pandas as pd
    from matplotlib.colors import to_rgb

    from simulator.memory_plot import CATEGORY_COLOURS, plot_memory_timeline
    assert len(set(CATEGORY_COLOURS.values())) == len(CATEGORY_COLOURS)
    for shown in (["weights", "activations"], ["weight_gradients", "activations"]):
        frame = pd.DataFrame({"time_s": [0.0, 1.0], **{c: [2**30, 2**30] for c in shown}, "total_bytes": [2**31] * 2})
        figure, axis = plt.subplots()
        try:
            plot_memory_timeline(frame, axis)
            drawn = [tuple(band.get_facecolor()[0][:3]) for band in axis.collections]
            assert drawn == [pytest.approx(to_rgb(CATEGORY_COLOURS[c])) for c in shown]
            peak = next(line for line in axis.get_lines() if line.get_label().startswith("peak"))
            assert to_rgb(peak.get_color()) not in [to_rgb(colour) for colour in CATEGORY_COLOURS.values()]
        finally:
            plt.close(figure)
