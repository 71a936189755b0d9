"""The line fitter and a real (quick) calibration of a tiny MLP at world size 2 on CPU."""

from __future__ import annotations

import copy
from dataclasses import replace
import os
import statistics
import time
import warnings

import pytest

torch = pytest.importorskip("torch")

from simulator.profile import load_profile  # noqa: E402
from simulator.profile_costs import ProfileCosts  # noqa: E402
from simulator.zoo import build_model  # noqa: E402
from validator.calibration_phases import weight_pass_ranks_at_once  # noqa: E402
from validator.microbench import ClampedFitWarning, fit_line, fit_linear, time_layers, time_optimizer  # noqa: E402

MODELS = "validator.models"


def tiny_mlp():
    return build_model("mlp", input_dim=64, hidden_dim=64, num_hidden_layers=2, num_classes=10)


# ----------------------------------------------------------------------------- fitting

def test_fit_linear_recovers_a_known_line():
    xs = [1, 2, 4, 8, 16]
    intercept, slope, r2 = fit_linear(xs, [0.5 + 0.25 * x for x in xs])
    assert intercept == pytest.approx(0.5)
    assert slope == pytest.approx(0.25)
    assert r2 == pytest.approx(1.0)


def test_fit_linear_weighted_recovers_alpha_beta():
    sizes = [4096 * 4 ** k for k in range(7)]
    times = [20e-6 + s / 2e9 for s in sizes]
    intercept, slope, r2 = fit_linear(sizes, times, weights=[1 / t ** 2 for t in times])
    assert intercept == pytest.approx(20e-6, rel=1e-6)
    assert 1 / slope == pytest.approx(2e9, rel=1e-6)


def test_fit_linear_clamps_a_negative_intercept_and_says_so():
    xs, ys = [1, 2, 3], [0.0, 1.0, 2.0]  # y = -1 + x
    with pytest.warns(ClampedFitWarning, match="negative intercept"):
        intercept, slope, _ = fit_linear(xs, ys)
    assert intercept == 0.0
    assert slope == pytest.approx((0 * 1 + 1 * 2 + 2 * 3) / (1 + 4 + 9))  # through the origin
    assert "negative intercept" in fit_line(xs, ys).clamped


def test_fit_linear_clamps_a_negative_slope():
    with pytest.warns(ClampedFitWarning, match="negative slope"):
        intercept, slope, _ = fit_linear([1, 2, 3], [3.0, 2.9, 2.8])
    assert slope == 0.0 and intercept == pytest.approx(2.9)


def test_fit_linear_exact_line_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_linear([1, 2], [1.0, 2.0])


# ----------------------------------------------------------------------------- single-process benchmarks

def test_time_layers_and_optimizer_single_process():
    workload = tiny_mlp()
    rows = time_layers(workload, [2, 8], repeats=2, warmup=1, models=MODELS)
    assert [row["name"] for row in rows] == ["fc1", "fc2", "fc3"]
    for row in rows:
        assert len(row["forward_s"]) == len(row["backward_s"]) == 2
        assert all(t > 0 for t in row["forward_s"] + row["backward_s"])
    result = time_optimizer("adam", [1000, [torch.zeros(10, 10), torch.zeros(10)]], repeats=2, warmup=1)
    assert [(r["num_params"], r["num_tensors"]) for r in result] == [(1000, 1), (110, 2)]
    assert all(r["median_s"] > 0 for r in result)


def test_time_weight_passes_single_process_leaves_the_modules_alone():
    from validator.weight_pass_bench import time_weight_passes

    modules = [torch.nn.Linear(8, 4), torch.nn.Linear(4, 2048), torch.nn.Linear(2048, 2048)]
    before = [copy.deepcopy(m.state_dict()) for m in modules]
    result = time_weight_passes(modules, [[0], [1, 2]], torch.ones(4, 8), repeats=3, warmup=1, max_copy_age=2)
    assert [(r["num_params"], r["num_tensors"]) for r in result] == [(36, 2), (4 * 2048 + 2048 * 2049 + 2048, 4)]
    for name in ("stash", "predict", "accumulate", "average", "stash_after_plain"):
        # 4 M parameters (16 MiB read, at least as much written) against 36: far above the overheads
        assert result[1][f"{name}_s"] > 5 * result[0][f"{name}_s"] > 0
    # the forward on the stashed copy against the same forward through the modules: never negative
    assert all(r["copy_forward_s"] >= 0 for r in result)
    # both backwards timed in the cycle; 4 M parameters' weight gradients against 36 parameters'
    assert all(r["module_backward_s"] > 0 and r["copy_backward_s"] > 0 for r in result)
    assert result[1]["module_backward_s"] > 5 * result[0]["module_backward_s"]
    assert result[1]["copy_backward_s"] > 5 * result[0]["copy_backward_s"]
    # the backward on copies one and two forwards old, in their own cycles, and through the modules
    # with 0, 1 and 2 micro-batches in flight before it
    assert all(len(r["aged_copy_backward_s"]) == 2 and min(r["aged_copy_backward_s"]) > 0 for r in result)
    assert min(result[1]["aged_copy_backward_s"]) > 5 * max(result[0]["aged_copy_backward_s"])
    assert all(len(r["aged_module_backward_s"]) == 3 and r["copy_cycle_fresh_s"] > 0 for r in result)
    assert min(result[1]["aged_module_backward_s"]) > 5 * max(result[0]["aged_module_backward_s"])
    for module, state in zip(modules, before):
        assert all(torch.equal(value, module.state_dict()[key]) for key, value in state.items())
        assert all(p.grad is None for p in module.parameters())
    with pytest.raises(ValueError, match="consecutive"):
        time_weight_passes(modules, [[0, 2]], torch.ones(4, 8), repeats=1, warmup=0)


# ----------------------------------------------------------------------------- real calibration

def test_weight_passes_are_timed_by_all_ranks_where_each_has_a_core():
    # a core per rank: they share the memory bus, which the passes stream through, so all at once
    assert weight_pass_ranks_at_once(2, "cpu", cores=2) == 2
    assert weight_pass_ranks_at_once(4, "cpu", cores=8) == 4
    # more ranks than cores: rank 0 alone (all at once, the block medians hid the time-sharing)
    assert weight_pass_ranks_at_once(4, "cpu", cores=2) == 1
    # one rank, and a GPU per rank (unchanged): rank 0 alone
    assert weight_pass_ranks_at_once(1, "cpu", cores=2) == 1
    assert weight_pass_ranks_at_once(2, "cuda", cores=16) == 1


def test_quick_calibration_of_a_tiny_mlp_at_world_size_2(tmp_path):
    from validator.calibrate import calibrate

    workload = tiny_mlp()
    params = dict(input_dim=64, hidden_dim=64, num_hidden_layers=2, num_classes=10)
    out = tmp_path / "profile.json"
    started = time.perf_counter()
    document = calibrate(workload, params, out, world_size=2, batch_sizes=(4, 32), repeats=3, warmup=1,
                         comm_sizes=(4096, 65536, 1 << 20), comm_repeats=3, models=MODELS, verbose=False,
                         layer_passes=2, jitter_passes=3)
    elapsed = time.perf_counter() - started
    assert elapsed < 60, f"quick calibration took {elapsed:.1f} s"
    assert out.is_file()

    profile = load_profile(out)
    assert profile.world_size == 2 and profile.backend == "gloo" and profile.device_kind == "cpu"
    assert profile.num_threads == 1
    assert profile.model_name == "mlp" and profile.num_layers == 3
    for layer in profile.layers:
        assert layer.forward.per_unit_s >= 0 and layer.backward.per_unit_s >= 0
        assert layer.forward.intercept_s >= 0 and layer.backward.intercept_s >= 0
        assert layer.batch_sizes == (4, 32)
    assert profile.p2p.bandwidth_bytes_per_s > 0
    assert set(profile.allreduce) == {2}
    assert profile.allreduce[2].bandwidth_bytes_per_s > 0
    assert profile.compute_slowdown[1] == 1.0 and profile.compute_slowdown[2] > 0
    assert profile.overlap is not None and profile.overlap.world_size == 2
    for kind in ("collective", "p2p"):  # each measured with a stream of at least the default length
        assert profile.overlap.compute_slowdown[kind] > 0 and profile.overlap.comm_slowdown[kind] > 0
        assert document["overlap"][kind]["num_messages"] >= {"collective": 16, "p2p": 64}[kind]
    handoff = document["handoff"]  # the chain: rank 1 always waits for rank 0's first message
    assert handoff["world_size"] == 2 and handoff["num_messages"] >= 1 and handoff["mean_delay_s"] > 0
    assert profile.handoff.mean_delay_s == handoff["mean_delay_s"]
    preposted = handoff["preposted"]  # the same chain with receives posted one ahead
    assert preposted["num_messages"] >= 1 and preposted["mean_delay_s"] > 0
    assert profile.handoff.preposted_mean_delay_s == preposted["mean_delay_s"]
    assert preposted["send_post_s"] > 0 and profile.handoff.preposted_send_post_s == preposted["send_post_s"]
    assert profile.handoff.preposted_send_post_mean_s == preposted["send_post_mean_s"] > 0  # the tail's mean too
    cycle = handoff["cycle"]  # every rank in the asynchronous 1F1B cycle at once
    assert cycle["num_messages"] >= 1 and cycle["num_ready"] >= 1
    assert profile.handoff.cycle.mean_delay_s == cycle["mean_delay_s"] > 0
    assert profile.handoff.cycle.send_post_s == cycle["send_post_s"] > 0
    # the layers in that cycle's windows against the shared cores (`cycle_compute`), five rounds
    assert len(document["cycle_compute"]["round_efficiencies"]) == 5
    assert profile.cycle_compute.efficiency == document["cycle_compute"]["efficiency"]
    assert 0.2 <= profile.cycle_compute.efficiency <= 2.0 and profile.cycle_compute.host_parallelism > 0
    # the asynchronous kinds' stage loops beside 1F1B's (SGD: no SpecTrain); a stalled rank's ratio
    # would leave the section out with a note instead
    if "stage_loops" in document:
        assert set(document["stage_loops"]) == {"stash", "newest"}
        for mode, entry in document["stage_loops"].items():
            assert len(entry["measured_s"]) == len(entry["modelled_reference_s"]) == 2
            assert profile.stage_loops[mode].factor == entry["factor"]
    else:
        assert any(note.startswith("stage_loops.") for note in document["notes"])
    passes = document["weight_passes"]  # on the optimizer's parameter sets
    assert set(passes) == {"stash", "predict", "repredict", "accumulate", "average", "copy_forward"}
    assert all(entry["num_params"] == document["optimizer"]["num_params"] for entry in passes.values())
    assert all(t > 0 for t in passes["repredict"]["medians_s"])  # timed, not derived
    # the stash timed right after an update (the runtime's order); the cycle's, after the modules'
    # forward and backward, kept beside it, one per set
    after_plain = passes["stash"]["after_plain_medians_s"]
    assert len(after_plain) == len(passes["stash"]["medians_s"]) and all(t > 0 for t in after_plain)
    assert set(profile.weight_passes) == {"stash", "predict", "repredict", "accumulate", "average", "copy_forward"}
    assert all(t >= 0 for t in passes["copy_forward"]["medians_s"])
    ratios = document["copy_backward"]["ratios"]  # the backward on the copy over the modules', per set
    assert len(ratios) == len(document["optimizer"]["num_params"]) and all(r > 0 for r in ratios)
    assert profile.copy_backward.factor == document["copy_backward"]["factor"] == pytest.approx(
        statistics.median(ratios))
    # 2 ranks: a copy at most one forward old; its factor the median over the sets
    ages = document["copy_backward"]["age_ratios"]
    assert len(ages) == len(ratios) and all(len(per_set) == 1 for per_set in ages)
    assert profile.copy_backward.age_factors == pytest.approx(
        (document["copy_backward"]["factor"], statistics.median(per_set[0] for per_set in ages)))
    growth = document["copy_backward"]["copy_age_growth"]  # the copy's over the modules', per set
    assert len(growth) == len(ratios) and all(len(per_set) == 1 and per_set[0] > 0 for per_set in growth)
    assert profile.copy_backward.copy_age_factors == pytest.approx(
        (profile.copy_backward.factor, profile.copy_backward.factor * statistics.median(g[0] for g in growth)))
    at_once = weight_pass_ranks_at_once(2, "cpu")  # both ranks where each has a core, else rank 0 alone
    assert all(entry["ranks_at_once"] == at_once for entry in passes.values())
    assert set(profile.weight_pass_ranks_at_once.values()) == {at_once}
    in_cycle = document["optimizer"]["in_cycle"]  # the update at the end of those cycles
    assert in_cycle["ranks_at_once"] == at_once and in_cycle["num_params"] == document["optimizer"]["num_params"]
    assert all(t > 0 for t in in_cycle["medians_s"])
    assert profile.optimizer_in_cycle is not None and profile.optimizer_in_cycle_ranks_at_once == at_once
    for entry in (*passes.values(), in_cycle):  # timed all at once: rank 0 alone kept beside, as recorded
        assert ("alone" in entry) == (at_once > 1)
        if at_once > 1:
            assert entry["alone"]["ranks_at_once"] == 1 and len(entry["alone"]["medians_s"]) == len(entry["medians_s"])
    if at_once > 1:
        assert all(t > 0 for t in in_cycle["alone"]["medians_s"])
    cold = document["cold_start"]  # at the middle batch size, one factor per layer
    assert cold["batch_size"] == 32 and len(cold["forward_factors"]) == len(cold["backward_factors"]) == 3
    assert profile.cold_start is not None and profile.cold_start.forward_factors == tuple(cold["forward_factors"])
    assert profile.cold_start.optimizer_factor == cold["optimizer_factor"] > 0
    assert cold["ranks_at_once"] == min(2, os.cpu_count() or 1)  # a single hot pass over a block iteration:
    for phase in ("forward", "backward"):
        assert len(cold[f"{phase}_single_pass_s"]) == 3 and all(t >= 0 for t in cold[f"{phase}_single_pass_s"])
    assert profile.cold_start.forward_single_pass_s == tuple(cold["forward_single_pass_s"])
    sweep = document["layer_sweep"]  # per layer, one ratio per calibrated batch size, both ranks at once
    assert sweep["batch_sizes"] == document["layers"][0]["batch_sizes"] and sweep["ranks_at_once"] == min(2, os.cpu_count() or 1)
    for phase in ("forward", "backward"):
        assert len(sweep[f"{phase}_ratios"]) == 3
        assert all(len(row) == len(sweep["batch_sizes"]) and min(row) > 0 for row in sweep[f"{phase}_ratios"])
    assert profile.layer_sweep is not None
    assert profile.layer_sweep.ratio("B", 1, sweep["batch_sizes"][0]) == sweep["backward_ratios"][1][0]
    assert document["format"] == "ghpsim-profile/1"
    spread = document["method"]["layer_passes"]  # two sweeps over the layers, each total vs their median
    assert spread["passes"] == 2 and len(spread["relative_totals"]) == 2
    assert sum(spread["relative_totals"]) == pytest.approx(2.0)
    assert spread["spread_pct"] >= 0 and "median over 2 pass(es)" in document["method"]["layers"]

    comm = document["method"]["comm_passes"]  # p2p and collectives timed after each of the two sweeps
    assert set(comm) == {"p2p", "allreduce.2", "allgather.2"}
    assert all(entry["passes"] == 2 and entry["spread_pct"] >= 0 for entry in comm.values())
    assert "median over 2 pass(es)" in document["method"]["comm"]

    jitter = document["pass_jitter"]  # a burst of 3 whole-model passes before, between and after the 3 phases
    assert jitter["batch_size"] == 32 and jitter["passes_per_burst"] == 3
    assert set(jitter["levels"]) == {"2"} and len(jitter["levels"]["2"]) == 4 * 3
    assert all(len(row) == 2 and min(row) > 0 for row in jitter["levels"]["2"])
    factors = profile.pass_jitter.levels[2]
    assert statistics.median(f for row in factors for f in row) == pytest.approx(1.0)
    offsets = jitter["start_offsets_s"]["2"]  # both ranks on this host: barrier exits on one clock
    assert len(offsets) == 4 * 3 and all(len(row) == 2 and min(row) == 0.0 and max(row) < 1.0 for row in offsets)

    costs = ProfileCosts(profile, workload, optimizer="sgd")
    assert costs.cold_start is profile.cold_start and costs.pass_jitter is profile.pass_jitter
    assert costs.compute_s(0, "F", 32) > 0 and costs.compute_s(2, "B", 4) > 0
    without_sweep = ProfileCosts(replace(profile, layer_sweep=None), workload, optimizer="sgd")
    assert costs.compute_s(2, "B", 32) == pytest.approx(
        without_sweep.compute_s(2, "B", 32) * profile.layer_sweep.ratio("B", 2, 32))
    assert costs.optimizer_s(workload.num_params) > 0
    assert costs.weight_pass_s("stash", workload.num_params) > 0
    assert costs.allreduce_s(1 << 20, 2) >= costs.allreduce_s(4096, 2) > 0  # few, noisy samples
    assert costs.p2p_s(1 << 20) > 0


def _with_cpu_accounting(other_share: float, steal_s: float) -> dict:
    return {"method": {"background_cpu": {"wall_s": 200.0, "num_cpus": 2, "other_processes_cpu_s": 0.0,
                                          "steal_s": steal_s, "share_of_machine": other_share}}, "notes": []}


def test_disturbance_names_other_processes_and_a_vm_hosts_steal():
    from validator.calibrate import disturbance

    assert disturbance(_with_cpu_accounting(0.02, 0.2)) is None  # a quiet calibration
    assert disturbance({"method": {}}) is None  # no accounting (not Linux): nothing to say
    assert disturbance(_with_cpu_accounting(0.0, 196.0)) == "the VM's host took 49% of the machine's CPU time (steal)"
    assert disturbance(_with_cpu_accounting(0.3, 0.0)) == "other processes used 30% of the machine's CPU time"


def test_calibrate_quietly_repeats_a_disturbed_calibration_and_stops_when_quiet(monkeypatch):
    import validator.calibrate as calibrate_module

    results = iter([_with_cpu_accounting(0.0, 196.0), _with_cpu_accounting(0.0, 0.1)])
    calls, said = [], []
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *args, **kwargs: calls.append(args) or next(results))
    document = calibrate_module.calibrate_quietly("workload", world_size=4, say=said.append)
    assert len(calls) == 2 and document["method"]["background_cpu"]["steal_s"] == 0.1
    assert said == ["[calibrate] attempt 1 of 3 disturbed: the VM's host took 49% of the machine's CPU time (steal); "
                    "calibrating again"]
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *args, **kwargs: _with_cpu_accounting(0.0, 196.0))
    said.clear()
    assert calibrate_module.disturbance(calibrate_module.calibrate_quietly(attempts=2, say=said.append))
    assert len(said) == 2 and said[-1].endswith("keeping it, with that note")
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        calibrate_module.calibrate_quietly(attempts=0)


def test_the_handoff_section_can_be_measured_alone():
    """`benchmarks/handoff_recalibrate.py`'s launch: two ranks pass messages along the chain with the
    model's layers computing between hops, both receive protocols, as the calibration's phase."""
    from validator.handoff_bench import handoff_rank_main
    from validator.launch import LaunchConfig, spawn
    handoff = spawn(handoff_rank_main, (tiny_mlp(), 8, MODELS, 0, 2, 1), LaunchConfig(world_size=2))[0]
    assert handoff["world_size"] == 2 and handoff["num_messages"] >= 1 and handoff["mean_delay_s"] > 0
    assert handoff["preposted"]["num_messages"] >= 1 and handoff["preposted"]["send_post_s"] > 0
