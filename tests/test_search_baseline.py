"""`ghpsim search`'s dp row (the baseline of its speedups) against `ghpsim simulate`'s dp.

The search's dp is PaSE's data-parallel configuration compiled like its other strategies: every
layer's weight gradient allreduced on its own. `simulate`'s dp fuses gradients into 25 MiB DDP
buckets, so the two differ (AlexNet on 64 GTX 1080 Ti: 76.12 vs 75.07 ms) by design; with a bucket
per layer (strategy.bucket_size_bytes=1) simulate plays the same allreduces and the same step.
The output says which baseline it uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghpsim.cli import main
from simulator.pase.run import dp_baseline, graph_for_scenario, search_point
from simulator.scenario import load_scenario
from simulator.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
ALEXNET = str(ROOT / "scenarios" / "pase_alexnet_1080ti.yaml")
ALEXNET_2080 = str(ROOT / "scenarios" / "pase_alexnet_2080ti.yaml")
DEMO = str(ROOT / "scenarios" / "demo.yaml")


def on_gpus(path: str, num_gpus: int, *overrides: str):
    """The scenario cut to its first `num_gpus` GPUs (what the search plays), with `overrides`."""
    scenario = load_scenario(path)
    per_node = min(num_gpus, scenario.cluster.gpus_per_node)
    return load_scenario(path, [f"cluster.num_nodes={num_gpus // per_node}", f"cluster.gpus_per_node={per_node}",
                                *overrides])


def search_dp_step_s(path: str, num_gpus: int) -> float:
    scenario = load_scenario(path)
    point = search_point(scenario, graph_for_scenario(scenario), num_gpus)
    return next(row for row in point["results"] if row["strategy"] == "dp")["simulated_step_s"]


@pytest.mark.parametrize("path, num_gpus", [(ALEXNET, 8), (ALEXNET, 64), (ALEXNET_2080, 16)])
def test_search_dp_is_simulate_dp_with_a_bucket_per_layer(path, num_gpus):
    searched = search_dp_step_s(path, num_gpus)
    per_layer = simulate(on_gpus(path, num_gpus, "strategy.bucket_size_bytes=1")).step_time_s
    assert searched == pytest.approx(per_layer, rel=1e-9)


@pytest.mark.parametrize("num_gpus, search_ms, simulate_ms", [(8, 41.41, 41.27), (64, 76.12, 75.07)])
def test_default_buckets_are_the_documented_difference(num_gpus, search_ms, simulate_ms):
    assert search_dp_step_s(ALEXNET, num_gpus) * 1e3 == pytest.approx(search_ms, abs=0.01)
    assert simulate(on_gpus(ALEXNET, num_gpus)).step_time_s * 1e3 == pytest.approx(simulate_ms, abs=0.01)


def test_baseline_of_the_pase_scenario_names_buckets_and_the_override():
    baseline = dp_baseline(load_scenario(ALEXNET))
    assert "each layer's weight gradient allreduced on its own" in baseline["description"]
    buckets = "gradients fused into DDP buckets of strategy.bucket_size_bytes (25 MiB)"
    assert baseline["simulate_dp_differs_by"] == [buckets]
    assert baseline["simulate_dp_same_with"] == "strategy.bucket_size_bytes=1"


def test_baseline_names_every_further_difference():
    baseline = dp_baseline(load_scenario(DEMO, ["training.recompute=full", "strategy.bucket_size_bytes=1MiB"]))
    differs = " | ".join(baseline["simulate_dp_differs_by"])
    assert "(1 MiB)" in differs and "kernel cost model" in differs and "training.recompute full" in differs
    assert baseline["simulate_dp_same_with"] is None  # more than buckets differ: no claim of equality


def test_search_output_says_what_its_dp_baseline_is(capsys):
    assert main(["search", ALEXNET, "--gpus", "8", "--no-simulate"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "dp: PaSE's data-parallel configuration" in out
    assert "`ghpsim simulate`'s dp differs: gradients fused into DDP buckets" in out
    assert "--set strategy.bucket_size_bytes=1" in out


def test_search_json_carries_the_dp_baseline(capsys):
    assert main(["search", ALEXNET, "--gpus", "4", "--json", "--no-simulate"]) == 0
    baseline = json.loads(capsys.readouterr().out)["dp_baseline"]
    assert baseline == dp_baseline(load_scenario(ALEXNET))


def test_a_batch_smaller_than_p_says_how_many_gpus_the_dp_baseline_uses(capsys):
    """Batch 2 on 8 GPUs: dp splits the batch only 2 ways, so the speedups over it count 6 idle GPUs
    and the output says so; batch 64 on 8 uses all 8 and says nothing."""
    assert main(["search", DEMO, "--set", "training.global_batch_size=2", "--gpus", "8", "--no-simulate", "--json"]) == 0
    (point,) = json.loads(capsys.readouterr().out)["points"]
    assert point["dp_devices"] == 2
    assert main(["search", DEMO, "--set", "training.global_batch_size=2", "--gpus", "8", "--no-simulate"]) == 0
    assert "p=8: dp splits the batch of 2 over 2 of the 8 GPUs" in capsys.readouterr().out.replace("\n", " ")
    assert main(["search", DEMO, "--gpus", "8", "--no-simulate"]) == 0
    assert "dp splits the batch" not in capsys.readouterr().out
