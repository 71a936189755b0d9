"""The layout search (simulator/layout_search.py) and its bounds (simulator/step_bound.py): the
first-ranked candidate is the exhaustive best, the step-time bound never exceeds the simulated
time, and memory pruning agrees with the memory model (simulator/memory.py)."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor

import pytest

from ghpsim import arguments
from ghpsim.cli import main
from simulator.fabrics import build_topology
from simulator.hardware import GPUS
from simulator.layout_search import MICROBATCH_SIZES, exact_peak_memory_bytes, megatron_space, search_layouts
from simulator.planner import Candidate, _workload, candidate_scenario, enumerate_candidates, scenario_for_gpus
from simulator.rank_reasons import pareto_front
from simulator.scenario import load_scenario, scenario_from_dict
from simulator.search_bounds import bound_model, screen_all
from simulator.simulate import analytic_costs, simulate
from simulator.step_bound import BoundModel

KINDS = ("dp", "mp", "ghp", "gpipe", "1f1b", "interleaved_1f1b", "megatron")


def tiny_llm(num_nodes=2, gpus_per_node=2, batch=8, layers=4, memory=None) -> dict:
    """A 4-block transformer on A100s (kernel cost model), 2 nodes: simulations take milliseconds."""
    gpu = "A100-80GB" if memory is None else {**GPUS["A100-80GB"].model_dump(mode="json"), "memory_bytes": memory}
    return {"name": "tiny_llm",
            "cluster": {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node, "gpu": gpu,
                        "intra_node_link": "nvlink3-a100", "inter_node_link": "ib-hdr"},
            "model": {"name": "transformer", "params": {"num_layers": layers, "hidden_size": 256, "num_heads": 8,
                                                        "seq_len": 128, "vocab_size": 1024}},
            "training": {"global_batch_size": batch, "dtype": "bf16", "optimizer": "adam"}}


def exhaustive(raw: dict, overrides=(), **options):
    return search_layouts(load_scenario(raw, list(overrides)), kinds=KINDS, microbatch_sizes=(1, 2), exhaustive=True,
                          context=True, workers=1, show_progress=False, **options)


@pytest.mark.parametrize("overrides", [
    (),
    ("cluster.topology=fat_tree", "training.recompute=full", "strategy.overlap_backward=false"),
    ("strategy.tp_comm_overlap=true", "strategy.bucket_size_bytes=100000", "training.memory_policy=reuse"),
])
def test_the_bound_is_never_above_the_simulated_time(overrides):
    ranking = exhaustive(tiny_llm(), overrides)
    kinds = {row["kind"] for row in ranking.rows}
    assert {"dp", "ghp", "1f1b", "gpipe", "megatron"} <= kinds and len(ranking.rows) > 100
    assert any(row["cp_degree"] == 2 for row in ranking.rows)  # context parallelism: t = 1, c = 2 on 2 GPUs a node
    for row in ranking.rows:
        assert 0 < row["bound_s"] <= row["step_time_s"], row["label"]
    # and it is close: most candidates' bounds are within 30 % of their simulated time
    close = [row for row in ranking.rows if row["bound_s"] >= 0.7 * row["step_time_s"]]
    assert len(close) >= 0.9 * len(ranking.rows)


def test_the_first_ranked_equals_the_exhaustive_best():
    raw = tiny_llm(batch=16)
    full = exhaustive(raw)
    for top in (1, 3):
        pruned = search_layouts(load_scenario(raw), kinds=KINDS, microbatch_sizes=(1, 2), top=top, workers=1,
                                show_progress=False)
        fitting = [row for row in full.rows if row["fits_in_memory"]]
        assert [(r["label"], r["step_time_s"]) for r in pruned.rows[:top]] == \
            [(r["label"], r["step_time_s"]) for r in fitting[:top]]
        stats = pruned.stats
        assert stats.pruned_bound > 0 and stats.simulated < len(full.rows)
        assert stats.enumerated == stats.pruned_memory + stats.pruned_bound + stats.simulated + len(pruned.skipped)
        # every candidate left out could not beat the top-th simulated time
        kth = pruned.rows[top - 1]["step_time_s"]
        assert all(entry["bound_s"] > kth for entry in pruned.pruned if entry["reason"] != "memory")


def test_memory_pruning_agrees_with_the_memory_model():
    raw = tiny_llm(batch=16, memory="32 MB")
    scenario = load_scenario(raw)
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    model = bound_model(scenario, workload)  # each candidate priced as it runs (selective recompute too)
    candidates = megatron_space(scenario, workload, (1, 2, 4))[::3] + enumerate_candidates(
        scenario, workload.num_layers, ("dp", "ghp", "gpipe", "1f1b", "pipedream"), (2, 4))[0]
    assert any(candidate.cp_degree == 2 for candidate in candidates)
    fits = {True: 0, False: 0}
    for candidate in candidates:
        concrete = scenario_from_dict(candidate_scenario(scenario, candidate))
        simulated = simulate(concrete, workload=workload).summary["memory"]["peak_memory_bytes"]
        assert exact_peak_memory_bytes(concrete, workload) == pytest.approx(simulated, rel=1e-12), candidate.label
        assert model.memory_floor_bytes(candidate) <= simulated * (1 + 1e-12), candidate.label
        fits[simulated <= scenario.cluster.gpu.memory_bytes] += 1
    assert fits[True] and fits[False]  # the capacity splits the space
    # the search drops exactly the layouts the memory model says do not fit
    ranking = exhaustive(raw)
    full = exhaustive(tiny_llm(batch=16))
    over = {row["label"] for row in full.rows if row["peak_memory_bytes"] > 32e6}
    assert {entry["label"] for entry in ranking.pruned if entry["reason"] == "memory"} | \
        {row["label"] for row in ranking.rows if not row["fits_in_memory"]} == over


def test_floors_and_bounds_over_worker_processes_equal_one_process():
    scenario = load_scenario(tiny_llm(num_nodes=2, gpus_per_node=4, batch=16, memory="64 MB"))
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    candidates = megatron_space(scenario, workload, (1, 2)) + enumerate_candidates(
        scenario, workload.num_layers, ("dp", "ghp", "1f1b"), (2, 4))[0]
    screened_serial, screened_spread = [], []  # what a progress bar is advanced by
    serial, _, _ = screen_all(scenario, workload, candidates, advance=screened_serial.append)
    with ProcessPoolExecutor(max_workers=2) as pool:
        spread, memory_s, bound_s = screen_all(scenario, workload, candidates, pool, workers=2,
                                               advance=screened_spread.append)
    assert spread == serial and memory_s > 0 and bound_s > 0
    assert sum(screened_serial) == sum(screened_spread) == len(candidates) and len(screened_spread) > 1
    fitting = [found for found in serial if found.bound is not None]
    assert 0 < len(fitting) < len(serial)  # the 64 MB device drops some layouts: they get no bound
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    for candidate, found in list(zip(candidates, serial))[::7]:
        assert found.floor_bytes == model.memory_floor_bytes(candidate), candidate.label


def test_megatron_space_covers_every_axis():
    scenario = load_scenario(tiny_llm(num_nodes=2, gpus_per_node=4, batch=16))
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    space = megatron_space(scenario, workload, (1, 2))
    assert {c.tp_degree for c in space} == {1, 2, 4} and {c.workers_per_group for c in space} == {1, 2, 4}
    assert {c.recompute for c in space} == {"none", "selective", "full"} and {c.zero_stage for c in space} == {0, 1, 2, 3}
    assert {c.sequence_parallel for c in space} == {False, True} and {c.num_virtual_stages for c in space} == {1, 2}
    assert {c.placement for c in space} == {"group_per_node", "tp_dp_pp"}
    assert {c.ep_degree for c in space} == {None}  # a dense model: no expert-parallel axis
    assert {(c.tp_degree, c.cp_degree) for c in space if c.cp_degree > 1} == {(1, 2), (1, 4), (2, 2)}
    assert len({c.label for c in space}) == len(space)
    layout = Candidate("megatron", 4, 2, "tp_dp_pp", 4, 1, 2, "full", 1, True)
    raw = candidate_scenario(scenario, layout)
    assert raw["strategy"]["placement"] == [0, 1, 4, 5, 2, 3, 6, 7]  # a stage's replicas side by side
    assert (raw["training"]["recompute"], raw["strategy"]["zero_stage"], raw["strategy"]["sequence_parallel"]) == \
        ("full", 1, True)
    assert arguments.MICROBATCH_SIZES == MICROBATCH_SIZES


def test_pareto_front():
    assert pareto_front([(1, 5), (2, 3), (3, 4), (2, 3), (4, 1)]) == [True, True, False, True, True]


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_rank_plans_runs_and_compares_cluster_sizes(capsys, tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(json.dumps(tiny_llm(batch=16)))
    plot = tmp_path / "pareto.png"
    code, out, _ = run(capsys, "rank", str(scenario), "--gpus", "2,4", "--top", "2", "--workers", "1",
                       "--tokens", "1e9", "--price-per-gpu-hour", "2.5", "--json", "--plot", str(plot))
    assert code == 0 and plot.read_bytes()[:4] == b"\x89PNG"
    sizes = json.loads(out)["sizes"]
    assert [size["num_gpus"] for size in sizes] == [2, 4]
    for size in sizes:
        best = size["rows"][0]
        steps = -(-1e9 // (16 * 128))
        assert best["run_steps"] == steps and best["time_to_train_s"] == pytest.approx(steps * best["step_time_s"])
        assert best["cost"] == pytest.approx(best["time_to_train_s"] / 3600 * size["num_gpus"] * 2.5)
        search = size["search"]
        assert search["simulated"] == len(size["rows"]) and search["enumerated"] > search["simulated"]
    code, out, _ = run(capsys, "rank", str(scenario), "--gpus", "2,4", "--top", "2", "--workers", "1", "--steps", "10")
    assert code == 0 and "cluster sizes: the best layout of each" in out and "pruned by the step-time bound" in out
    code, _, err = run(capsys, "rank", str(scenario), "--price-per-gpu-hour", "-1")
    assert code == 2 and err.strip() == "ghpsim: error: --price-per-gpu-hour: -1.0 must be a positive number up to 1e+30"
    with pytest.raises(SystemExit) as exit_info:
        main(["rank", str(scenario), "--tokens", "5", "--steps", "3"])
    assert exit_info.value.code == 2


def test_rank_says_in_one_line_when_no_layout_fits(capsys, tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(json.dumps(tiny_llm(memory="1 MB")))
    code, out, err = run(capsys, "rank", str(scenario), "--workers", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("ghpsim: error: cluster.gpu: no layout fits in 0.0 GiB of device memory on 4 GPUs (")
    code, out, err = run(capsys, "rank", str(scenario), "--workers", "1", "--gpus", "4")  # a flag given is named
    assert code == 2 and err.startswith("ghpsim: error: --gpus: no layout fits in 0.0 GiB")


def tiny_moe(memory=None) -> dict:
    """`tiny_llm`'s cluster with a 2-block mixture of 4 experts, top-2."""
    return {**tiny_llm(batch=8, memory=memory), "name": "tiny_moe",
            "model": {"name": "moe", "params": {"num_layers": 2, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 4,
                                                "seq_len": 128, "vocab_size": 1024, "num_experts": 4, "top_k": 2,
                                                "expert_ffn_hidden_size": 256}}}


def test_moe_search_adds_expert_degrees_with_valid_bounds_and_floors():
    scenario = load_scenario(tiny_moe(), ["costs.host_overhead_s=0"])  # a device-bound bound: the floors count
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    space = megatron_space(scenario, workload, (1,))
    assert {c.ep_degree for c in space} == {1, 2, 4}
    for c in space:  # e divides d and the 4 experts; EP > 1 only with ZeRO 0 / 1 and, with TP, SP
        assert c.data_parallel % c.ep_degree == 0
        assert c.ep_degree == 1 or (c.zero_stage < 2 and c.sequence_parallel == (c.tp_degree > 1))
    full = search_layouts(scenario, kinds=("megatron",), microbatch_sizes=(1,), exhaustive=True, workers=1,
                          show_progress=False)
    assert any(" ep=4" in row["label"] for row in full.rows)
    for row in full.rows:
        assert 0 < row["bound_s"] <= row["step_time_s"], row["label"]
    pruned = search_layouts(scenario, kinds=("megatron",), microbatch_sizes=(1,), top=1, workers=1,
                            show_progress=False)
    best = next(row for row in full.rows if row["fits_in_memory"])
    assert (pruned.rows[0]["label"], pruned.rows[0]["step_time_s"]) == (best["label"], best["step_time_s"])
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    checked = [c for c in space if c.ep_degree > 1][::3]
    assert {c.zero_stage for c in checked} == {0, 1}
    for candidate in checked:
        concrete = scenario_from_dict(candidate_scenario(scenario, candidate))
        assert concrete.strategy.ep_degree == candidate.ep_degree
        assert model.memory_floor_bytes(candidate) <= exact_peak_memory_bytes(concrete, workload) * (1 + 1e-12)


def test_the_moe_bound_counts_each_layers_all_to_alls_and_stays_below_the_simulation(monkeypatch):
    """Every MoE layer's pass adds its dispatch and combine all-to-alls at link rate over the EP
    group (`simulator.layout_geometry.expert_floors_s`), so the bound of an EP layout rises and
    stays below its simulated step."""
    import simulator.step_bound as step_bound
    from simulator.strategies.experts import alltoall_bytes_per_sample, is_moe
    scenario = load_scenario(tiny_moe(), ["costs.host_overhead_s=0"])  # a device-bound bound: the floors count
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    space = megatron_space(scenario, workload, (1,))
    candidate = next(c for c in space if c.ep_degree == 4 and c.tp_degree == 1 and c.workers_per_group == 1)
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    geo, b = model.geometry(candidate), model.microbatch_size(candidate)
    floors = step_bound.expert_floors_s(model, candidate, geo, b)
    assert sorted(floors) == [i for i, layer in enumerate(workload.layers) if is_moe(layer)]
    spec = workload.layers[min(floors)].spec
    size = alltoall_bytes_per_sample(spec, 1, False, model.element) * b
    assert floors[min(floors)] == model.collective_floor_s((tuple(geo.rings[0]),), "alltoall", size, "pairwise", 2) > 0
    with_floors = model.bound(candidate).step_s
    monkeypatch.setattr(step_bound, "expert_floors_s", lambda *args: {})
    assert BoundModel(scenario, workload, build_topology(scenario.cluster),
                      analytic_costs(scenario, workload)).bound(candidate).step_s < with_floors
    concrete = scenario_from_dict(candidate_scenario(scenario, candidate))
    assert with_floors <= simulate(concrete, workload=workload).step_time_s


def test_the_moe_bound_counts_the_expert_reductions_over_their_copies(monkeypatch):
    """ZeRO-1 reduce-scatters each bucket's expert gradients among the d / e copies of its experts and
    allgathers the updated expert shards there, on the stream with the rest (`simulator.strategies.
    experts`): the bound counts both, so it rises, and stays below the simulated step."""
    scenario = load_scenario(tiny_moe(), ["costs.host_overhead_s=0"])
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), ".")
    candidate = next(c for c in megatron_space(scenario, workload, (1,))
                     if c.ep_degree == 2 and c.data_parallel == 4 and c.zero_stage == 1 and c.tp_degree == 1)

    def model():
        return BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))

    copies = model().geometry(candidate).expert_groups(0, 2)  # both copies of each expert shard, at once
    assert sorted(len(group) for group in copies) == [2, 2]
    counted = model().bound(candidate).step_s
    floor = BoundModel.collective_floor_s
    monkeypatch.setattr(BoundModel, "collective_floor_s", lambda self, groups, *args:
                        0.0 if groups == copies else floor(self, groups, *args))
    assert model().bound(candidate).step_s < counted
    concrete = scenario_from_dict(candidate_scenario(scenario, candidate))
    assert counted <= simulate(concrete, workload=workload).step_time_s


def test_the_zero3_bound_floors_the_tp_ranks_gathers_together(monkeypatch):
    """A stage's t data-parallel groups (one per TP rank) gather and reduce-scatter at once, through
    the same node uplinks (two-tier fabric): the bound floors them together, as the engine plays them,
    so this communication-bound ZeRO-3 layout's bound is within 10 % of its simulation and under it;
    TP rank 0's group alone gave about half."""
    import dataclasses
    scenario = load_scenario({
        "name": "zero3", "cluster": {"num_nodes": 4, "gpus_per_node": 8, "nics_per_node": 8, "gpu": "A100-80GB",
                                     "intra_node_link": "nvlink3-a100", "inter_node_link": "ib-hdr"},
        "model": {"name": "transformer", "params": {"num_layers": 4, "hidden_size": 4096, "num_heads": 32,
                                                     "seq_len": 64, "vocab_size": 1000}},
        "strategy": {"kind": "megatron", "tp_degree": 4, "zero_stage": 3},
        "training": {"global_batch_size": 8, "dtype": "bf16", "optimizer": "adam"}})
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), scenario.base_dir)
    candidate = next(c for c in megatron_space(scenario, workload, (1,))
                     if c.label == "megatron (t=4 x p=1 x d=8) m=1 recompute=none zero3")

    def bound():
        return BoundModel(scenario, workload, build_topology(scenario.cluster),
                          analytic_costs(scenario, workload)).bound(candidate).step_s

    together = bound()
    step = simulate(scenario_from_dict(candidate_scenario(scenario, candidate)), workload=workload).step_time_s
    assert 0.9 * step <= together <= step
    geometry = BoundModel.geometry
    monkeypatch.setattr(BoundModel, "geometry", lambda self, c: dataclasses.replace(
        geometry(self, c), dp_groups=[(ring,) for ring in geometry(self, c).rings]))
    assert bound() < 0.6 * step


def test_the_floor_of_asynchronous_pipelines_counts_weight_copies_and_the_recomputed_chunk():
    """PipeDream's stashed versions and SpecTrain's predicted copy (simulator/memory_buffers.py) and,
    under full recompute, the first backward's re-run forward are in the floor: GPT-3 175B's
    asynchronous layouts on 512 GPUs come within a fifth of the memory model and never above it."""
    from simulator.memory_floor import weight_copies
    assert weight_copies("pipedream", 4, 8, True) == (3, 2, 1, 0)
    assert weight_copies("pipedream", 4, 8, False) == (0, 0, 0, 0)
    assert weight_copies("spectrain", 4, 8, True) == (1, 1, 1, 1)
    assert weight_copies("delayed_gradient", 4, 8, True) == (0, 0, 0, 0)
    scenario = load_scenario("scenarios/gpt3_175b_dgx_a100_3d.yaml", ["cluster.num_nodes=64"])
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), scenario.base_dir)
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    candidates = enumerate_candidates(scenario, workload.num_layers, ("pipedream", "spectrain"), (4,))[0]
    checked = [c for c in candidates if c.workers_per_group in (32, 64) and c.placement == "stage_per_node"]
    assert len(checked) == 4
    for candidate in checked:
        exact = exact_peak_memory_bytes(scenario_from_dict(candidate_scenario(scenario, candidate)), workload)
        assert 0.8 * exact <= model.memory_floor_bytes(candidate) <= exact * (1 + 1e-12), candidate.label


def test_rank_refuses_in_one_line_when_no_asynchronous_layout_fits(capsys):
    code = main(["rank", "scenarios/gpt3_175b_dgx_a100_3d.yaml", "--gpus", "512", "--workers", "1",
                 "--kinds", "pipedream,spectrain,delayed_gradient"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "no layout fits in 80.0 GiB of device memory on 512 GPUs" in err


def test_asynchronous_layouts_over_the_unfolded_pass_limit_are_skipped_with_the_reason():
    """Asynchronous pipelines replay K whole steps to their steady state
    (simulator/schedules/steady_state.py): R (n + m) passes, n = K m >= 3p + J m + 1 (J steps of at
    least 4p micro-batches measured), with R all N ranks where the replicas do not fold (no topology
    to check here)."""
    from types import SimpleNamespace

    from simulator.search_gates import ASYNCHRONOUS_UNFOLDED_PASSES, asynchronous_passes, unfolded_refusal
    assert asynchronous_passes(512, 64, 4) == 512 * (452 + 4)  # 49 steps of 4 to fill, J = 64 measured
    assert asynchronous_passes(8, 4, 8) == 8 * (32 + 8)  # 3p + 1 = 13: two steps of 8, J = 2 measured
    large = Candidate("pipedream", 256, 16, num_microbatches=4)
    reason = unfolded_refusal(SimpleNamespace(num_gpus=4096), large, None, {})
    assert f"{4096 * (116 + 4):,} rank x micro-batch passes exceed {ASYNCHRONOUS_UNFOLDED_PASSES:,}" in reason
    assert unfolded_refusal(SimpleNamespace(num_gpus=128), Candidate("spectrain", 8, 16, num_microbatches=4),
                            None, {}) is None  # 128 x (116 + 4) passes
    assert unfolded_refusal(SimpleNamespace(num_gpus=4096), Candidate("1f1b", 256, 16, num_microbatches=4),
                            None, {}) is None  # synchronous kinds have a bound and fold where they can


def test_asynchronous_layouts_whose_replicas_fold_are_searched():
    """GPT-3 175B's pipedream G 256 x p 16 on 4,096 GPUs: 245,760 passes unfolded, but its replicas
    fold (simulator/grid_symmetry.py) to 16 ranks, 960 passes: searched, and simulated in seconds."""
    from simulator.planner import scenario_for_gpus
    from simulator.search_gates import unfolded_refusal
    scenario = scenario_for_gpus(load_scenario("scenarios/gpt3_175b_dgx_a100_3d.yaml"), 4096)
    candidate = Candidate("pipedream", 256, 16, num_microbatches=2)
    assert unfolded_refusal(scenario, candidate, build_topology(scenario.cluster), {}) is None
    layout = scenario_from_dict(candidate_scenario(scenario, candidate), scenario.source, scenario.base_dir)
    summary = simulate(layout).summary
    assert summary["symmetry"]["used"] and summary["num_gpus"] == 4096 and summary["step_time_s"] > 0
    off = scenario.model_copy(update={"strategy": scenario.strategy.model_copy(update={"symmetry": "off"})})
    assert "exceed" in unfolded_refusal(off, candidate, build_topology(scenario.cluster), {})


FLOOR_CHECKS = {  # LLaMA-3 405B on 256 H100 (bf16): label -> the least share of the exact peak its floor reaches
    "megatron (t=1 x p=1 x d=256) m=8 recompute=full zero3": 0.55,  # every layer's input, one gathered unit
    "megatron (t=2 x p=32 x d=4) m=512 v=4 recompute=full zero1 sp": 0.6,  # fp32 main gradients, sent outputs
    "megatron (t=1 x c=8 x p=32 x d=1) m=2048 recompute=full zero1": 0.9,
    "megatron (t=1 x c=2 x p=128 x d=1) m=2048 recompute=full": 0.9,
}


def test_the_memory_floor_of_megatron_layouts_counts_what_their_plans_keep():
    """Under full recompute a megatron plan checkpoints every layer's input; its bf16 gradients
    accumulate in fp32; a pipeline stage keeps each sent output until its backward; ZeRO-3's unit
    computing at the peak holds its gathered parameters. The floor counts them, so layouts that cannot
    fit are dropped before they are simulated, and it stays under the memory model's exact peak."""
    scenario = scenario_for_gpus(load_scenario("scenarios/llama3_405b_4d_h100.yaml"), 256)
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), scenario.base_dir)
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    candidates = {c.label: c for c in megatron_space(scenario, workload) if c.label in FLOOR_CHECKS}
    assert set(candidates) == set(FLOOR_CHECKS)
    for label, share in FLOOR_CHECKS.items():
        exact = exact_peak_memory_bytes(scenario_from_dict(candidate_scenario(scenario, candidates[label])), workload)
        assert share * exact <= model.memory_floor_bytes(candidates[label]) <= exact * (1 + 1e-12), label


@pytest.mark.slow
@pytest.mark.parametrize("path, gpus", [("scenarios/llama3_70b_fsdp_h100.yaml", 64),
                                        ("scenarios/mixtral_8x7b_ep_h100.yaml", 64),
                                        ("scenarios/gpt3_175b_dgx_a100_3d.yaml", 128)])
def test_the_memory_floor_never_exceeds_the_exact_peak_across_the_search_space(path, gpus):
    """A floor above the exact peak would drop a layout that fits: sampled across each model's whole
    megatron space (every ZeRO stage, recompute mode, CP and EP degree it has)."""
    scenario = scenario_for_gpus(load_scenario(path), gpus)
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), scenario.base_dir)
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    space = megatron_space(scenario, workload)
    sampled = space[::len(space) // 20]
    assert len({(c.zero_stage, c.recompute) for c in sampled}) >= 4
    for candidate in sampled:
        exact = exact_peak_memory_bytes(scenario_from_dict(candidate_scenario(scenario, candidate)), workload)
        assert model.memory_floor_bytes(candidate) <= exact * (1 + 1e-12), candidate.label
