"""`ghpsim compare` / `ghpsim report --strategies` run the plans a user means: a pipeline item of the
scenario's own kind keeps its replicas (num_groups), as `ghpsim simulate` runs it, and another pipeline
kind says it drops them; plans that do not fit in GPU memory rank after every plan that fits; two items
that resolve to one plan are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.compare import compare, parse_strategy_specs, ranked
from simulator.report.inputs import load_report_input
from simulator.report.strategy_sections import ranking_display, ranking_frame
from simulator.scenario import PIPELINE_KINDS, load_scenario
from simulator.simulate import simulate
from simulator.tables import strategy_label
from tests.test_bad_input import assert_one_line_error, run_cli
from tests.test_scenario_step_times import EXPECTED, SCENARIOS

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "scenarios" / "demo.yaml"
HYPARFLOW = ROOT / "scenarios" / "pipeline_resnet110_hyparflow_cpu.yaml"  # gpipe, G=2 replicas, m=4
LLAMA_70B = ROOT / "scenarios" / "llama3_70b_fsdp_h100.yaml"
PIPELINE_SCENARIOS = [path for path in SCENARIOS if load_scenario(ROOT / path).strategy.kind in PIPELINE_KINDS]


def _json(capsys, *argv) -> dict:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# ----------------------------------------------------------------------------- 1: the scenario's own pipeline


def test_scenarios_hold_replicated_pipelines():
    assert len(PIPELINE_SCENARIOS) >= 3
    assert any((load_scenario(ROOT / path).strategy.num_groups or 1) > 1 for path in PIPELINE_SCENARIOS)


@pytest.mark.parametrize("path", PIPELINE_SCENARIOS)
def test_own_pipeline_kind_compares_as_simulate_runs_it(path):
    scenario = load_scenario(ROOT / path)
    own = simulate(scenario)
    (result,) = compare(scenario, parse_strategy_specs(scenario.strategy.kind))
    assert result.step_time_s == pytest.approx(own.step_time_s, rel=1e-9)
    assert result.step_time_s == pytest.approx(EXPECTED[path], rel=1e-9)
    assert strategy_label(result.summary) == strategy_label(own.summary)


def test_cli_compare_and_report_run_the_replicated_gpipe(capsys):
    simulated = _json(capsys, "simulate", HYPARFLOW)
    document = _json(capsys, "compare", HYPARFLOW, "--strategies", "gpipe")
    assert [row["strategy"] for row in document["results"]] == ["gpipe (G=2 x M=4) m=4"]
    assert document["results"][0]["step_time_s"] == pytest.approx(simulated["step_time_s"], rel=1e-9)
    assert document["pipeline_replicas_dropped"] == []
    report = load_report_input(HYPARFLOW, strategies="gpipe:8")  # the own kind with another m keeps G = 2
    assert [summary["num_groups"] for summary in report.summaries] == [2]


def test_other_pipeline_kind_says_it_drops_the_replicas(capsys):
    document = _json(capsys, "compare", HYPARFLOW, "--strategies", "gpipe,1f1b")
    labels = sorted(row["strategy"] for row in document["results"])
    assert labels == ["1f1b (G=1 x M=8) m=4", "gpipe (G=2 x M=4) m=4"]
    assert document["pipeline_replicas_dropped"] == ["1f1b"]
    code, out, err = run_cli(capsys, "compare", HYPARFLOW, "--strategies", "gpipe,1f1b")
    assert code == 0, err
    assert "1f1b: G=1, without strategy.num_groups 2 (kept for kind gpipe only)" in out


# ----------------------------------------------------------------------------- 4: plans that do not fit


def test_plan_that_does_not_fit_ranks_after_every_plan_that_fits(capsys):
    document = _json(capsys, "compare", LLAMA_70B, "--strategies", "dp,megatron")
    rows = document["results"]
    assert [(row["strategy"].split()[0], row["fits_in_memory"], row["rank"]) for row in rows] == [
        ("megatron", True, 1), ("dp", False, None)]
    assert rows[1]["step_time_s"] < rows[0]["step_time_s"]  # faster, but 1,098 GiB on 80 GiB GPUs
    assert [summary["fits_in_memory"] for summary in document["summaries"]] == [True, False]
    display = ranking_display(ranking_frame(list(reversed(document["summaries"]))))  # `ghpsim report`'s table
    assert list(display["#"]) == ["1", "-"]
    assert display["strategy"].iloc[1] == f"{rows[1]['strategy']} (does not fit)"


def test_report_of_a_compare_result_keeps_the_plans_that_fit_first(capsys, tmp_path):
    code, out, err = run_cli(capsys, "compare", LLAMA_70B, "--strategies", "dp,megatron", "--json")
    assert code == 0, err
    (tmp_path / "compare.json").write_text(out)
    report = load_report_input(tmp_path / "compare.json")
    assert [summary["fits_in_memory"] for summary in report.summaries] == [True, False]


def test_text_table_notes_the_plan_that_does_not_fit(capsys):
    code, out, err = run_cli(capsys, "compare", LLAMA_70B, "--strategies", "dp,megatron")
    assert code == 0, err
    assert out.index("megatron (t=1") < out.index("dp (G=64 x M=1) ")
    assert "infeasible (does not fit in GPU memory), ranked after every plan that fits: dp (G=64 x M=1)" in out
    numbers = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert numbers == ["1", "-"]  # only the plans that fit are numbered


def test_ranked_puts_fitting_plans_first():
    class Result:
        def __init__(self, time, fits):
            self.step_time_s, self.summary = time, {"step_time_s": time, "fits_in_memory": fits}

    results = [Result(1.0, False), Result(3.0, True), Result(0.5, False), Result(2.0, True)]
    assert [result.step_time_s for result in ranked(results)] == [2.0, 3.0, 0.5, 1.0]


# ----------------------------------------------------------------------------- 7: one plan, two items


@pytest.mark.parametrize("scenario, strategies, needles", [
    (DEMO, "ghp,ghp:8", ("ghp and ghp:8", "ghp (G=8 x M=2)")),  # the scenario's G = 8
    (DEMO, "1f1b,1f1b:1", ("1f1b and 1f1b:1", "1f1b (G=1 x M=16) m=1")),  # the scenario's m = 1
    (HYPARFLOW, "dp,gpipe:4,gpipe", ("gpipe:4 and gpipe", "gpipe (G=2 x M=4) m=4")),
])
def test_items_of_one_plan_are_refused(capsys, tmp_path, scenario, strategies, needles):
    line = assert_one_line_error(run_cli(capsys, "compare", scenario, "--strategies", strategies),
                                 "--strategies", "resolve to the same plan", *needles)
    assert line.startswith("ghpsim: error: ")
    assert_one_line_error(run_cli(capsys, "report", scenario, "--strategies", strategies, "--out",
                                  tmp_path / "report"), "resolve to the same plan", *needles)


def test_fastest_ghp_equal_to_a_given_g_is_refused(capsys):
    overrides = ("--set", "strategy.kind=dp", "--set", "strategy.num_groups=null")  # ghp: the fastest G, 4 here
    document = _json(capsys, "compare", DEMO, *overrides, "--strategies", "ghp")
    assert [row["strategy"] for row in document["results"]] == ["ghp (G=4 x M=4)"]
    assert_one_line_error(run_cli(capsys, "compare", DEMO, *overrides, "--strategies", "ghp:4,ghp"),
                          "ghp:4 and ghp resolve to the same plan, ghp (G=4 x M=4) (ghp: the fastest feasible G)")


def test_items_of_different_plans_still_run(capsys):
    document = _json(capsys, "compare", DEMO, "--strategies", "ghp,ghp:4,1f1b,1f1b:2")
    assert sorted(row["strategy"] for row in document["results"]) == [
        "1f1b (G=1 x M=16) m=1", "1f1b (G=1 x M=16) m=2", "ghp (G=4 x M=4)", "ghp (G=8 x M=2)"]


def test_a_ghp_scenarios_groups_dropped_by_a_pipeline_item_are_noted(capsys):
    """demo is ghp G = 8: gpipe:4 runs one pipeline over the 16 GPUs (G = 1), which simulate with
    kind gpipe would not (it keeps G = 8), so compare says so."""
    code, out, err = run_cli(capsys, "compare", DEMO, "--strategies", "ghp,gpipe:4", "--json")
    assert code == 0, err
    assert json.loads(out)["pipeline_replicas_dropped"] == ["gpipe:4"]
    code, out, err = run_cli(capsys, "compare", DEMO, "--strategies", "ghp,gpipe:4")
    assert "gpipe:4: G=1, without strategy.num_groups 8 (kept for kind ghp only)" in " ".join(out.split())
