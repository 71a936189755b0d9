"""The asynchronous cycle's message costs (`handoff.cycle`): the benchmark's order, the profile
section, and the engine playing them for asynchronous pipelines, and on a shared host for the
synchronous schedules whose ranks interleave forwards and backwards (1F1B, not GPipe)."""

import copy
import json
import time

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.profile import load_profile
from simulator.profile_costs import ProfileCosts
from simulator.profile_host import MessageCosts
from tests.helpers import FixedCosts, toy_workload
from tests.test_profile import document, workload
from validator.handoff_bench import CYCLE_REQUIRED_KEYS, DEFAULT_HOP_COMPUTE_S, cycle_order

CYCLE = {"num_messages": 40, "mean_delay_s": 0.004, "median_delay_s": 0.001, "send_post_s": 0.0002,
         "send_post_mean_s": 0.0009, "ready_receive_s": 0.0001, "ready_receive_mean_s": 0.0006, "num_ready": 50}


def testcycle_order_is_asynchronous_1f1b_with_fill_and_drain():
    """Stage 0 of 4 fills with 3 forwards, alternates, then drains 3 backwards; the last stage
    alternates from its first micro-batch; every micro-batch passes once each way, forward first."""
    show = lambda order: " ".join(f"{step}{microbatch}" for step, microbatch in order)
    assert show(cycle_order(0, 4, 6)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert show(cycle_order(3, 4, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"
    for rank in range(4):
        order = cycle_order(rank, 4, 10)
        assert sorted(order) == sorted([("F", mb) for mb in range(10)] + [("B", mb) for mb in range(10)])
        assert all(order.index(("F", mb)) < order.index(("B", mb)) for mb in range(10))


def _profile(tmp_path, cycle=None, name="cycle.json"):
    doc = copy.deepcopy(document())
    doc["handoff"] = {"world_size": 4, "size_bytes": 65536, "mean_delay_s": 0.001, "median_delay_s": 0.0002,
                      "preposted": {"num_messages": 20, "mean_delay_s": 0.0015, "median_delay_s": 0.0003,
                                    "send_post_s": 0.0001, "send_post_mean_s": 0.0002, "ready_receive_s": 0.0001,
                                    "ready_receive_mean_s": 0.0002}}
    if cycle is not None:
        doc["handoff"]["cycle"] = cycle
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return load_profile(path)


def test_profile_reads_the_cycle_and_the_costs_add_up_to_its_mean_delay(tmp_path):
    """As for the chain: the engine plays the isend call (median and tail) on the sender, then the
    point-to-point time, then the handoff; together the cycle's mean delay, the call not counted twice."""
    profile = _profile(tmp_path, CYCLE)
    assert profile.handoff.cycle.mean_delay_s == 0.004 and profile.handoff.cycle.send_post_mean_s == 0.0009
    costs = ProfileCosts(profile, workload(), shared_host=True)
    cycling = costs.asynchronous_messages
    idle_s = profile.p2p.time_s(65536)
    assert cycling.send_post_s + cycling.send_post_tail_s + idle_s + cycling.handoff_s == pytest.approx(0.004)
    assert (cycling.send_post_tail_s, cycling.ready_receive_s, cycling.ready_receive_tail_s) == pytest.approx(
        (0.0007, 0.0001, 0.0005))
    assert costs.send_post_s == pytest.approx(0.0001)  # the chain's figures stay for the other plans
    assert ProfileCosts(_profile(tmp_path, name="older.json"), workload(), shared_host=True).asynchronous_messages is None


@pytest.mark.parametrize("key", CYCLE_REQUIRED_KEYS)
def test_malformed_cycle_names_the_field(tmp_path, key):
    for bad in (-0.001, "fast"):
        with pytest.raises(ScenarioError, match=f"handoff.cycle.{key}"):
            _profile(tmp_path, {**CYCLE, key: bad})
    missing = {k: v for k, v in CYCLE.items() if k != key}
    with pytest.raises(ScenarioError, match=f"handoff.cycle.{key}"):
        _profile(tmp_path, missing)


def _step_s(kind: str, cycling: MessageCosts | None, shared_host: bool = False,
            runtime: MessageCosts | None = None) -> float:
    costs = FixedCosts(forward_s_per_sample=0.001)
    costs.send_post_s, costs.ready_receive_s = 0.0001, 0.0001
    costs.asynchronous_messages = cycling
    costs.runtime_messages = runtime
    if shared_host:  # a processor-sharing pool of 2 cores (simulator.host_sharing), as a calibrated CPU host
        costs.host_parallelism = 2.0
    strategy = {"kind": kind, "num_microbatches": 4, "partition": [2, 2]}
    if kind == "interleaved_1f1b":
        strategy = {**strategy, "num_virtual_stages": 2, "partition": [1, 1, 1, 1]}
    scenario = load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2,
                    "intra_node_link": {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}},
        "model": {"name": "mlp"},
        "strategy": strategy,
        "training": {"global_batch_size": 16},
    })
    return simulate(scenario, costs=costs, workload=toy_workload(4, num_params=1000)).step_time_s


SAME = MessageCosts(handoff_s=0.0, send_post_s=0.0001, send_post_tail_s=0.0, ready_receive_s=0.0001,
                    ready_receive_tail_s=0.0)
"""The chain's own figures in the cycle's place."""
DEAR = MessageCosts(handoff_s=0.0, send_post_s=0.0021, send_post_tail_s=0.0, ready_receive_s=0.0001,
                    ready_receive_tail_s=0.0)
"""A dearer isend call in the cycle: 2 ms more per message sent."""


@pytest.mark.parametrize("kind", ["pipedream", "spectrain"])
def test_asynchronous_plans_pay_the_cycles_message_costs_and_synchronous_ones_the_chains(kind):
    """Two stages, four micro-batches: with the chain's own figures in the cycle's place an
    asynchronous step is unchanged; a dearer isend call in the cycle lengthens it, and leaves GPipe
    and 1F1B as they were."""
    assert _step_s(kind, SAME) == pytest.approx(_step_s(kind, None))
    assert _step_s(kind, DEAR) > _step_s(kind, None) + 0.002
    for synchronous in ("gpipe", "1f1b", "interleaved_1f1b"):
        assert _step_s(synchronous, DEAR) == pytest.approx(_step_s(synchronous, None))


def test_on_a_shared_host_1f1b_pays_the_cycles_message_costs_and_gpipe_the_chains():
    """On a shared host (2026-11-24: a 2-stage 1F1B's isend calls averaged what the cycle's did,
    not the chain's), the schedules that interleave forwards and backwards pay the cycle's figures:
    a dearer isend call lengthens 1F1B's and interleaved 1F1B's step by at least one call's excess
    on the critical path; GPipe's sweeps, one way at a time, keep the chain's."""
    for kind in ("1f1b", "interleaved_1f1b", "pipedream"):
        assert _step_s(kind, SAME, shared_host=True) == pytest.approx(_step_s(kind, None, shared_host=True))
        assert _step_s(kind, DEAR, shared_host=True) > _step_s(kind, None, shared_host=True) + 0.002
    assert _step_s("gpipe", DEAR, shared_host=True) == pytest.approx(_step_s("gpipe", None, shared_host=True))


def test_the_cycle_can_be_measured_alone():
    """`benchmarks/handoff_recalibrate.py --cycle-only`'s launch: two ranks in the asynchronous cycle
    with the model's layers computing between messages; every figure the profile reads is there."""
    from tests.test_calibrate import MODELS, tiny_mlp
    from validator.handoff_bench import handoff_rank_main
    from validator.launch import LaunchConfig, spawn
    cycle = spawn(handoff_rank_main, (tiny_mlp(), 8, MODELS, 0, 2, 1, True), LaunchConfig(world_size=2))[0]
    assert cycle is not None and set(CYCLE_REQUIRED_KEYS) <= set(cycle)
    assert cycle["num_messages"] >= 1 and cycle["num_ready"] >= 1
    assert cycle["mean_delay_s"] > 0 and cycle["send_post_s"] > 0
    assert cycle["hop_compute_s"] >= DEFAULT_HOP_COMPUTE_S  # the tiny MLP's steps are far below the floor


def _fitted_hop_rank_main(rank: int, step_s: float) -> float:
    from validator.handoff_bench import stage_hop_compute_s
    return stage_hop_compute_s([lambda: time.sleep(step_s)] * 3)


@pytest.mark.parametrize("step_s, expected_s", [(0.006, 0.006), (0.0001, DEFAULT_HOP_COMPUTE_S)])
def test_the_cycles_window_fits_a_balanced_stage_of_the_model(step_s, expected_s):
    """Three 6 ms layer steps at 2 ranks: a stage's forward and backward take 9 ms, its backward window
    two thirds of that; steps far below the default window keep the default."""
    from validator.launch import LaunchConfig, spawn
    hops = spawn(_fitted_hop_rank_main, (step_s,), LaunchConfig(world_size=2))
    assert hops[0] == hops[1]  # both ranks run the same windows
    assert hops[0] == pytest.approx(expected_s, rel=0.3)


def _cycle_windows_rank_main(rank, forward_share):
    import torch
    from validator.handoff_bench import run_cycle
    weight = torch.randn(64, 64)
    windows = []
    run_cycle([lambda: torch.mm(weight, weight)], torch.ones(256), 6, 0.004, 0, windows, forward_share)
    order = cycle_order(rank, 2, 6)
    return [(step, end - start) for (step, _), (start, end, _) in zip(order, windows)]


@pytest.mark.parametrize("forward_share", [0.5, 0.75])
def test_the_cycle_forward_window_is_its_share_of_the_backward_one(forward_share):
    """`run_cycle(forward_share=...)` (the default 0.5 is what calibrations run): every forward
    window lasts at least its share of the 4 ms backward one, and the backward ones at least 4 ms
    (a window runs steps until its time has passed)."""
    from validator.launch import LaunchConfig, spawn
    for windows in spawn(_cycle_windows_rank_main, (forward_share,), LaunchConfig(world_size=2)):
        forwards = [s for step, s in windows if step == "F"]
        backwards = [s for step, s in windows if step == "B"]
        assert len(forwards) == len(backwards) == 6
        assert min(forwards) >= 0.004 * forward_share and min(backwards) >= 0.004
        assert sorted(forwards)[3] < 0.004 * forward_share + 0.002  # the median window ends soon after its time


def test_asynchronous_plans_pay_the_runtimes_own_message_costs_where_the_model_has_them():
    """`ProfileCosts.runtime_messages` (a shared host with a core per rank): asynchronous plans pay
    the figures timed in the runtime itself instead of the cycle's; 1F1B keeps the cycle's."""
    for kind in ("pipedream", "spectrain"):
        assert _step_s(kind, DEAR, True, runtime=SAME) == pytest.approx(_step_s(kind, None, True))
        assert _step_s(kind, SAME, True, runtime=DEAR) > _step_s(kind, SAME, True) + 0.002
    assert _step_s("1f1b", DEAR, True, runtime=SAME) == pytest.approx(_step_s("1f1b", DEAR, True))
