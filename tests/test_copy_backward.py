"""An asynchronous stage's backward on a weight copy over the same backward through the modules
(`simulator.copy_backward`): the section built from the weight passes' timings, read back, its
errors naming the field, the cost model taking its factor, and the engine playing that factor on
asynchronous plans' backwards only."""

import copy

import pytest

from simulator.copy_backward import copy_backward_section
from simulator.errors import ScenarioError
from simulator.profile import profile_from_dict
from simulator.profile_costs import ProfileCosts
from tests.test_pipeline_plans import Costs, run
from tests.test_profile import document, workload


def test_section_is_the_median_ratio_over_the_sets():
    items = [{"module_backward_s": 1.0, "copy_backward_s": 0.7},
             {"module_backward_s": 2.0, "copy_backward_s": 1.0},
             {"module_backward_s": 4.0, "copy_backward_s": 3.6}]
    section = copy_backward_section(items)
    assert section["ratios"] == pytest.approx([0.7, 0.5, 0.9])
    assert section["factor"] == pytest.approx(0.7)


@pytest.mark.parametrize("items", [None, [], [{"stash_s": 1.0}],
                                   [{"module_backward_s": 0.0, "copy_backward_s": 0.1}]])
def test_no_section_without_both_backwards_timed(items):
    assert copy_backward_section(items) is None


def test_profile_reads_the_section_and_the_cost_model_plays_its_factor():
    doc = copy.deepcopy(document())
    doc["copy_backward"] = {"factor": 0.7, "ratios": [0.6, 0.7, 0.8]}
    profile = profile_from_dict(doc)
    assert profile.copy_backward.factor == 0.7 and profile.copy_backward.ratios == (0.6, 0.7, 0.8)
    assert ProfileCosts(profile, workload()).asynchronous_backward_factor == 0.7
    older = profile_from_dict(document())  # profiles from before the section: the backward as timed
    assert older.copy_backward is None and ProfileCosts(older, workload()).asynchronous_backward_factor == 1.0


@pytest.mark.parametrize("field,value", [("factor", 0.01), ("factor", "fast"), ("ratios", "0.7"),
                                         ("ratios", [0.7, -1])])
def test_malformed_section_names_the_field(field, value):
    doc = copy.deepcopy(document())
    doc["copy_backward"] = {"factor": 0.7, "ratios": [0.7], field: value}
    with pytest.raises(ScenarioError, match=f"copy_backward.{field}"):
        profile_from_dict(doc)


class CopyBackwardCosts(Costs):
    """`Costs` whose asynchronous backward runs at `factor` of the modules' (B = 2 s per sample per layer)."""

    def __init__(self, factor: float):
        super().__init__()
        self.asynchronous_backward_factor = factor


class ScaledBackwardCosts(Costs):
    """`Costs` whose backward itself is `factor` x 2 s per sample per layer, for every plan."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def compute_s(self, layer_index, phase, batch):
        return super().compute_s(layer_index, phase, batch) * (self.factor if phase == "B" else 1.0)


@pytest.mark.parametrize("kind", ["pipedream", "spectrain", "delayed_gradient"])
@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_asynchronous_backwards_pay_the_factor(kind, factor):
    # the same step as a cost model whose backward itself takes factor x as long, and not the plain one
    p, m = 3, 6
    played = run(kind, p, m, [2] * p, costs=CopyBackwardCosts(factor)).step_time_s
    assert played == pytest.approx(run(kind, p, m, [2] * p, costs=ScaledBackwardCosts(factor)).step_time_s, rel=1e-9)
    assert played != pytest.approx(run(kind, p, m, [2] * p, costs=Costs()).step_time_s, rel=1e-3)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_synchronous_backwards_ignore_the_factor(kind):
    p, m = 3, 6  # F = 4 s, B = 8 s a stage: (m + p - 1)(t_f + t_b)
    assert run(kind, p, m, [2] * p, costs=CopyBackwardCosts(0.5)).step_time_s == pytest.approx((m + p - 1) * 12)


# ----------------------------------------------------------------------------- the copy's age

def test_section_keeps_each_age_as_the_median_over_the_sets():
    items = [{"module_backward_s": 1.0, "copy_backward_s": 0.7, "aged_copy_backward_s": [0.8, 0.9]},
             {"module_backward_s": 2.0, "copy_backward_s": 1.0, "aged_copy_backward_s": [1.8, 2.2]},
             {"module_backward_s": 4.0, "copy_backward_s": 3.6, "aged_copy_backward_s": [3.0, 4.0]}]
    section = copy_backward_section(items)
    expected = [[0.8, 0.9], [0.9, 1.1], [0.75, 1.0]]
    assert all(row == pytest.approx(want) for row, want in zip(section["age_ratios"], expected, strict=True))
    assert section["age_factors"] == pytest.approx([0.7, 0.8, 1.0])  # age 0 is the fresh copy's factor
    assert "copy_age_factors" not in section  # the modules' aged cycle not timed (the first candidate's)
    items[1]["aged_copy_backward_s"] = [1.8]  # ages not timed alike on every set: no ages kept
    assert "age_factors" not in copy_backward_section(items)


def test_section_charges_only_the_copys_growth_with_age_over_the_modules():
    # set 1: the copy grows 1.2x / 1.5x, the modules 1.0x (an MLP: the weights age, not the activations);
    # set 2: both grow alike (a transformer: the activations age as much through the modules)
    items = [{"module_backward_s": 1.0, "copy_backward_s": 0.7, "aged_copy_backward_s": [1.2, 1.5],
              "copy_cycle_fresh_s": 1.0, "aged_module_backward_s": [2.0, 2.0, 2.0]},
             {"module_backward_s": 1.0, "copy_backward_s": 0.7, "aged_copy_backward_s": [1.1, 1.3],
              "copy_cycle_fresh_s": 1.0, "aged_module_backward_s": [1.0, 1.1, 1.3]},
             {"module_backward_s": 1.0, "copy_backward_s": 0.7, "aged_copy_backward_s": [1.3, 1.6],
              "copy_cycle_fresh_s": 1.0, "aged_module_backward_s": [1.0, 1.0, 1.0]}]
    section = copy_backward_section(items)
    growth = [[1.2, 1.5], [1.0, 1.0], [1.3, 1.6]]
    assert all(row == pytest.approx(want) for row, want in zip(section["copy_age_growth"], growth, strict=True))
    assert section["copy_age_factors"] == pytest.approx([0.7, 0.7 * 1.2, 0.7 * 1.5])  # medians over the sets
    items[2]["aged_module_backward_s"] = [1.0, 0.0, 1.0]  # a backward that took no time: no growth kept
    assert "copy_age_factors" not in copy_backward_section(items)


def test_copy_ages_count_the_forwards_between_a_microbatch_forward_and_its_backward():
    from simulator.copy_backward import copy_ages
    from simulator.plan import Compute

    def forward(i, mb):
        return Compute(i, "F", 0, 3, 8.0, microbatch=mb)

    def backward(i, mb):
        return Compute(i, "B", 0, 3, 8.0, microbatch=mb)

    # a first stage of two in asynchronous 1F1B: two in flight once warm
    actions = [forward(0, 0), forward(1, 1), backward(2, 0), forward(3, 2), backward(4, 1), backward(5, 2)]
    assert copy_ages(actions) == {2: 1, 4: 1, 5: 0}


@pytest.mark.parametrize("key", ["age_factors", "copy_age_factors"])
def test_profile_reads_the_ages_and_malformed_ones_name_the_field(key):
    doc = copy.deepcopy(document())
    doc["copy_backward"] = {"factor": 0.7, "ratios": [0.7], "age_factors": [0.7, 0.9, 1.0],
                            "copy_age_factors": [0.7, 0.8, 0.95]}
    section = profile_from_dict(doc).copy_backward
    assert section.age_factors == (0.7, 0.9, 1.0)  # informational
    assert [section.at_age(age) for age in range(5)] == [0.7, 0.8, 0.95, 0.95, 0.95]  # the oldest beyond
    del doc["copy_backward"]["copy_age_factors"]  # the first candidate's profiles: the age-0 factor throughout
    assert [profile_from_dict(doc).copy_backward.at_age(age) for age in range(3)] == [0.7, 0.7, 0.7]
    doc["copy_backward"][key] = [0.7, 80.0]
    with pytest.raises(ScenarioError, match=rf"copy_backward.{key}\[1\]"):
        profile_from_dict(doc)


class AgedCopyCosts(Costs):
    """`Costs` whose copy factor is 1 on a fresh copy and `older` on any older one."""

    def __init__(self, older: float):
        from simulator.copy_backward import CopyBackward

        super().__init__()
        self.copy_backward = CopyBackward(factor=1.0, copy_age_factors=(1.0, older))


def test_engine_charges_each_backward_the_factor_at_its_copy_age():
    p, m = 2, 6
    fresh = run("pipedream", p, m, [2] * p, costs=AgedCopyCosts(1.0))
    aged = run("pipedream", p, m, [2] * p, costs=AgedCopyCosts(1.5))
    assert fresh.step_time_s == pytest.approx(run("pipedream", p, m, [2] * p, costs=Costs()).step_time_s, rel=1e-9)
    durations = {}
    for result, name in ((fresh, "fresh"), (aged, "aged")):
        backwards = result.spans[(result.spans["stream"] == "compute") & (result.spans["kind"] == "B")]
        durations[name] = {(row.rank, row.microbatch): row.duration_s for row in backwards.itertuples()}
    # the last stage runs each backward right after its forward: its copies are fresh
    last = [key for key in durations["fresh"] if key[0] == p - 1]
    assert last and all(durations["aged"][key] == pytest.approx(durations["fresh"][key]) for key in last)
    # the first stage's backwards behind another forward pay 1.5x
    first = [key for key in durations["fresh"] if key[0] == 0]
    ratios = [durations["aged"][key] / durations["fresh"][key] for key in first]
    assert sum(r == pytest.approx(1.5) for r in ratios) >= m - 2
    assert all(r == pytest.approx(1.5) or r == pytest.approx(1.0) for r in ratios)
    assert aged.step_time_s > fresh.step_time_s
    # a synchronous plan's backwards do not run on copies
    assert run("1f1b", p, m, [2] * p, costs=AgedCopyCosts(1.5)).step_time_s == pytest.approx(
        run("1f1b", p, m, [2] * p, costs=Costs()).step_time_s, rel=1e-9)
