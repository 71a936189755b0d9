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
