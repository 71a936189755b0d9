"""Sharded data parallelism (simulator/strategies/zero.py): the schema of zero_stage and
fsdp_sharding, the collectives of ZeRO-2/3 plans, ZeRO-3's 1.5x communication volume
(Rajbhandari et al. SC'20 sec. 7), FSDP's prefetch overlap, hybrid sharding, the reduce dtype,
FSDP2's copies and the layout search over the stages; the memory is tests/test_zero_memory.py's."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.fabrics import build_topology
from simulator.layout_search import exact_peak_memory_bytes, megatron_space, search_layouts
from simulator.plan import FORWARD, Collective, Compute
from simulator.planner import _workload, candidate_scenario
from simulator.scenario import scenario_from_dict
from simulator.simulate import analytic_costs
from simulator.step_bound import BoundModel

PEAK = 100e12
PARAMS = 1_000_000   # per toy block
LAYERS = 4
ELEMENT = 2          # fp16 (the ZeRO paper's mixed precision: fp16 parameters and gradients)
LATENCY, BANDWIDTH = 2e-6, 1e9
STATES = ("weights", "master_weights", "optimizer_state", "weight_gradients")
FSDP_SCENARIO = "scenarios/llama3_70b_fsdp_h100.yaml"


def raw(zero=0, dp=4, nodes=1, micro=1, bandwidth=BANDWIDTH, batch=8, dtype="fp16", **strategy) -> dict:
    """LAYERS compute-bound blocks of PARAMS parameters, fp16 + Adam, dp replicas on ring links."""
    link = {"latency_s": LATENCY, "bandwidth_bytes_per_s": bandwidth}
    rows = [{"name": f"block{i}", "kind": "attention", "forward_flops_per_sample": 4e12, "num_params": PARAMS,
             "input_elements_per_sample": 1_000_000, "output_elements_per_sample": 1_000_000} for i in range(LAYERS)]
    return {
        "cluster": {"num_nodes": nodes, "gpus_per_node": dp // nodes,
                    "gpu": {"peak_flops_per_s": {"fp32": PEAK, "fp16": PEAK, "bf16": PEAK}, "memory_bytes": "80 GiB",
                            "memory_bandwidth_bytes_per_s": 1e12},
                    "intra_node_link": link, "inter_node_link": link},
        "model": {"layers": rows},
        "strategy": {"kind": "megatron", "zero_stage": zero, "num_microbatches": micro, "collective": "ring", **strategy},
        "training": {"global_batch_size": batch, "optimizer": "adam", "dtype": dtype},
        "costs": {"efficiency": {"attention": 0.5}},
    }


def run(zero=0, **options):
    return simulate(load_scenario(raw(zero, **options)))


def collectives(result, rank=0) -> list[Collective]:
    return [action for action in result.plan.actions[rank] if isinstance(action, Collective)]


# ----------------------------------------------------------------------------- schema

@pytest.mark.parametrize("strategy, stage", [
    ({"zero_stage": 2}, 2), ({"zero_stage": 3}, 3), ({"fsdp_sharding": "full_shard"}, 3),
    ({"fsdp_sharding": "shard_grad_op"}, 2), ({"fsdp_sharding": "hybrid_shard"}, 3), ({"fsdp_sharding": "no_shard"}, 0),
    ({"fsdp_sharding": "full_shard", "zero_stage": 3}, 3),
])
def test_zero_stage_and_fsdp_names(strategy, stage):
    assert load_scenario(raw() | {"strategy": {"kind": "megatron", **strategy}}).strategy.zero_stage == stage


@pytest.mark.parametrize("strategy, words", [
    ({"fsdp_sharding": "full_shard", "zero_stage": 2}, ("strategy.zero_stage: 2", "strategy.fsdp_sharding: full_shard")),
    ({"fsdp_sharding": "no_shard", "zero_stage": 1}, ("strategy.zero_stage: 1", "strategy.fsdp_sharding: no_shard")),
    ({"zero_stage": 3, "pp_degree": 2}, ("strategy.zero_stage: 3", "pipeline parallelism (DeepSpeed)")),
    ({"fsdp_sharding": "shard_grad_op", "pp_degree": 2}, ("strategy.fsdp_sharding: shard_grad_op (ZeRO-2)", "DeepSpeed")),
    ({"zero_stage": 4}, ("strategy.zero_stage", "0, 1, 2 or 3")),
    ({"fsdp_sharding": "zero3"}, ("strategy.fsdp_sharding", "'zero3'")),
])
def test_inconsistent_sharding_names_the_fields(strategy, words):
    with pytest.raises(ScenarioError) as error:
        load_scenario(raw() | {"strategy": {"kind": "megatron", **strategy}})
    assert all(word in str(error.value) for word in words) and "\n" not in str(error.value)


def test_zero2_and_3_need_the_megatron_kind():
    with pytest.raises(ScenarioError, match="strategy.zero_stage: 3 needs strategy.kind megatron"):
        load_scenario(raw() | {"strategy": {"kind": "dp", "zero_stage": 3}})


# ----------------------------------------------------------------------------- plans

def test_zero3_plan_gathers_each_unit_twice_and_reduce_scatters_it_once_per_microbatch():
    d = 4
    for micro in (1, 2):
        result = run(3, micro=micro)
        ops = collectives(result)
        gathers = [c for c in ops if c.op == "allgather"]
        scatters = [c for c in ops if c.op == "reduce_scatter"]
        assert len(gathers) == 2 * LAYERS * micro and len(scatters) == LAYERS * micro and len(ops) == 3 * LAYERS * micro
        assert {c.size_bytes for c in gathers} == {PARAMS * ELEMENT / d}   # each rank's shard of one unit
        assert {c.size_bytes for c in scatters} == {PARAMS * ELEMENT}      # one unit's full gradient
        update = [a for a in result.plan.actions[0] if isinstance(a, Compute) and a.phase == "opt"]
        assert [a.num_params for a in update] == [LAYERS * PARAMS / d]
        assert result.plan.actions[0][-1] is update[0]  # no allgather after the update


def test_zero2_reduce_scatters_every_microbatch_and_gathers_after_the_update():
    one, two = run(1, micro=2), run(2, micro=2)
    assert [c.op for c in collectives(one)] == ["reduce_scatter", "allgather"]  # one 8 MB bucket
    assert [c.op for c in collectives(two)] == ["reduce_scatter", "reduce_scatter", "allgather"]
    assert collectives(two)[-1].size_bytes == LAYERS * PARAMS * ELEMENT / 4


def test_zero1_allreduce_moves_an_allreduce_and_an_allgather_and_holds_zero1_memory():
    """`zero1_gradient_reduce: allreduce` (DeepSpeed's BF16_Optimizer): the replicas allreduce the
    gradients, 2 (d-1)/d Psi a device, then allgather the updated shards, (d-1)/d Psi (ring volumes);
    ZeRO-1's reduce-scatter moves half the allreduce's bytes, and the memory is ZeRO-1's."""
    d, psi = 4, LAYERS * PARAMS * ELEMENT
    zero1, allreduce = run(1), run(1, zero1_gradient_reduce="allreduce")
    assert [c.op for c in collectives(allreduce)] == ["allreduce", "allgather"]
    assert sum(zero1.summary["bytes_per_tier"].values()) == pytest.approx(d * 2 * (d - 1) / d * psi)
    assert sum(allreduce.summary["bytes_per_tier"].values()) == pytest.approx(d * 3 * (d - 1) / d * psi)
    assert allreduce.step_time_s > zero1.step_time_s
    assert allreduce.summary["memory"]["peak_memory_bytes"] == zero1.summary["memory"]["peak_memory_bytes"]
    assert [c.op for c in collectives(run(0, zero1_gradient_reduce="allreduce"))] == ["allreduce"]  # no shards


def test_shard_grad_op_gathers_before_each_forward_only_and_nothing_after_the_update():
    """FSDP SHARD_GRAD_OP: each unit gathered before its forward (every micro-batch: resharded after
    its backward), kept through the backward, reduce-scattered after it; no gather after the update."""
    d = 4
    for micro in (1, 2):
        result = run(2, micro=micro, fsdp_sharding="shard_grad_op")
        ops = collectives(result)
        assert [c.op for c in ops] == micro * (["allgather"] * LAYERS + ["reduce_scatter"] * LAYERS)
        assert {c.size_bytes for c in ops if c.op == "allgather"} == {PARAMS * ELEMENT / d}
        assert {c.size_bytes for c in ops if c.op == "reduce_scatter"} == {PARAMS * ELEMENT}
        assert all(f" {FORWARD}" in c.label for c in ops if c.op == "allgather")  # none before a backward
        assert isinstance(result.plan.actions[0][-1], Compute)  # the update is the last action


def test_shard_grad_op_moves_ddp_bytes_at_other_times_than_zero2():
    """SHARD_GRAD_OP and ZeRO-2 both move 2 (d-1)/d Psi a device a step; ZeRO-2's allgather waits
    for the update, SHARD_GRAD_OP's gathers are prefetched beside the forward: shorter on slow links."""
    d, psi = 4, LAYERS * PARAMS * ELEMENT
    zero2 = run(2, bandwidth=1e8)
    grad_op = run(2, bandwidth=1e8, fsdp_sharding="shard_grad_op")
    for result in (zero2, grad_op):
        assert sum(result.summary["bytes_per_tier"].values()) == pytest.approx(d * 2 * (d - 1) / d * psi)
    assert grad_op.step_time_s < zero2.step_time_s


def test_zero3_moves_one_and_a_half_times_ddp_bytes():
    """Per device per step, ring volume: DDP 2 (d-1)/d Psi, ZeRO-3 3 (d-1)/d Psi (ZeRO sec. 7.2.2)."""
    d, psi = 4, LAYERS * PARAMS * ELEMENT
    ddp, zero3 = run(0).summary, run(3).summary
    assert sum(ddp["bytes_per_tier"].values()) == pytest.approx(d * 2 * (d - 1) / d * psi)
    assert sum(zero3["bytes_per_tier"].values()) == pytest.approx(d * 3 * (d - 1) / d * psi)


def test_zero3_prefetch_hides_all_but_the_first_gathers_and_the_last_reduce_scatter():
    """Each gather and reduce-scatter here is shorter than a layer's compute: with forward prefetch
    and BACKWARD_PRE only the first forward gather, the first backward gather and the last
    reduce-scatter are exposed, each (d-1) ring steps of alpha + (Psi_unit / d) / beta."""
    d = 4
    result = run(3)
    spans = result.spans
    compute = spans[(spans["rank"] == 0) & (spans["stream"] == "compute")]
    step = (d - 1) * (LATENCY + PARAMS * ELEMENT / d / BANDWIDTH)
    assert result.summary["step_time_s"] == pytest.approx((compute["end_s"] - compute["start_s"]).sum() + 3 * step)


def test_zero3_is_close_to_ddp_on_fast_links_and_longer_on_slow_ones():
    def times(bandwidth):
        ddp = run(0, bandwidth=bandwidth, bucket_size_bytes=1).summary["step_time_s"]  # a bucket per layer
        return ddp, run(3, bandwidth=bandwidth).summary["step_time_s"]
    ddp, zero3 = times(100e9)
    assert zero3 == pytest.approx(ddp, rel=1e-4)
    ddp, zero3 = times(1e6)
    assert zero3 > 1.25 * ddp
    # comm-bound: at least the comm stream, 3 collectives of (d-1) steps per unit
    assert zero3 >= LAYERS * 3 * 3 * PARAMS * ELEMENT / 4 / 1e6


def test_fsdp_with_tensor_parallelism_gathers_the_tp_shard():
    result = simulate(load_scenario(raw(3, dp=8, tp_degree=2)))
    gathers = [c for c in collectives(result) if c.op == "allgather"]
    tp_share = result.plan.meta["rank_workload"].layers[0].num_params
    assert tp_share < PARAMS and {c.size_bytes for c in gathers} == {tp_share * ELEMENT / 4}


def test_hybrid_shard_gathers_in_the_node_and_allreduces_shards_across_nodes():
    result = run(3, fsdp_sharding="hybrid_shard", dp=4, nodes=2, symmetry="off")  # 2 GPUs per node: s = 2
    assert result.summary["tensor"]["shard_degree"] == 2 and not result.summary["tensor"]["symmetry"]["used"]
    folded = run(3, fsdp_sharding="hybrid_shard", dp=4, nodes=2)  # one rank playing every group's (test_symmetry.py)
    assert folded.summary["tensor"]["symmetry"]["used"] and folded.step_time_s == pytest.approx(result.step_time_s)
    ops = collectives(result)
    devices = result.plan.rank_to_device
    for op in ("allgather", "reduce_scatter"):
        assert {tuple(devices[r] // 2 for r in c.ranks) for c in ops if c.op == op} == {(0, 0)}  # in node 0
    allreduces = [c for c in ops if c.op == "allreduce"]
    assert len(allreduces) == LAYERS and {c.size_bytes for c in allreduces} == {PARAMS * ELEMENT / 2}
    assert {tuple(devices[r] // 2 for r in c.ranks) for c in allreduces} == {(0, 1)}  # across the nodes
    row = result.summary["devices"][0]["memory_breakdown_bytes"]
    assert row["weights"] == pytest.approx(LAYERS * PARAMS * ELEMENT / 2)


# ----------------------------------------------------------------------------- search

def test_search_space_has_zero_2_and_3_only_without_pipelines():
    scenario = load_scenario(raw())
    workload = _workload(scenario.model.model_dump_json(), ".")
    space = megatron_space(scenario, workload, (1, 2))
    assert {c.zero_stage for c in space} == {0, 1, 2, 3}
    assert all(c.workers_per_group == 1 and c.data_parallel > 1 for c in space if c.zero_stage >= 2)
    model = BoundModel(scenario, workload, build_topology(scenario.cluster), analytic_costs(scenario, workload))
    for candidate in (c for c in space if c.zero_stage >= 2):
        concrete = scenario_from_dict(candidate_scenario(scenario, candidate))
        summary = simulate(concrete, workload=workload).summary
        assert model.bound(candidate).step_s <= summary["step_time_s"], candidate.label
        peak = summary["memory"]["peak_memory_bytes"]
        assert exact_peak_memory_bytes(concrete, workload) == pytest.approx(peak, rel=1e-12), candidate.label
        assert model.memory_floor_bytes(candidate) <= peak * (1 + 1e-12), candidate.label


def test_rank_searches_the_zero_stages():
    """Room for ZeRO-3's replica-4 layout (60 MB) but not ZeRO-1's (66 MB): the search ranks ZeRO-3
    first (its per-layer reduce-scatters overlap the backward) and no other d = 4 layout fits."""
    base = raw()
    base["cluster"]["gpu"]["memory_bytes"] = 63e6
    ranking = search_layouts(load_scenario(base), kinds=("megatron",), microbatch_sizes=(2,), top=1, workers=1,
                             show_progress=False)
    best = ranking.rows[0]
    assert best["fits_in_memory"] and best["label"] == "megatron (t=1 x p=1 x d=4) m=1 recompute=none zero3"
    assert ranking.rows[0]["step_time_s"] == pytest.approx(run(3).summary["step_time_s"])
    exhaustive = search_layouts(load_scenario(base), kinds=("megatron",), microbatch_sizes=(2,), workers=1,
                                exhaustive=True, show_progress=False)
    fitting = {row["label"] for row in exhaustive.rows if row["fits_in_memory"] and "d=4" in row["label"]}
    assert fitting and all(" zero3" in label for label in fitting)


def test_symmetric_zero3_equals_the_full_simulation():
    options = {"dp": 8, "nodes": 2, "micro": 2, "batch": 16, "tp_degree": 2, "sequence_parallel": True}
    folded, full = run(3, **options), run(3, symmetry="off", **options)
    assert folded.summary["tensor"]["symmetry"]["used"] and not full.summary["tensor"]["symmetry"]["used"]
    assert folded.summary["step_time_s"] == pytest.approx(full.summary["step_time_s"], rel=1e-12)
    assert folded.summary["memory"]["peak_memory_bytes"] == pytest.approx(full.summary["memory"]["peak_memory_bytes"])


def test_fsdp_reduce_dtype_doubles_the_reduce_scatter_and_keeps_fp32_gradient_shards():
    base = load_scenario(FSDP_SCENARIO, ["cluster.num_nodes=2", "model.params.num_layers=4"])
    fp32 = load_scenario(FSDP_SCENARIO, ["cluster.num_nodes=2", "model.params.num_layers=4",
                                         "strategy.fsdp_reduce_dtype=fp32"])
    plain, wide = simulate(base), simulate(fp32)

    def sizes(result, op):
        return [a.size_bytes for a in result.plan.actions[0] if isinstance(a, Collective) and a.op == op]

    assert sizes(wide, "reduce_scatter") == [2 * size for size in sizes(plain, "reduce_scatter")]
    assert sizes(wide, "allgather") == sizes(plain, "allgather")
    gradients = [row["memory_breakdown_bytes"]["weight_gradients"] for row in (plain.summary["devices"][0],
                                                                              wide.summary["devices"][0])]
    assert gradients[1] == pytest.approx(2 * gradients[0])


def test_fsdp_reduce_dtype_needs_sharded_gradients():
    """One line naming the field, through the CLI's path: a ScenarioError (exit 2), not a traceback."""
    with pytest.raises(ScenarioError, match=r"strategy.fsdp_reduce_dtype: fp32 applies to sharded gradients .* zero_stage 1"):
        load_scenario(FSDP_SCENARIO, ["strategy.fsdp_sharding=null", "strategy.zero_stage=1",
                                      "strategy.fsdp_reduce_dtype=fp32"])


# ----------------------------------------------------------------------------- FSDP2's copies

def copy_passes(result, rank=0) -> list[Compute]:
    return [a for a in result.plan.actions[rank] if isinstance(a, Compute) and a.phase.startswith("fsdp_copy")]


def test_fsdp2_copies_each_gathered_unit_out_and_each_gradient_in_on_the_compute_stream():
    """FSDP2 (torch `_fsdp_collectives.py`): the gathered unit is copied into its parameters after its
    allgather and before it computes; its gradients into the reduce-scatter buffer after its backward
    and before the reduce-scatter. Each pass moves 2 words a parameter at memory bandwidth."""
    micro = 2
    fsdp2, flat = run(3, micro=micro, fsdp_sharding="full_shard"), run(3, micro=micro)
    assert fsdp2.summary["tensor"]["fsdp_version"] == 2 and flat.summary["tensor"]["fsdp_version"] == 1
    assert copy_passes(flat) == []
    actions = fsdp2.plan.actions[0]
    outs = [a for a in copy_passes(fsdp2) if a.phase == "fsdp_copy_out"]
    ins = [a for a in copy_passes(fsdp2) if a.phase == "fsdp_copy_in"]
    assert len(outs) == 2 * LAYERS * micro and len(ins) == LAYERS * micro
    assert {a.num_params for a in outs + ins} == {PARAMS}  # the whole unit, not the shard
    for copy in outs:  # after its unit's gather, and the unit's pass waits for it
        assert any(isinstance(actions[dep], Collective) and actions[dep].op == "allgather" for dep in copy.deps)
        assert any(copy.id in a.deps for a in actions if isinstance(a, Compute) and a.phase in (FORWARD, "B"))
    for copy in ins:  # before its unit's reduce-scatter
        assert any(isinstance(a, Collective) and a.op == "reduce_scatter" and copy.id in a.deps for a in actions)
    spans = fsdp2.spans
    copies = spans[(spans["rank"] == 0) & spans["name"].str.startswith("fsdp_copy")]
    assert len(copies) == 3 * LAYERS * micro
    assert list(copies["end_s"] - copies["start_s"]) == pytest.approx([2 * PARAMS * ELEMENT / 1e12] * len(copies),
                                                                      rel=1e-6)  # at the memory bandwidth, 1e12
    assert fsdp2.summary["step_time_s"] > flat.summary["step_time_s"]
    assert run(3, micro=micro, fsdp_sharding="full_shard", fsdp_version=1).summary["step_time_s"] == \
        pytest.approx(flat.summary["step_time_s"], rel=1e-12)


def test_fsdp2_copy_in_casts_to_the_reduce_dtype():
    """16-bit gradients copied into an fp32 reduce-scatter buffer: read 1 word, write 2 (3 words,
    1.5x the plain copy); shard_grad_op copies out before the forward only."""
    costs = analytic_costs(load_scenario(raw(3)), None)
    plain, upcast = (costs.weight_pass_s(name, PARAMS) for name in ("fsdp_copy_in", "fsdp_copy_in_upcast"))
    assert upcast == pytest.approx(1.5 * plain)
    wide = run(3, fsdp_sharding="full_shard", fsdp_reduce_dtype="fp32")
    assert {a.phase for a in copy_passes(wide)} == {"fsdp_copy_out", "fsdp_copy_in_upcast"}
    grad_op = run(2, fsdp_sharding="shard_grad_op")
    assert [a.phase for a in copy_passes(grad_op)].count("fsdp_copy_out") == LAYERS


def test_fsdp_version_needs_per_unit_gathers_and_the_planner_drops_it():
    with pytest.raises(ScenarioError, match=r"strategy.fsdp_version: 2 applies to parameters gathered per unit .* "
                                            r"zero_stage 2"):
        load_scenario(raw(2, fsdp_version=2))
    scenario = load_scenario(raw(3, fsdp_version=2))
    workload = _workload(scenario.model.model_dump_json(), ".")
    for candidate in megatron_space(scenario, workload, (1, 2)):  # every stage's candidate is a valid scenario
        strategy = scenario_from_dict(candidate_scenario(scenario, candidate)).strategy
        assert strategy.fsdp_version == (2 if candidate.zero_stage == 3 else None), candidate.label


def test_rank_moves_an_fsdp_scenario_to_another_gpu_count():
    """`rank --gpus N` drops the scenario's own layout for N != its GPUs; a sharded scenario's base
    stays megatron (ZeRO-2/3 are megatron's) with its FSDP keys, which its candidates inherit."""
    from simulator.planner import scenario_for_gpus
    moved = scenario_for_gpus(load_scenario(FSDP_SCENARIO), 32)
    assert moved.num_gpus == 32 and moved.strategy.kind == "megatron"
    assert (moved.strategy.zero_stage, moved.strategy.fsdp_sharding, moved.strategy.tp_degree) == (3, "full_shard", 1)


def test_fsdp_sharding_is_named_where_it_set_the_stage_a_layout_cannot_take():
    from ghpsim.cli import main as cli
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli(["simulate", "scenarios/llama3_70b_fsdp_h100.yaml", "--set", "strategy.cp_degree=2"]) == 2
    assert "strategy.fsdp_sharding: full_shard (ZeRO-3) with cp_degree 2 is not modelled" in err.getvalue()
