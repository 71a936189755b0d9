"""simulator.memory_floor: the activations a rank's schedule holds, and the floor under the memory model."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import load_scenario
from simulator.layout_search import exact_peak_memory_bytes
from simulator.memory_buffers import usable_memory_bytes
from simulator.memory_floor import held_bytes
from simulator.planner import Candidate
from simulator.search_bounds import bound_model

LLAMA3_8B = Path(__file__).resolve().parents[1] / "scenarios" / "llama3_8b_dgx_h100.yaml"


def _interleaved(p: int, m: int, v: int) -> Candidate:
    return Candidate("megatron", 1, p, "group_per_node", m, v, 1)


def test_equal_chunks_peak_when_the_first_backward_starts():
    """Megatron's interleaved warm-up (SC'21 sec. 2.2): rank k runs 2 (p - 1 - k) + (v - 1) p + 1
    forwards before its first backward, and with chunks alike no later step holds more."""
    p, m, v = 4, 8, 2
    for k in range(p):
        assert held_bytes(_interleaved(p, m, v), k, [1.0] * (p * v)) == 2 * (p - 1 - k) + (v - 1) * p + 1


def test_a_larger_second_chunk_peaks_in_the_steady_state():
    """Rank 1 of p = 4, m = 8, v = 2 holds chunk 1 five times and chunk 5 (on the same rank) four
    times when its first backward (of chunk 5) starts. Each steady step then runs a forward of one
    chunk and frees a backward of the other, so when chunk 1 is ten times the bytes of chunk 5, its
    later forwards outgrow the warm-up."""
    p, m, v, k = 4, 8, 2, 1
    warm_up = 2 * (p - 1 - k) + (v - 1) * p + 1
    sizes = [0.0] * (p * v)
    sizes[k], sizes[p + k] = 10.0, 1.0
    first_backward = 5 * sizes[k] + (warm_up - 5) * sizes[p + k]
    assert held_bytes(_interleaved(p, m, v), k, sizes) > first_backward


LAYOUT = ["strategy.tp_degree=1", "strategy.pp_degree=8", "strategy.num_virtual_stages=2",
          "strategy.num_microbatches=32", "training.global_batch_size=32"]
"""LLaMA-3 8B, PP 8 x v 2, 32 micro-batches of one 8k sequence on one DGX H100."""
OVER = [2, 3, 2, 2, 2, 2, 2, 3, 3, 2, 2, 2, 2, 2, 2, 1]
"""The split the balanced partition chose there before it weighed memory: rank 1's chunks of 3 and
2 blocks hold more in the steady state than at its first backward."""


def test_the_floor_sees_an_interleaved_split_over_the_device():
    """The floor counted only the warm-up (83.8 GB, under the 85.9 GB the device has; the memory
    model 91.2 GB). It stays under the memory model and now says the split does not fit."""
    scenario = load_scenario(LLAMA3_8B, [*LAYOUT, f"strategy.partition={OVER}".replace(" ", "")])
    floor = bound_model(scenario).memory_floor_bytes(Candidate("megatron", 1, 8, "group_per_node", 32, 2, 1))
    assert usable_memory_bytes(scenario) < floor <= exact_peak_memory_bytes(scenario)


def test_the_balanced_split_keeps_to_splits_that_fit():
    """Over the device, the flushed partition ranks splits by (bytes over, played step): here one
    that fits and runs 23 % faster than the uniform split (the first choice needed 91.2 GB). The
    planner's geometry takes the same split, so its floor and bound describe what it simulates."""
    from simulator import simulate
    balanced = simulate(load_scenario(LLAMA3_8B, LAYOUT))
    uniform = simulate(load_scenario(LLAMA3_8B, [*LAYOUT, "strategy.partition=uniform"]))
    assert balanced.summary["fits_in_memory"] and balanced.summary["partition"] != OVER
    assert balanced.step_time_s < uniform.step_time_s * 0.8
    model = bound_model(load_scenario(LLAMA3_8B, LAYOUT))
    geometry = model.geometry(Candidate("megatron", 1, 8, "group_per_node", 32, 2, 1))
    assert [b - a for a, b in geometry.ranges] == balanced.summary["partition"]


def test_rounds_past_three_replay_the_steady_state():
    """`held_bytes` plays m = 3p in place of a longer step: the counts it keeps are the same."""
    from simulator.memory_floor import chunk_counts
    for p, v in ((2, 2), (3, 3), (4, 2), (8, 4)):
        for m in range(3 * p, 8 * p + 1, p):
            assert {k: set(c) for k, c in enumerate(chunk_counts(p, m, v))} == \
                {k: set(c) for k, c in enumerate(chunk_counts(p, 3 * p, v))}, (p, v, m)


DEMO = Path(__file__).resolve().parents[1] / "scenarios" / "demo.yaml"
VGG_GPIPE = ["strategy.kind=gpipe", "strategy.num_groups=4", "strategy.num_microbatches=4",
             "training.global_batch_size=2048"]
"""VGG16 GPipe, 4 replicas x 4 stages on 32 GB V100s, 128 images a micro-batch: the fastest splits put
the convolutions' large maps on one stage, which then cannot hold its 4 micro-batches."""


def test_the_floor_counts_the_maps_a_backward_keeps():
    """When rank 0's backward reaches its first layers it holds the other micro-batches, the input
    maps and input gradients of the layers already done (the memory model keeps them until the
    micro-batch's backward ends) and the workspace: within 0.2 % of the memory model's 34.25 GiB
    on [10, 4, 1, 1] (it counted the held micro-batches alone: 31.4 GiB, under the device)."""
    scenario = load_scenario(DEMO, [*VGG_GPIPE, "strategy.partition=[10,4,1,1]"])
    floor = bound_model(scenario).memory_floor_bytes(Candidate("gpipe", 4, 4, "group_per_node", 4))
    exact = exact_peak_memory_bytes(scenario)
    assert usable_memory_bytes(scenario) < floor <= exact < floor * 1.002


def test_a_pipeline_split_over_the_device_keeps_to_stages_that_fit():
    """One chunk a rank: each rank's ranges are masked to those it can hold, so the candidates fit.
    The first choice [13, 1, 1, 1] needed 35.0 GiB; now [7, 7, 1, 1] fits, 2.5x faster than uniform."""
    from simulator import simulate
    balanced = simulate(load_scenario(DEMO, VGG_GPIPE))
    uniform = simulate(load_scenario(DEMO, [*VGG_GPIPE, "strategy.partition=uniform"]))
    assert balanced.summary["fits_in_memory"] and uniform.summary["fits_in_memory"]
    assert balanced.step_time_s < uniform.step_time_s / 2
    assert balanced.summary["partition_note"] == (  # the summary says why
        "[7, 7, 1, 1] is the fastest split that fits; the fastest, [13, 1, 1, 1], needs at least 35.0 GiB on a "
        "rank, over the 32.0 GiB usable on a device")
    assert uniform.summary["partition_note"] is None


@pytest.mark.slow
def test_the_split_kept_under_the_device_is_the_fastest_that_fits():
    """All 455 splits of VGG16 in 4 stages simulated: none that fits is faster."""
    from itertools import combinations

    from simulator import simulate
    balanced = simulate(load_scenario(DEMO, VGG_GPIPE))
    fitting = []
    for cuts in combinations(range(1, 16), 3):
        bounds = (0, *cuts, 16)
        split = [b - a for a, b in zip(bounds, bounds[1:])]
        result = simulate(load_scenario(DEMO, [*VGG_GPIPE, f"strategy.partition={split}".replace(" ", "")]))
        if result.summary["fits_in_memory"]:
            fitting.append(result.step_time_s)
    assert balanced.step_time_s <= min(fitting) * (1 + 1e-9)


def test_where_no_split_fits_the_fastest_stays():
    """VGG16 GPipe, 32 micro-batches of 16 on four 11 GB GPUs: no split fits, so the partition keeps
    its first choice rather than a slower one that is over the device by less (3.52 s against 2.33 s)."""
    from simulator import simulate
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "pipeline_vgg16_1f1b_pcie.yaml"
    layout = ["strategy.kind=gpipe", "strategy.num_microbatches=32", "training.global_batch_size=512"]
    balanced = simulate(load_scenario(scenario, layout))
    uniform = simulate(load_scenario(scenario, [*layout, "strategy.partition=uniform"]))
    assert not balanced.summary["fits_in_memory"] and not uniform.summary["fits_in_memory"]
    assert balanced.step_time_s <= uniform.step_time_s
    note = balanced.summary["partition_note"]
    assert note.startswith(f"{balanced.summary['partition']} needs at least ") and note.endswith(" fits"), note


def test_the_least_fullest_rank_is_the_best_of_every_split():
    """With one chunk a rank, `SplitMemory.least_fullest_bytes` is the least, over every split of the
    layers, of its fullest rank's bytes (brute force over VGG16's splits into 4 GPipe stages)."""
    from itertools import combinations

    from simulator.memory_floor import candidate_split_memory
    scenario = load_scenario(DEMO, VGG_GPIPE)
    model = bound_model(scenario)
    candidate = Candidate("gpipe", 4, 4, "group_per_node", 4)
    split = candidate_split_memory(model, candidate, model.rank_model(candidate)[0])
    count = len(split.layers)
    every = [max(split.rank_bytes(tuple(zip((0, *cuts), (*cuts, count)))))
             for cuts in combinations(range(1, count), 3)]
    assert split.least_fullest_bytes() == pytest.approx(min(every), rel=1e-12)
    assert split.least_bytes() < split.least_fullest_bytes()


def test_layouts_no_split_can_hold_are_pruned_without_partitioning_and_as_before():
    """A candidate whose least fullest rank is over the device is refused with that floor, before its
    layers are partitioned; the search's decisions and bounds are those of the partitioned floors
    (GPT-3 175B's megatron space on 128 GPUs, every 11th candidate)."""
    import json

    from simulator.layout_search import megatron_space
    from simulator.memory_floor import SplitMemory
    from simulator.planner import _workload, scenario_for_gpus
    from simulator.search_bounds import screen
    scenario = scenario_for_gpus(load_scenario("scenarios/gpt3_175b_dgx_a100_3d.yaml"), 128)
    workload = _workload(json.dumps(scenario.model.model_dump(mode="json"), sort_keys=True), scenario.base_dir)
    candidates = megatron_space(scenario, workload, context=False)[::11]
    capacity = usable_memory_bytes(scenario)
    quick = screen(bound_model(scenario, workload), candidates)[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SplitMemory, "least_fullest_bytes", lambda self: 0.0)  # every floor partitioned
        partitioned = screen(bound_model(scenario, workload), candidates)[0]
    early = [a for a, b in zip(quick, partitioned) if a.floor_bytes != b.floor_bytes]
    assert len(early) > len(candidates) / 4
    assert all(capacity < a.floor_bytes <= b.floor_bytes for a, b in zip(quick, partitioned) if a in early)
    decisions = [[(found.floor_bytes > capacity, found.bound) for found in run] for run in (quick, partitioned)]
    assert decisions[0] == decisions[1]
