"""Pass jitter (simulator.pass_jitter): the profile section, the level a plan draws from, and the
jittered step against closed forms on a toy model with free links."""

from __future__ import annotations

import re
import statistics

import pytest

from simulator import load_scenario, simulate
from simulator.document_reader import DocumentReader
from simulator.errors import ScenarioError
from simulator.pass_jitter import (PassJitter, compute_concurrency, jittered_prediction, jittered_step_times_s,
                                   parse_pass_jitter, shared_work_s)
from simulator.workload import Layer, Workload
from tests.helpers import FixedCosts

FREE = {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}


def parse(section: dict) -> PassJitter | None:
    return parse_pass_jitter(DocumentReader("p.json"), {"pass_jitter": section})


def test_rows_become_factors_over_the_median_of_their_level():
    jitter = parse({"batch_size": 16, "levels": {"2": [[0.010, 0.020], [0.010, 0.030]], "1": [[0.004], [0.002]]}})
    assert jitter.batch_size == 16
    assert list(jitter.levels) == [1, 2]
    flat = [f for row in jitter.levels[2] for f in row]  # median of 10, 20, 10, 30 ms: 15
    assert flat == pytest.approx([2 / 3, 4 / 3, 2 / 3, 2.0])
    assert [row[0] for row in jitter.levels[1]] == pytest.approx([4 / 3, 2 / 3])
    spread = jitter.spread(2)
    assert spread["median_slowest_factor"] == pytest.approx(5 / 3) and spread["passes"] == 2
    assert parse_pass_jitter(DocumentReader("p.json"), {}) is None


@pytest.mark.parametrize("section,field", [
    ({"batch_size": 4, "levels": {"2": [[0.01, 0.02], [0.01]]}}, "pass_jitter.levels.2[1]"),
    ({"batch_size": 4, "levels": {"2": [[0.01, -0.02]]}}, "pass_jitter.levels.2[0][1]"),
    ({"batch_size": 4, "levels": {"two": [[0.01, 0.02]]}}, "pass_jitter.levels.two"),
    ({"batch_size": 4, "levels": {"2": []}}, "pass_jitter.levels.2"),
    ({"batch_size": 0, "levels": {"1": [[0.01]]}}, "pass_jitter.batch_size"),
    ({"batch_size": 4, "levels": {}}, "pass_jitter.levels"),
    ({"batch_size": 4, "levels": {"2": [[0.01, 0.02]]}, "start_offsets_s": {"2": [[0.0, -0.001]]}},
     "pass_jitter.start_offsets_s.2[0][1]"),
    ({"batch_size": 4, "levels": {"2": [[0.01, 0.02]]}, "start_offsets_s": {"2": [[0.0, 0.001], [0.0, 0.0]]}},
     "pass_jitter.start_offsets_s.2"),
    ({"batch_size": 4, "levels": {"2": [[0.01, 0.02]]}, "start_offsets_s": {"2": [[0.0]]}},
     "pass_jitter.start_offsets_s.2[0]"),
])
def test_a_bad_section_names_the_field(section, field):
    with pytest.raises(ScenarioError, match=re.escape(f"p.json: {field}: ")):
        parse(section)


def test_start_offsets_stay_in_seconds_and_a_level_without_them_starts_together():
    jitter = parse({"batch_size": 4, "levels": {"1": [[0.01]], "2": [[0.01, 0.03], [0.02, 0.02]]},
                    "start_offsets_s": {"2": [[0.0, 0.004], [0.002, 0.0]]}})
    assert jitter.start_offsets_s == {2: ((0.0, 0.004), (0.002, 0.0))}
    assert jitter.times_s[2] == ((0.01, 0.03), (0.02, 0.02))
    assert [offsets for _, offsets in jitter.speed_draws(2, 9)] == [(0.0, 0.004), (0.002, 0.0)]
    assert jitter.speed_draws(1, 9) == [((1.0,), (0.0,))]


def test_shared_work_is_each_ranks_share_of_the_cores_while_it_ran():
    """One core, ranks over [0, 10] and [5, 15]: alone 5 s, sharing 5 s at half speed: 7.5 s each."""
    assert shared_work_s([0.0, 5.0], [10.0, 10.0], 1.0) == pytest.approx((7.5, 7.5))
    assert shared_work_s([0.0] * 4, [20.0] * 4, 2.0) == pytest.approx((10.0,) * 4)
    assert shared_work_s([0.0, 0.0], [4.0, 10.0], 2.0) == pytest.approx((4.0, 10.0))  # a core each
    assert shared_work_s([0.0, 0.0, 0.0], [3.0, 3.0, 6.0], 1.0) == pytest.approx((1.0, 1.0, 4.0))


def test_the_level_nearest_the_concurrency_and_evenly_spaced_draws():
    jitter = PassJitter(4, {2: tuple((float(i), 1.0) for i in range(10)), 4: ((1.0,) * 4,)})
    assert jitter.level_for(1.0) == 2 and jitter.level_for(3.0) == 4 and jitter.level_for(3.9) == 4
    assert jitter.level_for(2.9) == 2
    assert [row[0] for row in jitter.draws(2, 5)] == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert len(jitter.draws(2, 50)) == 10


# ----------------------------------------------------------------------------- engine

class JitteredCosts(FixedCosts):
    """F = 1 s per sample per layer, B = 2 s, free update; a pass_jitter section."""

    def __init__(self, workload: Workload, jitter: PassJitter):
        super().__init__(1.0, 0.0)
        self.workload = workload
        self.pass_jitter = jitter


def toy() -> Workload:
    return Workload("toy", tuple(Layer(f"l{i}", "linear", 1e9, 2e9, 1000, 100, 100, 100) for i in range(2)))


def run(kind: str, jitter: PassJitter, batch: int):
    strategy = {"kind": "mp", "partition": [1, 1]} if kind == "mp" else {"kind": "dp", "num_groups": 2}
    scenario = load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "intra_node_link": FREE, "inter_node_link": FREE},
        "model": {"name": "mlp"}, "strategy": strategy, "training": {"global_batch_size": batch}})
    costs = JitteredCosts(toy(), jitter)
    return simulate(scenario, costs=costs, workload=costs.workload), costs


ROWS = ((1.0, 1.0), (1.0, 2.0), (2.0, 1.0))


def test_data_parallel_waits_for_the_slower_rank_of_each_draw():
    """Two groups of batch 1 over both layers (F 2 s, B 4 s), free allreduce: step = 6 max(a, b)."""
    result, costs = run("dp", PassJitter(2, {2: ROWS}), batch=2)
    assert result.step_time_s == pytest.approx(6.0)
    assert compute_concurrency(result) == pytest.approx(2.0, rel=1e-6)
    level, times = jittered_step_times_s(result, costs)
    assert level == 2 and times == pytest.approx([6.0, 12.0, 12.0])
    prediction = jittered_prediction(result, costs)
    assert prediction["step_time_s"] == pytest.approx(12.0) and prediction["nominal_step_s"] == pytest.approx(6.0)
    assert prediction["p10_step_s"] == pytest.approx(6.0) and prediction["p90_step_s"] == pytest.approx(12.0)
    assert result.plan.num_ranks == 2  # the plan played is the one simulated, not recompiled


def test_a_pipeline_of_two_ranks_taking_turns_adds_their_slowdowns_and_draws_from_one_rank_at_once():
    """Two stages of one layer, batch 1: F0, F1, B1, B0 one after another, step = 3 a + 3 b; the
    ranks compute one at a time (concurrency 1), so the one-rank level is drawn."""
    jitter = PassJitter(2, {1: ((1.0,), (2.0,), (1.0,)), 2: ((5.0, 5.0),)})
    result, costs = run("mp", jitter, batch=1)
    assert result.step_time_s == pytest.approx(6.0)
    assert compute_concurrency(result) == pytest.approx(1.0, rel=1e-6)
    level, times = jittered_step_times_s(result, costs)
    assert level == 1 and times == pytest.approx([6.0, 12.0, 6.0])
    level, times = jittered_step_times_s(result, JitteredCosts(toy(), PassJitter(2, {2: ROWS})))
    assert times == pytest.approx([6.0, 9.0, 9.0])
    assert statistics.median(times) == pytest.approx(9.0)


def test_a_rank_leaving_the_barrier_late_delays_the_step_from_the_first_ranks_start():
    """DP as above (6 s of compute per rank at factor 1), free links and update; draw i leaves the
    allreduce with the offsets of row i + 1 (half the 3 rows on). Draw 1: rank 1 starts 3 s late,
    rank 0 waits for it at the allreduce: 9 s (exits 0, 0). Draw 2: rank 1 (factor 2) ends at 12,
    rank 0 leaves the allreduce 1 s late: 13 s. Draw 3: rank 0 (factor 2) starts 1 s late and ends
    at 13 (12 s from its start); rank 1, started at 0, leaves the allreduce 3 s late: 16 s."""
    jitter = PassJitter(2, {2: ROWS}, start_offsets_s={2: ((0.0, 3.0), (0.0, 0.0), (1.0, 0.0))})
    assert jitter.exit_draws(2, 9) == [(0.0, 0.0), (1.0, 0.0), (0.0, 3.0)]
    result, costs = run("dp", jitter, batch=2)
    assert jittered_step_times_s(result, costs)[1] == pytest.approx([9.0, 13.0, 16.0])


def test_exit_offsets_delay_only_a_rank_that_waited_for_a_collective():
    """The same plans on a topology whose rank 1 leaves each collective it waited for 2 s late: DP
    (6 s of compute, free allreduce and update) ends at 8 s; MP has no collective and stays at 6 s;
    a level without start offsets draws none."""
    from simulator.engine import Engine
    from simulator.simulate import engine_costs
    from simulator.topology import build_topology

    for kind, expected_s in (("dp", 8.0), ("mp", 6.0)):
        result, costs = run(kind, PassJitter(2, {2: ROWS}), batch=2 if kind == "dp" else 1)
        topology = build_topology(result.scenario.cluster)
        topology.exit_delays_s = {result.plan.rank_to_device[1]: 2.0}
        spans = Engine(result.plan, topology, engine_costs(result.plan, costs)).run().spans
        assert max(span[5] for span in spans) == pytest.approx(expected_s)
    assert PassJitter(2, {2: ROWS}).exit_draws(2, 9) == [(0.0, 0.0)] * 3


def test_on_a_shared_core_a_replayed_pass_ends_as_measured():
    """Both ranks on one core (P = 1), passes of 12 s measured. Together from 0: 6 s of work each,
    the typical pass (factor 1: the nominal 6 s). Rank 1 starting 6 s late: rank 0 ran alone 6 s, then
    both at half speed until 12; 9 s of work each (factor 1.5). Replayed: [0, 12] and [6, 18], and
    the DP step (free allreduce) 18 s from rank 0's start. Draw 1 leaves the allreduce with the
    offsets of the late row (rank 1 resumes 6 s late, 18 s), draws 2 and 3 with none."""
    together, late = (12.0, 12.0), (0.0, 6.0)
    jitter = PassJitter(2, {2: ((1.0, 1.0),) * 3}, start_offsets_s={2: ((0.0, 0.0), late, (0.0, 0.0))},
                        times_s={2: (together, together, together)})
    assert [factors for factors, _ in jitter.speed_draws(2, 9, parallelism=1.0)] == [
        pytest.approx((1.0, 1.0)), pytest.approx((1.5, 1.5)), pytest.approx((1.0, 1.0))]
    result, costs = run("dp", jitter, batch=2)
    costs.host_parallelism = 1.0
    level, times = jittered_step_times_s(result, costs)
    assert level == 2 and times == pytest.approx([18.0, 18.0, 12.0])


def test_without_a_section_there_is_no_jittered_prediction():
    result, _ = run("dp", PassJitter(2, {2: ROWS}), batch=2)
    assert jittered_prediction(result, FixedCosts()) is None
