"""Cold operands (simulator.cold_start): the model's formula, the profile section, the engine's ages,
and the microbenchmark's decay fit."""

from __future__ import annotations

import math
import statistics
import re

import pytest

from simulator import load_scenario, simulate
from simulator.cold_start import ColdStart, parse_cold_start, update_state_share
from simulator.document_reader import DocumentReader
from simulator.errors import ScenarioError
from simulator.workload import Layer, Workload
from tests.helpers import FixedCosts

FREE = {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}
DECAY_S = 0.5


def cold(forward=(2.0, 2.0), backward=(3.0, 3.0), optimizer=1.5, topk=1.0) -> ColdStart:
    return ColdStart(gap_s=5.0, decay_s=DECAY_S, batch_size=2, forward_factors=tuple(forward),
                     backward_factors=tuple(backward), optimizer_factor=optimizer, topk_factor=topk)


def coldness(age_s: float) -> float:
    return 1 - math.exp(-age_s / DECAY_S)


def test_factor_is_one_when_hot_and_the_calibrated_ratio_when_cold():
    model = cold()
    assert model.layer_factor("F", 0, 0.0) == 1.0
    assert model.layer_factor("B", 1, 1e9) == pytest.approx(3.0)
    assert model.layer_factor("F", 0, DECAY_S) == pytest.approx(1 + 1 * coldness(DECAY_S))
    assert model.update_factor(0.0) == 1.0 and model.update_factor(1e9) == pytest.approx(1.5)
    assert cold(topk=1.8).selection_factor(DECAY_S) == pytest.approx(1 + 0.8 * coldness(DECAY_S))


def test_the_update_mixes_the_ages_of_its_state_and_of_its_weights_by_their_bytes():
    model = cold(optimizer=1.5)
    # state cold for a long time, weights and gradients just written: only the state's share pays
    assert model.update_factor(1e9, 0.0, 0.4) == pytest.approx(1 + 0.5 * 0.4)
    assert model.update_factor(1e9, 0.0, 0.0) == 1.0  # plain SGD: no state
    assert model.update_factor(DECAY_S, 1.0, 0.25) == pytest.approx(1 + 0.5 * (0.25 * coldness(DECAY_S) + 0.75))
    assert update_state_share("sgd") == 0.0
    assert update_state_share("momentum") == pytest.approx(2 / 5)  # velocity read + written of 5 words
    assert update_state_share("adam") == pytest.approx(4 / 7)      # two moments of 7 words


def test_a_measured_ratio_below_one_is_noise_and_counts_as_one():
    model = cold(forward=(0.9, 0.8), optimizer=0.95)
    assert model.layer_factor("F", 0, 1e9) == 1.0
    assert model.update_factor(1e9) == 1.0


# ----------------------------------------------------------------------------- profile section

SECTION = {"gap_s": 0.05, "decay_s": 0.01, "batch_size": 16, "forward_factors": [1.5, 1.2],
           "backward_factors": [1.7, 1.1], "optimizer_factor": 1.3, "decay_shares": [0.1, 0.5, 0.9]}


def test_the_profile_section_parses():
    parsed = parse_cold_start(DocumentReader("p.json"), {"cold_start": SECTION}, 2)
    assert parsed == ColdStart(0.05, 0.01, 16, (1.5, 1.2), (1.7, 1.1), 1.3)
    assert parsed.topk_factor == 1.0  # a section from before the top-k measurement
    with_topk = parse_cold_start(DocumentReader("p.json"), {"cold_start": {**SECTION, "topk_factor": 1.6}}, 2)
    assert with_topk.topk_factor == 1.6
    assert parse_cold_start(DocumentReader("p.json"), {}, 2) is None
    assert parsed.single_pass_s("F", 1) == 0.0  # a section from before the single-pass measurement
    single = parse_cold_start(DocumentReader("p.json"), {"cold_start": {
        **SECTION, "forward_single_pass_s": [0.001, 0.0], "backward_single_pass_s": [0.0, 0.003]}}, 2)
    assert (single.single_pass_s("F", 0), single.single_pass_s("F", 1)) == (0.001, 0.0)
    assert (single.single_pass_s("B", 0), single.single_pass_s("B", 1)) == (0.0, 0.003)


def test_single_pass_time_is_the_hot_pass_over_the_block_median_at_the_fits_concurrency():
    """Hot passes timed with 2 ranks at once against the layer medians with 2 ranks at once, at the
    cold batch (16, the second of three), converted to the fits' 4 ranks at once (x 3.0 / 1.5);
    a hot pass faster than the block median counts as 0."""
    from validator.cold_bench import single_pass_overheads

    cold = {"batch_size": 16, "ranks_at_once": 2, "hot_forward_s": [0.0015, 0.0009],
            "hot_backward_s": [0.0030, 0.0025]}
    medians = {1: {"forward": [[0.0, 0.0, 0.0]] * 2, "backward": [[0.0, 0.0, 0.0]] * 2},
               2: {"forward": [[0.0004, 0.0010, 0.0030], [0.0005, 0.0010, 0.0031]],
                   "backward": [[0.0008, 0.0020, 0.0060], [0.0009, 0.0020, 0.0061]]}}
    slowdown = {1: 1.0, 2: 1.5, 4: 3.0}
    result = single_pass_overheads(cold, medians, [4, 16, 64], slowdown, 4)
    assert result["forward_single_pass_s"] == pytest.approx([0.0010, 0.0])
    assert result["backward_single_pass_s"] == pytest.approx([0.0020, 0.0010])
    # nothing to compare with: an older section, a level or the batch size not timed
    assert single_pass_overheads({**cold, "ranks_at_once": None}, medians, [4, 16, 64], slowdown, 4) == {}
    assert single_pass_overheads({**cold, "ranks_at_once": 4}, medians, [4, 16, 64], slowdown, 4) == {}
    assert single_pass_overheads(cold, medians, [4, 8, 64], slowdown, 4) == {}


def test_single_pass_time_prefers_the_paired_excess_over_the_distant_block_median():
    """With the paired figures present, the hot passes and the layer medians taken at other moments
    are ignored: excess x slowdown[4] / slowdown[2], a negative excess counting as 0."""
    from validator.cold_bench import single_pass_overheads

    cold = {"batch_size": 16, "ranks_at_once": 2, "hot_forward_s": [0.0015, 0.0009],
            "hot_backward_s": [0.0030, 0.0025], "paired_excess_forward_s": [0.0001, -0.0002],
            "paired_excess_backward_s": [0.0, 0.0003]}
    medians = {2: {"forward": [[0.0004, 0.0010, 0.0030]] * 2, "backward": [[0.0008, 0.0020, 0.0060]] * 2}}
    result = single_pass_overheads(cold, medians, [4, 16, 64], {1: 1.0, 2: 1.5, 4: 3.0}, 4)
    assert result["forward_single_pass_s"] == pytest.approx([0.0002, 0.0])
    assert result["backward_single_pass_s"] == pytest.approx([0.0, 0.0006])
    # the paired figures need no layer medians at the cold batch size
    assert single_pass_overheads(cold, {}, [4, 8, 64], {1: 1.0, 2: 1.5, 4: 3.0}, 4) == result


def test_paired_excess_is_the_median_of_differences_taken_together():
    """A slow spell that slows a pair's single pass and its block alike cancels in the pair: the
    median of differences is 0.1 ms, while the median single pass minus the median block is 0.9 ms."""
    from validator.cold_bench import paired_excess_s

    single = [1.1e-3, 1.1e-3, 2.7e-3, 2.7e-3, 2.7e-3]
    block = [1.0e-3, 1.0e-3, 1.6e-3, 1.6e-3, 2.6e-3]
    assert paired_excess_s(single, block) == pytest.approx(0.1e-3)
    assert statistics.median(single) - statistics.median(block) == pytest.approx(1.1e-3)


@pytest.mark.parametrize("change,field", [
    ({"forward_factors": [1.5]}, "cold_start.forward_factors"),
    ({"backward_factors": [1.5, -1.0]}, "cold_start.backward_factors[1]"),
    ({"decay_s": 0}, "cold_start.decay_s"),
    ({"batch_size": 1.5}, "cold_start.batch_size"),
    ({"optimizer_factor": "fast"}, "cold_start.optimizer_factor"),
    ({"topk_factor": 0}, "cold_start.topk_factor"),
    ({"forward_single_pass_s": [0.001]}, "cold_start.forward_single_pass_s"),
    ({"backward_single_pass_s": [0.001, -0.002]}, "cold_start.backward_single_pass_s[1]"),
])
def test_a_bad_profile_section_names_the_field(change, field):
    with pytest.raises(ScenarioError, match=re.escape(f"p.json: {field}: ")):
        parse_cold_start(DocumentReader("p.json"), {"cold_start": {**SECTION, **change}}, 2)


# ----------------------------------------------------------------------------- engine


class ColdCosts(FixedCosts):
    """F = 1 s per sample per layer, B = 2 s, update 1 s; a cold-start model."""

    def __init__(self, workload: Workload, model: ColdStart):
        super().__init__(1.0, 1.0)
        self.workload = workload
        self.cold_start = model


def toy(num_layers: int = 2) -> Workload:
    return Workload("toy", tuple(Layer(f"l{i}", "linear", 1e9, 2e9, 1000, 100, 100, 100) for i in range(num_layers)))


def simulate_mp(costs, batch: int = 1):
    scenario = load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "intra_node_link": FREE, "inter_node_link": FREE},
        "model": {"name": "mlp"},
        "strategy": {"kind": "mp", "partition": [1, 1]},
        "training": {"global_batch_size": batch},
    })
    return simulate(scenario, costs=costs, workload=costs.workload)


def test_the_engine_slows_each_pass_by_the_time_since_its_rank_last_ran_the_layer():
    """Two stages of one layer, batch 1 (F 1 s, B 2 s, update 1 s back to back), free links:
    rank 0 F [0, 1]; rank 1 F starts at 1 on a layer last run at 0 (previous update), then B at
    once (hot); rank 0's B waits for it, its layer last run at 1."""
    workload = toy()
    model = cold()
    spans = simulate_mp(ColdCosts(workload, model)).spans

    def span(rank, name):
        row = spans[(spans["rank"] == rank) & (spans["name"] == name)].iloc[0]
        return row.start_s, row.end_s

    f0 = span(0, "F0 L0-0")
    assert f0 == pytest.approx((0.0, 1.0))  # its layer was run by the update at time 0
    f1 = span(1, "F0 L1-1")
    assert f1[0] == pytest.approx(1.0)
    f1_factor = 1 + (2.0 - 1) * coldness(1.0)
    assert f1[1] - f1[0] == pytest.approx(f1_factor)
    b1 = span(1, "B0 L1-1")
    assert b1[1] - b1[0] == pytest.approx(2.0)  # right after its forward: hot
    b0 = span(0, "B0 L0-0")
    age = b0[0] - f0[1]
    assert age == pytest.approx(f1_factor + 2.0)
    assert b0[1] - b0[0] == pytest.approx(2.0 * (1 + (3.0 - 1) * coldness(age)))
    u0 = span(0, "optimizer")
    assert u0[1] - u0[0] == pytest.approx(1.0 * (1 + 0.5 * coldness(u0[0])))  # state aged since the step began


@pytest.mark.parametrize("state_share", [0.0, 0.4])
def test_the_engine_ages_an_update_by_its_state_and_by_its_layers_last_backward(state_share):
    """The same two stages; rank 0's update starts as its backward ends: its weights and gradients
    are hot, its state (share `state_share`) aged since the step began."""
    costs = ColdCosts(toy(), cold())
    costs.update_state_share = state_share
    spans = simulate_mp(costs).spans
    rows = spans[spans["rank"] == 0].set_index("name")
    start_s, end_s = rows.loc["optimizer", "start_s"], rows.loc["optimizer", "end_s"]
    assert start_s == pytest.approx(rows.loc["B0 L0-0", "end_s"])
    assert end_s - start_s == pytest.approx(1.0 * (1 + 0.5 * state_share * coldness(start_s)))
    assert end_s - start_s < 1.0 + 0.5 * coldness(start_s) - 1e-3  # less than with every operand as old as the state


def _pass(id_: int, phase: str, microbatch: int = 0):
    from simulator.plan import Compute
    return Compute(id_, phase, 0, 1, 1.0, microbatch)


def test_a_backward_after_other_micro_batches_passes_on_its_layer_runs_hot():
    """GPipe's order on one rank: F0, F1, F2 back to back, then B0. Its saved activations are 2 s
    old, but the layer ran until B0 started: hot (bench_cold_gap: only the first pass after a
    pause pays). After a 2 s wait instead, B0 pays the penalty of a 2 s age."""
    from simulator.layer_ages import LayerAges

    model = cold(backward=(3.0, 3.0))
    busy = LayerAges([ColdCosts(toy(1), model)])
    for index, end_s in enumerate((1.0, 2.0, 3.0)):
        busy.ran(_pass(index, "F", index), 0, end_s)
    assert busy.factor(_pass(3, "B", 0), 0, 3.0) == pytest.approx(1.0)

    waited = LayerAges([ColdCosts(toy(1), model)])
    waited.ran(_pass(0, "F", 0), 0, 1.0)
    assert waited.factor(_pass(3, "B", 0), 0, 3.0) == pytest.approx(1 + 2.0 * coldness(2.0))


def test_a_pass_over_several_cold_layers_pays_the_largest_excess_once():
    """Two layers (F 1 s each at batch 1), both last run long ago, factors 2.0 and 1.5: the pass
    takes 2 s + max(1 x 1.0, 1 x 0.5) = 3 s, not 2 s + 1.5 s (bench_cold_gap: one wake-up a pass)."""
    from simulator.layer_ages import LayerAges
    from simulator.plan import Compute

    tracker = LayerAges([ColdCosts(toy(2), cold(forward=(2.0, 1.5)))])
    forward = Compute(0, "F", 0, 2, 1.0)
    assert tracker.factor(forward, 0, 1e9) == pytest.approx((2.0 + 1.0) / 2.0)
    tracker.ran(forward, 0, 1e9)
    assert tracker.factor(Compute(1, "F", 0, 2, 1.0, 1), 0, 1e9) == pytest.approx(1.0)  # right after: hot


def test_without_a_cold_start_model_passes_run_at_their_back_to_back_times():
    costs = ColdCosts(toy(), cold())
    costs.cold_start = None
    spans = simulate_mp(costs).spans
    durations = dict(zip(spans["name"] + "@" + spans["rank"].astype(str), spans["end_s"] - spans["start_s"]))
    assert durations["B0 L0-0@0"] == pytest.approx(2.0) and durations["F0 L1-1@1"] == pytest.approx(1.0)
    assert durations["optimizer@0"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- microbenchmark


def test_fit_decay_recovers_the_time_constant_of_exact_shares():
    from validator.cold_bench import fit_decay_s

    gaps = (0.002, 0.005, 0.015)
    for tau in (0.003, 0.01):
        shares = [1 - math.exp(-g / tau) for g in gaps]
        assert fit_decay_s(gaps, shares) == pytest.approx(tau, rel=0.06)  # the grid's spacing


def test_time_cold_start_measures_every_layer_and_the_update():
    from validator.cold_bench import DECAY_BOUNDS_S, time_cold_start
    from simulator.zoo import build_model

    workload = build_model("mlp", input_dim=32, hidden_dim=32, num_hidden_layers=1, num_classes=4)
    result = time_cold_start(workload, 4, "momentum", gap_s=0.004, decay_gaps_s=(0.001, 0.002), pairs=1)
    for key in ("forward_factors", "backward_factors", "hot_forward_s", "hot_backward_s"):
        assert len(result[key]) == workload.num_layers and all(value > 0 for value in result[key])
    for key in ("paired_excess_forward_s", "paired_excess_backward_s"):  # single pass - block, ms apart
        assert len(result[key]) == workload.num_layers
        assert all(excess < hot for excess, hot in zip(result[key], result[key.replace("paired_excess", "hot")]))
    assert result["optimizer_factor"] > 0 and result["topk_factor"] > 0 and result["batch_size"] == 4 and result["gap_s"] == 0.004
    assert DECAY_BOUNDS_S[0] <= result["decay_s"] <= DECAY_BOUNDS_S[1]
    assert all(0.0 <= share <= 1.0 for share in result["decay_shares"])
    section = parse_cold_start(DocumentReader("x"), {"cold_start": result}, workload.num_layers)
    assert section.forward_factors == tuple(result["forward_factors"])
