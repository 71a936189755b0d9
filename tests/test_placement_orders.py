"""The planner's named megatron rank orders in a scenario (`strategy.placement: tp_dp_pp`), and
`ghpsim rank` rows that reproduce: each carries the `--set` list that makes `ghpsim simulate` run
its layout, with the same step time; small run figures (time, GPU-hours, cost) that agree."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from simulator.layout_geometry import megatron_placement, resolved_placement
from simulator.rank_cli import _amount
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.tensor import tensor_config
from tests.test_bad_input import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
GPT2 = ROOT / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"
DEMO = ROOT / "scenarios" / "demo.yaml"
RESNET = ROOT / "scenarios" / "resnet50_dp_a100.yaml"
SLOW_LINKS = ("--set", "cluster.inter_node_link=10gbe")
"""On 2 nodes joined by 10 GbE a stage's replicas side by side (tp_dp_pp) win the megatron search."""


def _rank_json(capsys, *argv) -> dict:
    code, out, err = run_cli(capsys, "rank", *argv, "--workers", "1", "--json")
    assert code == 0, err
    return json.loads(out)


def test_rank_winner_in_tp_dp_pp_order_simulates_to_its_ranked_step_time(capsys):
    document = _rank_json(capsys, GPT2, "--gpus", "16", "--kinds", "megatron", "--top", "2", *SLOW_LINKS)
    best = document["rows"][0]
    assert best["placement"] == "tp_dp_pp" and "strategy.placement=tp_dp_pp" in best["set"]
    assert best["set"][:2] == ["cluster.inter_node_link=10gbe", "cluster.num_nodes=2"]  # the user's --set first
    assert best["overrides"]["strategy.placement"] == "tp_dp_pp"
    argv = [item for pair in (("--set", entry) for entry in best["set"]) for item in pair]
    code, out, err = run_cli(capsys, "simulate", GPT2, *argv, "--json")
    assert code == 0, err
    step_s = json.loads(out)["step_time_s"]
    assert step_s == pytest.approx(best["step_time_s"], rel=1e-9)
    for row in document["rows"][1:]:  # every row carries its own list
        assert simulate(load_scenario(GPT2, row["set"])).step_time_s == pytest.approx(row["step_time_s"], rel=1e-9)


def test_rank_text_prints_the_command_that_runs_number_one(capsys):
    code, out, err = run_cli(capsys, "rank", DEMO, "--gpus", "8", "--kinds", "dp,mp,ghp", "--top", "2",
                             "--workers", "1", "--set", "training.global_batch_size=64")
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("#1 as a scenario: "))
    command = shlex.split(line.removeprefix("#1 as a scenario: ").split(" (--json")[0])
    assert command[:2] == ["ghpsim", "simulate"] and "--set" in command
    best_ms = next(float(cells[3].replace(",", "")) for cells in
                   (row.split("│") for row in out.splitlines()) if len(cells) > 4 and cells[1].strip() == "1")
    code, out, err = run_cli(capsys, *command[1:], "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] * 1e3 == pytest.approx(best_ms, abs=0.006)


def test_named_orders_resolve_to_the_planner_device_lists():
    for cp, extra in ((1, ()), (2, ("strategy.cp_degree=2", "strategy.tp_degree=2", "strategy.symmetry=off"))):
        scenario = load_scenario(GPT2, ["strategy.placement=tp_dp_pp", *extra])
        t, p = scenario.strategy.tp_degree, scenario.strategy.pp_degree
        d = scenario.num_gpus // (t * p * cp)
        config = tensor_config(scenario)
        assert config.placement == megatron_placement("tp_dp_pp", t, p, d, cp)
        assert sorted(config.placement) == list(range(scenario.num_gpus))
        assert config.device_of(1, 0, 0) == t  # the next replica of stage 0 sits beside the first
    own = tensor_config(load_scenario(GPT2))
    assert own.placement == "group_per_node" == resolved_placement("group_per_node", 4, 2, 4)


def test_tp_dp_pp_differs_from_megatron_order_and_is_simulated():
    base = simulate(load_scenario(GPT2, ["cluster.inter_node_link=10gbe"]))
    ordered = simulate(load_scenario(GPT2, ["cluster.inter_node_link=10gbe", "strategy.placement=tp_dp_pp"]))
    assert ordered.summary["placement"] == "tp_dp_pp" and base.summary["placement"] == "group_per_node"
    assert sorted(ordered.summary["placement_devices"]) == list(range(32)) and "placement_devices" not in base.summary
    assert ordered.step_time_s != base.step_time_s


@pytest.mark.parametrize("overrides, needles", [
    (("strategy.placement=tp_dp_pp",), ("strategy.placement", "tp_dp_pp", "megatron", "kind ghp", "device list")),
    (("strategy.placement=tp_dp_pp", "strategy.kind=1f1b", "strategy.num_groups=null"), ("tp_dp_pp", "kind 1f1b")),
    (("strategy.placement=tp_pp_dp",), ("strategy.placement", "tp_dp_pp", "list", "'tp_pp_dp'")),
    (("strategy.placement=3",), ("strategy.placement", "group_per_node", "list")),
])
def test_placement_errors_are_one_line(capsys, overrides, needles):
    argv = [item for pair in (("--set", entry) for entry in overrides) for item in pair]
    assert_one_line_error(run_cli(capsys, "simulate", DEMO, *argv), *needles)


def test_amounts_keep_three_significant_digits():
    assert _amount(0.0175, 1) == "0.0175" and _amount(0.281) == "0.281" and _amount(0.5612) == "0.561"
    assert _amount(1234.56, 1) == "1,234.6" and _amount(1234.56) == "1,235" and _amount(0.0) == "0"
    assert _amount(12.345) == "12.3" and _amount(12.345, 1) == "12.3"


def test_small_run_figures_agree(capsys):
    code, out, err = run_cli(capsys, "rank", RESNET, "--tokens", "1.28e6", "--price-per-gpu-hour", "2", "--top", "1",
                             "--kinds", "dp", "--workers", "1")
    assert code == 0, err
    cells = next(row.split("│") for row in out.splitlines() if row.split("│")[1:2] == [" 1 "])
    hours, gpu_hours, cost = (float(cell.replace(",", "")) for cell in cells[-4:-1])
    gpus = int(re.search(r": (\d+) GPUs", out).group(1))
    assert 0 < hours < 0.1 and hours * gpus == pytest.approx(gpu_hours, rel=0.01)
    assert gpu_hours * 2 == pytest.approx(cost, rel=0.01)
