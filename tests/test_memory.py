"""Memory model: closed forms of the peak per device (simulator.memory), whole small timelines."""

from pathlib import Path

import pytest

from simulator.engine import Engine
from simulator.memory import MemoryConfig, memory_report, rank_memory
from simulator.memory_timeline import memory_timeline
from simulator.plan import Compute, Plan, Stage
from simulator.records import span_table
from simulator.strategies.ghp import apply_training_options
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, run_grid, toy_workload

E = 4  # fp32 bytes
LAYERS, PARAMS, ELEMENTS = 4, 100, 100


def _dp(config: MemoryConfig, batch=8, bucket_bytes=2 * PARAMS * E, optimizer_s=0.5):
    workload = toy_workload(LAYERS, num_params=PARAMS, output_elements=ELEMENTS)
    topology = Topology(1, 2, link(0.0, 1e6), link(0.0, 1e6))
    plan, spans = run_grid(workload, topology, FixedCosts(1.0, optimizer_s=optimizer_s), 2, 1, batch,
                           bucket_size_bytes=bucket_bytes)
    return memory_report(plan, workload, spans, config)["devices"][0]


@pytest.mark.parametrize("optimizer, state_copies", [("sgd", 0), ("momentum", 1), ("adam", 2)])
def test_dp_peak_is_weights_grads_state_feature_and_gradient_maps_at_b_over_n(optimizer, state_copies):
    """Policy none: every layer's input feature map and input gradient (none for the data) stay until
    backward ends. Two candidate peaks: backward's start (all activations + logits and log-softmax,
    the last layer's input gradient and the loss's NLL gradient) and layer 0's backward (3 input
    gradients; the buckets in flight are the gradients themselves, reduced in place)."""
    device = _dp(MemoryConfig(optimizer=optimizer))
    b = 8 / 2  # B / N samples per rank
    unit = ELEMENTS * b * E
    persistent = 2 * LAYERS * PARAMS * E + state_copies * LAYERS * PARAMS * 4
    workspace = unit + PARAMS * E               # a layer's output gradient + fresh weight gradient
    at_backward_start = persistent + (LAYERS + 2) * unit + 2 * unit + workspace
    at_first_layer = persistent + LAYERS * unit + (LAYERS - 1) * unit + workspace
    assert device["peak_memory_bytes"] == pytest.approx(max(at_backward_start, at_first_layer))
    breakdown = device["memory_breakdown_bytes"]
    assert breakdown["activations"] == (LAYERS + 2) * unit and breakdown["gradient_maps"] == 2 * unit
    assert breakdown["optimizer_state"] == state_copies * LAYERS * PARAMS * 4
    workload = toy_workload(LAYERS, num_params=PARAMS, output_elements=ELEMENTS)
    plan, spans = run_grid(workload, Topology(1, 2, link(0.0, 1e6), link(0.0, 1e6)),
                           FixedCosts(1.0, optimizer_s=0.5), 2, 1, 8, bucket_size_bytes=2 * PARAMS * E)
    frame = memory_timeline(rank_memory(plan, workload, spans, MemoryConfig(optimizer=optimizer))[0])
    assert (frame["comm_buffers"] == 0).all()  # dense allreduces reduce the gradient buckets in place
    assert frame["total_bytes"].max() == pytest.approx(max(at_backward_start, at_first_layer))


def _sparse_saving_workload():
    """Layers whose saved activations (10/sample) are much smaller than their gradient maps (100);
    10 classes."""
    from simulator.workload import Layer, Workload
    layer = dict(kind="linear", forward_flops_per_sample=1e9, backward_flops_per_sample=2e9, num_params=PARAMS,
                 input_elements_per_sample=ELEMENTS, saved_elements_per_sample=10)
    return Workload("thin", tuple(Layer(name=f"l{i}", output_elements_per_sample=ELEMENTS if i + 1 < LAYERS else 10,
                                        **layer) for i in range(LAYERS)))


def test_reuse_writes_gradient_maps_into_activation_buffers_so_they_do_not_pile_up():
    workload = _sparse_saving_workload()
    topology = Topology(1, 2, link(0.0, 1e6), link(0.0, 1e6))
    plan, spans = run_grid(workload, topology, FixedCosts(1.0), 2, 1, 8, bucket_size_bytes=2 * PARAMS * E)
    none, reuse = (memory_report(plan, workload, spans, MemoryConfig(memory_policy=policy))["devices"][0]
                   for policy in ("none", "reuse"))
    b, persistent = 4, 2 * LAYERS * PARAMS * E
    unit, workspace = ELEMENTS * b * E, ELEMENTS * b * E + PARAMS * E
    # none: at layer 0's (or 1's) backward, 3 input gradient maps, the kept feature maps (the buckets
    # in flight are the gradients themselves)
    assert none["peak_memory_bytes"] == pytest.approx(persistent + 3 * unit + 4 * 10 * b * E + workspace)
    # reuse: at layer 1's backward, layers 0-1's activations, the incoming gradient of segment 0-1
    assert reuse["peak_memory_bytes"] == pytest.approx(persistent + 2 * 10 * b * E + unit + workspace)
    assert reuse["peak_memory_bytes"] < none["peak_memory_bytes"]


def test_mixed_precision_keeps_fp32_master_weights_and_state():
    device = _dp(MemoryConfig(dtype="fp16", optimizer="adam"))
    breakdown = device["memory_breakdown_bytes"]
    params = LAYERS * PARAMS
    assert breakdown["weights"] == 2 * params and breakdown["weight_gradients"] == 2 * params
    assert breakdown["master_weights"] == 4 * params and breakdown["optimizer_state"] == 8 * params


def _single_stage_plan(order: list[tuple[str, int]], microbatch_size: float = 2.0, meta=None) -> tuple:
    """One rank running its whole 4-layer model over micro-batches in `order`, e.g. [("F", 0), ...]."""
    workload = toy_workload(LAYERS, num_params=PARAMS, output_elements=ELEMENTS)
    actions = [Compute(id=i, phase=phase, layer_start=0, layer_end=LAYERS, batch=microbatch_size, microbatch=mb)
               for i, (phase, mb) in enumerate(order)]
    actions.append(Compute(id=len(actions), phase="opt", layer_start=0, layer_end=LAYERS, batch=0,
                           num_params=LAYERS * PARAMS))
    plan = Plan("gpipe", 1, 1, (Stage(0, 0, LAYERS, LAYERS * PARAMS),), (0,), (tuple(actions),),
                microbatch_size * 4, meta={"placement": "group_per_node", "partition": [LAYERS], **(meta or {})})
    return plan, workload


def _run(plan, workload, config):
    topology = Topology(1, 1, link(0.0, 1e9), link(0.0, 1e9))
    spans = span_table(Engine(plan, topology, FixedCosts(1.0)).run().spans)
    return memory_report(plan, workload, spans, config), spans


GPIPE = [("F", i) for i in range(4)] + [("B", i) for i in reversed(range(4))]
ONE_F_ONE_B = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
MICROBATCH_ACTIVATIONS = (LAYERS + 2) * ELEMENTS * 2.0 * E  # saved + logits and log-softmax


@pytest.mark.parametrize("order, in_flight", [(GPIPE, 4), (ONE_F_ONE_B, 2)])
def test_activations_follow_the_schedule_gpipe_keeps_m_and_1f1b_keeps_its_in_flight_count(order, in_flight):
    plan, workload = _single_stage_plan(order)
    _, spans = _run(plan, workload, MemoryConfig(memory_policy="reuse"))
    memory = rank_memory(plan, workload, spans, MemoryConfig(memory_policy="reuse"))[0]
    frame = memory_timeline(memory)
    assert frame["activations"].max() == pytest.approx(in_flight * MICROBATCH_ACTIVATIONS)
    assert frame["activations"].iloc[-1] == 0  # everything freed by the end of the step


def test_stashed_weight_versions_and_extra_copies_come_from_plan_meta():
    plan, workload = _single_stage_plan(GPIPE, meta={"stashed_weight_versions": [2], "extra_weight_copies": [1]})
    report, _ = _run(plan, workload, MemoryConfig())
    assert report["devices"][0]["memory_breakdown_bytes"]["stashed_weights"] == 3 * LAYERS * PARAMS * E


def test_full_recompute_trades_activation_memory_for_one_extra_forward_per_microbatch():
    plan, workload = _single_stage_plan(GPIPE)
    config = MemoryConfig(memory_policy="reuse", recompute="full")
    base, base_spans = _run(plan, workload, MemoryConfig(memory_policy="reuse"))
    recomputed = apply_training_options(plan, workload, recompute="full")
    report, spans = _run(recomputed, workload, config)
    forward_s = LAYERS * 1.0 * 2.0  # FixedCosts: 1 s per sample per layer forward
    assert spans["end_s"].max() == pytest.approx(base_spans["end_s"].max() + 4 * forward_s)
    memory = rank_memory(recomputed, workload, spans, config)[0]
    kept = ELEMENTS * 2.0 * E + 2 * ELEMENTS * 2.0 * E  # segment input (checkpoint) + the loss's logits
    # peak activations: three micro-batches' kept tensors + one fully rematerialised micro-batch
    assert memory_timeline(memory)["activations"].max() == pytest.approx(3 * kept + MICROBATCH_ACTIVATIONS)
    assert report["peak_memory_bytes"] < base["peak_memory_bytes"]


def test_offload_keeps_activations_only_during_their_compute_and_exposes_unhidden_transfers():
    plan, workload = _single_stage_plan(GPIPE)
    bandwidth = MICROBATCH_ACTIVATIONS / 100.0  # each transfer takes 100 s; forward 8 s, backward 16 s
    config = MemoryConfig(memory_policy="reuse", offload_activations=True, host_bandwidth_bytes_per_s=bandwidth)
    report, spans = _run(plan, workload, config)
    memory = rank_memory(plan, workload, spans, config)[0]
    # only the layer being computed holds activations: at most the last layer's + logits + log-softmax
    assert memory_timeline(memory)["activations"].max() == pytest.approx(3 * ELEMENTS * 2.0 * E)
    assert report["offload_s"] == pytest.approx(8 * 100.0)
    # transfers out overlap the 4 forwards (8 s each), transfers in the 4 backwards (16 s each)
    hidden = 4 * 8 + 4 * 16
    assert report["offload_exposed_s"] == pytest.approx(800 - hidden)


class TopkFixedCosts(FixedCosts):
    def topk_s(self, num_elements: float, density: float | None = None) -> float:
        return 0.0  # instantaneous top-k selection


def test_laysa_keeps_one_layer_gradient_buffer_and_a_persistent_residual():
    workload = toy_workload(LAYERS, num_params=PARAMS, output_elements=ELEMENTS)
    topology = Topology(1, 2, link(0.0, 1e6), link(0.0, 1e6))
    plan, _ = run_grid(workload, topology, FixedCosts(1.0), 2, 1, 8)
    sparse = apply_training_options(plan, workload, gradient_compression="topk", compression_density=0.1)
    spans = span_table(Engine(sparse, topology, TopkFixedCosts(1.0)).run().spans)
    laysa = memory_report(sparse, workload, spans, MemoryConfig(memory_policy="laysa"))["devices"][0]
    reuse = memory_report(sparse, workload, spans, MemoryConfig(memory_policy="reuse"))["devices"][0]
    assert laysa["memory_breakdown_bytes"]["weight_gradients"] == PARAMS * E
    assert laysa["memory_breakdown_bytes"]["residual"] == LAYERS * PARAMS * E
    assert reuse["memory_breakdown_bytes"]["weight_gradients"] == LAYERS * PARAMS * E
    assert laysa["peak_memory_bytes"] < reuse["peak_memory_bytes"]


def _scenario(memory: str):
    from simulator.scenario import load_scenario
    gpu = {"name": "tiny", "peak_flops_per_s": {"fp32": 1e13}, "memory_bytes": memory,
           "memory_bandwidth_bytes_per_s": 1e12}
    return load_scenario({"cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": gpu},
                          "model": {"name": "mlp"}, "training": {"global_batch_size": 32}})


def test_summary_and_tables_report_peak_memory_and_mark_plans_that_do_not_fit(capsys):
    from simulator.compare import compare
    from simulator.tables import comparison_frame, print_comparison
    from simulator.simulate import simulate
    params = 3_962_890  # zoo mlp
    result = simulate(_scenario("1 GiB"))
    device = result.summary["devices"][0]
    assert device["peak_memory_bytes"] >= 2 * params * 4 and device["fits_in_memory"]
    assert sum(device["memory_breakdown_bytes"].values()) == pytest.approx(device["peak_memory_bytes"])
    assert result.summary["fits_in_memory"] and result.summary["gradient_compression"] is None
    results = compare(_scenario("20 MiB"), [("dp", None), ("mp", None)])
    frame = comparison_frame(results)
    assert list(frame["fits_in_memory"]) == [r.summary["fits_in_memory"] for r in results]
    assert not frame.set_index("strategy")["fits_in_memory"]["dp (G=2 x M=1)"]  # whole model + grads + bucket > 20 MiB
    print_comparison(results, "t")
    assert "infeasible" in capsys.readouterr().out


def _layers_with(kind: str | None = None, spec_kind: str | None = None):
    """The toy workload with every layer of `kind` and/or with a `Layer.spec` of `spec_kind`."""
    from dataclasses import replace
    workload = toy_workload(LAYERS, num_params=PARAMS, output_elements=ELEMENTS)
    layers = tuple(replace(layer, kind=kind or layer.kind, spec={"kind": spec_kind} if spec_kind else layer.spec)
                   for layer in workload.layers)
    return replace(workload, layers=layers)


def test_pipeline_sender_keeps_its_output_and_the_received_gradient_receiver_counts_its_input():
    """MP over 2 stages (layers 0-1 | 2-3), B = 8: u = one feature map of the batch."""
    workload = toy_workload(LAYERS, num_params=PARAMS, output_elements=ELEMENTS)
    plan, spans = run_grid(workload, Topology(1, 2, link(0.0, 1e6), link(0.0, 1e6)), FixedCosts(1.0), 1, 2, 8)
    u, persistent, workspace = ELEMENTS * 8 * E, 2 * 2 * PARAMS * E, ELEMENTS * 8 * E + PARAMS * E
    sender, receiver = memory_report(plan, workload, spans, MemoryConfig())["devices"]
    # sender: layers 0-1 saved + its sent output; layer 1's input gradient + the received one
    assert sender["peak_memory_bytes"] == pytest.approx(persistent + 3 * u + 2 * u + workspace)
    assert sender["memory_breakdown_bytes"]["activations"] == 3 * u
    assert sender["memory_breakdown_bytes"]["gradient_maps"] == 2 * u
    # last stage: layers 2-3 saved + logits and log-softmax; layer 3's input gradient + the NLL gradient
    assert receiver["peak_memory_bytes"] == pytest.approx(persistent + 4 * u + 2 * u + workspace)
    reuse = rank_memory(plan, workload, spans, MemoryConfig(memory_policy="reuse"))[0]
    frame = memory_timeline(reuse)
    assert frame["activations"].max() == pytest.approx(3 * u)  # the sent output until layer 1's backward ends
    assert frame["activations"].iloc[-1] == 0 and frame["gradient_maps"].iloc[-1] == 0


@pytest.mark.parametrize("spec_kind, extra_maps", [("basic_block", 1), ("transformer_block", 1), ("fc", 0)])
def test_a_residual_layer_holds_the_gradient_at_its_add_during_its_backward(spec_kind, extra_maps):
    plain = _dp(MemoryConfig())
    workload = _layers_with(spec_kind=spec_kind)
    plan, spans = run_grid(workload, Topology(1, 2, link(0.0, 1e6), link(0.0, 1e6)),
                           FixedCosts(1.0, optimizer_s=0.5), 2, 1, 8, bucket_size_bytes=2 * PARAMS * E)
    device = memory_report(plan, workload, spans, MemoryConfig())["devices"][0]
    unit = ELEMENTS * 4 * E  # B / N = 4 samples
    assert device["peak_memory_bytes"] == pytest.approx(plain["peak_memory_bytes"] + extra_maps * unit)


@pytest.mark.parametrize("kind, blocked, extra_maps", [("conv", True, 2), ("conv", False, 0), ("linear", True, 0)])
def test_blocked_conv_layout_devices_hold_blocked_copies_of_the_conv_gradients(kind, blocked, extra_maps):
    """oneDNN (x86 CPU) conv backward: + dL/dY and dL/dX in its blocked layout (input + output maps)."""
    workload = _layers_with(kind=kind)
    plan, spans = run_grid(workload, Topology(1, 2, link(0.0, 1e6), link(0.0, 1e6)),
                           FixedCosts(1.0, optimizer_s=0.5), 2, 1, 8, bucket_size_bytes=2 * PARAMS * E)
    base = memory_report(plan, workload, spans, MemoryConfig())["devices"][0]["peak_memory_bytes"]
    device = memory_report(plan, workload, spans, MemoryConfig(blocked_conv_layout=blocked))["devices"][0]
    assert device["peak_memory_bytes"] == pytest.approx(base + extra_maps * ELEMENTS * 4 * E)


def test_memory_config_marks_the_cpu_device_as_blocked_conv_layout():
    from simulator.memory import memory_config
    from simulator.scenario import load_scenario
    assert memory_config(load_scenario("scenarios/validation/resnet_cpu.yaml")).blocked_conv_layout
    assert not memory_config(_scenario("1 GiB")).blocked_conv_layout


def test_resnet_head_counts_its_input_kept_by_the_last_blocks_relu():
    """The global pool (a mean) keeps nothing; the previous block's final ReLU keeps its output."""
    from simulator.zoo import build_model
    head = build_model("resnet20").layers[-1]
    assert head.saved_elements_per_sample == 64 * 8 * 8 + 64  # ReLU output + the linear's input
    preact = build_model("resnet_cifar", depth=11, variant="preact_bottleneck").layers[-1]
    assert preact.saved_elements_per_sample == 2 * 256 * 8 * 8 + 256  # BN input + ReLU output + linear input


def test_a_pipeline_s_unhidden_offload_transfers_are_exposed_communication_not_bubble():
    """Each device's compute_s + comm_s + idle_s is the step time, the offload's exposed host copies
    in comm_s (tests/test_summary_labels.py for dp), so the stages' shares are of the whole step."""
    from simulator import load_scenario, simulate
    overrides = ["strategy.kind=1f1b", "strategy.num_groups=1", "training.offload_activations=true",
                 "costs.host_bandwidth_bytes_per_s=1e9", "strategy.num_microbatches=4"]
    demo = Path(__file__).resolve().parents[1] / "scenarios" / "demo.yaml"
    summary = simulate(load_scenario(demo, overrides)).summary
    assert summary["memory"]["offload_exposed_s"] > 0.1 * summary["step_time_s"]
    for row in summary["devices"]:
        assert row["compute_s"] + row["comm_s"] + row["idle_s"] == pytest.approx(summary["step_time_s"], rel=1e-9)
        assert row["comm_s"] >= summary["memory"]["offload_exposed_s"]
    for stage in summary["pipeline"]["stages"]:
        assert stage["exposed_comm_fraction"] >= summary["memory"]["offload_exposed_s"] / summary["step_time_s"]
