"""An asynchronous stage's own loop over what the model charges for it (`simulator.stage_loop`,
`validator.stage_loop_bench`): the plan without its messages, the section read back with errors
naming the field, the engine playing each weight mode's factor on asynchronous plans only, and the
loops timed on two real ranks and modelled on a real profile."""

import copy
from pathlib import Path

import pytest

from simulator.errors import ScenarioError
from simulator.plan import Compute, Recv, Send
from simulator.profile import profile_from_dict
from simulator.profile_costs import ProfileCosts
from simulator.scenario import load_scenario
from simulator.model_source import resolve_workload
from simulator.stage_loop import (LOOP_KINDS, StageLoop, loop_entry, loop_mode, modelled_loop_s, stage_loop_plan,
                                  stage_loops_section, without_messages)
from tests.test_pipeline_plans import Costs, run
from tests.test_profile import document, workload

ROOT = Path(__file__).resolve().parent.parent


def _mlp_workload():
    scenario = load_scenario(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml", ["cluster.gpus_per_node=2"])
    return resolve_workload(scenario.model, scenario.base_dir)


@pytest.mark.parametrize("kind", list(LOOP_KINDS))
def test_the_loop_keeps_every_compute_in_order_and_drops_the_messages(kind):
    plan = stage_loop_plan(_mlp_workload(), 2, kind)
    stripped = without_messages(plan)
    for before, after in zip(plan.actions, stripped.actions):
        assert any(isinstance(a, (Send, Recv)) for a in before)
        assert not any(isinstance(a, (Send, Recv)) for a in after)
        assert [a.id for a in before if isinstance(a, Compute)] == [a.id for a in after]
        kept = {a.id for a in after}
        assert all(dep in kept for a in after for dep in a.deps)
    assert loop_mode(plan) == LOOP_KINDS[kind]


def test_weight_modes_follow_the_runtime():
    assert loop_mode(stage_loop_plan(_mlp_workload(), 2, "pipedream")) == "stash"
    assert loop_mode(run("1f1b", 2, 4, [1, 1]).plan) is None
    assert loop_mode(run("pipedream", 2, 4, [1, 1], weight_stashing=False).plan) == "newest"


def test_entry_factor_is_the_asynchronous_over_synchronous_ratio_measured_over_modelled():
    # measured: async 0.4 s against 1F1B 0.2 s (x2); modelled: 0.3 against 0.2 (x1.5) -> 2 / 1.5
    entry = loop_entry([0.3, 0.1], [0.1, 0.1], [0.2, 0.1], [0.1, 0.1])
    assert entry["factor"] == pytest.approx(2 / 1.5) and entry["measured_s"] == [0.3, 0.1]
    # a machine twice as slow in both loops measures the same factor
    assert loop_entry([0.6, 0.2], [0.2, 0.2], [0.2, 0.1], [0.1, 0.1])["factor"] == pytest.approx(2 / 1.5)
    assert loop_entry([0.2, 0.2], [0.1, 0.1], [0.2, 0.2], [0.1, 0.1])["factor"] == pytest.approx(1.0)


def _with_section(section):
    doc = copy.deepcopy(document())
    doc["stage_loops"] = section
    return doc


def test_profile_reads_the_section_and_the_cost_model_keeps_it():
    doc = _with_section({"stash": {"kind": "pipedream", "measured_s": [0.3, 0.2], "modelled_s": [0.25, 0.2],
                                   "reference_s": [0.2, 0.2], "modelled_reference_s": [0.2, 0.2], "factor": 1.1}})
    profile = profile_from_dict(doc)
    loop = profile.stage_loops["stash"]
    assert loop.factor == 1.1 and loop.modelled_s == (0.25, 0.2) and loop.reference_s == (0.2, 0.2)
    assert profile_from_dict(document()).stage_loops == {}  # older profiles


def _levels(doc: dict, levels: list[int]) -> dict:
    doc["pass_jitter"] = {"batch_size": 16, "levels": {str(k): [[0.01] * k, [0.012] * k] for k in levels}}
    return doc


def test_the_cost_model_plays_the_section_only_where_each_rank_had_a_core():
    section = {"stash": {"factor": 1.1}}
    own_cores = profile_from_dict(_levels(_with_section(section), [4]))
    assert ProfileCosts(own_cores, workload(), shared_host=True).stage_loops["stash"].factor == 1.1
    oversubscribed = profile_from_dict(_levels(_with_section(section), [2, 4]))  # 4 ranks on 2 cores
    assert ProfileCosts(oversubscribed, workload(), shared_host=True).stage_loops == {}
    assert ProfileCosts(profile_from_dict(_with_section(section)), workload(), shared_host=True).stage_loops == {}
    assert ProfileCosts(own_cores, workload()).stage_loops == {}  # not a shared host: no GPU profile scored


@pytest.mark.parametrize("section,field", [
    ({"stash": {"factor": 5.0}}, "stage_loops.stash.factor"),
    ({"stash": {"factor": "slow"}}, "stage_loops.stash.factor"),
    ({"stash": {"factor": 1.0, "measured_s": [0.1, -1]}}, r"stage_loops.stash.measured_s\[1\]"),
    ({"stashed": {"factor": 1.0}}, "stage_loops.stashed"),
    ({"stash": 1.2}, "stage_loops.stash"),
])
def test_malformed_section_names_the_field(section, field):
    with pytest.raises(ScenarioError, match=field):
        profile_from_dict(_with_section(section))


class LoopCosts(Costs):
    """`Costs` (F = 1 s per sample per layer, B = 2 s) with a stage loop factor per weight mode."""

    def __init__(self, **factors):
        super().__init__()
        self.stage_loops = {mode: StageLoop((), (), factor) for mode, factor in factors.items()}


@pytest.mark.parametrize("kind,options,mode", [("pipedream", {}, "stash"), ("spectrain", {}, "predict"),
                                               ("delayed_gradient", {}, "newest"),
                                               ("pipedream", {"weight_stashing": False}, "newest")])
def test_asynchronous_compute_pays_its_modes_factor(kind, options, mode):
    # free links: every span scales, so the step does
    plain = run(kind, 3, 6, [2, 2, 2], **options).step_time_s
    assert run(kind, 3, 6, [2, 2, 2], costs=LoopCosts(**{mode: 1.5}), **options).step_time_s == pytest.approx(1.5 * plain)
    other = "stash" if mode != "stash" else "predict"
    assert run(kind, 3, 6, [2, 2, 2], costs=LoopCosts(**{other: 1.5}), **options).step_time_s == pytest.approx(plain)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_synchronous_plans_ignore_the_factors(kind):
    p, m = 3, 6  # F = 4 s, B = 8 s a stage: (m + p - 1)(t_f + t_b)
    costs = LoopCosts(stash=1.5, predict=1.5, newest=1.5)
    assert run(kind, p, m, [2] * p, costs=costs).step_time_s == pytest.approx((m + p - 1) * 12)


def test_modelled_loop_is_each_ranks_compute_back_to_back():
    plan = run("pipedream", 2, 4, [1, 1]).plan
    stripped = without_messages(plan)
    costs = Costs()
    # no waiting: a rank's compute end is the sum of its compute (F = 2 s, B = 4 s a micro-batch here)
    ends = modelled_loop_s(plan, costs)
    sums = [sum(costs.compute_s(a.layer_start, a.phase, a.batch) for a in actions
                if isinstance(a, Compute) and a.phase in ("F", "B")) for actions in stripped.actions]
    assert ends == pytest.approx(sums)


def _loop_rank_main(rank: int):
    import torch
    torch.set_num_threads(1)
    from validator.stage_loop_bench import measure_stage_loops
    return measure_stage_loops(_mlp_workload(), "momentum", "cpu", steps=2, warmup=1)


def test_loops_are_timed_on_two_real_ranks_and_modelled_on_a_real_profile():
    from validator.launch import LaunchConfig, spawn
    measured = spawn(_loop_rank_main, (), LaunchConfig(world_size=2))[0]
    assert set(measured) == set(LOOP_KINDS.values())
    assert all(len(entry[key]) == 2 and min(entry[key]) > 0 for entry in measured.values()
               for key in ("measured_s", "reference_s"))
    profile_path = ROOT / "reports" / "profiles" / "mlp_cpu_ws2_momentum.json"
    import json
    section = stage_loops_section(json.loads(profile_path.read_text()), _mlp_workload(), measured)
    for mode, entry in section.items():
        assert entry["kind"] == measured[mode]["kind"] and min(entry["modelled_s"]) > 0
        assert min(entry["modelled_reference_s"]) > 0 and entry["reference_s"] == measured[mode]["reference_s"]
        assert entry["factor"] == pytest.approx((sum(entry["measured_s"]) / sum(entry["reference_s"]))
                                                / (sum(entry["modelled_s"]) / sum(entry["modelled_reference_s"])))


def test_an_implausible_factor_leaves_the_section_out_with_a_note():
    from validator.calibration_document import loadable_document
    doc = _with_section({"stash": {"kind": "pipedream", "factor": 3.5}})
    kept = loadable_document(doc, "p.json")
    assert "stage_loops" not in kept and any("stage_loops.stash.factor" in note for note in kept["notes"])
    assert profile_from_dict(kept).stage_loops == {}
