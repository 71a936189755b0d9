"""Per-layer costs of the weight passes and the update in cycle (`simulator.weight_pass_layers`)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import ScenarioError
from simulator.profile import load_profile
from simulator.profile_costs import ProfileCosts
from simulator.weight_pass_layers import (LayerPassCosts, PassSets, calibration_layer_sets,
                                          nonnegative_least_squares, per_layer_costs)
from tests.test_profile import document, workload, write


def test_the_sets_follow_the_calibrations_rule():
    """Singles and prefixes in order, layers without weights dropped, repeats skipped (the rule of
    `validator.calibration_phases._layer_sets`)."""
    assert calibration_layer_sets([5, 0, 7]) == [(0,), (2,), (0, 2)]
    assert calibration_layer_sets([3, 4, 5]) == [(0,), (1,), (0, 1), (2,), (0, 1, 2)]


def test_nonnegative_least_squares_matches_the_exact_solution_and_clips_at_zero():
    matrix = np.array([[1.0, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 1, 1]])
    exact = np.array([2.0, 3.0, 0.5])
    assert nonnegative_least_squares(matrix, matrix @ exact) == pytest.approx(exact)
    # a target that an unconstrained fit meets with a negative cost: that cost is held at 0
    target = np.array([1.0, 1.0, 2.0, -1.0, 1.0])
    solution = nonnegative_least_squares(matrix, target)
    assert (solution >= 0).all() and solution[2] == 0.0
    unconstrained = np.linalg.lstsq(matrix, target, rcond=None)[0]
    assert unconstrained[2] < 0


def test_nonnegative_least_squares_ends_on_identical_columns():
    """Two layers that only ever appear together: any split of the cost fits; one is returned."""
    solution = nonnegative_least_squares(np.array([[1.0, 1.0], [1.0, 1.0]]), np.array([2.0, 2.0]))
    assert (solution >= 0).all() and solution.sum() == pytest.approx(2.0)


def test_a_flat_cost_per_layer_is_recovered_where_the_parameter_fit_is_not():
    """Every layer costing 30 us whatever its size (as the ResNet's stash did): the per-layer costs
    give a stage of many small layers more than a stage of few large ones, which a fit on parameters
    inverts."""
    params = [1000, 1000, 1000, 1000, 50_000, 50_000]
    sets = calibration_layer_sets(params)
    medians = [30e-6 * len(layers) for layers in sets]
    costs = LayerPassCosts(PassSets({"stash": tuple(medians)}), params)
    assert costs.over("stash", 0, 4, 4000) == pytest.approx(120e-6)
    assert costs.over("stash", 4, 6, 100_000) == pytest.approx(60e-6)
    counts = [sum(params[i] for i in layers) for layers in sets]
    per_param = np.polyfit(counts, medians, 1)[0]
    assert per_param * 4000 < per_param * 100_000  # the fit's order is the other way round


def test_a_stage_pays_the_prefixes_growth_at_its_own_size():
    """Four 1000-parameter layers at 1 s each alone; the prefixes cost their singles' sum up to
    2000 parameters and 1.5x from 3000 on (a working set past a cache). A stage of the last two
    layers is the size of the 2-layer prefix: it pays 2 s, not the growth the larger prefixes
    show (the least-squares fit puts that growth on the later layers)."""
    params = [1000] * 4
    sets = calibration_layer_sets(params)  # (0,), (1,), (0, 1), (2,), (0, 1, 2), (3,), (0, 1, 2, 3)
    medians = [1.0, 1.0, 2.0, 1.0, 4.5, 1.0, 6.0]
    costs = LayerPassCosts(PassSets({"stash": tuple(medians)}), params)
    assert costs.over("stash", 2, 4, 2000) == pytest.approx(2.0)
    assert costs.over("stash", 1, 4, 3000) == pytest.approx(4.5)
    assert costs.over("stash", 0, 4, 4000) == pytest.approx(6.0)
    assert costs.over("stash", 3, 4, 1000) == pytest.approx(1.0)
    assert costs.over("stash", 0, 2, 2000) + costs.over("stash", 2, 4, 2000) == pytest.approx(4.0)  # halves
    assert per_layer_costs(sets, medians, 4)[2:].sum() > 2.5  # what the fit before charged the last two


def test_the_growth_is_interpolated_between_the_prefixes_sizes():
    params = [1000, 3000, 1000]  # prefixes at 1000 (ratio 1), 4000 (ratio 2), 5000 (ratio 2)
    sets = calibration_layer_sets(params)  # (0,), (1,), (0, 1), (2,), (0, 1, 2)
    costs = LayerPassCosts(PassSets({"stash": (1.0, 3.0, 8.0, 1.0, 10.0)}), params)
    assert costs.over("stash", 1, 2, 3000) == pytest.approx(3.0 * (1 + 2000 / 3000))  # r(3000) = 5/3
    assert costs.over("stash", 1, 3, 4000) == pytest.approx(4.0 * 2.0)


def test_ranges_that_do_not_hold_the_actions_parameters_fall_back():
    params = [10, 20, 30]
    costs = LayerPassCosts(PassSets({"stash": (1.0, 2.0, 3.0, 3.0, 6.0), "predict": (1.0, 2.0)}), params)
    assert costs.over("stash", 0, 2, 30) == pytest.approx(3.0)
    assert costs.over("stash", 0, 3, 40) is None  # an interleaved stage's chunks: not this range
    assert costs.over("predict", 0, 1, 10) is None  # its sets do not match the workload's
    assert costs.over("accumulate", 0, 1, 10) is None


def test_per_layer_costs_reproduce_the_sets_they_came_from():
    sets = calibration_layer_sets([4, 4, 4])
    medians = [1.0, 2.0, 3.1, 0.5, 3.4]
    costs = per_layer_costs(sets, medians, 3)
    predicted = [costs[list(layers)].sum() for layers in sets]
    assert np.abs(np.array(predicted) - medians).max() < 0.25


def _with_sets(doc, stash_medians, update_medians):
    w = workload()
    counts = [sum(w.layers[i].num_params for i in layers) for layers in calibration_layer_sets(
        [layer.num_params for layer in w.layers])]
    doc["weight_passes"] = {"stash": {"intercept_s": 1e-5, "per_param_s": 2e-9, "ranks_at_once": 1,
                                      "num_params": counts, "medians_s": stash_medians}}
    doc["optimizer"]["in_cycle"] = {"intercept_s": 2e-4, "per_param_s": 3e-9, "ranks_at_once": 1,
                                    "num_params": counts, "medians_s": update_medians}
    return doc


def test_profile_costs_use_the_per_layer_costs_over_a_layer_range(tmp_path):
    """The test MLP's layers fc1, fc2 (4160 parameters each) and fc3 (650): 5 sets. With their medians
    kept, a pass over a range sums the layers' costs (rescaled by compute_slowdown like the fit);
    without a range, or in a profile without medians, the fit."""
    flat = [1e-4, 1e-4, 2e-4, 1e-4, 3e-4]
    doc = _with_sets(document(), flat, [m * 2 for m in flat])
    shared = ProfileCosts(load_profile(write(tmp_path, doc)), workload(), shared_host=True)
    w = workload()
    head = w.layers[2].num_params
    assert shared.weight_pass_s("stash", head, layers=(2, 3)) == pytest.approx(1e-4)
    assert shared.weight_pass_s("stash", head) == pytest.approx(1e-5 + 2e-9 * head)
    assert shared.optimizer_s(w.num_params, layers=(0, 3)) == pytest.approx(6e-4)
    at_four = ProfileCosts(load_profile(write(tmp_path, doc)), workload())
    assert at_four.weight_pass_s("stash", head, layers=(2, 3)) == pytest.approx(2e-4)  # compute_slowdown 2
    for section in ("weight_passes", "optimizer"):
        for entry in ([doc["weight_passes"]["stash"]] if section == "weight_passes" else [doc["optimizer"]["in_cycle"]]):
            del entry["medians_s"]
    older = ProfileCosts(load_profile(write(tmp_path, doc, "older.json")), workload(), shared_host=True)
    assert older.weight_pass_s("stash", head, layers=(2, 3)) == pytest.approx(1e-5 + 2e-9 * head)


@pytest.mark.parametrize("medians, field", [([1e-4, 1e-4], "weight_passes.stash.medians_s"),
                                            ([1e-4, 1e-4, 2e-4, -1e-4, 3e-4], r"weight_passes.stash.medians_s\[3\]")])
def test_malformed_medians_name_the_field(tmp_path, medians, field):
    doc = _with_sets(document(), medians, [1e-4] * 5)
    with pytest.raises(ScenarioError, match=field):
        load_profile(write(tmp_path, doc))


def _with_alone_sets(doc, ratio):
    """`_with_sets`'s passes timed with all 4 ranks at once (played at / compute_slowdown[4] = 2 on a
    shared host), and the same sets alone at 1 / `ratio` of what is played."""
    flat = [1e-4, 1e-4, 2e-4, 1e-4, 3e-4]
    doc = _with_sets(doc, flat, [m * 2 for m in flat])
    for entry in (doc["weight_passes"]["stash"], doc["optimizer"]["in_cycle"]):
        entry["ranks_at_once"] = 4
        entry["alone"] = {"intercept_s": 0.0, "per_param_s": 1e-9, "ranks_at_once": 1,
                          "medians_s": [m / 2 / ratio for m in entry["medians_s"]]}
    return doc


def test_memory_contention_is_the_played_cost_over_the_alone_one(tmp_path):
    w = workload()
    profile = load_profile(write(tmp_path, _with_alone_sets(document(), 1.5)))
    assert profile.pass_sets.alone_medians_s["stash"] == pytest.approx([m / 3 for m in (1e-4, 1e-4, 2e-4, 1e-4, 3e-4)])
    shared = ProfileCosts(profile, w, shared_host=True)
    head = w.layers[2].num_params
    assert shared.memory_contention("stash", head, (2, 3)) == pytest.approx(1.5)
    assert shared.memory_contention("opt", w.num_params, (0, 3)) == pytest.approx(1.5)
    assert shared.memory_contention_ranks == 4
    assert shared.memory_contention("stash", head, None) == 1.0  # no per-layer costs: played as timed
    assert ProfileCosts(profile, w).memory_contention("stash", head, (2, 3)) == 1.0  # not a shared host
    faster_at_once = ProfileCosts(load_profile(write(tmp_path, _with_alone_sets(document(), 0.8), "fast.json")), w,
                                  shared_host=True)
    assert faster_at_once.memory_contention("stash", head, (2, 3)) == 1.0


def test_malformed_alone_medians_name_the_field(tmp_path):
    doc = _with_alone_sets(document(), 1.5)
    doc["weight_passes"]["stash"]["alone"]["medians_s"][1] = "fast"
    with pytest.raises(ScenarioError, match=r"weight_passes.stash.alone.medians_s\[1\]"):
        load_profile(write(tmp_path, doc))
    doc["weight_passes"]["stash"]["alone"]["medians_s"] = [1e-4]
    with pytest.raises(ScenarioError, match=r"weight_passes.stash.alone.medians_s"):
        load_profile(write(tmp_path, doc))
