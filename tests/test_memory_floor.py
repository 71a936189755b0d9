"""simulator.memory_floor: the activations a rank's schedule holds, and the floor under the memory model."""

from __future__ import annotations

from pathlib import Path

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


def test_the_floor_sees_a_balanced_interleaved_split_that_does_not_fit():
    """LLaMA-3 8B, PP 8 x v 2, 32 micro-batches of one 8k sequence on H100: the balanced split gives
    rank 1 chunks of 3 and 2 blocks, whose steady state holds more than its first backward; the
    floor counted only the warm-up (83.8 GB, under the 85.9 GB the device has; the memory model
    91.2 GB). The floor stays under the memory model and now says it does not fit."""
    layout = ["strategy.tp_degree=1", "strategy.pp_degree=8", "strategy.num_virtual_stages=2",
              "strategy.num_microbatches=32", "training.global_batch_size=32"]
    scenario = load_scenario(LLAMA3_8B, layout)
    floor = bound_model(scenario).memory_floor_bytes(Candidate("megatron", 1, 8, "group_per_node", 32, 2, 1))
    assert usable_memory_bytes(scenario) < floor <= exact_peak_memory_bytes(scenario)


def test_rounds_past_three_replay_the_steady_state():
    """`held_bytes` plays m = 3p in place of a longer step: the counts it keeps are the same."""
    from simulator.memory_floor import chunk_counts
    for p, v in ((2, 2), (3, 3), (4, 2), (8, 4)):
        for m in range(3 * p, 8 * p + 1, p):
            assert {k: set(c) for k, c in enumerate(chunk_counts(p, m, v))} == \
                {k: set(c) for k, c in enumerate(chunk_counts(p, 3 * p, v))}, (p, v, m)
