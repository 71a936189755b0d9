"""The line fitter, the single-process benchmarks and a real (quick) calibration of a tiny MLP at
world size 2 on CPU whose profile the simulator loads and uses."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")

from simulator.errors import ScenarioError  # noqa: E402
from simulator.profile import WEIGHT_PASS_NAMES, load_profile  # noqa: E402
from simulator.profile_costs import ProfileCosts  # noqa: E402
from simulator.zoo import build_model  # noqa: E402
from validator.calibration_phases import stage_sets  # noqa: E402
from validator.fitting import fit_line  # noqa: E402
from validator.microbench import time_layers, time_optimizer  # noqa: E402

MODELS = "validator.models"


def tiny_mlp():
    return build_model("mlp", input_dim=64, hidden_dim=64, num_hidden_layers=2, num_classes=10)


# ----------------------------------------------------------------------------- fitting

def test_fit_line_recovers_a_known_line():
    xs = [1, 2, 4, 8, 16]
    fit = fit_line(xs, [0.5 + 0.25 * x for x in xs])
    assert fit.intercept == pytest.approx(0.5) and fit.slope == pytest.approx(0.25)
    assert fit.r2 == pytest.approx(1.0) and fit.clamped is None


def test_fit_line_weighted_recovers_alpha_beta():
    sizes = [4096 * 4 ** k for k in range(7)]
    times = [20e-6 + s / 2e9 for s in sizes]
    fit = fit_line(sizes, times, weights=[1 / t ** 2 for t in times])
    assert fit.intercept == pytest.approx(20e-6, rel=1e-6)
    assert 1 / fit.slope == pytest.approx(2e9, rel=1e-6)


def test_fit_line_clamps_a_negative_intercept_and_says_so():
    xs, ys = [1, 2, 3], [0.0, 1.0, 2.0]  # y = -1 + x
    fit = fit_line(xs, ys)
    assert fit.intercept == 0.0 and "negative intercept" in fit.clamped
    assert fit.slope == pytest.approx((0 * 1 + 1 * 2 + 2 * 3) / (1 + 4 + 9))  # through the origin


def test_fit_line_clamps_a_negative_slope():
    fit = fit_line([1, 2, 3], [3.0, 2.9, 2.8])
    assert fit.slope == 0.0 and fit.intercept == pytest.approx(2.9) and "negative slope" in fit.clamped


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
    result = time_weight_passes(modules, [[0], [1, 2]], repeats=3, warmup=1)
    assert [(r["num_params"], r["num_tensors"]) for r in result] == [(36, 2), (4 * 2048 + 2048 * 2049 + 2048, 4)]
    for name in WEIGHT_PASS_NAMES:
        # 4 M parameters (16 MiB read, at least as much written) against 36: far above the overheads
        assert result[1][f"{name}_s"] > 5 * result[0][f"{name}_s"] > 0
    for module, state in zip(modules, before):
        assert all(torch.equal(value, module.state_dict()[key]) for key, value in state.items())
        assert all(p.grad is None for p in module.parameters())
    with pytest.raises(ValueError, match="consecutive"):
        time_weight_passes(modules, [[0, 2]], repeats=1, warmup=0)


def test_updates_are_timed_over_every_prefix_of_layers_that_adds_weights():
    assert [list(layers) for layers in stage_sets([10, 0, 5, 0])] == [[0], [0, 1, 2]]


# ----------------------------------------------------------------------------- real calibration

@pytest.mark.slow
def test_quick_calibration_of_a_tiny_mlp_at_world_size_2_is_a_profile_the_simulator_uses(tmp_path, capsys):
    from ghpsim.cli import main
    from validator.calibrate import calibrate

    workload = tiny_mlp()
    params = dict(input_dim=64, hidden_dim=64, num_hidden_layers=2, num_classes=10)
    out = tmp_path / "profile.json"
    returned = calibrate(workload, params, out, world_size=2, batch_sizes=(4, 32), repeats=3, warmup=1,
                         comm_sizes=(4096, 65536, 1 << 20), comm_repeats=3, models=MODELS, verbose=False,
                         layer_passes=2, optimizer="momentum")

    profile = load_profile(out)
    assert profile == returned and json.loads(out.read_text())["format"] == "ghpsim-profile/2"
    assert profile.world_size == 2 and profile.backend == "gloo" and profile.device.kind == "cpu"
    assert profile.device.num_threads == 1
    assert profile.model.name == "mlp" and profile.model.params == params and profile.num_layers == 3
    assert profile.model.num_params == workload.num_params
    assert all(layer.forward.at(32) > 0 and layer.backward.at(32) > 0 for layer in profile.layers)
    assert profile.optimizer.name == "momentum" and profile.optimizer.at(workload.num_params) > 0
    assert set(profile.weight_passes) == set(WEIGHT_PASS_NAMES)
    assert all(fit.at(workload.num_params) > 0 for fit in profile.weight_passes.values())
    assert set(profile.topk) == {0.001, 0.01, 0.1}
    assert profile.p2p.bandwidth_bytes_per_s > 0
    assert profile.p2p.send_overhead_s > 0 and profile.p2p.receive_overhead_s > 0  # LogP's o_s, o_r
    assert set(profile.allreduce) == set(profile.allgather) == {2}
    assert set(profile.compute_slowdown) == {1, 2} and profile.compute_slowdown[1] == 1.0
    shared = profile.shared_processors  # a CPU host: the ranks share its cores
    assert shared.measured_ranks == 2
    assert shared.parallelism == pytest.approx(2 / profile.compute_slowdown[2])
    for factors in (shared.compute_slowdown_while, shared.comm_slowdown_while_computing):
        assert set(factors) == {"collective", "p2p"} and min(factors.values()) > 0
    assert shared.wakeup_s >= 0
    provenance = profile.provenance  # the free-form record of how it was measured
    assert provenance["settings"]["batch_sizes"] == [4, 32] and provenance["settings"]["layer_passes"] == 2
    assert provenance["layer_passes"]["passes"] == 2
    assert set(provenance["comm_passes"]) == {"p2p", "allreduce.2", "allgather.2"}
    assert 0 < provenance["measure_s"] < provenance["total_s"] and isinstance(provenance["notes"], list)
    assert provenance["torch_version"] == torch.__version__
    sweep = provenance["layer_sweep"]  # the fits are the back-to-back medians x these, per batch size
    assert sweep["batch_sizes"] == [4, 32] and sweep["ranks_at_once"] >= 1
    for phase in ("forward", "backward"):
        assert len(sweep[f"{phase}_ratios"]) == 3
        assert all(len(ratios) == 2 and min(ratios) > 0 for ratios in sweep[f"{phase}_ratios"])
    messages = provenance["messages"]  # the chain's raw figures
    assert messages["size_bytes"] == 64 << 10 and messages["num_waited"] > 0 and messages["num_ready"] > 0
    assert messages["hop_compute_s"] >= 0.002 and messages["hop_source"] in ("default", "stage_backward",
                                                                             "stage_backward_clamped")
    assert profile.p2p.send_overhead_s == messages["send_call_mean_s"]
    assert profile.p2p.receive_overhead_s == messages["ready_receive_mean_s"]
    assert shared.wakeup_s == pytest.approx(max(0.0, messages["delay_mean_s"] - profile.p2p.time_s(64 << 10)
                                                - profile.p2p.send_overhead_s))

    costs = ProfileCosts(profile, workload, optimizer="momentum")
    assert costs.compute_s(0, "F", 32) > 0 and costs.weight_pass_s("stash", workload.num_params) > 0
    assert costs.collective_s("allreduce", 1 << 20, 2) > 0 and costs.p2p_s(1 << 20) > 0

    capsys.readouterr()  # `ghpsim simulate --profile` plays the profile: dp and a 2-stage pipeline
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(json.dumps({
        "name": "tiny", "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "cpu",
                                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": {"name": "mlp", "params": params}, "strategy": {"kind": "pipedream", "num_microbatches": 4},
        "training": {"global_batch_size": 32, "optimizer": "momentum"}}))
    for kind in ("dp", "pipedream"):
        assert main(["simulate", str(scenario), "--set", f"strategy.kind={kind}", "--profile", str(out),
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["step_time_s"] > 0


@pytest.mark.parametrize("setting, value, message", [
    ("layer_passes", 0, "layer_passes: 0 must be at least 1"),
    ("repeats", 0, "repeats: 0 must be at least 1"),
    ("batch_sizes", (8, 8), "batch_sizes: need at least two distinct"),
    ("device", "tpu", "device: expected cpu or cuda"),
])
def test_bad_settings_are_one_line_errors_that_write_nothing(tmp_path, setting, value, message):
    from validator.calibrate import calibrate

    out = tmp_path / "profile.json"
    with pytest.raises(ScenarioError, match=message):
        calibrate(tiny_mlp(), {}, out, **{setting: value})
    assert not out.exists()


# ----------------------------------------------------------------------------- in-sweep fits, message overheads

def test_in_sweep_medians_are_the_back_to_back_medians_times_the_ratio_per_batch_size():
    from validator.sweep_ratio import in_sweep

    assert in_sweep([1.0, 2.0, 4.0], [1.5, 1.25, 1.0]) == [1.5, 2.5, 4.0]
    with pytest.raises(ValueError, match="3 medians but 2 ratios"):
        in_sweep([1.0, 2.0, 4.0], [1.0, 1.0])


def test_layer_fits_are_fitted_to_the_in_sweep_medians_and_the_slowdown_to_the_back_to_back_ones():
    from validator.calibrate import _layer_fits

    workload = tiny_mlp()  # 3 layers, calibrated at batch sizes 4 and 32 on 2 ranks
    def rows(scale):  # per layer {forward_s, backward_s}: a + b x batch, the same on every rank
        return [{"forward_s": [scale * (1e-3 + 1e-4 * b) for b in (4, 32)],
                 "backward_s": [scale * (2e-3 + 2e-4 * b) for b in (4, 32)]} for _ in range(3)]
    by_level = {2: [rows(1.8), rows(1.8)], 1: [rows(1.0)]}
    ratios = {"forward_ratios": [[2.0, 1.0], [1.0, 1.0], [1.0, 1.0]],
              "backward_ratios": [[1.0, 1.0], [1.5, 1.5], [1.0, 1.0]]}
    back_to_back, _ = _layer_fits(workload, by_level, (4, 32), 2, [])
    fits, slowdown = _layer_fits(workload, by_level, (4, 32), 2, [], ratios)
    assert slowdown == {1: 1.0, 2: pytest.approx(1.8)}  # host sharing: ratios do not enter it
    # layer 0 forward: 1.8 x (1.4 ms x 2, 4.2 ms x 1) -> the line through them
    slope = 1.8 * (4.2e-3 - 2.8e-3) / 28
    assert fits[0]["forward"]["per_sample_s"] == pytest.approx(slope)
    assert fits[0]["forward"]["intercept_s"] == pytest.approx(1.8 * 2.8e-3 - slope * 4)
    assert fits[1]["backward"]["intercept_s"] == pytest.approx(1.5 * back_to_back[1]["backward"]["intercept_s"])
    assert fits[1]["backward"]["per_sample_s"] == pytest.approx(1.5 * back_to_back[1]["backward"]["per_sample_s"])
    assert fits[2] == back_to_back[2]  # ratios of 1: unchanged


def test_sweep_ratios_of_the_ranks_that_measured_are_averaged():
    from validator.sweep_ratio import combine_ranks, ranks_at_once

    first = {"forward_ratios": [[1.0, 2.0]], "backward_ratios": [[1.2, 1.4]], "sweep_backward_s": [0.01, 0.03]}
    second = {"forward_ratios": [[3.0, 2.0]], "backward_ratios": [[1.0, 1.0]], "sweep_backward_s": [0.03, 0.05]}
    combined = combine_ranks([first, None, second, None])
    assert combined == {"forward_ratios": [[2.0, 2.0]], "backward_ratios": [[pytest.approx(1.1), 1.2]],
                        "sweep_backward_s": [0.02, 0.04]}
    with pytest.raises(ValueError, match="no rank measured"):
        combine_ranks([None, None])
    assert ranks_at_once(4, "cpu", cores=2) == 2 and ranks_at_once(2, "cpu", cores=8) == 2
    assert ranks_at_once(4, "cuda", cores=2) == 4


def _chain_records():
    """Two ranks' records (`message_bench._one_repeat`): rank 0 sent 3 messages to rank 1, which sent
    one back; receivers reached their receives 1 ms after (ready), 0.2 ms after (neither) and 1 ms
    before (waited) the sends."""
    sends0 = [((0, 1, 0, 1), 10.000, 100e-6), ((0, 1, 1, 1), 11.000, 200e-6), ((0, 1, 2, 1), 12.000, 300e-6)]
    receives1 = [((0, 1, 0, 1), 10.001, 10.001, 10.00105),    # ready: o_r 50 us
                 ((0, 1, 1, 1), 11.0002, 11.0002, 11.0003),   # lead 0.2 ms < margin: neither
                 ((0, 1, 2, 1), 11.999, 12.0008, 12.0009)]    # waited: delay 0.8 ms
    sends1 = [((0, -1, 0, 0), 13.000, 400e-6)]
    receives0 = [((0, -1, 0, 0), 12.998, 13.0012, 13.0013)]   # waited: delay 1.2 ms
    return [(sends0, receives0), (sends1, receives1)]


def test_message_summary_takes_o_s_from_the_isend_calls_o_r_from_ready_receives_delays_from_waited_ones():
    from validator.message_bench import message_summary

    summary = message_summary(_chain_records(), 65536, 0.002, 4)
    assert (summary["num_sends"], summary["num_ready"], summary["num_waited"]) == (4, 1, 2)
    assert summary["send_call_mean_s"] == pytest.approx(250e-6)
    assert summary["send_call_median_s"] == pytest.approx(250e-6)
    assert summary["ready_receive_mean_s"] == pytest.approx(50e-6)
    assert summary["delay_mean_s"] == pytest.approx(1.0e-3) and summary["delay_median_s"] == pytest.approx(1.0e-3)
    assert summary["size_bytes"] == 65536 and summary["hop_compute_s"] == 0.002 and summary["world_size"] == 2
    nothing_ready = message_summary(_chain_records(), 65536, 0.002, 4, ready_margin_s=1.0)
    assert nothing_ready["num_ready"] == 0 and nothing_ready["ready_receive_mean_s"] is None


def test_wakeup_is_the_waited_delay_less_the_idle_message_and_the_send_call_never_negative():
    from validator.message_bench import stage_hop_s, wakeup_s

    assert wakeup_s(1.0e-3, 0.3e-3, 0.2e-3) == pytest.approx(0.5e-3)
    assert wakeup_s(0.4e-3, 0.3e-3, 0.2e-3) == 0.0
    assert stage_hop_s(0.03, 2) == (0.015, "stage_backward")
    assert stage_hop_s(0.001, 2) == (0.002, "stage_backward_clamped")
    assert stage_hop_s(10.0, 4) == (0.05, "stage_backward_clamped")
    assert stage_hop_s(None, 2) == (0.002, "default")


def test_message_fields_write_the_overheads_and_the_wakeup_and_note_what_is_missing():
    from validator.calibrate import message_fields
    from validator.message_bench import message_summary

    p2p = {"latency_s": 100e-6, "bandwidth_bytes_per_s": 65536 / 100e-6}  # 64 KiB: 0.2 ms idle
    notes = []
    overheads, wakeup = message_fields(message_summary(_chain_records(), 65536, 0.002, 4), p2p, notes)
    assert overheads == {"send_overhead_s": pytest.approx(250e-6), "receive_overhead_s": pytest.approx(50e-6)}
    assert wakeup == pytest.approx(1.0e-3 - 200e-6 - 250e-6) and notes == []
    summary = message_summary(_chain_records(), 65536, 0.002, 4, ready_margin_s=1.0)
    overheads, wakeup = message_fields({**summary, "delay_mean_s": None}, p2p, notes)
    assert overheads["receive_overhead_s"] == 0.0 and wakeup is None
    assert notes == ["p2p.receive_overhead_s: the message chain timed no such message; left at 0",
                     "shared_processors.wakeup_s: the message chain timed no waited message; left at 0"]


# ----------------------------------------------------------------------------- disturbed machines

def _with_cpu_accounting(other_share: float, steal_s: float):
    from simulator.profile import Profile
    return Profile.model_construct(provenance={"background_cpu": {
        "wall_s": 200.0, "num_cpus": 2, "other_processes_cpu_s": 0.0, "steal_s": steal_s,
        "share_of_machine": other_share}})


def test_disturbance_names_other_processes_and_a_vm_hosts_steal():
    from simulator.profile import Profile
    from validator.calibrate import disturbance

    assert disturbance(_with_cpu_accounting(0.02, 0.2)) is None  # a quiet calibration
    assert disturbance(Profile.model_construct(provenance={})) is None  # no accounting (not Linux)
    assert disturbance(_with_cpu_accounting(0.0, 196.0)) == "the VM's host took 49% of the machine's CPU time (steal)"
    assert disturbance(_with_cpu_accounting(0.3, 0.0)) == "other processes used 30% of the machine's CPU time"


def test_calibrate_quietly_repeats_a_disturbed_calibration_and_stops_when_quiet(monkeypatch):
    import validator.calibrate as calibrate_module

    results = iter([_with_cpu_accounting(0.0, 196.0), _with_cpu_accounting(0.0, 0.1)])
    calls, said = [], []
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *args, **kwargs: calls.append(args) or next(results))
    profile = calibrate_module.calibrate_quietly("workload", world_size=4, say=said.append)
    assert len(calls) == 2 and profile.provenance["background_cpu"]["steal_s"] == 0.1
    assert said == ["[calibrate] attempt 1 of 3 disturbed: the VM's host took 49% of the machine's CPU time (steal); "
                    "calibrating again"]
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *args, **kwargs: _with_cpu_accounting(0.0, 196.0))
    said.clear()
    assert calibrate_module.disturbance(calibrate_module.calibrate_quietly(attempts=2, say=said.append))
    assert len(said) == 2 and said[-1].endswith("keeping it, with that note")
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        calibrate_module.calibrate_quietly(attempts=0)


# ----------------------------------------------------------------------------- flags named in the error line

@pytest.mark.parametrize("flags, needle", [
    (["--world-size", "9999"], "--world-size 9999: device 'cpu', backend 'gloo': 9999 ranks on "),
    (["--batch-sizes", "4"], "--batch-sizes '4': need at least two distinct positive batch sizes"),
    (["--batch-sizes", "4,100000"], "--batch-sizes '4,100000': 100000 is larger than the"),
])
def test_calibrate_names_the_flag_of_a_world_size_or_batch_sizes_that_cannot_run(capsys, tmp_path, monkeypatch,
                                                                                 flags, needle):
    import validator.calibrate as calibrate_module
    from tests.test_bad_input import ROOT, assert_one_line_error, run_cli

    started = []
    monkeypatch.setattr(calibrate_module, "spawn", lambda *args: started.append(args))
    out = tmp_path / "profile.json"
    assert_one_line_error(run_cli(capsys, "calibrate", "--scenario", ROOT / "scenarios" / "validation" / "mlp_cpu.yaml",
                                  *flags, "--out", out), needle)
    assert started == [] and not out.exists()
