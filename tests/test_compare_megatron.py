"""`ghpsim compare` and megatron layouts: a megatron scenario compares its own layout by default (as
`ghpsim report` reports it), and `--strategies megatron` names that layout (or, for a scenario of
another kind, its tp_degree x pp_degree as kind megatron)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.compare import DEFAULT_STRATEGIES, default_strategies, parse_strategy_specs, ranking_key, with_strategy
from simulator.errors import ScenarioError
from simulator.report.inputs import load_report_input
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_bad_input import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "scenarios" / "llama3_8b_dgx_h100.yaml"
GPT2 = ROOT / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"
DEMO = ROOT / "scenarios" / "demo.yaml"


def _compare(capsys, *argv) -> dict:
    code, out, err = run_cli(capsys, "compare", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_megatron_scenario_compares_its_own_layout_by_default_as_report_does(capsys):
    document = _compare(capsys, LLAMA)
    assert [row["strategy"].split()[0] for row in document["results"]] == ["megatron"]
    own = simulate(load_scenario(LLAMA))
    assert document["summaries"][0]["step_time_s"] == own.step_time_s
    report = load_report_input(LLAMA)
    assert [summary["step_time_s"] for summary in report.summaries] == [own.step_time_s]


def test_strategies_megatron_joins_the_other_kinds(capsys):
    document = _compare(capsys, LLAMA, "--strategies", "dp,megatron,mp")
    kinds = sorted(row["strategy"].split()[0] for row in document["results"])
    assert kinds == ["dp", "megatron", "mp"]
    keys = [ranking_key(summary) for summary in document["summaries"]]  # by step time, the plans that fit first
    assert keys == sorted(keys) and simulate(load_scenario(LLAMA)).step_time_s in [time for _, time in keys]


def test_text_table_lists_the_megatron_layout(capsys):
    code, out, err = run_cli(capsys, "compare", LLAMA)
    assert code == 0 and err == ""
    assert "megatron" in out and "dp (G=" not in out


def test_other_kind_with_tp_or_pp_degrees_runs_as_megatron(capsys):
    overrides = ["strategy.kind=dp", "strategy.num_groups=null", "strategy.pp_degree=2", "strategy.partition=[1, 2, 3]"]
    document = _compare(capsys, DEMO, *(item for entry in overrides for item in ("--set", entry)),
                        "--strategies", "megatron")
    summary = document["summaries"][0]
    assert (summary["strategy"], summary["num_groups"], summary["workers_per_group"]) == ("megatron", 8, 2)
    scenario = with_strategy(load_scenario(DEMO, overrides), "megatron")
    assert (scenario.strategy.kind, scenario.strategy.pp_degree, scenario.strategy.num_groups) == ("megatron", 2, None)
    assert scenario.strategy.partition == "balanced"  # a partition of another number of stages is dropped
    assert simulate(scenario).step_time_s == summary["step_time_s"]


def test_megatron_spec_without_degrees_is_one_line(capsys):
    assert_one_line_error(run_cli(capsys, "compare", DEMO, "--strategies", "dp,megatron"),
                          "--strategies", "megatron", "tp_degree", "kind ghp")


@pytest.mark.parametrize("text", ["megatron:2", "megatrons"])
def test_bad_megatron_specs(text):
    with pytest.raises(ScenarioError, match="megatron"):
        parse_strategy_specs(text)


def test_default_strategies():
    assert default_strategies(load_scenario(LLAMA)) == "megatron"
    assert default_strategies(load_scenario(DEMO)) == DEFAULT_STRATEGIES
    assert parse_strategy_specs("megatron,dp") == [("megatron", None), ("dp", None)]


def test_megatron_order_is_dropped_for_other_kinds(capsys):
    document = _compare(capsys, GPT2, "--set", "strategy.placement=tp_dp_pp", "--strategies", "1f1b:8,megatron")
    placements = {row["strategy"].split()[0]: summary["placement"]
                  for row, summary in zip(document["results"], document["summaries"])}
    assert placements["1f1b"] == "group_per_node" and placements["megatron"] == "tp_dp_pp"


def test_compare_help_names_megatron(capsys):
    code, out, _ = run_cli(capsys, "compare", "--help")
    text = " ".join(out.split())
    assert code == 0 and "megatron" in text and "ghp:G" in text


def test_other_kinds_run_without_megatron_only_settings_and_say_so(capsys):
    # Mixtral's scenario is megatron with expert parallelism 8 and ZeRO-1: dp runs without both, as
    # `simulate --set strategy.kind=dp` would have to
    mixtral = ROOT / "scenarios" / "mixtral_8x7b_ep_h100.yaml"
    settings = ("--set", "model.params.num_layers=4")
    document = _compare(capsys, str(mixtral), "--strategies", "megatron,dp", *settings)
    assert document["megatron_only_dropped"] == ["strategy.zero_stage 1", "strategy.ep_degree 8"]
    dp = next(row for row in document["results"] if row["strategy"].startswith("dp"))
    alone = simulate(load_scenario(mixtral, ["model.params.num_layers=4", "strategy.kind=dp", "strategy.ep_degree=1",
                                             "strategy.zero_stage=0"]))
    assert dp["step_time_s"] == pytest.approx(alone.step_time_s, rel=1e-12)
    code, out, err = run_cli(capsys, "compare", str(mixtral), "--strategies", "megatron,dp", *settings)
    assert code == 0 and "dp: without strategy.zero_stage 1, strategy.ep_degree 8 (kind megatron only)" in out
    assert _compare(capsys, str(mixtral), "--strategies", "megatron", *settings)["megatron_only_dropped"] == []


@pytest.mark.parametrize("spec,counted", [("ghp:0", "G groups"), ("ghp:-2", "G groups"), ("gpipe:0", "m micro-batches")])
def test_a_count_below_one_after_the_colon_is_named_for_what_it_counts(spec, counted):
    with pytest.raises(ScenarioError) as raised:
        parse_strategy_specs(spec)
    assert str(raised.value) == f"--strategies: '{spec}': the number after ':' ({counted}) must be at least 1"


def test_a_malformed_count_after_the_colon_is_one_line_not_a_traceback():
    with pytest.raises(ScenarioError, match="'ghp:\\+-3' is not one of dp, mp, ghp"):
        parse_strategy_specs("ghp:+-3")
