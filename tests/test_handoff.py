"""Handoff delays on a shared host: the microbenchmark's summary, the profile section, and the
engine's later arrivals (closed forms)."""

import copy
import json

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.profile import load_profile
from simulator.profile_costs import ProfileCosts
from tests.helpers import FixedCosts, Topology, link, run_grid, toy_workload
from tests.test_profile import document, workload
from validator.handoff_bench import handoff_summary


def _records(sent_at, waited_from, done_at):
    """Two ranks, one forward message per micro-batch from rank 0 to rank 1."""
    sends = [(0, 1, mb, 1, t) for mb, t in enumerate(sent_at)]
    receives = [(0, 1, mb, 1, w, d) for mb, (w, d) in enumerate(zip(waited_from, done_at))]
    return [(sends, []), ([], receives)]


def test_summary_counts_only_messages_whose_receiver_was_waiting():
    # micro-batch 0: receiver waiting since 0.0, sent 1.0, done 1.002 (delay 2 ms)
    # micro-batch 1: receiver waiting since 2.0, sent 3.0, done 3.004 (delay 4 ms)
    # micro-batch 2: sent 5.0, receiver only came at 6.0 (not a handoff: excluded)
    summary = handoff_summary(_records([1.0, 3.0, 5.0], [0.0, 2.0, 6.0], [1.002, 3.004, 6.0001]),
                              65536, 0.002, 3)
    assert summary["num_messages"] == 2
    assert summary["mean_delay_s"] == pytest.approx(0.003)
    assert summary["median_delay_s"] == pytest.approx(0.003)
    assert summary["world_size"] == 2 and summary["size_bytes"] == 65536


def test_summary_times_the_ranks_own_work_per_message():
    """The isend calls' median, and the median wait on a message sent at least READY_MARGIN_S before
    its receiver came (micro-batch 2: sent 5.0, waited from 6.0 to 6.0001); the one sent 0.2 ms
    before the wait (micro-batch 3) might still be in flight and is neither a handoff nor ready."""
    records = _records([1.0, 3.0, 5.0, 7.0], [0.0, 2.0, 6.0, 7.0002], [1.002, 3.004, 6.0001, 7.0005])
    records[0] = (*records[0], [0.0001, 0.0003, 0.0002, 0.0002])
    summary = handoff_summary(records, 65536, 0.002, 4)
    assert summary["num_messages"] == 2 and summary["num_ready"] == 1
    assert summary["send_post_s"] == pytest.approx(0.0002)
    assert summary["send_post_mean_s"] == pytest.approx(0.0002)
    assert summary["ready_receive_s"] == summary["ready_receive_mean_s"] == pytest.approx(0.0001)
    older = handoff_summary(_records([1.0], [0.0], [1.002]), 65536, 0.002, 1)  # no isend times, none ready
    assert older["send_post_s"] is None and older["ready_receive_s"] is None
    assert older["send_post_mean_s"] is None and older["ready_receive_mean_s"] is None


def test_summary_keeps_the_tail_of_the_ranks_own_work_in_the_mean():
    """Three ready waits of 0.1 ms and one of 4 ms (the thread waited for a core): median 0.1 ms,
    mean 1.075 ms; isend calls 0.1, 0.1, 0.1 and 2.1 ms: median 0.1, mean 0.6 ms."""
    sent = [1.0, 3.0, 5.0, 7.0, 9.0]
    waited = [0.0, 4.0, 6.0, 8.0, 10.0]
    done = [1.002, 4.0001, 6.0001, 8.0001, 10.004]
    records = _records(sent, waited, done)
    records[0] = (*records[0], [0.0001, 0.0001, 0.0001, 0.0021, 0.0001])
    summary = handoff_summary(records, 65536, 0.002, 5)
    assert summary["num_ready"] == 4
    assert summary["ready_receive_s"] == pytest.approx(0.0001)
    assert summary["ready_receive_mean_s"] == pytest.approx(0.001075)
    assert summary["send_post_s"] == pytest.approx(0.0001)
    assert summary["send_post_mean_s"] == pytest.approx(0.0005)


def test_summary_without_a_waiting_receiver_is_an_error():
    with pytest.raises(ValueError, match="no message"):
        handoff_summary(_records([1.0], [2.0], [2.1]), 65536, 0.002, 1)


def _with_handoff(tmp_path, mean_delay_s, name="handoff.json", preposted_s=None, **own_work_s):
    doc = copy.deepcopy(document())
    doc["handoff"] = {"world_size": 4, "size_bytes": 65536, "mean_delay_s": mean_delay_s, "median_delay_s": 0.0002}
    if preposted_s is not None:
        doc["handoff"]["preposted"] = {"num_messages": 20, "mean_delay_s": preposted_s, "median_delay_s": 0.0003,
                                       **own_work_s}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return load_profile(path)


def test_profile_handoff_is_the_mean_delay_beyond_the_idle_ping_pong(tmp_path):
    profile = _with_handoff(tmp_path, 0.001)
    idle_s = profile.p2p.time_s(65536)
    assert ProfileCosts(profile, workload(), shared_host=True).handoff_s == pytest.approx(0.001 - idle_s)
    assert ProfileCosts(profile, workload()).handoff_s == 0.0  # dedicated devices: no shared scheduler
    assert ProfileCosts(_with_handoff(tmp_path, 0.0, "fast.json"), workload(), shared_host=True).handoff_s == 0.0


def test_preposted_receives_have_their_own_handoff_and_older_profiles_share_one(tmp_path):
    profile = _with_handoff(tmp_path, 0.001, preposted_s=0.0025)
    idle_s = profile.p2p.time_s(65536)
    costs = ProfileCosts(profile, workload(), shared_host=True)
    assert costs.handoff_s == pytest.approx(0.001 - idle_s)
    assert costs.handoff_preposted_s == pytest.approx(0.0025 - idle_s)
    older = ProfileCosts(_with_handoff(tmp_path, 0.001, "older.json"), workload(), shared_host=True)
    assert older.handoff_preposted_s == older.handoff_s == pytest.approx(0.001 - idle_s)


def test_a_gpu_profile_pays_its_handoff_without_a_shared_host(tmp_path):
    """On a GPU, gloo stages every message through the host: the handoff and the runtime's own work
    per message apply there too (measured since 2026-11-23), not only on a shared CPU host."""
    doc = copy.deepcopy(document())
    doc["device"] = {"kind": "cuda", "name": "test gpu", "num_threads": 1}
    doc["handoff"] = {"world_size": 4, "size_bytes": 65536, "mean_delay_s": 0.001, "median_delay_s": 0.0002,
                      "preposted": {"num_messages": 20, "mean_delay_s": 0.0025, "median_delay_s": 0.0003,
                                    "send_post_s": 0.0001, "ready_receive_s": 0.00015}}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(doc))
    profile = load_profile(path)
    costs = ProfileCosts(profile, workload())
    assert costs.host_parallelism is None  # no processor-sharing pool on a GPU
    assert costs.handoff_s == pytest.approx(0.001 - profile.p2p.time_s(65536))
    assert (costs.send_post_s, costs.ready_receive_s) == pytest.approx((0.0001, 0.00015))


def test_the_preposted_handoff_leaves_out_the_isend_call_the_engine_plays_before_the_send(tmp_path):
    """The chain times a delay from the start of the sender's isend call; the engine plays that call
    (median and tail) on the sender before the send, then the point-to-point time, then the handoff:
    together exactly the measured mean delay, the call not counted twice."""
    profile = _with_handoff(tmp_path, 0.001, preposted_s=0.0025, send_post_s=0.0001, send_post_mean_s=0.0004)
    costs = ProfileCosts(profile, workload(), shared_host=True)
    idle_s = profile.p2p.time_s(65536)
    assert costs.send_post_s + costs.send_post_tail_s + idle_s + costs.handoff_preposted_s == pytest.approx(0.0025)
    assert costs.handoff_s == pytest.approx(0.001 - idle_s)  # on-demand receives: the engine plays no isend call there


@pytest.mark.parametrize("preposted, field", [({"mean_delay_s": -0.001}, "handoff.preposted.mean_delay_s"),
                                              ([1, 2], "handoff.preposted")])
def test_malformed_preposted_handoff_names_the_field(tmp_path, preposted, field):
    doc = copy.deepcopy(document())
    doc["handoff"] = {"size_bytes": 65536, "mean_delay_s": 0.001, "preposted": preposted}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ScenarioError, match=field):
        load_profile(path)


def test_malformed_handoff_section_names_the_field(tmp_path):
    doc = copy.deepcopy(document())
    doc["handoff"] = {"size_bytes": 65536, "mean_delay_s": -1}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ScenarioError, match="handoff.mean_delay_s"):
        load_profile(path)


def test_model_parallel_step_grows_by_one_handoff_per_message_on_the_critical_path():
    """Two stages, one micro-batch: the activation and its gradient are the only messages and both
    are on the critical path, so the step grows by exactly 2 x handoff_s."""
    toy = toy_workload(4, num_params=1000)
    topology = Topology(1, 2, link(0.0, 1e12), link(0.0, 1e12))
    steps = {}
    for handoff_s in (0.0, 0.003):
        costs = FixedCosts(forward_s_per_sample=0.001)
        costs.handoff_s = handoff_s
        _, spans = run_grid(toy, topology, costs, 1, 2, 8)
        steps[handoff_s] = spans["end_s"].max()
    assert steps[0.003] - steps[0.0] == pytest.approx(2 * 0.003)


def _pipeline_step_s(costs) -> float:
    scenario = load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "intra_node_link": {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}},
        "model": {"name": "mlp"},
        "strategy": {"kind": "gpipe", "num_microbatches": 1, "partition": [2, 2]},
        "training": {"global_batch_size": 8},
    })
    return simulate(scenario, costs=costs, workload=toy_workload(4, num_params=1000)).step_time_s


def test_pipeline_plans_pay_the_preposted_handoff_and_grids_the_on_demand_one():
    """GPipe with one micro-batch on two stages: its activation and gradient are both on the critical
    path, so the step grows by exactly 2 x the pre-posted handoff and not at all with the on-demand
    one; the model-parallel grid of the same layers the other way round."""
    toy = toy_workload(4, num_params=1000)
    topology = Topology(1, 2, link(0.0, 1e12), link(0.0, 1e12))
    pipeline, grid = {}, {}
    for on_demand_s, preposted_s in ((0.0, 0.0), (0.003, 0.0), (0.0, 0.005)):
        costs = FixedCosts(forward_s_per_sample=0.001)
        costs.handoff_s, costs.handoff_preposted_s = on_demand_s, preposted_s
        pipeline[(on_demand_s, preposted_s)] = _pipeline_step_s(costs)
        _, spans = run_grid(toy, topology, costs, 1, 2, 8)
        grid[(on_demand_s, preposted_s)] = spans["end_s"].max()
    assert pipeline[(0.003, 0.0)] == pytest.approx(pipeline[(0.0, 0.0)])
    assert pipeline[(0.0, 0.005)] - pipeline[(0.0, 0.0)] == pytest.approx(2 * 0.005)
    assert grid[(0.003, 0.0)] - grid[(0.0, 0.0)] == pytest.approx(2 * 0.003)
    assert grid[(0.0, 0.005)] == pytest.approx(grid[(0.0, 0.0)])


class _SharedHost(FixedCosts):
    """FixedCosts on a shared host of 2 cores (`simulator.host_sharing`), p2p free."""

    def __init__(self, handoff_s: float):
        super().__init__(forward_s_per_sample=0.001)
        self.host_parallelism = 2.0
        self.handoff_s = self.handoff_preposted_s = handoff_s

    def p2p_s(self, size_bytes: float) -> float:
        return 0.0


def test_on_a_shared_host_an_arrival_while_no_rank_computes_pays_no_handoff():
    """Model parallelism over 4 ranks, one micro-batch: every message arrives while the other ranks
    wait (its sender's compute has ended), as in the ping-pong the p2p fit comes from: no handoff.
    GPipe with 4 micro-batches on 2 stages: the activations of micro-batches 2-4 arrive while the
    second stage computes the one before, and pay it."""
    toy = toy_workload(8, num_params=1000)
    steps = {}
    for handoff_s in (0.0, 0.003):
        _, spans = run_grid(toy, Topology(1, 4, link(0.0, 1e12), link(0.0, 1e12)), _SharedHost(handoff_s), 1, 4, 16)
        steps["mp", handoff_s] = spans["end_s"].max()
        scenario = load_scenario({
            "cluster": {"num_nodes": 1, "gpus_per_node": 2,
                        "intra_node_link": {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}},
            "model": {"name": "mlp"},
            "strategy": {"kind": "gpipe", "num_microbatches": 4, "partition": [4, 4]},
            "training": {"global_batch_size": 16},
        })
        steps["gpipe", handoff_s] = simulate(scenario, costs=_SharedHost(handoff_s), workload=toy).step_time_s
    assert steps["mp", 0.003] == pytest.approx(steps["mp", 0.0])
    assert steps["gpipe", 0.003] > steps["gpipe", 0.0] + 0.003


def test_profile_reads_the_pipeline_runtimes_own_work_per_message(tmp_path):
    profile = _with_handoff(tmp_path, 0.001, preposted_s=0.0025, send_post_s=0.0001, ready_receive_s=0.00015)
    costs = ProfileCosts(profile, workload(), shared_host=True)
    assert (costs.send_post_s, costs.ready_receive_s) == pytest.approx((0.0001, 0.00015))
    assert costs.send_post_tail_s == costs.ready_receive_tail_s == 0.0  # no means recorded
    older = ProfileCosts(_with_handoff(tmp_path, 0.001, "older.json", preposted_s=0.0025), workload(), shared_host=True)
    assert older.send_post_s == older.ready_receive_s == 0.0
    tails = ProfileCosts(_with_handoff(tmp_path, 0.001, "tails.json", preposted_s=0.0025, send_post_s=0.0001,
                                       ready_receive_s=0.00015, send_post_mean_s=0.0006,
                                       ready_receive_mean_s=0.00095), workload(), shared_host=True)
    assert (tails.send_post_tail_s, tails.ready_receive_tail_s) == pytest.approx((0.0005, 0.0008))
    with pytest.raises(ScenarioError, match="handoff.preposted.send_post_s"):
        _with_handoff(tmp_path, 0.001, "bad.json", preposted_s=0.0025, send_post_s=-1.0)


def _gpipe_step_s(costs, m: int, partition: list[int]) -> float:
    scenario = load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "intra_node_link": {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}},
        "model": {"name": "mlp"},
        "strategy": {"kind": "gpipe", "num_microbatches": m, "partition": partition},
        "training": {"global_batch_size": 4 * m},
    })
    return simulate(scenario, costs=costs, workload=toy_workload(sum(partition), num_params=1000)).step_time_s


def _own_work_costs(send_post_s: float, ready_receive_s: float, send_post_tail_s: float = 0.0,
                    ready_receive_tail_s: float = 0.0) -> FixedCosts:
    costs = FixedCosts(forward_s_per_sample=0.001)
    costs.send_post_s, costs.ready_receive_s = send_post_s, ready_receive_s
    costs.send_post_tail_s, costs.ready_receive_tail_s = send_post_tail_s, ready_receive_tail_s
    return costs


def test_pipeline_ranks_spend_their_own_time_on_each_message():
    """GPipe, one micro-batch, two stages: the activation's and the gradient's isend calls are both on
    the critical path (+2 x send_post_s) and both receives are waited for (a handoff, not
    ready_receive_s). One micro-batch more, the second stage three times the first: micro-batch 1's
    activation arrives while the second stage computes micro-batch 0, the only ready receive on the
    critical path (+1 x ready_receive_s)."""
    base = _gpipe_step_s(_own_work_costs(0.0, 0.0), 1, [2, 2])
    assert _gpipe_step_s(_own_work_costs(0.0004, 0.0), 1, [2, 2]) - base == pytest.approx(2 * 0.0004)
    assert _gpipe_step_s(_own_work_costs(0.0, 0.0007), 1, [2, 2]) == pytest.approx(base)
    slow_second = _gpipe_step_s(_own_work_costs(0.0, 0.0), 2, [1, 3])
    assert _gpipe_step_s(_own_work_costs(0.0, 0.0007), 2, [1, 3]) - slow_second == pytest.approx(0.0007)


def test_the_tails_of_the_ranks_own_work_add_along_the_critical_path_like_their_medians():
    """The same two plans with the tails (mean over median) in place of the medians: on a host
    without shared cores a delay and a job of the same length cost the same, so the closed forms
    above hold with the tails: +2 x send tail at one micro-batch, +1 x ready tail at two."""
    base = _gpipe_step_s(_own_work_costs(0.0, 0.0), 1, [2, 2])
    assert _gpipe_step_s(_own_work_costs(0.0, 0.0, send_post_tail_s=0.0005), 1, [2, 2]) - base == pytest.approx(0.001)
    assert _gpipe_step_s(_own_work_costs(0.0, 0.0, ready_receive_tail_s=0.0009), 1, [2, 2]) == pytest.approx(base)
    slow_second = _gpipe_step_s(_own_work_costs(0.0, 0.0), 2, [1, 3])
    both = _own_work_costs(0.0001, 0.0002, send_post_tail_s=0.0, ready_receive_tail_s=0.0009)
    only_median = _own_work_costs(0.0001, 0.0002)
    assert _gpipe_step_s(both, 2, [1, 3]) - _gpipe_step_s(only_median, 2, [1, 3]) == pytest.approx(0.0009)
    assert _gpipe_step_s(_own_work_costs(0.0, 0.0, ready_receive_tail_s=0.0009), 2, [1, 3]) - slow_second \
        == pytest.approx(0.0009)


def test_the_model_parallel_runtime_pays_no_pipeline_message_work():
    """The grid runtime receives on demand: its plans carry no pre-posted receives, so the pipeline
    runtime's per-message time does not apply to it."""
    toy = toy_workload(4, num_params=1000)
    topology = Topology(1, 2, link(0.0, 1e12), link(0.0, 1e12))
    _, plain = run_grid(toy, topology, _own_work_costs(0.0, 0.0), 1, 2, 8)
    _, with_work = run_grid(toy, topology, _own_work_costs(0.0004, 0.0007), 1, 2, 8)
    assert with_work["end_s"].max() == pytest.approx(plain["end_s"].max())
