"""Pipeline plans through the engine against closed forms (uniform stages, free links), replicas
with allreduce, the plan contract, the summary and the user errors."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.collective_forms import ring_allreduce_time_s
from simulator.errors import ScenarioError
from simulator.plan import Compute, Recv, Send
from simulator.workload import Layer, Workload
from tests.helpers import FixedCosts

FREE = {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e18}


class Costs(FixedCosts):
    """F = 1 s per sample per layer, B = 2 s; optimizer 0 s; a prediction `axpy` seconds (a
    re-prediction before a backward `repredict`, default the same), a stash `stash` seconds, an
    accumulation `accumulate` seconds per 1000 parameters."""

    def __init__(self, axpy: float = 0.0, stash: float = 0.0, accumulate: float = 0.0, average: float = 0.0,
                 repredict: float | None = None):
        super().__init__(1.0, 0.0)
        self.axpy, self.stash, self.accumulate, self.average = axpy, stash, accumulate, average
        self.repredict = axpy if repredict is None else repredict

    def weight_pass_s(self, name: str, num_params: int, layers=None) -> float:
        if name == "predict":
            return self.axpy
        if name == "repredict":
            return self.repredict
        return {"stash": self.stash, "accumulate": self.accumulate, "average": self.average}[name] * num_params / 1000


def workload(num_layers: int, params_per_layer=None) -> Workload:
    params = params_per_layer or [1000] * num_layers
    return Workload("toy", tuple(
        Layer(f"l{i}", "linear", 1e9, 2e9, params[i], 100, 100, 100) for i in range(num_layers)))


def run(kind, p, m, partition, groups=1, batch_per_microbatch=2, layers=None, costs=None, inter=FREE, **strategy):
    """Simulate `kind` on G nodes x p devices (group_per_node: a replica per node), every rank's plan
    (`strategy.symmetry` off unless given: the tests read other replicas' actions)."""
    strategy.setdefault("symmetry", "off")
    layers = layers or workload(sum(partition))
    scenario = load_scenario({
        "cluster": {"num_nodes": groups, "gpus_per_node": p, "intra_node_link": FREE, "inter_node_link": inter},
        "model": {"name": "mlp"},
        "strategy": {"kind": kind, "num_groups": groups, "num_microbatches": m, "partition": list(partition),
                     **strategy},
        "training": {"global_batch_size": batch_per_microbatch * m * groups},
    })
    return simulate(scenario, costs=costs or Costs(), workload=layers)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 5), (4, 8)])
def test_flushed_pipeline_step_is_m_plus_p_minus_1_times_tf_plus_tb(kind, p, m):
    result = run(kind, p, m, [2] * p)
    tf = 2 * 2 * 1.0            # b = 2 samples x 2 layers x 1 s
    tb = 2 * tf
    assert result.step_time_s == pytest.approx((m + p - 1) * (tf + tb), rel=1e-9)
    bubbles = [row["bubble_fraction"] for row in result.summary["pipeline"]["stages"]]
    assert bubbles == pytest.approx([(p - 1) / (m + p - 1)] * p, rel=1e-9)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (2, 6, 3)])
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_the_ideal_time(p, m, v):
    result = run("interleaved_1f1b", p, m, [1] * (p * v), num_virtual_stages=v)
    ideal = m * (1 + 2) * 2 * v      # m micro-batches x (tf + tb) of v layers, b = 2
    assert (result.step_time_s - ideal) / ideal == pytest.approx((p - 1) / (v * m), rel=1e-9)
    stage = result.plan.stages[0]
    assert stage.chunks == tuple((c, c + 1) for c in range(0, p * v, p))
    assert (stage.layer_start, stage.layer_end) == (0, (v - 1) * p + 1)


@pytest.mark.parametrize("kind", ["pipedream", "delayed_gradient"])
def test_asynchronous_1f1b_completes_one_microbatch_per_slowest_stage_time(kind):
    # Stages of 1, 3 and 2 layers: the middle one is the bottleneck, (1 + 2) x 3 layers x b = 2.
    result = run(kind, 3, 4, [1, 3, 2])
    slowest_s = 3 * 3 * 2
    assert result.step_time_s == pytest.approx(4 * slowest_s, rel=1e-9)
    assert result.summary["pipeline"]["steady_state_interval_s"] == pytest.approx(slowest_s, rel=1e-9)
    bubbles = [row["bubble_fraction"] for row in result.summary["pipeline"]["stages"]]
    assert bubbles == pytest.approx([2 / 3, 0.0, 1 / 3], abs=1e-9)
    devices = result.summary["devices"]
    assert [row["compute_s"] + row["comm_s"] + row["idle_s"] for row in devices] == pytest.approx(
        [result.step_time_s] * 3)


@pytest.mark.parametrize("kind", ["pipedream", "delayed_gradient", "spectrain"])
def test_a_long_asynchronous_step_is_measured_on_its_own_play_as_on_two_steps(kind):
    """m >= 7p + 1: the 4p micro-batches after the fill of the step's own play, times m / 4p, give
    the step that a run of two whole steps measures over one (stages of 1, 3 and 2 layers; the
    device breakdown sums to the step as well)."""
    from dataclasses import replace

    from simulator.engine import Engine
    from simulator.fabrics import build_topology
    from simulator.schedules.steady_state import microbatch_completions
    from simulator.strategies.pipeline import compile_pipeline_plan, pipeline_config
    p, m = 3, 7 * 3 + 1
    result = run(kind, p, m, [1, 3, 2])
    config = pipeline_config(result.scenario)
    two_steps = replace(config, num_microbatches=2 * m, global_batch_size=2 * config.global_batch_size)
    topology = build_topology(result.scenario.cluster)
    plan = compile_pipeline_plan(two_steps, workload(6), topology, Costs())
    completion = microbatch_completions(Engine(plan, topology, Costs()).run().spans)
    assert result.step_time_s == pytest.approx(completion[2 * p - 1 + m] - completion[2 * p - 1], rel=1e-9)
    assert result.summary["pipeline"]["step_time_definition"].endswith("times m/4p")
    devices = result.summary["devices"]
    assert [row["compute_s"] + row["comm_s"] + row["idle_s"] for row in devices] == pytest.approx(
        [result.step_time_s] * p)


def test_uniform_asynchronous_pipeline_has_no_fill_and_drain():
    p, m = 4, 8
    asynchronous, synchronous = run("pipedream", p, m, [2] * p), run("1f1b", p, m, [2] * p)
    assert asynchronous.step_time_s == pytest.approx(m * 12, rel=1e-9)
    assert synchronous.step_time_s == pytest.approx((m + p - 1) * 12, rel=1e-9)
    assert asynchronous.summary["pipeline"]["one_step_makespan_s"] == pytest.approx(synchronous.step_time_s)


@pytest.mark.parametrize("prediction,passes", [("staggered", 2), ("forward", 1)])
def test_spectrain_pays_one_axpy_per_predicted_pass(prediction, passes):
    axpy = 0.5
    result = run("spectrain", 3, 6, [2] * 3, costs=Costs(axpy), weight_prediction=prediction)
    assert result.step_time_s == pytest.approx(6 * (12 + passes * axpy), rel=1e-9)
    predictions = [a for a in result.plan.actions[0] if isinstance(a, Compute) and a.phase in ("predict", "repredict")]
    assert len(predictions) == passes * 6 and predictions[0].num_params == 2000
    assert result.summary["pipeline"]["stages"][0]["extra_weight_copies"] == 1


def test_staggered_spectrain_costs_the_prediction_before_a_backward_as_a_repredict():
    """The prediction before each backward is its own phase (it also copies into the forward's
    weights), costed apart: the step grows by the difference on every micro-batch."""
    axpy, repredict = 0.5, 1.25
    result = run("spectrain", 3, 6, [2] * 3, costs=Costs(axpy, repredict=repredict), weight_prediction="staggered")
    assert result.step_time_s == pytest.approx(6 * (12 + axpy + repredict), rel=1e-9)
    for actions in result.plan.actions:
        order = [a for a in actions if isinstance(a, Compute)]
        for before, after in zip(order, order[1:]):
            if before.phase in ("predict", "repredict"):
                assert (before.phase, after.phase) in (("predict", "F"), ("repredict", "B"))
                assert before.microbatch == after.microbatch
    forward_only = run("spectrain", 3, 6, [2] * 3, costs=Costs(axpy, repredict=repredict), weight_prediction="forward")
    assert not any(a.phase == "repredict" for actions in forward_only.plan.actions for a in actions
                   if isinstance(a, Compute))


INTER = {"latency_s": 1e-3, "bandwidth_bytes_per_s": 1e6}


def _stage0_params_only(p):
    return workload(2 * p, [250_000, 250_000] + [0] * (2 * p - 2))


def test_replicas_allreduce_the_stage_after_the_flush():
    # 2 replicas x 3 stages; only stage 0 has parameters (2 MB), so one ring crosses the nodes.
    p, m = 3, 4
    result = run("1f1b", p, m, [2] * p, groups=2, layers=_stage0_params_only(p), inter=INTER,
                 overlap_backward=False, collective="ring")
    allreduce = ring_allreduce_time_s(500_000 * 4, 2, INTER["latency_s"], INTER["bandwidth_bytes_per_s"])
    assert result.step_time_s == pytest.approx((m + p - 1) * 12 + allreduce, rel=1e-9)
    overlapped = run("1f1b", p, m, [2] * p, groups=2, layers=_stage0_params_only(p), inter=INTER,
                     bucket_size_bytes=10**6, collective="ring")
    second_bucket = ring_allreduce_time_s(10**6, 2, INTER["latency_s"], INTER["bandwidth_bytes_per_s"])
    # The first bucket (layer 1) overlaps layer 0's backward (4 s > its 1 s allreduce).
    assert overlapped.step_time_s == pytest.approx((m + p - 1) * 12 + second_bucket, rel=1e-9)


def test_asynchronous_replicas_allreduce_every_microbatch():
    p, m = 3, 4
    result = run("pipedream", p, m, [2] * p, groups=2, layers=_stage0_params_only(p), inter=INTER,
                 overlap_backward=False, collective="ring")
    allreduce = ring_allreduce_time_s(500_000 * 4, 2, INTER["latency_s"], INTER["bandwidth_bytes_per_s"])
    assert result.step_time_s == pytest.approx(m * (12 + allreduce), rel=1e-9)
    keys = [a.key for a in result.plan.actions[0] if not isinstance(a, (Compute, Send, Recv))]
    assert keys == [("allreduce", 0, 0, i) for i in range(m)]


def test_plan_follows_the_contract():
    result = run("1f1b", 2, 4, [1, 1], groups=2)
    plan = result.plan
    assert plan.group_batch == 8 and plan.workers_per_group == 2 and plan.num_groups == 2
    rank = plan.rank_of(1, 1)
    computes = [a for a in plan.actions[rank] if isinstance(a, Compute)]
    assert [(a.phase, a.microbatch) for a in computes] == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3), ("opt", -1)]
    assert {a.batch for a in computes} == {2}
    receives = [a.key for a in plan.actions[rank] if isinstance(a, Recv)]
    sends = [a.key for a in plan.actions[rank] if isinstance(a, Send)]
    assert receives == [("act", 1, 0, i) for i in range(4)] and sends == [("grad", 1, 0, i) for i in range(4)]
    assert plan.meta["schedule_kind"] == "1f1b" and plan.meta["microbatches_in_flight"] == [2, 1]
    assert plan.meta["asynchronous"] is False and plan.meta["weight_stashing"] is False
    stashing = run("pipedream", 2, 4, [1, 1], weight_stashing=True).plan.meta
    no_stash = run("pipedream", 2, 4, [1, 1], weight_stashing=False).plan.meta
    assert stashing["stashed_weight_versions"] == [1, 0] and no_stash["stashed_weight_versions"] == [0, 0]
    assert stashing["weight_staleness"] == no_stash["weight_staleness"] == [1, 0]


def test_simulate_table_shows_the_stages(capsys):
    from simulator.tables import print_summary, make_console
    print_summary(run("pipedream", 2, 4, [1, 1]), make_console())
    output = capsys.readouterr().out
    assert "per stage" in output and "steady state" in output


@pytest.mark.parametrize("kind,m,extra,message", [
    ("1f1b", 3, {}, "strategy.num_microbatches: 3 does not divide the group batch 8"),
    ("gpipe", 4, {"num_virtual_stages": 2}, "strategy.num_virtual_stages: 2 is only used by interleaved_1f1b"),
    ("interleaved_1f1b", 2, {"num_virtual_stages": 3}, "strategy.num_virtual_stages: 2 stages x 3 chunks exceed"),
])
def test_impossible_pipelines_are_scenario_errors(kind, m, extra, message):
    scenario = load_scenario({"cluster": {"num_nodes": 1, "gpus_per_node": 2}, "model": {"name": "mlp"},
                              "strategy": {"kind": kind, "num_microbatches": m, **extra},
                              "training": {"global_batch_size": 8}})
    with pytest.raises(ScenarioError, match=message):
        simulate(scenario, costs=Costs(), workload=workload(4))


def test_one_scenario_compares_flat_and_interleaved_schedules():
    """with_strategy keeps num_virtual_stages for interleaved_1f1b only, so the validator can launch
    1f1b and interleaved_1f1b of one scenario in the same rounds."""
    from simulator.compare import with_strategy
    scenario = load_scenario({"cluster": {"num_nodes": 1, "gpus_per_node": 2, "intra_node_link": FREE},
                              "model": {"name": "mlp"},
                              "strategy": {"kind": "dp", "num_virtual_stages": 2},
                              "training": {"global_batch_size": 8}})
    flat = with_strategy(scenario, "1f1b:4")
    interleaved = with_strategy(scenario, "interleaved_1f1b:4")
    assert flat.strategy.num_virtual_stages == 1
    assert interleaved.strategy.num_virtual_stages == 2
    steps = {name: simulate(variant, costs=Costs(), workload=workload(4)).step_time_s
             for name, variant in (("flat", flat), ("interleaved", interleaved))}
    # uniform stages, free links: (m + p - 1)(t_f + t_b) against a bubble cut to (p - 1)/(v m)
    ideal_s = 4 * 2 * 2 * (1 + 2)  # m x layers per stage x batch per micro-batch x (F + B)
    assert steps["flat"] == pytest.approx(ideal_s * (1 + 1 / 4))
    assert steps["interleaved"] == pytest.approx(ideal_s * (1 + 1 / 8))


def test_asynchronous_stages_pay_their_stash_and_accumulation_passes():
    # 3 stages of 2 layers of 1000 parameters; per micro-batch a stage computes 12 s, stashes
    # 2000 parameters (0.25 s / 1000) and accumulates them (0.5 s / 1000): 13.5 s per micro-batch
    costs = Costs(stash=0.25, accumulate=0.5)
    stashing = run("pipedream", 3, 6, [2] * 3, costs=costs)
    assert stashing.step_time_s == pytest.approx(6 * (12 + 0.5 + 1.0), rel=1e-9)
    actions = [a for a in stashing.plan.actions[1] if isinstance(a, Compute)]
    phases = [a.phase for a in actions]
    assert phases[:6] == ["stash", "F", "stash", "F", "B", "accumulate"]  # 1F1B warm-up of stage 1
    assert {a.num_params for a in actions if a.phase in ("stash", "accumulate")} == {2000}
    # no stashing: only the accumulation; synchronous kinds: neither
    newest = run("pipedream", 3, 6, [2] * 3, costs=costs, weight_stashing=False)
    assert newest.step_time_s == pytest.approx(6 * (12 + 1.0), rel=1e-9)
    flushed = run("1f1b", 3, 6, [2] * 3, costs=costs)
    assert flushed.step_time_s == pytest.approx((6 + 3 - 1) * 12, rel=1e-9)


def test_replicated_stages_average_their_gradients_before_the_update():
    # 2 replicas (free links: the allreduce takes no time); each stage's 2000 parameters are
    # divided by G at 0.5 s per 1000 before the update; one replica has nothing to average
    p, m = 3, 4
    replicated = run("1f1b", p, m, [2] * p, groups=2, costs=Costs(average=0.5))
    assert replicated.step_time_s == pytest.approx((m + p - 1) * 12 + 1.0, rel=1e-9)
    single = run("1f1b", p, m, [2] * p, costs=Costs(average=0.5))
    assert single.step_time_s == pytest.approx((m + p - 1) * 12, rel=1e-9)


def test_weight_pass_costs_analytic_and_profiled():
    from simulator.costs import AnalyticCosts
    from simulator.hardware import resolve_gpu
    from simulator.profile import profile_from_dict
    from simulator.profile_costs import ProfileCosts
    from tests.test_profile import document
    from tests.test_profile import workload as mlp

    gpu = resolve_gpu("V100")
    analytic = AnalyticCosts(workload(2), gpu, "fp16", "momentum")
    # prediction: reads W and v, writes W_hat: 3 x params x 2 bytes at the memory bandwidth
    assert analytic.weight_pass_s("predict", 10**6) == pytest.approx(3 * 10**6 * 2 / gpu.memory_bandwidth_bytes_per_s)
    assert analytic.weight_pass_s("stash", 10**6) == pytest.approx(2 * 10**6 * 2 / gpu.memory_bandwidth_bytes_per_s)
    doc = document()
    doc.pop("weight_passes")
    doc["optimizer"] = {"name": "momentum", "intercept_s": 5e-5, "per_param_s": 1e-9}
    profiled = ProfileCosts(profile_from_dict(doc), mlp())
    # no weight_passes section: scaled from the momentum update (5 words per parameter)
    assert profiled.weight_pass_s("predict", 10**6) == pytest.approx(5e-5 + 1e-9 * 10**6 * 3 / 5)
    assert profiled.weight_pass_s("accumulate", 10**6) == pytest.approx(5e-5 + 1e-9 * 10**6 * 3 / 5)
    assert profiled.weight_pass_s("stash", 10**6) == pytest.approx(5e-5 + 1e-9 * 10**6 * 2 / 5)
    assert profiled.weight_pass_s("predict", 0) == 0.0
    # measured passes replace the estimate
    doc["weight_passes"] = {"stash": {"intercept_s": 1e-5, "per_param_s": 2e-9},
                            "predict": {"intercept_s": 2e-5, "per_param_s": 3e-9}}
    measured = ProfileCosts(profile_from_dict(doc), mlp())
    assert measured.weight_pass_s("stash", 10**6) == pytest.approx(1e-5 + 2e-3)
    assert measured.weight_pass_s("predict", 10**6) == pytest.approx(2e-5 + 3e-3)
    assert measured.weight_pass_s("accumulate", 10**6) == pytest.approx(5e-5 + 1e-9 * 10**6 * 3 / 5)
    # a profile from before the re-prediction was timed: its prediction's fit, as then
    assert measured.weight_pass_s("repredict", 10**6) == pytest.approx(2e-5 + 3e-3)
    doc["weight_passes"]["repredict"] = {"intercept_s": 4e-5, "per_param_s": 6e-9}
    assert ProfileCosts(profile_from_dict(doc), mlp()).weight_pass_s("repredict", 10**6) == pytest.approx(4e-5 + 6e-3)
    # and without any weight pass, from the update like the others (5 of momentum's 5 words)
    assert profiled.weight_pass_s("repredict", 10**6) == pytest.approx(5e-5 + 1e-9 * 10**6 * 5 / 5)
    doc["weight_passes"] = {"copy": {"intercept_s": 1e-5, "per_param_s": 2e-9}}
    with pytest.raises(ScenarioError, match="weight_passes.copy"):
        profile_from_dict(doc)
    doc["weight_passes"] = {"stash": {"intercept_s": -1, "per_param_s": 2e-9}}
    with pytest.raises(ScenarioError, match="weight_passes.stash.intercept_s"):
        profile_from_dict(doc)
