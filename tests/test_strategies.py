"""Strategy plans through the whole pipeline: the GHP corners, free-link MP, partitions, placements."""

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from simulator import load_scenario, simulate
from simulator.costs import BACKWARD, FORWARD
from simulator.partition import balanced_partition, flushed_partition, serial_partition
from simulator.stage_costs import StageUpdate
from simulator.placement import place_ranks
from simulator.simulate import analytic_costs
from simulator.strategies.ghp import bucket_segments
from tests.helpers import toy_workload

ROOT = Path(__file__).resolve().parent.parent
FREE_LINK = {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}


def scenario(kind="dp", groups=None, nodes=2, gpus_per_node=2, model="resnet20", batch=64, **strategy):
    return load_scenario({
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus_per_node, "gpu": "V100",
                    "intra_node_link": strategy.pop("intra", "nvlink2-v100"),
                    "inter_node_link": strategy.pop("inter", "ib-edr")},
        "model": {"name": model},
        "strategy": {"kind": kind, "num_groups": groups, **strategy},
        "training": {"global_batch_size": batch, "optimizer": "momentum"},
    })


def test_ghp_with_one_group_equals_model_parallelism():
    assert simulate(scenario("ghp", 1)).step_time_s == pytest.approx(simulate(scenario("mp")).step_time_s, rel=1e-12)


def test_ghp_with_one_worker_per_group_equals_data_parallelism():
    assert simulate(scenario("ghp", 4)).step_time_s == pytest.approx(simulate(scenario("dp")).step_time_s, rel=1e-12)


def test_model_parallel_with_free_links_is_the_sum_of_layer_times_at_the_full_batch():
    mp = scenario("mp", intra=FREE_LINK, inter=FREE_LINK)  # on the device alone: the host's lead is carried
    mp = mp.model_copy(update={"costs": mp.costs.model_copy(update={"host_overhead_s": 0.0})})
    result = simulate(mp)
    costs = analytic_costs(mp, result.workload)
    layers_s = sum(costs.compute_s(i, FORWARD, 64) + costs.compute_s(i, BACKWARD, 64)
                   for i in range(result.workload.num_layers))
    first_stage = result.plan.stages[0]
    assert result.step_time_s == pytest.approx(layers_s + costs.optimizer_s(first_stage.num_params), rel=1e-7)


def test_data_parallel_has_no_idle_compute_gaps_before_the_last_bucket():
    result = simulate(scenario("dp", nodes=1, gpus_per_node=4))
    devices = result.summary["devices"]
    for row in devices:
        assert row["compute_s"] + row["comm_s"] + row["idle_s"] == pytest.approx(result.step_time_s, rel=1e-9)
    counts = result.summary["collective_algorithms"]
    assert {label.split("/")[0] for label in counts} == {"ring"}  # "ring/<NCCL protocol>"
    assert sum(counts.values()) == len(result.plan.actions[0]) - 3


def test_slow_network_makes_the_allreduce_hierarchical_and_slower():
    fast = simulate(scenario("dp", inter="ib-hdr"))
    slow = simulate(scenario("dp", inter="10gbe"))
    assert {label.split("/")[0] for label in fast.summary["collective_algorithms"]} == {"hierarchical"}
    assert slow.step_time_s > fast.step_time_s
    assert slow.summary["bytes_per_tier"]["inter"] == pytest.approx(fast.summary["bytes_per_tier"]["inter"])


def test_parameter_server_moves_as_many_bytes_as_a_ring_but_is_slower_at_its_hot_spot():
    # Both move 2 (p - 1) S in total; the server's link carries p - 1 of them at once.
    allreduce = simulate(scenario("dp", nodes=4, gpus_per_node=1, model="resnet56"))
    server = simulate(scenario("dp", nodes=4, gpus_per_node=1, model="resnet56", dp_sync="parameter_server"))
    assert set(server.summary["collective_algorithms"]) == {"parameter_server"}
    assert server.summary["bytes_per_tier"]["inter"] == pytest.approx(allreduce.summary["bytes_per_tier"]["inter"])
    assert server.step_time_s > allreduce.step_time_s


def _send_bytes(result):
    return result.spans.loc[result.spans["stream"] == "send", "size_bytes"].sum()


def test_stage_per_node_keeps_gradients_inside_nodes_and_sends_activations_across():
    # 2 nodes x 2 GPUs, G = 2, M = 2: stage_per_node puts a stage's peers on one node. Every rank
    # simulated: the send spans of both replicas are summed
    result = simulate(scenario("ghp", 2, placement="stage_per_node", symmetry="off"))
    assert result.plan.rank_to_device == (0, 2, 1, 3)
    assert result.summary["bytes_per_tier"]["inter"] == pytest.approx(_send_bytes(result))
    transposed = simulate(scenario("ghp", 2, placement="group_per_node", symmetry="off"))
    allreduce_inter = transposed.summary["bytes_per_tier"]["inter"]
    assert 0 < allreduce_inter < transposed.summary["bytes_per_tier"]["intra"] + allreduce_inter
    assert transposed.summary["bytes_per_tier"]["intra"] == pytest.approx(_send_bytes(transposed))


def test_place_ranks_layouts():
    assert place_ranks("group_per_node", 2, 3, 3) == (0, 1, 2, 3, 4, 5)
    assert place_ranks("stage_per_node", 2, 3, 2) == (0, 2, 4, 1, 3, 5)
    assert place_ranks((5, 4, 3, 2, 1, 0), 2, 3, 3) == (5, 4, 3, 2, 1, 0)


def _stage_cost(compute, forward, backward, num_stages, stage, start, end, update=None):
    """A stage's cost over layers [start, end), written out plainly (`simulator.partition`)."""
    cost = compute[start:end].sum()
    cost += forward[stage, end - 1] if stage < num_stages - 1 else 0.0
    cost += backward[stage, start] if stage > 0 else 0.0
    if update is not None:
        allreduce = update.per_byte_s[stage] * update.gradient_bytes[start:end].sum() + update.constant_s[stage]
        exposed = max(allreduce - update.backward_s[start:end].sum(), 0.0) if update.overlapped else allreduce
        cost += update.share * (exposed + update.optimizer_s[start:end].sum())
    return cost


def _brute_force(compute, forward, backward, num_stages, update=None):
    num_layers = len(compute)
    best = np.inf
    for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
        bounds = (0, *cuts, num_layers)
        best = min(best, max(_stage_cost(compute, forward, backward, num_stages, stage, start, end, update)
                             for stage, (start, end) in enumerate(zip(bounds, bounds[1:]))))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_balanced_partition_is_optimal_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    num_layers, num_stages = 9, 3
    compute = rng.uniform(0.1, 2.0, num_layers)
    forward = rng.uniform(0.0, 0.5, (num_stages, num_layers))
    backward = rng.uniform(0.0, 0.5, (num_stages, num_layers))
    ranges = balanced_partition(compute, forward, backward, num_stages)
    assert ranges[0][0] == 0 and ranges[-1][1] == num_layers
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    worst = max(compute[a:b].sum() + (forward[m, b - 1] if m < num_stages - 1 else 0)
                + (backward[m, a] if m > 0 else 0) for m, (a, b) in enumerate(ranges))
    assert worst == pytest.approx(_brute_force(compute, forward, backward, num_stages))


def _random_stages(rng, num_layers: int, num_stages: int, max_gradient_bytes: float, share: float, overlapped: bool):
    """Random per-layer compute and boundary sends, and each stage's allreduce and optimizer step."""
    compute = rng.uniform(0.1, 2.0, num_layers)
    forward = rng.uniform(0.0, 0.5, (num_stages, num_layers))
    backward = rng.uniform(0.0, 0.5, (num_stages, num_layers))
    update = StageUpdate(per_byte_s=rng.uniform(1e-9, 4e-9, num_stages), constant_s=rng.uniform(0.0, 0.2, num_stages),
                         gradient_bytes=rng.uniform(0.0, max_gradient_bytes, num_layers), backward_s=compute * 2 / 3,
                         optimizer_s=rng.uniform(0.0, 0.3, num_layers), share=share, overlapped=overlapped)
    return compute, forward, backward, update


@pytest.mark.parametrize("seed, overlapped", [(seed, seed % 2 == 0) for seed in range(6)])
def test_balanced_partition_with_each_stage_update_is_optimal_against_brute_force(seed, overlapped):
    """Each stage's allreduce (affine in its gradient bytes, partly hidden by its backward) and
    optimizer step count in its cost: the DP's slowest stage is the brute force's."""
    rng, num_layers, num_stages = np.random.default_rng(seed), 9, 3
    compute, forward, backward, update = _random_stages(rng, num_layers, num_stages, 1e9, 0.5, overlapped)
    ranges = balanced_partition(compute, forward, backward, num_stages, update)
    assert [a for a, _ in ranges[1:]] == [b for _, b in ranges[:-1]] and ranges[-1][1] == num_layers
    worst = max(_stage_cost(compute, forward, backward, num_stages, m, a, b, update) for m, (a, b) in enumerate(ranges))
    assert worst == pytest.approx(_brute_force(compute, forward, backward, num_stages, update))
    assert worst > _brute_force(compute, forward, backward, num_stages)  # the update costs something


def _serial_step(compute, forward, backward, update, bounds):
    """The serial objective written out: every stage's cost, plus the longest tail of allreduce and
    optimizer step left after the backward pass (layers before a stage still run their backward)."""
    num_stages, total, tails = len(bounds) - 1, 0.0, []
    for stage, (start, end) in enumerate(zip(bounds, bounds[1:])):
        total += _stage_cost(compute, forward, backward, num_stages, stage, start, end)
        allreduce = update.per_byte_s[stage] * update.gradient_bytes[start:end].sum() + update.constant_s[stage]
        exposed = max(allreduce - update.backward_s[start:end].sum(), 0.0) if update.overlapped else allreduce
        tails.append(max(exposed + update.optimizer_s[start:end].sum() - update.backward_s[:start].sum(), 0.0))
    return total + max(tails)


@pytest.mark.parametrize("seed", range(6))
def test_serial_partition_minimises_the_sum_and_the_longest_tail_within_the_memory_cap(seed):
    rng, num_layers, num_stages = np.random.default_rng(seed), 9, 3
    compute, forward, backward, update = _random_stages(rng, num_layers, num_stages, 2e9, 1.0, seed % 2 == 0)
    layer_bytes = rng.uniform(1.0, 3.0, num_layers)
    cap = float(np.quantile(layer_bytes, 0.5) * 4)
    ranges = serial_partition(compute, forward, backward, num_stages, update, layer_bytes, cap)
    bounds = [a for a, _ in ranges] + [num_layers]
    fitting = [(0, *cuts, num_layers) for cuts in itertools.combinations(range(1, num_layers), num_stages - 1)
               if all(layer_bytes[a:b].sum() <= cap for a, b in zip((0, *cuts), (*cuts, num_layers)))]
    assert max(layer_bytes[a:b].sum() for a, b in ranges) <= cap
    assert _serial_step(compute, forward, backward, update, bounds) == pytest.approx(
        min(_serial_step(compute, forward, backward, update, b) for b in fitting))
    assert serial_partition(compute, forward, backward, num_stages, update, layer_bytes, 0.5) is None  # nothing fits


@pytest.mark.parametrize("seed, num_microbatches, num_virtual_stages", [(0, 1, 1), (1, 2, 1), (2, 4, 1), (3, 8, 1),
                                                                      (4, 32, 1), (5, 4, 2)])
def test_flushed_partition_minimises_the_fill_plus_the_paced_micro_batches(seed, num_microbatches, num_virtual_stages):
    """A flushed pipeline's step, sum_k c_k / v + max((m v - 1) max_k p_k, (m - 1 / v) max_d L_d)
    (p_k: without the update's share; L_d: the v chunks device d holds), at its brute-force minimum
    for v = 1: few micro-batches weigh every chunk (the fill), many the slowest one; for v = 2 no
    worse than the chunk-balanced split."""
    rng, num_layers = np.random.default_rng(seed), 9
    num_chunks = 4 if num_virtual_stages > 1 else 3
    compute, forward, backward, update = _random_stages(rng, num_layers, num_chunks, 1e9, 1 / num_microbatches,
                                                        seed % 2 == 0)
    forward *= 8  # transfers that matter: a cut at a large activation costs more than the compute it evens

    def step(bounds):
        costs = [_stage_cost(compute, forward, backward, num_chunks, k, a, b, update)
                 for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        plain = [_stage_cost(compute, forward, backward, num_chunks, k, a, b)
                 for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        num_devices = num_chunks // num_virtual_stages
        busiest = max(sum(costs[device::num_devices]) for device in range(num_devices))
        return sum(costs) / num_virtual_stages + max((num_microbatches * num_virtual_stages - 1) * max(plain),
                                                     (num_microbatches - 1 / num_virtual_stages) * busiest)

    ranges = flushed_partition(compute, forward, backward, num_chunks, update, num_microbatches, num_virtual_stages)
    assert [a for a, _ in ranges[1:]] == [b for _, b in ranges[:-1]] and ranges[-1][1] == num_layers
    chosen = step([a for a, _ in ranges] + [num_layers])
    best = min(step((0, *cuts, num_layers)) for cuts in itertools.combinations(range(1, num_layers), num_chunks - 1))
    if num_virtual_stages == 1:  # exact
        assert chosen == pytest.approx(best)
    else:  # the best chain under a bound on one chunk: never worse than evening the chunks
        evened = balanced_partition(compute, forward, backward, num_chunks, update)
        assert best <= chosen <= step([a for a, _ in evened] + [num_layers]) * (1 + 1e-12)


def test_one_micro_batch_over_identical_layers_gets_the_even_split():
    """With one micro-batch every split's sum is the same up to rounding; the least-max chain must
    win the tie (its largest stage holds, reduces and updates the fewest parameters), not whichever
    tied chain the sum's dynamic programme lands on."""
    num_layers, num_chunks = 72, 12
    compute = np.full((num_chunks, num_layers), 0.0699 + 1e-17 * np.arange(num_layers))
    zeros = np.zeros((num_chunks, num_layers))
    ranges = flushed_partition(compute, zeros + 1e-3, zeros + 1e-3, num_chunks, None, 1)
    assert max(b - a for a, b in ranges) == 6
    # the BLOOM-176B layout at one micro-batch (global batch 16): about the even split, not 48 layers
    # on one stage, which needed 221 GiB on an 80 GB GPU; the first stage, whose backward ends last
    # and whose gradient allreduce is left with nothing to hide behind, keeps fewer layers
    overrides = ["training.global_batch_size=16", "strategy.num_microbatches=1"]
    path = ROOT / "scenarios" / "bloom_176b_jean_zay.yaml"
    result = simulate(load_scenario(path, [*overrides, "strategy.partition=balanced"]))
    even = simulate(load_scenario(path, [*overrides, "strategy.partition=uniform"]))
    split = result.summary["partition"]
    assert max(split) <= 8 and split[0] < split[-1] and result.summary["memory"]["fits_in_memory"]
    assert result.step_time_s < even.step_time_s


def test_one_micro_batch_takes_the_split_its_schedule_plays_fastest():
    """With one micro-batch the closed form sees only the sum of the stages' costs, which counts
    each replica allreduce as if paid one after another; the schedule's play ranks the splits.
    VGG16 GPipe, 8 replicas of 2 stages over HDR InfiniBand: the best of all 15 splits (the sum
    alone chose [15, 1], 17 % slower)."""
    demo = ROOT / "scenarios" / "demo.yaml"
    base = ["strategy.kind=gpipe", "strategy.num_groups=8", "strategy.num_microbatches=1",
            "training.global_batch_size=64", "cluster.inter_node_link=ib-hdr", "strategy.placement=stage_per_node"]
    chosen = simulate(load_scenario(demo, base))
    num_layers = sum(chosen.summary["partition"])
    every = [simulate(load_scenario(demo, [*base, f"strategy.partition=[{first}, {num_layers - first}]"])).step_time_s
             for first in range(1, num_layers)]
    assert chosen.step_time_s <= min(every) * (1 + 1e-9)


def test_the_balanced_split_never_plays_slower_than_the_uniform_one():
    # BERT-large GPipe, 8 stages, 32 micro-batches: the closed form's candidates all missed the
    # uniform split, which the schedule plays 3.5 % faster
    bert = ROOT / "scenarios" / "bert_large_ghp.yaml"
    base = ["strategy.kind=gpipe", "strategy.num_groups=1", "strategy.num_microbatches=32",
            "training.global_batch_size=128", "strategy.placement=group_per_node"]
    balanced = simulate(load_scenario(bert, base))
    uniform = simulate(load_scenario(bert, [*base, "strategy.partition=uniform"]))
    assert balanced.step_time_s <= uniform.step_time_s * (1 + 1e-9)


def test_a_faster_link_never_slows_a_pipeline_through_its_partition():
    # VGG16 1F1B, 4 replicas of 4 stages, one micro-batch: every cut's activations cross the link
    # between nodes once per step, so the split that keeps them small (after the convolutions)
    # stays best as the link gets faster; balancing compute alone cut through the early feature
    # maps at 25 and 100 GbE and took 2.3x and 1.7x as long.
    demo = ROOT / "scenarios" / "demo.yaml"
    steps = [simulate(load_scenario(demo, ["strategy.kind=1f1b", "strategy.num_groups=4",
                                           f"cluster.inter_node_link={link}"])) for link in ("10gbe", "25gbe", "100gbe")]
    assert all(result.summary["partition"] == [13, 1, 1, 1] for result in steps)
    assert all(faster.step_time_s <= slower.step_time_s for slower, faster in zip(steps, steps[1:]))


def test_a_faster_link_never_slows_an_interleaved_pipeline_through_its_partition():
    # VGG16 interleaved 1F1B, 4 replicas of 4 devices x 2 chunks, 8 micro-batches: weighing chunks
    # alone (and the update as if it paced a chunk m v times) put two heavy chunks on device 1 at
    # 100 GB/s ([4, 6, 1, 1, 1, 1, 1, 1], 95 ms against 74 ms at 50 GB/s)
    demo = ROOT / "scenarios" / "demo.yaml"
    steps = [simulate(load_scenario(demo, ["strategy.kind=interleaved_1f1b", "strategy.num_groups=4",
                                           "strategy.num_microbatches=8", "strategy.num_virtual_stages=2",
                                           f"cluster.inter_node_link={link}"]))
             for link in ("100gbe", "ib-hdr", "ib-ndr", "ib-xdr")]
    assert all(faster.step_time_s <= slower.step_time_s for slower, faster in zip(steps, steps[1:]))
    assert steps[-1].summary["partition"] != [4, 6, 1, 1, 1, 1, 1, 1]


def test_ghp_stages_are_cut_where_the_serial_step_is_shortest():
    # VGG16 ghp 4 x 4 over 10 GbE, each stage's 4 peers on one node: activations cross 10 GbE at
    # every cut. A compute-balanced split ([4, 3, 1, 8]) cuts through the large early feature maps
    # and takes 490 ms; the serial partition cuts after the convolutions.
    demo = ROOT / "scenarios" / "demo.yaml"
    chosen = simulate(load_scenario(demo, ["strategy.num_groups=4"]))
    assert chosen.summary["partition"] == [13, 1, 1, 1]
    balanced = simulate(load_scenario(demo, ["strategy.num_groups=4", "strategy.partition=[4,3,1,8]"]))
    assert chosen.step_time_s < balanced.step_time_s / 4


def test_a_faster_link_never_slows_the_ghp_step_through_its_partition():
    # VGG16 ghp 4 x 4 at batch 256: the serial partition may fill a device (its memory, not the
    # balanced split's largest stage, caps a stage), so the cut after the convolutions stays open
    # as the link between the stages' nodes gets faster.
    demo = ROOT / "scenarios" / "demo.yaml"
    steps = [simulate(load_scenario(demo, ["strategy.num_groups=4", "training.global_batch_size=256",
                                           f"cluster.inter_node_link={link}"]))
             for link in ("10gbe", "25gbe", "100gbe", "ib-hdr")]
    assert all(result.summary["partition"] == [13, 1, 1, 1] for result in steps)
    assert all(faster.step_time_s <= slower.step_time_s for slower, faster in zip(steps, steps[1:]))
    assert all(result.summary["devices"][0]["fits_in_memory"] for result in steps)


def test_bucket_segments_close_buckets_in_backward_order():
    workload = toy_workload(6, num_params=1_000_000)  # 4 MB of fp32 gradients per layer
    segments = bucket_segments(workload, 0, 6, 4, bucket_size_bytes=8e6)
    assert segments == [(4, 6, 8e6), (2, 4, 8e6), (0, 2, 8e6)]
    assert bucket_segments(workload, 0, 6, 4, float("inf")) == [(0, 6, 24e6)]


def test_simulation_is_deterministic():
    first = simulate(scenario("ghp", 2, model="resnet56"))
    second = simulate(scenario("ghp", 2, model="resnet56"))
    assert first.spans.equals(second.spans)


def test_actions_built_in_one_step_equal_their_class_built_ones():
    """`_ActionList.add` fills a frozen action's fields at once; a call its class would refuse
    (a missing field, an unknown one, or both at once) is still refused by the class."""
    from simulator.plan import Collective, Compute, Send
    from simulator.strategies.ghp import _ActionList
    builder = _ActionList()
    builder.add(Compute, phase="F", layer_start=0, layer_end=2, batch=4.0, microbatch=1, deps=(0,))
    builder.add(Send, dst=3, size_bytes=8.0, key=("act", 0), deps=(0,))
    builder.add(Collective, op="allreduce", ranks=(0, 1), size_bytes=16.0, key=("dp", 0), label="b0")
    assert builder.actions == [
        Compute(id=0, phase="F", layer_start=0, layer_end=2, batch=4.0, microbatch=1, deps=(0,)),
        Send(id=1, dst=3, size_bytes=8.0, key=("act", 0), deps=(0,)),
        Collective(id=2, op="allreduce", ranks=(0, 1), size_bytes=16.0, key=("dp", 0), label="b0")]
    assert builder.actions[0].label == "F1 L0-1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        builder.actions[0].batch = 2.0
    for fields in ({"phase": "F", "layer_start": 0, "layer_end": 1},                       # batch missing
                   {"phase": "F", "layer_start": 0, "layer_end": 1, "batch": 1.0, "size": 1},  # unknown
                   {"phase": "F", "layer_start": 0, "layer_end": 1, "batches": 1.0}):         # both
        with pytest.raises(TypeError):
            builder.add(Compute, **fields)


def test_the_serial_partition_declines_where_its_matrices_pass_the_memory_limit(monkeypatch):
    import simulator.partition as partition
    num_layers, num_stages = 40, 4
    update = StageUpdate(np.zeros(num_stages), np.zeros(num_stages), np.ones(num_layers), np.ones(num_layers),
                         np.zeros(num_layers), 1.0, True)
    args = (np.ones(num_layers), np.zeros((num_stages, num_layers)), np.zeros((num_stages, num_layers)), num_stages, update)
    assert serial_partition(*args) is not None
    monkeypatch.setattr(partition, "SERIAL_MEMORY_LIMIT_BYTES", 2 * num_stages * num_layers**2 * 8 - 1)
    assert serial_partition(*args) is None  # the caller keeps the balanced split
