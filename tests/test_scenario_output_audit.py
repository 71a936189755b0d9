"""Audit fixes of scenario validation and `simulate`'s output: cost settings the model in use would
ignore are refused, a context-parallel run's micro-batch counts whole samples, a named megatron order
keeps its name, and a name or description holding control or format characters is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_bad_input import assert_one_line_error, run_cli
from tests.test_context_parallel import scenario as cp_scenario

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "scenarios" / "demo.yaml"
GPT2 = ROOT / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml"
TINY = {"model": {"name": "resnet20"}, "training": {"global_batch_size": 8}}  # V100: the kernel model under auto
TOY_GPU = {"name": "toy", "peak_flops_per_s": {"fp32": 1e13}, "memory_bytes": "16 GiB",
           "memory_bandwidth_bytes_per_s": 5e11}  # no architecture: the analytic model under auto


@pytest.mark.parametrize("overrides, needles", [
    (("costs.efficiency={conv: 0.1}",),
     ("costs.efficiency", "0.1", "analytic cost model only", "kernel model", "costs.model auto", "volta",
      "set costs.model analytic")),
    (("costs.model=kernel", "costs.efficiency={linear: 0.5}"), ("costs.efficiency", "costs.model kernel")),
    (("costs.model=analytic", "costs.host_overhead_s=0.001"),
     ("costs.host_overhead_s", "0.001", "kernel cost model only", "analytic model", "costs.model analytic",
      "set costs.model kernel")),
])
def test_a_cost_setting_the_model_in_use_ignores_is_one_line(capsys, overrides, needles):
    argv = [item for entry in overrides for item in ("--set", entry)]
    assert_one_line_error(run_cli(capsys, "simulate", DEMO, *argv), "scenarios/demo.yaml", *needles)


def test_host_overhead_on_a_gpu_of_no_named_family_names_the_fallback():
    with pytest.raises(ScenarioError, match=r"costs.host_overhead_s: 0 .*costs.model auto: 'toy' of family none"):
        load_scenario({**TINY, "cluster": {"gpu": TOY_GPU}, "costs": {"host_overhead_s": 0}})


@pytest.mark.parametrize("cluster, costs", [
    ({}, {"model": "analytic", "efficiency": {"conv": 0.1}}),  # the analytic model uses efficiency
    ({"gpu": TOY_GPU}, {"efficiency": {"conv": 0.1}}),  # auto: the roofline for a GPU of no family
    ({}, {"host_overhead_s": 0}),  # auto: the kernel model for V100
    ({"gpu": TOY_GPU}, {"model": "kernel", "host_overhead_s": 0}),
    ({}, {"efficiency": {}, "host_overhead_s": None}),  # set to nothing: nothing ignored
])
def test_cost_settings_the_model_uses_are_accepted(cluster, costs):
    load_scenario({**TINY, "cluster": cluster, "costs": costs})


def test_efficiency_changes_the_step_where_it_is_accepted():
    plain = simulate(load_scenario(DEMO, ["costs.model=analytic"])).step_time_s
    slow = simulate(load_scenario(DEMO, ["costs.model=analytic", "costs.efficiency={conv: 0.1}"])).step_time_s
    assert slow > plain


def test_context_parallel_micro_batch_is_whole_samples_in_both_sections():
    summary = simulate(cp_scenario(cp=2, gpus=4, pp=2, batch=4, num_microbatches=4)).summary
    assert summary["tensor"]["cp_degree"] == 2
    assert summary["tensor"]["microbatch_size"] == summary["pipeline"]["microbatch_size"] == 1  # 4 / (1 replica x 4)


def test_context_parallel_simulate_prints_one_micro_batch_size(capsys):
    code, out, err = run_cli(capsys, "simulate", GPT2, "--set", "strategy.cp_degree=2", "--set",
                             "strategy.tp_degree=2", "--set", "strategy.num_microbatches=32")
    assert code == 0, err
    assert "micro-batch 2," in out and "micro-batches of 2," in out and "of 1," not in out  # 256 / 4 replicas / 32
    assert "micro-batches of 2, each split over CP 2 by sequence," in out
    code, out, _ = run_cli(capsys, "simulate", GPT2, "--json", "--set", "strategy.cp_degree=2", "--set",
                           "strategy.tp_degree=2", "--set", "strategy.num_microbatches=32")
    assert json.loads(out)["pipeline"]["microbatch_size"] == 2


def test_a_named_megatron_order_is_printed_by_name(capsys):
    code, out, err = run_cli(capsys, "simulate", GPT2, "--set", "strategy.placement=tp_dp_pp")
    assert code == 0, err
    assert "placement tp_dp_pp," in out and "[0, 1, 2, 3" not in out
    code, out, _ = run_cli(capsys, "simulate", GPT2, "--json", "--set", "strategy.placement=tp_dp_pp")
    summary = json.loads(out)
    assert summary["placement"] == "tp_dp_pp"
    assert summary["placement_devices"][:8] == [0, 1, 2, 3, 16, 17, 18, 19]  # a stage's replicas side by side


def test_a_device_list_stays_a_device_list(capsys):
    code, out, _ = run_cli(capsys, "simulate", GPT2, "--json", "--set", f"strategy.placement={list(range(31, -1, -1))}")
    summary = json.loads(out)
    assert code == 0 and summary["placement"] == list(range(31, -1, -1)) and "placement_devices" not in summary


@pytest.mark.parametrize("field, text, shown", [
    ("name", "a\x1b[31mred", r"'\x1b'"),
    ("name", "evil\u202eexe.txt", r"'\u202e'"),
    ("description", "x\u2066y", r"'\u2066'"),
    ("description", "zero\u200bwidth", r"'\u200b'"),
    ("description", "two\nlines", r"'\n'"),
    ("name", "bell\x07", r"'\x07'"),
    ("name", "del\x7f", r"'\x7f'"),
    ("description", "c1\x9b31m", r"'\x9b'"),
])
def test_control_and_format_characters_in_name_or_description_are_refused(capsys, tmp_path, field, text, shown):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({**TINY, field: text}), encoding="utf-8")  # JSON is YAML: the escapes as written
    line = assert_one_line_error(run_cli(capsys, "simulate", path), f"{field}: character {shown}")
    assert all(char.isprintable() for char in line)


def test_printable_unicode_names_are_accepted():
    scenario = load_scenario({**TINY, "name": "Modèle 模型 – α", "description": "tabs\u00a0aside, ok"})
    assert scenario.name == "Modèle 模型 – α"
