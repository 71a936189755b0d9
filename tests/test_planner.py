"""The planner (simulator/planner.py) and `ghpsim rank` (simulator/rank_cli.py)."""

from __future__ import annotations

import json

import pytest

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.heuristics import estimate_peak_memory_bytes
from simulator.planner import (MEMORY_ESTIMATE, MEMORY_MODEL, Candidate, candidate_kinds, enumerate_candidates,
                               planned_peak_memory_bytes, rank_candidates, scenario_for_gpus)
from simulator.schedules import default_microbatch_counts
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies import STRATEGIES
from simulator.zoo import build_model

DEMO = "scenarios/demo.yaml"


def tiny(num_nodes=2, gpus_per_node=4, batch=64, layers=6, memory="32 GiB") -> dict:
    """An MLP on a cluster of inline parts (a tiny model, so simulations take milliseconds)."""
    return {
        "name": "tiny",
        "cluster": {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node,
                    "gpu": {"peak_flops_per_s": {"fp32": 1e12}, "memory_bytes": memory,
                            "memory_bandwidth_bytes_per_s": 1e11},
                    "intra_node_link": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 1e10},
                    "inter_node_link": {"latency_s": 5e-5, "bandwidth_bytes_per_s": 1e9}},
        "model": {"name": "mlp", "params": {"input_dim": 256, "hidden_dim": 512,
                                            "num_hidden_layers": layers - 1, "num_classes": 10}},
        "training": {"global_batch_size": batch},
    }


def labels(candidates):
    return [candidate.label for candidate in candidates]


def test_candidate_counts_for_eight_gpus():
    scenario = load_scenario(tiny(layers=8))
    found, skipped = enumerate_candidates(scenario, 8, kinds=("dp", "mp", "ghp"))
    # dp, mp, ghp G in {2, 4} x 2 placements
    assert labels(found) == ["dp (G=8 x M=1)", "mp (G=1 x M=8)",
                             "ghp (G=2 x M=4) group_per_node", "ghp (G=2 x M=4) stage_per_node",
                             "ghp (G=4 x M=2) group_per_node", "ghp (G=4 x M=2) stage_per_node"]
    assert skipped == []
    # 16 GPUs: G in {2, 4, 8} -> 2 + 3 x 2
    assert len(enumerate_candidates(scenario_for_gpus(scenario, 16), 16, kinds=("dp", "mp", "ghp"))[0]) == 8


def test_candidates_skip_impossible_grids_with_reasons():
    scenario = load_scenario(tiny(batch=12))
    found, skipped = enumerate_candidates(scenario, 3, kinds=("dp", "mp", "ghp"))
    # B = 12: dp (G = 8) not divisible; 3 layers: mp (M = 8) and ghp G = 2 (M = 4) impossible
    assert labels(found) == ["ghp (G=4 x M=2) group_per_node", "ghp (G=4 x M=2) stage_per_node"]
    assert {s["label"]: s["reason"] for s in skipped} == {
        "dp (G=8 x M=1)": "training.global_batch_size 12 is not divisible by G=8",
        "mp (G=1 x M=8)": "8 stages for the model's 3 layers",
        "ghp (G=2 x M=4) group_per_node": "4 stages for the model's 3 layers",
        "ghp (G=2 x M=4) stage_per_node": "4 stages for the model's 3 layers"}


def test_single_node_keeps_one_placement():
    found, skipped = enumerate_candidates(load_scenario(tiny(num_nodes=1, gpus_per_node=8)), 16,
                                          kinds=("dp", "mp", "ghp"))
    assert len(found) == 4 and all("stage_per_node" not in label for label in labels(found))
    assert [s["label"] for s in skipped] == ["ghp (G=2 x M=4) stage_per_node", "ghp (G=4 x M=2) stage_per_node"]


def test_pipeline_candidates_micro_batch_counts():
    # G in {1, 2, 4} (M >= 2); G = 1 one placement, else two; m in {2, 4, 8}: 3 + 6 + 6
    found, _ = enumerate_candidates(load_scenario(tiny()), 16, kinds=("gpipe",), microbatch_counts=(2, 4, 8))
    assert len(found) == 15
    assert found[0] == Candidate("gpipe", 1, 8, "group_per_node", 2)
    assert found[0].label == "gpipe (G=1 x M=8) m=2"
    # by default m is every power of two from 2 to min(4 M, the group's batch B / G), B = 64: G = 1 (M = 8)
    # 2..32, G = 2 (M = 4) 2..16, G = 4 (M = 2) 2..8
    found, _ = enumerate_candidates(load_scenario(tiny()), 16, kinds=("gpipe",))
    assert sorted({(c.num_groups, c.num_microbatches) for c in found}) == [
        (1, 2), (1, 4), (1, 8), (1, 16), (1, 32), (2, 2), (2, 4), (2, 8), (2, 16), (4, 2), (4, 4), (4, 8)]
    assert default_microbatch_counts(4, 24) == (2, 4, 8) and default_microbatch_counts(1, 64) == (2, 4, 8)
    # B = 8: G = 4 leaves 2 samples per replica, so only m = 2
    found, skipped = enumerate_candidates(load_scenario(tiny(batch=8)), 16, kinds=("gpipe",), microbatch_counts=(2, 4, 8))
    assert sorted({(c.num_groups, c.num_microbatches) for c in found}) == [
        (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2)]
    assert "group batch 2 is not divisible by m=4 micro-batches" in {s["reason"] for s in skipped}
    interleaved, _ = enumerate_candidates(load_scenario(tiny()), 16, kinds=("interleaved_1f1b",), microbatch_counts=(4,))
    assert {c.num_virtual_stages for c in interleaved} == {2} and interleaved[0].label.endswith("m=4 v=2")
    assert set(candidate_kinds()) <= set(STRATEGIES) | {"dp", "mp", "ghp", "megatron"}


def test_gpus_override_rule():
    scenario = load_scenario(tiny())
    assert (scenario_for_gpus(scenario, 16).cluster.num_nodes, scenario_for_gpus(scenario, 16).cluster.gpus_per_node) == (4, 4)
    two = scenario_for_gpus(scenario, 2).cluster
    assert (two.num_nodes, two.gpus_per_node) == (1, 2)
    for bad in (6, 0):
        with pytest.raises(ScenarioError, match=f"--gpus: {bad} is not a multiple of cluster.gpus_per_node=4"):
            scenario_for_gpus(scenario, bad)


def test_part_of_a_node_keeps_nics_that_divide_its_gpus():
    scenario = load_scenario("scenarios/gpt3_175b_dgx_a100_3d.yaml")  # 8 GPUs and 8 NICs a node, fat-tree
    for gpus, nics in ((7, 1), (6, 2), (4, 4), (8, 8)):
        cluster = scenario_for_gpus(scenario, gpus).cluster
        assert (cluster.num_nodes, cluster.gpus_per_node, cluster.nics_per_node) == (1, gpus, nics)
    assert scenario_for_gpus(scenario, 16).cluster.nics_per_node == 8


def test_ranking_equals_sorting_independent_simulations():
    ranking = rank_candidates(load_scenario(DEMO), 8, kinds=("dp", "mp", "ghp"), workers=1, show_progress=False)
    assert ranking.scenario.num_gpus == 8 and len(ranking.rows) == 6
    independent = {}
    for kind, groups, placement in (("dp", None, "group_per_node"), ("mp", None, "group_per_node"),
                                    ("ghp", 2, "group_per_node"), ("ghp", 2, "stage_per_node"),
                                    ("ghp", 4, "group_per_node"), ("ghp", 4, "stage_per_node")):
        overrides = ["cluster.num_nodes=2", f"strategy.kind={kind}", f"strategy.placement={placement}",
                     f"strategy.num_groups={'null' if groups is None else groups}"]
        result = simulate(load_scenario(DEMO, overrides))
        g, m = result.plan.num_groups, result.plan.workers_per_group
        label = {"dp": f"dp (G={g} x M=1)", "mp": f"mp (G=1 x M={m})"}.get(kind, f"ghp (G={g} x M={m}) {placement}")
        independent[label] = result.step_time_s
    assert [row["label"] for row in ranking.rows] == sorted(independent, key=independent.get)
    for row in ranking.rows:
        assert row["step_time_s"] == pytest.approx(independent[row["label"]], rel=1e-12)
    assert [row["rank"] for row in ranking.rows] == [1, 2, 3, 4, 5, 6]


def test_process_pool_gives_the_serial_ranking():
    scenario = load_scenario(tiny())
    serial = rank_candidates(scenario, kinds=("dp", "mp", "ghp"), workers=1, show_progress=False)
    pooled = rank_candidates(scenario, kinds=("dp", "mp", "ghp"), workers=2, show_progress=False)
    assert pooled.rows == serial.rows and pooled.skipped == serial.skipped


def test_candidates_over_device_memory_rank_last_and_marked():
    # 6 layers of 256x512 / 512x512 / 512x10 fp32, SGD: dp holds all 1.19M params (w + g = 9.5 MB);
    # 8 MB of device memory leaves dp out, M >= 2 stages fit
    ranking = rank_candidates(load_scenario(tiny(memory="8 MB")), kinds=("dp", "mp", "ghp"), workers=1,
                              show_progress=False)
    dp = ranking.find("dp (G=8 x M=1)")
    assert not dp["fits_in_memory"] and dp["peak_memory_bytes"] > 8e6 and ranking.rows[-1] is dp
    fitting = [row for row in ranking.rows if row["fits_in_memory"]]
    assert ranking.rows[:len(fitting)] == fitting and len(fitting) == 4
    assert [row["step_time_s"] for row in fitting] == sorted(row["step_time_s"] for row in fitting)


def test_memory_estimate_when_the_summary_has_no_memory_figures(monkeypatch):
    import simulator.planner as planner

    def without_memory(*args, **kwargs):
        result = simulate(*args, **kwargs)
        for row in result.summary["devices"]:
            row.pop("peak_memory_bytes", None)
        return result

    monkeypatch.setattr(planner, "simulate", without_memory)
    ranking = rank_candidates(load_scenario(tiny(memory="8 MB")), kinds=("dp", "ghp"), workers=1, show_progress=False)
    assert ranking.memory_source == MEMORY_ESTIMATE
    workload = build_model("mlp", input_dim=256, hidden_dim=512, num_hidden_layers=5, num_classes=10)
    dp = ranking.find("dp (G=8 x M=1)")
    assert dp["peak_memory_bytes"] == pytest.approx(estimate_peak_memory_bytes(
        workload, 0, 6, dtype="fp32", optimizer="sgd", stashed_samples=8))
    assert not dp["fits_in_memory"] and ranking.rows[-1] is dp


def test_pipeline_memory_estimate_holds_the_schedules_micro_batches():
    # 1f1b, M = 4 stages, m = 4 micro-batches of 16: stage j holds min(4, 4 - j) of them; gpipe all 4
    workload = build_model("mlp", input_dim=256, hidden_dim=512, num_hidden_layers=7, num_classes=10)
    for kind, held in (("1f1b", [4, 3, 2, 1]), ("gpipe", [4, 4, 4, 4])):
        raw = {**tiny(num_nodes=1, layers=8), "strategy": {"kind": kind, "num_microbatches": 4}}
        scenario = load_scenario(raw)
        result = simulate(scenario, workload=workload)
        estimates = planned_peak_memory_bytes(result.plan, workload, scenario)
        for rank, stage in enumerate(result.plan.stages):
            assert estimates[rank] == pytest.approx(estimate_peak_memory_bytes(
                workload, stage.layer_start, stage.layer_end, dtype="fp32", optimizer="sgd",
                stashed_samples=held[rank] * 16, pass_samples=16))


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_rank_cli_json_plot_and_heuristics(capsys, tmp_path):
    plot = tmp_path / "rank.png"
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "8", "--json", "--plot", str(plot), "--workers", "1",
                       "--kinds", "dp,mp,ghp")
    assert code == 0 and plot.read_bytes()[:4] == b"\x89PNG"
    report = json.loads(out)
    assert report["num_gpus"] == 8 and report["num_nodes"] == 2 and report["memory_source"] == MEMORY_MODEL
    rows = report["rows"]
    assert {"step_time_s", "throughput_samples_per_s", "speedup", "comm_share", "peak_memory_bytes", "fits_in_memory",
            "rank"} <= set(rows[0])
    best = rows[0]["step_time_s"]
    assert [h["heuristic"] for h in report["heuristics"]] == ["memory-first", "time-minimising"]
    for pick in report["heuristics"]:
        row = next(r for r in rows if r["label"] == pick["label"])
        assert pick["simulated_rank"] == row["rank"] and pick["simulated_s"] == row["step_time_s"]
        assert pick["regret_pct"] == pytest.approx(100 * (row["step_time_s"] - best) / best)
        assert pick["grid_regret_pct"] == pick["regret_pct"]  # only dp/mp/ghp were ranked
    # memory-first: every grid fits in 32 GiB, so the smallest M: dp
    assert report["heuristics"][0]["label"] == "dp (G=8 x M=1)"


def test_rank_cli_table_and_errors(capsys):
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "8", "--top", "3", "--workers", "1", "--kinds", "dp,ghp",
                       "--exhaustive")
    assert code == 0 and "ghp (G=4 x M=2) stage_per_node" in out and "regret" in out
    assert "memory: simulated (memory model)" in out and "5 candidates simulated" in out
    code, out, _ = run(capsys, "rank", DEMO, "--gpus", "8", "--top", "1", "--workers", "1", "--kinds", "dp,ghp")
    assert code == 0 and "5 enumerated" in out and "pruned by the step-time bound" in out
    code, _, err = run(capsys, "rank", DEMO, "--gpus", "6")
    assert code == 2 and err.strip() == "ghpsim: error: --gpus: 6 is not a multiple of cluster.gpus_per_node=4 (nor at most one node)"
    code, _, err = run(capsys, "rank", DEMO, "--top", "0")
    assert code == 2 and "--top: 0" in err
    code, _, err = run(capsys, "rank", DEMO, "--kinds", "dp,zz")
    assert code == 2 and "--kinds: 'dp,zz': choose from dp, mp, ghp" in err


# ----------------------------------------------------------------------------- megatron


def tiny_transformer(num_nodes=1, gpus_per_node=4, batch=16) -> dict:
    """The validation transformer (4 blocks, 4 heads) on the tiny cluster."""
    raw = tiny(num_nodes=num_nodes, gpus_per_node=gpus_per_node, batch=batch)
    raw["model"] = {"name": "transformer", "params": {"num_layers": 4, "hidden_size": 128, "num_heads": 4,
                                                      "seq_len": 32, "vocab_size": 512}}
    return raw


def test_megatron_candidates_keep_tensor_parallelism_inside_a_node():
    found, skipped = enumerate_candidates(load_scenario(tiny(num_nodes=2, gpus_per_node=4)), 16, kinds=("megatron",),
                                          microbatch_counts=(2, 4))
    # N = 8, t in {2, 4} (a node has 4 GPUs); t = 2: p in {1, 2, 4}, t = 4: p in {1, 2}; m = 1 without a pipeline
    assert labels(found) == [
        "megatron (t=2 x p=1 x d=4) m=1", "megatron (t=2 x p=2 x d=2) m=2", "megatron (t=2 x p=2 x d=2) m=4",
        "megatron (t=2 x p=4 x d=1) m=2", "megatron (t=2 x p=4 x d=1) m=4",
        "megatron (t=4 x p=1 x d=2) m=1", "megatron (t=4 x p=2 x d=1) m=2", "megatron (t=4 x p=2 x d=1) m=4"]
    assert skipped == []
    found, skipped = enumerate_candidates(load_scenario(tiny(num_nodes=2, gpus_per_node=4, batch=6)), 16,
                                          kinds=("megatron",), microbatch_counts=(4,))
    reasons = {s["label"]: s["reason"] for s in skipped}
    assert reasons["megatron (t=2 x p=1 x d=4) m=1"] == "training.global_batch_size 6 is not divisible by d=4 replicas"
    assert reasons["megatron (t=2 x p=2 x d=2) m=4"] == "replica batch 3 is not divisible by m=4 micro-batches"
    assert labels(found) == ["megatron (t=4 x p=1 x d=2) m=1"]  # 6 / 2 replicas, no micro-batches


def test_a_transformer_ranks_megatron_plans_as_their_own_simulations():
    scenario = load_scenario(tiny_transformer())
    ranking = rank_candidates(scenario, microbatch_counts=(2,), workers=1, show_progress=False)
    megatron = [row for row in ranking.rows if row["kind"] == "megatron"]
    assert {row["label"] for row in megatron} == {"megatron (t=2 x p=1 x d=2) m=1", "megatron (t=2 x p=2 x d=1) m=2",
                                                  "megatron (t=4 x p=1 x d=1) m=1"}
    for row in megatron:
        t, p = row["tp_degree"], row["workers_per_group"]
        direct = simulate(load_scenario(tiny_transformer(), [
            "strategy.kind=megatron", f"strategy.tp_degree={t}", f"strategy.pp_degree={p}",
            f"strategy.num_microbatches={row['num_microbatches']}"]))
        assert row["step_time_s"] == pytest.approx(direct.step_time_s, rel=1e-12)
    # an MLP has no attention to split: megatron is not among the default kinds
    assert not [row for row in rank_candidates(load_scenario(tiny(num_nodes=1)), microbatch_counts=(2,), workers=1,
                                               show_progress=False).rows if row["kind"] == "megatron"]


def test_a_megatron_scenario_keeps_its_kind_on_another_gpu_count():
    """Moved to another N (rank --gpus, validate at a profile's world size), a megatron scenario
    without ZeRO stays megatron at t = p = 1 (DDP), as one with ZeRO does; a dp one stays dp."""
    from simulator.planner import scenario_for_gpus
    megatron = load_scenario("scenarios/validation/mlp_cpu.yaml", ["strategy.kind=megatron", "strategy.num_groups=null"])
    moved = scenario_for_gpus(megatron, 2)
    assert (moved.strategy.kind, moved.strategy.tp_degree, moved.strategy.pp_degree, moved.num_gpus) == ("megatron", 1, 1, 2)
    assert scenario_for_gpus(load_scenario("scenarios/validation/mlp_cpu.yaml"), 2).strategy.kind == "dp"
