"""Long synchronous pipelines: a few micro-batches played, the verified steady state extended
(simulator/steady_extension.py). The extended run must equal the run of every micro-batch."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from simulator import load_scenario
from simulator.layout_search import search_layouts
from simulator.steady_extension import _label_parts, short_microbatches

simulate_module = importlib.import_module("simulator.simulate")
extension_module = importlib.import_module("simulator.steady_extension")
ROOT = Path(__file__).resolve().parents[1]


def scenario(num_microbatches=32, symmetry="auto", training=None, **strategy):
    """TP 2 x PP 4 x DP 2 of an 8-layer GPT on two 8-GPU nodes, micro-batch 1."""
    return load_scenario({
        "cluster": {"num_nodes": 2, "gpus_per_node": 8, "nics_per_node": 8, "gpu": "A100-80GB",
                    "intra_node_link": "nvlink3-a100", "inter_node_link": "ib-hdr", "topology": "fat_tree"},
        "model": {"name": "transformer", "params": {"num_layers": 8, "hidden_size": 256, "num_heads": 4,
                                                     "seq_len": 128, "vocab_size": 1000}},
        "strategy": {"kind": "megatron", "tp_degree": 2, "pp_degree": 4, "num_microbatches": num_microbatches,
                     "symmetry": symmetry, **strategy},
        "training": {"global_batch_size": 2 * num_microbatches, "dtype": "bf16", "optimizer": "adam",
                     **(training or {})},
    })


def every_microbatch(monkeypatch, case):
    with monkeypatch.context() as patch:
        patch.setattr(simulate_module, "short_microbatches", lambda _scenario: None)
        return simulate_module.simulate(case)


def without_run_figures(summary: dict) -> dict:
    return {key: value for key, value in summary.items() if key not in ("wall_s", "num_events", "steady_state")}


def assert_close(ours, theirs, path="summary"):
    """Equal nested summaries, numbers to 1e-9 relative."""
    if isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), path
        for key in theirs:
            assert_close(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), path
        for index, (mine, other) in enumerate(zip(ours, theirs)):
            assert_close(mine, other, f"{path}[{index}]")
    elif isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15), path
    else:
        assert ours == theirs, path


def assert_same(extended, full):
    """Same summary (to 1e-9 relative) and the same spans: labels, micro-batches, times."""
    assert extended.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert_close(without_run_figures(extended.summary), without_run_figures(full.summary))
    columns = ["rank", "stream", "start_s"]
    ours = extended.spans.sort_values(columns, kind="stable").reset_index(drop=True)
    theirs = full.spans.sort_values(columns, kind="stable").reset_index(drop=True)
    assert len(ours) == len(theirs)
    for column in ("rank", "stream", "name", "kind", "size_bytes", "microbatch"):
        assert (ours[column] == theirs[column]).all(), column
    assert (ours["start_s"] - theirs["start_s"]).abs().max() <= 1e-9 * full.step_time_s
    assert (ours["end_s"] - theirs["end_s"]).abs().max() <= 1e-9 * full.step_time_s


@pytest.mark.parametrize("num_microbatches,strategy,training", [
    (32, {}, {}),
    (32, {}, {"recompute": "full"}),
    (32, {"sequence_parallel": True, "tp_comm_overlap": True}, {"recompute": "selective"}),
    (32, {"zero_stage": 1}, {}),
    (48, {"num_virtual_stages": 2}, {}),
    (48, {"cp_degree": 2, "tp_degree": 1}, {}),  # CP ring sends number on by their own counter
])
def test_the_extended_run_equals_the_run_of_every_microbatch(monkeypatch, num_microbatches, strategy, training):
    case = scenario(num_microbatches, training=training, **strategy)
    short, period = short_microbatches(case)
    extended = simulate_module.simulate(case)
    full = every_microbatch(monkeypatch, case)
    note = extended.summary["steady_state"]
    assert note.startswith(f"{short} of {num_microbatches} micro-batches simulated"), note
    assert extended.summary["num_events"] < full.summary["num_events"]
    assert extended.plan.meta["num_microbatches"] == num_microbatches
    assert extended.plan.meta["played_microbatches"] == short
    assert len(extended.played_spans) < len(extended.spans)
    assert_same(extended, full)


DEMO = ROOT / "scenarios" / "demo.yaml"  # VGG-16 on 4 x 4 V100, 10 GbE between nodes


@pytest.mark.parametrize("overrides, played", [
    (["strategy.kind=1f1b", "strategy.num_groups=4", "training.global_batch_size=1024"], 28),  # 5 p + 8
    (["strategy.kind=interleaved_1f1b", "strategy.num_groups=4", "strategy.num_virtual_stages=2",
      "training.global_batch_size=1024"], 24),  # 6 p
    (["strategy.kind=1f1b", "strategy.num_groups=1", "training.global_batch_size=256"], 88),  # 16 stages
])  # the 1f1b plays settle in the longer play (5 p + 8 micro-batches), with a period of 2
def test_layer_table_pipelines_are_extended_as_megatron_plans_are(monkeypatch, overrides, played):
    case = load_scenario(DEMO, [*overrides, "strategy.num_microbatches=256"])
    extended = simulate_module.simulate(case)
    assert extended.summary["steady_state"].startswith(f"{played} of 256 micro-batches simulated")
    assert_same(extended, every_microbatch(monkeypatch, case))


def test_a_short_play_splits_the_stages_as_the_step_would(monkeypatch):
    """The balanced split depends on m (the fill against the paced micro-batches): the play of 10
    micro-batches must run the split of the step of 32, [6, 10], not its own [13, 3] (30 % slower)."""
    case = load_scenario(DEMO, ["strategy.kind=1f1b", "strategy.num_groups=8", "strategy.num_microbatches=32",
                                "training.global_batch_size=2048", "strategy.placement=group_per_node"])
    extended = simulate_module.simulate(case)
    assert extended.summary["steady_state"].startswith("10 of 32 micro-batches simulated")
    assert_same(extended, every_microbatch(monkeypatch, case))


def test_a_long_pipelines_bound_stays_below_its_extended_play():
    """The bound partitions for the step's m micro-batches; the extended play must run that split
    too (VGG16 1F1B on 8 GPUs, m = 32: the play's own split was 27 us faster than the bound)."""
    scenario = load_scenario(DEMO)
    ranking = search_layouts(scenario, 8, kinds=("1f1b",), microbatch_counts=(32,), exhaustive=True, workers=1,
                             show_progress=False)
    assert ranking.rows and all(0 < row["bound_s"] <= row["step_time_s"] for row in ranking.rows)


def test_replicas_at_different_paces_are_played_in_full_without_a_short_play(monkeypatch):
    """A straggler in one replica: that replica keeps its own period, so no short play is tried
    (each failed one cost about the step again); a straggler at the same place in every replica
    keeps one period, and the extension is exact."""
    raw = scenario(32).model_dump(mode="json")

    def with_stragglers(stragglers: dict):
        return load_scenario({**raw, "cluster": {**raw["cluster"], "stragglers": stragglers}})

    with monkeypatch.context() as patch:
        patch.setattr(simulate_module, "_short_play", lambda *args: pytest.fail("a short play was tried"))
        unlike = simulate_module.simulate(with_stragglers({0: 1.3}))  # replica 0: devices 0-7
    assert unlike.summary["steady_state"].startswith(
        "every micro-batch simulated: the data-parallel replicas run at different paces")
    alike = with_stragglers({0: 1.3, 8: 1.3})
    extended = simulate_module.simulate(alike)
    assert extended.summary["steady_state"].startswith("12 of 32 micro-batches simulated")
    assert_same(extended, every_microbatch(monkeypatch, alike))


def test_layer_table_pipelines_take_no_play_twice_as_long():
    case = load_scenario(DEMO, ["strategy.kind=1f1b", "strategy.num_groups=1", "strategy.num_microbatches=256",
                                "training.global_batch_size=256"])
    assert short_microbatches(case, longer=True) == (88, 1)
    assert short_microbatches(case, longer=True, at_least=176, doubled=True) is None
    assert short_microbatches(scenario(512), longer=True, at_least=56, doubled=True) == (56, 1)  # megatron's


@pytest.mark.parametrize("num_microbatches,played", [
    (256, 88),   # the longer play (5 p + 8) leaves 168 micro-batches: 12 periods of 14
    (240, 100),  # 152 left is no whole number of periods: played again on 100, leaving 10 periods
])
def test_a_regime_that_repeats_every_few_microbatches_is_found_and_extended_exactly(monkeypatch, num_microbatches,
                                                                                      played):
    """LLaMA-3 405B at TP 8 x CP 2 x PP 16 on 256 H100: one cycle in every 14 (p - 2) is faster, so
    no period of one micro-batch settles; the longer play finds the period of 14."""
    case = load_scenario(ROOT / "scenarios" / "llama3_405b_4d_h100.yaml", [
        "cluster.num_nodes=32", "strategy.pp_degree=16", "strategy.num_virtual_stages=1",
        f"strategy.num_microbatches={num_microbatches}", f"training.global_batch_size={num_microbatches}",
        "training.recompute=none"])
    first, _ = short_microbatches(case)
    extended = simulate_module.simulate(case)
    note = extended.summary["steady_state"]
    assert note.startswith(f"{played} of {num_microbatches} micro-batches simulated"), note
    assert "periods of 14 micro-batches" in note
    assert extended.plan.meta["played_microbatches"] == played > first
    full = every_microbatch(monkeypatch, case)
    assert_same(extended, full)
    if num_microbatches == 256:  # no period found in the longer play: every micro-batch, and the note says so
        monkeypatch.setattr(simulate_module, "candidate_periods", lambda *_args: [])
        refused = simulate_module.simulate(case)
        assert refused.summary["steady_state"].startswith(f"every micro-batch simulated: the cycle has not settled "
                                                          f"within {first} micro-batches")
        assert refused.summary["steady_state"].endswith(f"nor has any longer period in a play of {played} micro-batches")
        assert refused.step_time_s == full.step_time_s


def test_a_cycle_that_has_not_settled_is_simulated_in_full(monkeypatch):
    """Too few micro-batches to see three equal periods: the check refuses, every micro-batch runs."""
    case = scenario(32)
    monkeypatch.setattr(extension_module, "SETTLE_MICROBATCHES", 1)
    refused = simulate_module.simulate(case)
    assert refused.summary["steady_state"].startswith("every micro-batch simulated: ")
    assert refused.played_spans is None
    monkeypatch.setattr(extension_module, "SETTLE_MICROBATCHES", 8)
    assert refused.step_time_s == every_microbatch(monkeypatch, case).step_time_s


@pytest.mark.parametrize("case", [
    scenario(32, symmetry="off"),                    # off: every rank and every micro-batch
    scenario(16),                                    # fewer than twice the p + 8 it would play
    scenario(32, training={"offload_activations": True, "memory_policy": "reuse"}),  # exposed time per micro-batch
    scenario(32, training={"global_batch_size": 256}, pp_degree=1),  # no pipeline
])
def test_where_it_does_not_apply(case):
    assert short_microbatches(case) is None
    assert "steady_state" not in simulate_module.simulate(case).summary


def test_the_memory_plot_walks_the_spans_the_plan_played(tmp_path):
    from simulator.memory_plot import write_memory_plot
    result = simulate_module.simulate(scenario(32))
    assert result.played_spans is not None
    path = write_memory_plot(result, tmp_path / "memory.png")
    assert path.stat().st_size > 0


def test_labels_are_renumbered_at_their_microbatch():
    assert _label_parts("F5 L0-5", 5) == ("F", " L0-5")
    assert _label_parts("send act12", 12) == ("send act", "")
    assert _label_parts("tp allreduce x49", -1) is None
    assert _label_parts("optimizer", 3) == ("optimizer", None)


def test_a_step_too_large_to_hold_is_refused_even_when_its_played_part_fits(monkeypatch):
    """The extended spans cover every micro-batch: the memory check sizes the step, not the part played."""
    from simulator import limits
    from simulator.errors import ScenarioError
    from simulator.fabrics import build_topology
    from simulator.model_source import resolve_workload
    from simulator.strategies import compile_plan
    case = scenario(32)
    short, _ = short_microbatches(case)
    workload = resolve_workload(case.model)
    played = compile_plan(extension_module.shortened(case, short), workload, build_topology(case.cluster),
                          simulate_module.analytic_costs(case, workload))
    played_bytes = played.num_ranks * len(played.actions[0]) * limits.BYTES_PER_ACTION
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 2 * played_bytes / limits.MEMORY_HEADROOM)
    with pytest.raises(ScenarioError, match=r"simulating 4 ranks x ~[\d,]+ actions needs"):
        simulate_module.simulate(case)
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 4 * played_bytes / limits.MEMORY_HEADROOM)
    assert "steady_state" in simulate_module.simulate(case).summary


def test_a_transient_longer_than_the_longer_play_is_searched_in_plays_twice_as_long(monkeypatch):
    """Plays too short to settle (patched lengths: p + 1, then the same again) are followed by plays
    of twice the length while one is at most half the step; the one that settles is extended and
    equals the run of every micro-batch."""
    case = scenario(128)
    monkeypatch.setattr(extension_module, "SETTLE_MICROBATCHES", 1)
    monkeypatch.setattr(extension_module, "LONGER_PLAY_STAGES", 0)
    extended = simulate_module.simulate(case)
    note = extended.summary["steady_state"]
    played = extended.plan.meta["played_microbatches"]
    assert played == 10, note  # 5 (the first play), 5 (the longer), then 10, which settles
    assert note.startswith(f"{played} of 128 micro-batches simulated"), note
    assert_same(extended, every_microbatch(monkeypatch, case))
    monkeypatch.setattr(simulate_module, "candidate_periods", lambda *_args: [])
    refused = simulate_module.simulate(case)
    assert refused.summary["steady_state"].endswith("nor has any longer period in a play of 5 or 10 or 20 or 40 micro-batches")
