"""Calibration profiles (simulator.profile, format ghpsim-profile/2) and their cost model."""

from __future__ import annotations

import json

import pytest

from simulator.costs import single_device_step_s
from simulator.errors import ScenarioError
from simulator.profile import FORMAT, load_profile, profile_document, profile_from_dict
from simulator.profile_costs import ProfileCosts
from simulator.zoo import build_model

PARAMS = dict(input_dim=64, hidden_dim=64, num_hidden_layers=2, num_classes=10)


def workload():
    return build_model("mlp", **PARAMS)


def document(kind: str = "cuda") -> dict:
    doc = {
        "format": FORMAT,
        "device": {"kind": kind, "name": "test device", "num_threads": 1},
        "backend": "gloo",
        "world_size": 4,
        "model": {"name": "mlp", "params": PARAMS, "layer_names": ["fc1", "fc2", "fc3"],
                  "num_params": workload().num_params},
        "layers": [{"name": f"fc{i + 1}",
                    "forward": {"intercept_s": 1e-5 * (i + 1), "per_sample_s": 1e-6},
                    "backward": {"intercept_s": 2e-5, "per_sample_s": 2e-6 * (i + 1)}} for i in range(3)],
        "optimizer": {"name": "sgd", "intercept_s": 5e-5, "per_param_s": 1e-9},
        "weight_passes": {"stash": {"intercept_s": 1e-5, "per_param_s": 2e-10}},
        "topk": {"0.01": {"intercept_s": 1e-5, "per_element_s": 1e-9}},
        "p2p": {"latency_s": 3e-5, "bandwidth_bytes_per_s": 2e9},
        "allreduce": {"2": {"latency_s": 6e-5, "bandwidth_bytes_per_s": 1e9},
                      "4": {"latency_s": 1e-4, "bandwidth_bytes_per_s": 5e8}},
        "allgather": {"4": {"latency_s": 2e-4, "bandwidth_bytes_per_s": 4e8}},
        "compute_slowdown": {"1": 1.0, "2": 1.5, "4": 2.0},
        "provenance": {"created_utc": "2026-01-01T00:00:00+00:00"},
    }
    if kind == "cpu":
        doc["shared_processors"] = {"parallelism": 2.0, "measured_ranks": 4,
                                    "compute_slowdown_while": {"collective": 1.5},
                                    "comm_slowdown_while_computing": {"collective": 2.0}}
    return doc


def write(tmp_path, doc, name="profile.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_round_trip_and_linear_fits(tmp_path):
    profile = load_profile(write(tmp_path, document()))
    assert profile.num_layers == 3 and profile.world_size == 4 and profile.shared_processors is None
    again = profile_from_dict(json.loads(json.dumps(profile_document(profile))))
    assert profile_document(again) == profile_document(profile)
    costs = ProfileCosts(profile, workload())
    assert costs.compute_s(1, "F", 10) == pytest.approx(2e-5 + 10e-6)
    assert costs.compute_s(2, "B", 4) == pytest.approx(2e-5 + 4 * 6e-6)
    assert costs.optimizer_s(1000) == pytest.approx(5e-5 + 1e-6)
    assert costs.weight_pass_s("stash", 1000) == pytest.approx(1e-5 + 2e-7)
    assert costs.topk_s(1000, 0.01) == pytest.approx(1e-5 + 1e-6)
    expected_step = sum(costs.compute_s(i, p, 8) for i in range(3) for p in "FB") + costs.optimizer_s(workload().num_params)
    assert single_device_step_s(costs, workload(), 8) == pytest.approx(expected_step)


def test_communication_fits_by_group_size(tmp_path):
    costs = ProfileCosts(load_profile(write(tmp_path, document())), workload())
    assert costs.communication is costs
    assert costs.p2p_s(2e6) == pytest.approx(3e-5 + 1e-3)
    assert costs.collective_s("allreduce", 1e6, 2) == pytest.approx(6e-5 + 1e-3)
    assert costs.collective_s("allgather", 4e5, 4) == pytest.approx(2e-4 + 1e-3)
    assert costs.collective_s("allreduce", 1e6, 1) == 0.0
    with pytest.raises(ScenarioError, match=r"no fit for a group of 3 ranks \(profiled group sizes: 2, 4; world size 4\): calibrate at world size 3"):
        costs.collective_s("allreduce", 1e6, 3)


def test_fits_rescale_to_the_ranks_computing_at_once(tmp_path):
    profile = load_profile(write(tmp_path, document()))
    as_calibrated = ProfileCosts(profile, workload())
    two_at_once = ProfileCosts(profile, workload(), concurrent_ranks=2)
    assert two_at_once.compute_s(0, "F", 8) == pytest.approx(as_calibrated.compute_s(0, "F", 8) * 1.5 / 2.0)
    assert two_at_once.optimizer_s(100) == pytest.approx(as_calibrated.optimizer_s(100) * 0.75)
    with pytest.raises(ScenarioError, match="no factor for 3 ranks"):
        ProfileCosts(profile, workload(), concurrent_ranks=3)


def test_a_shared_host_profile_costs_one_rank_alone_and_plays_on_the_pool(tmp_path):
    profile = load_profile(write(tmp_path, document("cpu")))
    costs = ProfileCosts(profile, workload())
    assert costs.shared_processors.parallelism == 2.0
    assert costs.compute_s(0, "F", 8) == pytest.approx((1e-5 + 8e-6) / 2.0)  # slowdown[1] / slowdown[4]


def test_a_weight_pass_without_a_fit_scales_the_update_by_the_words_it_moves(tmp_path):
    doc = document()
    doc.pop("weight_passes")
    costs = ProfileCosts(load_profile(write(tmp_path, doc)), workload())
    # sgd moves 12 bytes a parameter; an accumulate 3 fp32 words = 12 bytes: the update's slope
    assert costs.weight_pass_s("accumulate", 1000) == pytest.approx(5e-5 + 1e-6)


def test_model_mismatch_names_both(tmp_path):
    profile = load_profile(write(tmp_path, document()))
    other = build_model("mlp", input_dim=64, hidden_dim=64, num_hidden_layers=3, num_classes=10)
    with pytest.raises(ScenarioError) as error:
        ProfileCosts(profile, other)
    assert "profile.json" in str(error.value) and "3 vs 4 layers" in str(error.value)
    assert str(error.value).endswith("calibrate with this scenario's model")
    with pytest.raises(ScenarioError, match="resnet20"):
        ProfileCosts(profile, build_model("resnet20"))
    with pytest.raises(ScenarioError, match="optimizer"):
        ProfileCosts(profile, workload(), optimizer="adam")


def _broken(mutate):
    doc = document()
    mutate(doc)
    return doc


@pytest.mark.parametrize("doc, field", [
    ("{not json", "not a JSON profile"),
    ("[1, 2]", "format"),
    ({"format": "something-else/3"}, "format: expected 'ghpsim-profile/2'"),
    ({"format": "ghpsim-profile/1"}, "older profile format; this ghpsim reads 'ghpsim-profile/2': calibrate again"),
    (_broken(lambda d: d.pop("layers")), "layers: Field required"),
    (_broken(lambda d: d["layers"][1]["forward"].update(per_sample_s="fast")), "layers.1.forward.per_sample_s"),
    (_broken(lambda d: d["layers"][2]["backward"].update(intercept_s=-1)), "layers.2.backward.intercept_s"),
    (_broken(lambda d: d["layers"].pop()), "2 entries but model.layer_names has 3"),
    (_broken(lambda d: d["allreduce"]["2"].update(bandwidth_bytes_per_s=0)), "allreduce.2.bandwidth_bytes_per_s"),
    (_broken(lambda d: d.pop("p2p")), "p2p: required when world_size is 4"),
    (_broken(lambda d: d["device"].update(kind="tpu")), "device.kind"),
    (_broken(lambda d: d["optimizer"].pop("per_param_s")), "optimizer.per_param_s"),
    (_broken(lambda d: d.update(cold_start={})), "cold_start: Extra inputs are not permitted"),
    (_broken(lambda d: d.update(shared_processors={"parallelism": 0, "measured_ranks": 2})),
     "shared_processors.parallelism"),
])
def test_malformed_old_or_foreign_files_are_one_line_errors(tmp_path, doc, field):
    path = write(tmp_path, doc, "bad_profile.json")
    with pytest.raises(ScenarioError) as error:
        load_profile(path)
    message = str(error.value)
    assert str(path) in message and field in message
    assert "\n" not in message and len(message) <= 300


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="profile not found"):
        load_profile(tmp_path / "nope.json")


def test_world_size_one_needs_no_communication():
    doc = document()
    doc.update(world_size=1, allreduce={}, allgather={}, compute_slowdown={"1": 1.0})
    doc.pop("p2p")
    profile = profile_from_dict(doc)
    with pytest.raises(ScenarioError, match="p2p: not profiled"):
        ProfileCosts(profile, workload()).p2p_s(100)


@pytest.mark.parametrize("setting, message", [
    ("strategy.dp_sync=parameter_server", "strategy.dp_sync: parameter_server cannot be priced from the calibration"),
    ("strategy.collective=tree", "strategy.collective: tree cannot be priced from the calibration"),
    ("cluster.degraded_links={node0: 0.5}", "cluster.degraded_links: cannot be priced from the calibration"),
])
def test_a_calibration_profile_refuses_collectives_it_did_not_measure(setting, message):
    """A calibration profile times the backend's own allreduce over the links as they were: a
    parameter server, a chosen algorithm or a degraded link would be priced as that allreduce
    without a word, so each is refused in one line."""
    from simulator.model_source import resolve_workload
    from simulator.profile_costs import scenario_profile_costs
    from simulator.scenario import load_scenario
    profile = "reports/profiles/mlp_cpu_ws2.json"
    scenario = load_scenario("scenarios/validation/mlp_cpu.yaml", ["cluster.gpus_per_node=2", setting])
    with pytest.raises(ScenarioError, match=message):
        scenario_profile_costs(profile, scenario, resolve_workload(scenario.model, scenario.base_dir))
    plain = load_scenario("scenarios/validation/mlp_cpu.yaml", ["cluster.gpus_per_node=2"])
    assert scenario_profile_costs(profile, plain, resolve_workload(plain.model, plain.base_dir)) is not None


@pytest.mark.parametrize("field, value", [("world_size", "2"), ("world_size", True)])
def test_a_profile_number_given_as_text_or_a_boolean_is_refused(tmp_path, field, value):
    """JSON numbers only where the profile expects a number (the scenario loader refuses text too):
    pydantic's lax mode would read "2" as 2 and true as 1."""
    document = json.loads(open("reports/profiles/mlp_cpu_ws2.json").read())
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**document, field: value}))
    with pytest.raises(ScenarioError, match=f"{field}: expected a number, got {value!r}"):
        load_profile(path)
    path.write_text(json.dumps(document))
    assert load_profile(path).world_size == document["world_size"]


def test_fsdp_host_work_goes_with_each_fsdp2_copy_pass_and_nothing_else(tmp_path):
    """The profile's `fsdp` (validator/fsdp_bench.py), a + b x the unit's parameter tensors, is added
    to every FSDP2 copy pass, one of which goes with each all-gather and reduce-scatter, and to no
    other pass."""
    without = ProfileCosts(load_profile(write(tmp_path, document())), workload())
    doc = document()
    doc["fsdp"] = {"collective_overhead_s": 1e-3, "per_tensor_s": 1e-4, "layer_tensors": [2, 2, 3]}
    with_host = ProfileCosts(load_profile(write(tmp_path, doc, "fsdp.json")), workload())
    for name in ("fsdp_copy_out", "fsdp_copy_in", "fsdp_copy_in_upcast"):
        assert with_host.weight_pass_s(name, 1000, layers=(2, 3)) == pytest.approx(
            without.weight_pass_s(name, 1000) + 1e-3 + 3 * 1e-4)
    assert with_host.weight_pass_s("fsdp_copy_out", 1000, layers=(0, 2)) == pytest.approx(
        without.weight_pass_s("fsdp_copy_out", 1000) + 1e-3 + 4 * 1e-4)
    for name in ("stash", "accumulate"):
        assert with_host.weight_pass_s(name, 1000, layers=(0, 1)) == without.weight_pass_s(name, 1000)
    assert with_host.weight_pass_s("fsdp_copy_out", 0) == 0.0  # a unit without parameters gathers nothing
    for bad, needle in (({"collective_overhead_s": -1e-3}, "fsdp.collective_overhead_s"),
                        ({"collective_overhead_s": 0.0, "layer_tensors": [2, 2]}, "fsdp.layer_tensors: 2 entries")):
        doc["fsdp"] = bad
        with pytest.raises(ScenarioError, match=needle):
            load_profile(write(tmp_path, doc, "bad.json"))
