"""The pipeline runtime's own message figures (`handoff.runtime`, recorded by the calibration and
played for asynchronous plans where each rank has a core): the records taken from the runtime's spans, the profile section and its
errors, the figures as the cost model turns them into message costs, and the microbenchmark on two real
ranks."""

import json

import pytest

from simulator.errors import ScenarioError
from simulator.profile import load_profile
from simulator.profile_costs import ProfileCosts
from simulator.profile_host import message_costs
from tests.test_handoff_cycle import CYCLE, _profile
from tests.test_profile import workload
from validator.handoff_bench import CYCLE_REQUIRED_KEYS, handoff_summary
from validator.runtime_messages_bench import message_records, thread_cpu_per_message_s

RUNTIME = {**CYCLE, "mean_delay_s": 0.001, "send_post_mean_s": 0.0003, "ready_receive_mean_s": 0.0002,
           "workload": "mlp 768x8, pipedream:4, micro-batch 16"}


def test_runtime_spans_become_the_cycles_records_and_summary():
    """Rank 0 sends act3 at 1.0 ms (call 0.1 ms) and waits for grad3 from 2.0 ms; rank 1 starts
    waiting for act3 before it was sent (0.5 ms) and returns at 1.4 ms, sends grad3 at 1.2 ms, which
    rank 0 comes to 0.8 ms later: one waited message (delay 0.4 ms from the isend) and one arrived
    (wait 0.1 ms). Times are from each rank's step start, 10 s on both clocks."""
    rank0 = [(0, "compute", "F3 L0-2", "F", 0.0, 0.001, 0.0, 3),
             (0, "send", "send act3", "send", 0.001, 0.0011, 4096.0, 3),
             (0, "recv", "recv grad3", "recv", 0.002, 0.0021, 4096.0, 3)]
    rank1 = [(1, "recv", "recv act3", "recv", 0.0005, 0.0014, 4096.0, 3),
             (1, "send", "send grad3", "send", 0.0012, 0.0013, 4096.0, 3)]
    records = [message_records(rank0, 7, 0, 10.0), message_records(rank1, 7, 1, 10.0)]
    sends, receives, posts = records[0]
    assert sends == [(7, +1, 3, 1, pytest.approx(10.001))]
    assert receives == [(7, -1, 3, 0, pytest.approx(10.002), pytest.approx(10.0021))]
    assert posts == [pytest.approx(0.0001)]
    summary = handoff_summary(records, 0, 0.0, 4)
    assert summary["num_messages"] == 1 and summary["mean_delay_s"] == pytest.approx(0.0004)
    assert summary["num_ready"] == 1 and summary["ready_receive_mean_s"] == pytest.approx(0.0001)
    assert summary["send_post_mean_s"] == pytest.approx(0.0001)


def test_profile_reads_the_runtime_section_beside_the_cycle(tmp_path):
    profile = _profile(tmp_path, CYCLE)
    doc_path = tmp_path / "runtime.json"
    doc = json.loads((tmp_path / "cycle.json").read_text())
    doc["handoff"]["runtime"] = RUNTIME
    doc_path.write_text(json.dumps(doc))
    with_runtime = load_profile(doc_path)
    assert with_runtime.handoff.runtime.mean_delay_s == 0.001
    assert profile.handoff.runtime is None
    # what `reports/diagnostics/ws4_async_gap/whatif_variants.py runtime_messages` plays: the same
    # costs as the cycle's, from the runtime's figures; the model itself keeps the cycle's
    idle_s = with_runtime.p2p.time_s(65536)
    runtime = message_costs(with_runtime.handoff.runtime, idle_s)
    assert runtime.send_post_s + runtime.send_post_tail_s + idle_s + runtime.handoff_s == pytest.approx(0.001)
    assert runtime.ready_receive_tail_s == pytest.approx(0.0001)
    costs = ProfileCosts(with_runtime, workload(), shared_host=True)
    assert costs.asynchronous_messages == message_costs(with_runtime.handoff.cycle, idle_s)
    assert costs.asynchronous_messages.handoff_s > runtime.handoff_s
    # a core per rank (no pass_jitter level below the world size): asynchronous plans pay the
    # runtime's figures (`ProfileCosts.runtime_messages`); a dedicated device and older profiles: none
    assert costs.runtime_messages == runtime
    assert ProfileCosts(with_runtime, workload()).runtime_messages is None
    assert ProfileCosts(profile, workload(), shared_host=True).runtime_messages is None
    # ranks outnumbering the host's cores (it also timed passes with fewer ranks at once): the cycle's
    doc["pass_jitter"] = {"batch_size": 16, "levels": {str(k): [[0.01] * k, [0.012] * k]
                                                      for k in (1, doc["world_size"])}}
    doc_path.write_text(json.dumps(doc))
    assert ProfileCosts(load_profile(doc_path), workload(), shared_host=True).runtime_messages is None


@pytest.mark.parametrize("key", CYCLE_REQUIRED_KEYS)
def test_malformed_runtime_section_names_the_field(tmp_path, key):
    _profile(tmp_path, CYCLE)
    doc = json.loads((tmp_path / "cycle.json").read_text())
    doc["handoff"]["runtime"] = {**RUNTIME, key: -0.001}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ScenarioError, match=f"handoff.runtime.{key}"):
        load_profile(path)


def _runtime_rank_main(rank: int):
    import torch
    torch.set_num_threads(1)
    from validator.runtime_messages_bench import measure_runtime_messages
    return measure_runtime_messages(steps=3, warmup=1)


def test_the_runtimes_messages_are_timed_on_two_real_ranks():
    """Two gloo ranks run PipeDream on the synthetic MLP; every figure the profile reads is there and
    each kind of message was seen."""
    from validator.launch import LaunchConfig, spawn
    section = spawn(_runtime_rank_main, (), LaunchConfig(world_size=2))[0]
    assert section is not None and set(CYCLE_REQUIRED_KEYS) <= set(section)
    assert section["num_messages"] >= 1 and section["num_ready"] >= 1
    assert section["mean_delay_s"] > 0 and section["send_post_s"] > 0
    assert "mlp" in section["workload"]


def test_thread_cpu_per_message_is_the_ranks_sum_over_their_message_ends():
    # rank 0: 3 ms of other-thread CPU over 10 ends; rank 1: 1 ms over 10 (a negative clock jitter
    # counts as 0); no message timed: 0
    assert thread_cpu_per_message_s([(0.003, 10), (0.001, 10)]) == pytest.approx(0.0002)
    assert thread_cpu_per_message_s([(0.002, 4), (-1e-6, 4)]) == pytest.approx(0.00025)
    assert thread_cpu_per_message_s([(0.001, 0)]) == 0.0
