"""What the READMEs promise and the code once did not do: `costs.host_bandwidth_bytes_per_s` is a
scenario key that sets the offload bandwidth; `ghpsim rank --gpus N` ranks a scenario whose own
grid does not fit N; bytes per link tier are counted when communication is priced from
measurements; a sweep report prints integer-valued fields as integers."""

from __future__ import annotations

import io
import json
import re

import pandas as pd
import pytest
from rich.console import Console

from ghpsim.cli import main
from simulator.costs import AnalyticCosts
from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.planner import rank_candidates, scenario_for_gpus
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.tables import print_summary

DEMO = "scenarios/demo.yaml"
PCIE3_BYTES_PER_S = 15.75e9


def tiny(num_nodes=2, gpus_per_node=2, batch=32, **sections) -> dict:
    """An MLP on inline parts: simulations take milliseconds."""
    return {
        "name": "tiny",
        "cluster": {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node,
                    "gpu": {"peak_flops_per_s": {"fp32": 1e12}, "memory_bytes": "32 GiB",
                            "memory_bandwidth_bytes_per_s": 1e11},
                    "intra_node_link": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 1e10},
                    "inter_node_link": {"latency_s": 5e-5, "bandwidth_bytes_per_s": 1e9}},
        "model": {"name": "mlp", "params": {"input_dim": 256, "hidden_dim": 512, "num_hidden_layers": 5,
                                            "num_classes": 10}},
        "training": {"global_batch_size": batch, **sections.pop("training", {})},
        **sections,
    }


# ----------------------------------------------------------------------------- 1. host bandwidth

def test_host_bandwidth_is_a_scenario_key_that_times_the_offload():
    """Offloaded activations move at `costs.host_bandwidth_bytes_per_s` (default PCIe 3.0 x16):
    the host transfer time scales as 1 / bandwidth."""
    offload = {"memory_policy": "reuse", "offload_activations": True}
    default = simulate(load_scenario(tiny(training=offload))).summary["memory"]
    slow_scenario = load_scenario(tiny(training=offload, costs={"host_bandwidth_bytes_per_s": "1 GB/s"}))
    assert slow_scenario.costs.host_bandwidth_bytes_per_s == 1e9
    slow = simulate(slow_scenario).summary["memory"]
    assert default["offload_s"] > 0
    assert slow["offload_s"] == pytest.approx(default["offload_s"] * PCIE3_BYTES_PER_S / 1e9, rel=1e-9)
    assert slow["offload_exposed_s"] > default["offload_exposed_s"]


@pytest.mark.parametrize("value, message", [
    (-1, "costs.host_bandwidth_bytes_per_s: Input should be greater than 0"),
    ("2 GB", "costs.host_bandwidth_bytes_per_s: unit 'GB' in '2 GB' is not a unit of bytes_per_s"),
])
def test_a_bad_host_bandwidth_is_one_line_naming_the_key(value, message):
    with pytest.raises(ScenarioError, match=re.escape(message)) as error:
        load_scenario(tiny(costs={"host_bandwidth_bytes_per_s": value}))
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- 2. rank --gpus N

def test_rank_on_a_gpu_count_the_scenarios_grid_does_not_divide():
    """The demo's ghp G=8 does not divide 12 GPUs: ranking 12 GPUs drops the scenario's own grid
    and ranks every feasible allocation of 12."""
    ranking = rank_candidates(load_scenario(DEMO), 12, kinds=("dp", "mp", "ghp"), workers=1, show_progress=False)
    assert ranking.scenario.num_gpus == 12 and ranking.rows
    assert {row["num_groups"] * row["workers_per_group"] for row in ranking.rows} == {12}
    assert "ghp (G=4 x M=3) stage_per_node" in [row["label"] for row in ranking.rows]
    assert any("is not divisible by G=12" in skipped["reason"] for skipped in ranking.skipped)  # dp: batch 64


def test_scenario_for_gpus_keeps_the_scenario_on_its_own_count_and_drops_its_grid_on_another():
    scenario = load_scenario(DEMO)
    assert scenario_for_gpus(scenario, 16) is scenario and scenario_for_gpus(scenario, None) is scenario
    other = scenario_for_gpus(scenario, 12)
    assert (other.cluster.num_nodes, other.cluster.gpus_per_node) == (3, 4)
    assert (other.strategy.kind, other.strategy.num_groups) == ("dp", None)
    assert other.strategy.bucket_size_bytes == scenario.strategy.bucket_size_bytes
    megatron = load_scenario("scenarios/gpt2_1.5b_dgx_a100_3d.yaml")  # t=4 x p=2 does not divide 24
    assert scenario_for_gpus(megatron, 24).strategy.tp_degree == 1


def test_rank_cli_on_another_gpu_count(capsys):
    code = main(["rank", DEMO, "--gpus", "12", "--kinds", "dp,mp,ghp", "--workers", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document = json.loads(captured.out)
    assert document["num_gpus"] == 12 and document["rows"][0]["label"].startswith("ghp (G=4 x M=3)")


def test_rank_cli_with_nothing_feasible_is_one_line(capsys):
    code = main(["rank", DEMO, "--gpus", "12", "--kinds", "dp", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ghpsim: error: --gpus/--kinds: no candidate could be simulated")
    assert "training.global_batch_size 64 is not divisible by G=12" in err


# ----------------------------------------------------------------------------- 3. measured communication

class MeasuredCommunication(AnalyticCosts):
    """Analytic compute with communication priced as a calibration profile prices it
    (`CostModel.communication`: fixed measured times, no flow network)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.communication = self
        self.message_overheads_s = (0.0, 0.0)

    def p2p_s(self, size_bytes: float) -> float:
        return 1e-4

    def collective_s(self, op: str, size_bytes: float, num_ranks: int) -> float:
        return 1e-3


def _measured(scenario):
    workload = resolve_workload(scenario.model, scenario.base_dir)
    training = scenario.training
    costs = MeasuredCommunication(workload, scenario.cluster.gpu, training.dtype, training.optimizer,
                                  scenario.costs.efficiency)
    return simulate(scenario, costs=costs, workload=workload)


@pytest.mark.parametrize("strategy", [
    {"kind": "dp"},
    {"kind": "ghp", "num_groups": 2, "placement": "stage_per_node"},
    {"kind": "gpipe", "num_groups": 2, "num_microbatches": 2},
    {"kind": "dp", "dp_sync": "parameter_server", "num_parameter_servers": 2},
])
def test_measured_communication_still_counts_the_bytes_per_tier(strategy):
    """The bytes a plan moves do not depend on how its time is priced: with measured communication
    the summary's bytes per tier are the flow model's (they were 0.0)."""
    scenario = load_scenario(tiny(strategy=strategy))
    analytic, measured = simulate(scenario), _measured(scenario)
    assert measured.summary["collective_algorithms"].get("measured", 0) > 0  # the flow network was bypassed
    assert measured.step_time_s != pytest.approx(analytic.step_time_s)
    assert analytic.summary["bytes_per_tier"]["inter"] > 0
    assert measured.summary["bytes_per_tier"] == pytest.approx(analytic.summary["bytes_per_tier"], rel=1e-12)


def test_the_summary_prints_the_counted_bytes_not_zero():
    scenario = load_scenario(tiny(num_nodes=1, strategy={"kind": "dp"}))
    result = _measured(scenario)
    console = Console(file=io.StringIO(), width=200)
    print_summary(result, console)
    text = console.file.getvalue()
    intra_mb = result.summary["bytes_per_tier"]["intra"] / 1e6
    assert intra_mb > 0.05 and f"intra {intra_mb:,.1f} MB" in text and "intra 0.0 MB" not in text


# ----------------------------------------------------------------------------- 4. sweep report integers

def test_sweep_report_prints_integer_fields_as_integers(capsys, tmp_path):
    """`strategy.num_groups` is null for dp: pandas reads the column back as floats (4.0, 16.0);
    the report prints 4 and 16, the CSV has integers."""
    spec = tmp_path / "groups.yaml"
    spec.write_text(json.dumps({"name": "groups", "base": tiny(num_nodes=4, gpus_per_node=4, batch=64),
                                "axes": {"strategy.kind,strategy.num_groups": [["dp", None], ["ghp", 4], ["ghp", 16],
                                                                               ["ghp", 3]]}}))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "sweep"), "--workers", "1", "--no-progress"]) == 0
    csv = (tmp_path / "sweep" / "results.csv").read_text()
    assert pd.read_csv(tmp_path / "sweep" / "results.csv")["strategy.num_groups"].dtype == float  # the trap
    assert [line.split(",")[2] for line in csv.splitlines()[1:]] == ["", "4", "16", "3"]
    assert main(["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    markdown = (tmp_path / "report" / "report.md").read_text()
    html = (tmp_path / "report" / "report.html").read_text()
    assert "| strategy.num_groups | -, 4, 16, 3 |" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| ghp |")]
    assert [row.split(" | ")[1] for row in rows] == ["4", "16", "3"]
    assert not re.search(r"\b(4|16|3)\.0\b", markdown + html)
