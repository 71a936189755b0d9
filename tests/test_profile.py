"""Calibration profiles: loading, validation and the cost model (no torch needed)."""

from __future__ import annotations

import copy
import json

import pytest

from simulator.costs import BACKWARD, FORWARD, single_device_step_s
from simulator.errors import ScenarioError
from simulator.layer_ages import LayerAges
from simulator.plan import OPTIMIZER, Compute
from simulator.profile import FORMAT, PROFILE_FORMAT, load_profile, profile_from_dict
from simulator.profile_costs import ProfileCosts
from simulator.zoo import build_model

PARAMS = dict(input_dim=64, hidden_dim=64, num_hidden_layers=2, num_classes=10)


def workload():
    return build_model("mlp", **PARAMS)


def document():
    w = workload()
    return {
        "format": FORMAT,
        "created_utc": "2024-01-01T00:00:00+00:00",
        "device": {"kind": "cpu", "name": "test cpu", "num_threads": 1},
        "torch_version": "2.13.0",
        "backend": "gloo",
        "world_size": 4,
        "model": {"name": "mlp", "params": PARAMS, "num_layers": 3, "layer_names": ["fc1", "fc2", "fc3"],
                  "num_params": w.num_params},
        "layers": [
            {"index": i, "name": f"fc{i + 1}",
             "forward": {"intercept_s": 1e-5 * (i + 1), "per_sample_s": 1e-6},
             "backward": {"intercept_s": 2e-5, "per_sample_s": 2e-6 * (i + 1)},
             "batch_sizes": [4, 16, 64], "r2_forward": 0.99, "r2_backward": 0.98}
            for i in range(3)],
        "optimizer": {"name": "sgd", "intercept_s": 5e-5, "per_param_s": 1e-9},
        "p2p": {"latency_s": 3e-5, "bandwidth_bytes_per_s": 2e9, "sizes_bytes": [4096, 16777216]},
        "allreduce": {
            "2": {"latency_s": 6e-5, "bandwidth_bytes_per_s": 1e9, "sizes_bytes": [4096, 16777216]},
            "4": {"latency_s": 1e-4, "bandwidth_bytes_per_s": 5e8, "sizes_bytes": [4096, 16777216]},
        },
        "compute_slowdown": {"1": 1.0, "4": 2.0},
    }


def write(tmp_path, doc, name="profile.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_round_trip_and_linear_compute(tmp_path):
    path = write(tmp_path, document())
    profile = load_profile(path)
    assert profile.source == str(path)
    assert profile.world_size == 4 and profile.backend == "gloo" and profile.device_name == "test cpu"
    assert profile.model_params == PARAMS and profile.num_layers == 3
    assert profile.layers[1].batch_sizes == (4, 16, 64)
    assert profile.layers[0].forward.r2 == 0.99
    assert profile.compute_slowdown == {1: 1.0, 4: 2.0}

    costs = ProfileCosts(profile, workload(), optimizer="sgd")
    assert costs.compute_s(0, FORWARD, 10) == pytest.approx(1e-5 + 10e-6)
    assert costs.compute_s(2, BACKWARD, 8) == pytest.approx(2e-5 + 8 * 6e-6)
    assert costs.compute_s(1, FORWARD, 0) == pytest.approx(2e-5)
    # linear in the batch
    assert costs.compute_s(1, BACKWARD, 30) - costs.compute_s(1, BACKWARD, 20) == pytest.approx(
        costs.compute_s(1, BACKWARD, 20) - costs.compute_s(1, BACKWARD, 10))
    assert costs.optimizer_s(1_000_000) == pytest.approx(5e-5 + 1e-3)
    assert costs.optimizer_s(0) == 0.0
    assert single_device_step_s(costs, workload(), 10) > 0
    with pytest.raises(ValueError):
        costs.compute_s(0, "X", 1)


def test_the_single_pass_time_is_added_to_every_pass_at_the_fits_concurrency(tmp_path):
    doc = document()
    doc["cold_start"] = {"gap_s": 0.05, "decay_s": 0.01, "batch_size": 16, "forward_factors": [1.0] * 3,
                         "backward_factors": [1.0] * 3, "optimizer_factor": 1.0,
                         "forward_single_pass_s": [1e-4, 0.0, 3e-4], "backward_single_pass_s": [2e-4, 0.0, 0.0]}
    plain, single = document(), ProfileCosts(load_profile(write(tmp_path, doc)), workload())
    base = ProfileCosts(load_profile(write(tmp_path, plain, "plain.json")), workload())
    for batch in (1, 16, 64):  # the same seconds at every batch size
        assert single.compute_s(0, FORWARD, batch) == pytest.approx(base.compute_s(0, FORWARD, batch) + 1e-4)
        assert single.compute_s(2, FORWARD, batch) == pytest.approx(base.compute_s(2, FORWARD, batch) + 3e-4)
        assert single.compute_s(0, BACKWARD, batch) == pytest.approx(base.compute_s(0, BACKWARD, batch) + 2e-4)
        assert single.compute_s(1, BACKWARD, batch) == pytest.approx(base.compute_s(1, BACKWARD, batch))
    # rescaled with the fit to one rank alone (compute_slowdown[4] = 2)
    alone = ProfileCosts(load_profile(write(tmp_path, doc)), workload(), concurrent_ranks=1)
    assert alone.compute_s(2, FORWARD, 8) == pytest.approx(base.compute_s(2, FORWARD, 8) / 2 + 1.5e-4)


def test_comm_times(tmp_path):
    costs = ProfileCosts(load_profile(write(tmp_path, document())), workload())
    assert costs.p2p_s(2e6) == pytest.approx(3e-5 + 1e-3)
    assert costs.p2p_s(0) == 0.0
    assert costs.allreduce_s(1e6, 2) == pytest.approx(6e-5 + 1e-3)
    assert costs.allreduce_s(1e6, 4) == pytest.approx(1e-4 + 2e-3)
    assert costs.allreduce_s(1e6, 1) == 0.0
    with pytest.raises(ScenarioError, match=r"group of 8 ranks; profiled group sizes: 2, 4") as error:
        costs.allreduce_s(1e6, 8)
    assert "profile.json" in str(error.value)


def test_concurrent_ranks_rescales_compute(tmp_path):
    profile = load_profile(write(tmp_path, document()))
    at_four = ProfileCosts(profile, workload())
    alone = ProfileCosts(profile, workload(), concurrent_ranks=1)
    assert alone.compute_s(0, FORWARD, 10) == pytest.approx(at_four.compute_s(0, FORWARD, 10) / 2)
    with pytest.raises(ScenarioError, match="compute_slowdown: no factor for 3 ranks"):
        ProfileCosts(profile, workload(), concurrent_ranks=3)


def test_update_and_weight_passes_rescale_like_the_layers(tmp_path):
    """All of a profile's compute fits were timed with world_size ranks at once: on a shared host the
    engine plays one rank's work on the processor-sharing pool, so the update and the asynchronous
    pipelines' weight passes are rescaled to one rank alone as the layers are (counted twice before)."""
    doc = document()
    doc["weight_passes"] = {name: {"intercept_s": 1e-5, "per_param_s": 2e-9} for name in ("stash", "predict", "accumulate")}
    profile = load_profile(write(tmp_path, doc))
    at_four = ProfileCosts(profile, workload())
    for alone in (ProfileCosts(profile, workload(), concurrent_ranks=1), ProfileCosts(profile, workload(), shared_host=True)):
        assert alone.optimizer_s(10_000) == pytest.approx(at_four.optimizer_s(10_000) / 2)
        assert at_four.optimizer_s(10_000) == pytest.approx(5e-5 + 1e-5)
        for name in ("stash", "predict", "accumulate"):
            assert alone.weight_pass_s(name, 10_000) == pytest.approx((1e-5 + 2e-5) / 2)
    older = ProfileCosts(load_profile(write(tmp_path, document(), "older.json")), workload(), shared_host=True)
    # no weight_passes section: the update's fit scaled by the words moved (stash 2 of sgd's 3), then rescaled
    assert older.weight_pass_s("stash", 10_000) == pytest.approx((5e-5 + 1e-9 * 10_000 * 2 / 3) / 2)


def test_weight_passes_timed_alone_rescale_from_one_rank(tmp_path):
    """Profiles since 2026-11 time the weight passes on rank 0 alone (`ranks_at_once: 1`): a shared
    host plays them as timed, and k ranks at once scales them by compute_slowdown[k] / [1]."""
    doc = document()
    doc["weight_passes"] = {name: {"intercept_s": 1e-5, "per_param_s": 2e-9, "ranks_at_once": 1}
                            for name in ("stash", "predict", "accumulate")}
    profile = load_profile(write(tmp_path, doc))
    assert profile.weight_pass_ranks_at_once == {"stash": 1, "predict": 1, "accumulate": 1}
    at_four, shared = ProfileCosts(profile, workload()), ProfileCosts(profile, workload(), shared_host=True)
    for name in ("stash", "predict", "accumulate"):
        assert shared.weight_pass_s(name, 10_000) == pytest.approx(1e-5 + 2e-5)
        assert at_four.weight_pass_s(name, 10_000) == pytest.approx((1e-5 + 2e-5) * 2)
    assert at_four.optimizer_s(10_000) == pytest.approx(5e-5 + 1e-5)  # the update: still all ranks at once
    older = load_profile(write(tmp_path, {**doc, "weight_passes": {"stash": {"intercept_s": 1e-5, "per_param_s": 2e-9}}},
                               "older.json"))
    assert older.weight_pass_ranks_at_once == {"stash": 4}  # no field: timed with world_size ranks at once
    doc["weight_passes"]["stash"]["ranks_at_once"] = 0
    with pytest.raises(ScenarioError, match="weight_passes.stash.ranks_at_once"):
        load_profile(write(tmp_path, doc, "bad.json"))
    doc["weight_passes"]["stash"]["ranks_at_once"] = 3
    with pytest.raises(ScenarioError, match="compute_slowdown: no factor for 3 ranks"):
        ProfileCosts(load_profile(write(tmp_path, doc, "three.json")), workload(), shared_host=True)


def test_update_timed_in_cycle_replaces_the_back_to_back_fit(tmp_path):
    """Profiles since 2026-11-23 time the update at the end of a micro-batch cycle, rank 0 alone
    (`optimizer.in_cycle`): it replaces the back-to-back fit, rescaled like the weight passes, and
    the engine adds no cold-start factor to it; profiles without it predict as before."""
    doc = document()
    doc["optimizer"]["in_cycle"] = {"intercept_s": 2e-4, "per_param_s": 3e-9, "ranks_at_once": 1}
    profile = load_profile(write(tmp_path, doc))
    assert profile.optimizer_in_cycle.at(10_000) == pytest.approx(2e-4 + 3e-5)
    shared, at_four = ProfileCosts(profile, workload(), shared_host=True), ProfileCosts(profile, workload())
    assert shared.update_timed_in_cycle and shared.optimizer_s(10_000) == pytest.approx(2e-4 + 3e-5)
    assert at_four.optimizer_s(10_000) == pytest.approx((2e-4 + 3e-5) * 2)  # compute_slowdown[4] / [1]
    assert at_four.optimizer_s(0) == 0.0
    doc["cold_start"] = {"gap_s": 0.05, "decay_s": 0.004, "batch_size": 16, "forward_factors": [1.0] * 3,
                         "backward_factors": [1.0] * 3, "optimizer_factor": 1.8}
    cold = ProfileCosts(load_profile(write(tmp_path, doc, "cold.json")), workload(), shared_host=True)
    update = Compute(id=0, phase=OPTIMIZER, layer_start=0, layer_end=3, batch=0, num_params=10_000)
    assert LayerAges([cold]).factor(update, 0, 1.0) == 1.0  # its fit holds the cold already
    del doc["optimizer"]["in_cycle"]
    older = ProfileCosts(load_profile(write(tmp_path, doc, "older.json")), workload(), shared_host=True)
    assert not older.update_timed_in_cycle and older.optimizer_s(10_000) == pytest.approx((5e-5 + 1e-5) / 2)
    assert LayerAges([older]).factor(update, 0, 1.0) == pytest.approx(1.8)  # a step's pause: the full cold factor
    doc["optimizer"]["in_cycle"] = {"intercept_s": 2e-4, "per_param_s": -1e-9, "ranks_at_once": 1}
    with pytest.raises(ScenarioError, match="optimizer.in_cycle.per_param_s"):
        load_profile(write(tmp_path, doc, "bad.json"))


def test_model_mismatch_names_both(tmp_path):
    profile = load_profile(write(tmp_path, document()))
    other = build_model("mlp", input_dim=64, hidden_dim=64, num_hidden_layers=3, num_classes=10)
    with pytest.raises(ScenarioError) as error:
        ProfileCosts(profile, other)
    message = str(error.value)
    assert "profile.json" in message and "3 layers" in message and "4 layers" in message
    with pytest.raises(ScenarioError, match="resnet20"):
        ProfileCosts(profile, build_model("resnet20"))
    wider = build_model("mlp", input_dim=64, hidden_dim=128, num_hidden_layers=2, num_classes=10)
    with pytest.raises(ScenarioError, match="parameters"):
        ProfileCosts(profile, wider)
    with pytest.raises(ScenarioError, match="optimizer"):
        ProfileCosts(profile, workload(), optimizer="adam")


def _broken(mutate):
    doc = document()
    mutate(doc)
    return doc


@pytest.mark.parametrize("doc, field", [
    ("{not json", "not a JSON calibration profile"),
    ("[1, 2]", "format"),
    ({"format": "something-else/3"}, "format: expected 'ghpsim-profile/1'"),
    ({"hello": "world"}, "format"),
    (_broken(lambda d: d.pop("layers")), "layers: missing field"),
    (_broken(lambda d: d["layers"][1]["forward"].update(per_sample_s="fast")), "layers[1].forward.per_sample_s"),
    (_broken(lambda d: d["layers"][2]["backward"].update(intercept_s=-1)), "layers[2].backward.intercept_s"),
    (_broken(lambda d: d["layers"].pop()), "layers: 2 entries but model.num_layers is 3"),
    (_broken(lambda d: d["layers"][0].update(index=5)), "layers[0].index"),
    (_broken(lambda d: d["allreduce"]["2"].update(bandwidth_bytes_per_s=0)), "allreduce.2.bandwidth_bytes_per_s"),
    (_broken(lambda d: d["allreduce"].update(x={})), "allreduce.x"),
    (_broken(lambda d: d.pop("p2p")), "p2p: missing field"),
    (_broken(lambda d: d["device"].update(kind="tpu")), "device.kind"),
    (_broken(lambda d: d["optimizer"].pop("per_param_s")), "optimizer.per_param_s: missing field"),
    (_broken(lambda d: d["compute_slowdown"].update({"4": "x"})), "compute_slowdown.4"),
    (_broken(lambda d: d.update(model="mlp")), "model: expected an object"),
    (_broken(lambda d: d.update(overlap={"world_size": 4, "collective": {"compute_slowdown": 0, "comm_slowdown": 2}})),
     "overlap.collective.compute_slowdown"),
    (_broken(lambda d: d.update(overlap={"collective": {}})), "overlap.world_size: missing field"),
])
def test_malformed_or_foreign_files_raise_scenario_error(tmp_path, doc, field):
    path = write(tmp_path, doc, "bad_profile.json")
    with pytest.raises(ScenarioError) as error:
        load_profile(path)
    message = str(error.value)
    assert str(path) in message and field in message
    assert "\n" not in message


def test_overlap_section_becomes_the_shared_host_interference(tmp_path):
    doc = document()
    doc["overlap"] = {"world_size": 4, "collective": {"compute_slowdown": 1.3, "comm_slowdown": 2.5, "stream_s": 0.1},
                      "p2p": {"compute_slowdown": 1.1, "comm_slowdown": 1.7}}
    profile = load_profile(write(tmp_path, doc))
    shared = ProfileCosts(profile, workload(), shared_host=True).interference
    assert shared.world_size == 4
    assert shared.compute_slowdown == {"collective": 1.3, "p2p": 1.1}
    assert shared.comm_slowdown == {"collective": 2.5, "p2p": 1.7}
    assert ProfileCosts(profile, workload()).interference is None  # only on a shared host
    assert load_profile(write(tmp_path, document(), "old.json")).overlap is None  # older profiles


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="nope.json"):
        load_profile(tmp_path / "nope.json")


def test_world_size_one_needs_no_comm():
    doc = document()
    doc.update(world_size=1, p2p=None, allreduce={}, compute_slowdown={"1": 1.0})
    costs = ProfileCosts(profile_from_dict(copy.deepcopy(doc)), workload())
    assert costs.allreduce_s(1e6, 1) == 0.0
    with pytest.raises(ScenarioError, match="p2p"):
        costs.p2p_s(100)


def test_format_is_documented():
    import simulator.profile as module
    for key in ("compute_slowdown", "per_sample_s", "bandwidth_bytes_per_s", "intercept_s", "per_param_s"):
        assert key in PROFILE_FORMAT
    assert PROFILE_FORMAT in module.__doc__


def test_allreduce_stream_gives_the_streamed_allreduce_factor_on_a_shared_host(tmp_path):
    doc = document()
    # 4-rank fit at 1 MiB: 1e-4 + 2**20 / 5e8 = 2.197 ms; the stream: 10 of them in 11 ms -> 1.1 ms each
    doc["overlap"] = {"world_size": 4, "collective": {"compute_slowdown": 1.3, "comm_slowdown": 2.5,
                                                      "size_bytes": 2**20, "num_messages": 10, "stream_s": 0.011}}
    profile = load_profile(write(tmp_path, doc))
    assert profile.allreduce_stream.num_messages == 10
    expected = 0.0011 / (1e-4 + 2**20 / 5e8)
    assert ProfileCosts(profile, workload(), shared_host=True).streamed_allreduce_factor == pytest.approx(expected)
    assert ProfileCosts(profile, workload()).streamed_allreduce_factor == 1.0  # only on a shared host
    doc["overlap"]["collective"]["stream_s"] = 0.05  # a stream slower than one at a time: noise, capped at 1
    assert ProfileCosts(load_profile(write(tmp_path, doc, "slow.json")), workload(),
                        shared_host=True).streamed_allreduce_factor == 1.0
    old = load_profile(write(tmp_path, document(), "old.json"))
    assert old.allreduce_stream is None
    assert ProfileCosts(old, workload(), shared_host=True).streamed_allreduce_factor == 1.0
