"""The lean engine (issue 73): no SimPy event or process per action or send, waiters only for what is
waited on, data parallelism linear in the ranks, and sizes refused before a plan outgrows memory."""

from __future__ import annotations

import pytest
import simpy

import simulator.limits as limits
from simulator import load_scenario, simulate
from simulator.engine import Engine
from simulator.errors import ScenarioError, SimulationError
from simulator.network import FlowNetwork
from simulator.plan import Collective, Compute, Plan, Recv, Send, Stage
from simulator.strategies import compile_plan
from simulator.topology import Topology
from tests.helpers import FixedCosts, link, toy_workload
from tests.test_bad_input import BASE, assert_one_line_error, run_cli, write_scenario


def two_node_topology() -> Topology:
    return Topology(2, 1, link(1e-6, 1e9), link(1e-5, 1e8))


def chain_plan(num_actions: int, batch: float = 1.0) -> Plan:
    """Rank 0 runs `num_actions` computes in a chain, then sends to rank 1, which computes."""
    first = tuple(Compute(i, "F", 0, 1, batch, deps=(i - 1,) if i else ()) for i in range(num_actions))
    first += (Send(num_actions, 1, 1e6, ("x",), deps=(num_actions - 1,)),)
    second = (Recv(0, 0, ("x",)), Compute(1, "F", 0, 1, batch, deps=(0,)))
    stages = (Stage(0, 0, 1, 0), Stage(1, 0, 1, 0))
    return Plan("mp", 1, 2, stages, (0, 1), (first, second), batch)


def test_no_event_or_process_per_action(monkeypatch):
    """A chain of 200 computes costs one timeout each: no done event per action, no process at all."""
    def no_process(self, generator):
        raise AssertionError("the engine started a SimPy process")
    monkeypatch.setattr(simpy.Environment, "process", no_process)
    engine = Engine(chain_plan(200), two_node_topology(), FixedCosts(forward_s_per_sample=1e-3))
    result = engine.run()
    num_actions = 203
    simpy_events = result.num_events - num_actions  # num_events = SimPy events + action completions
    assert simpy_events <= 201 + 2, simpy_events  # 201 computes + one flow timer and the send's latency
    # 200 computes, the send (route latency 1e-6 + 1e-5, 1 MB at 100 MB/s), the receiver's compute
    assert max(span[5] for span in result.spans) == pytest.approx(0.2 + 1e-6 + 1e-5 + 1e6 / 1e8 + 1e-3, rel=1e-12)


def test_zero_duration_chains_do_not_recurse():
    """5,000 free computes in a chain complete at t = 0 without exhausting the stack."""
    result = Engine(chain_plan(5000, batch=0.0), two_node_topology(), FixedCosts()).run()
    computes = [span for span in result.spans if span[1] == "compute"]
    assert len(computes) == 5001 and all(span[4] == span[5] == 0.0 for span in computes[:-1])


def test_action_ids_need_not_be_positions():
    plan = chain_plan(3)
    renumbered = tuple(tuple(type(a)(**{**a.__dict__, "id": a.id * 10 + 7,
                                        **({"deps": tuple(d * 10 + 7 for d in a.deps)} if hasattr(a, "deps") else {})})
                             for a in rank) for rank in plan.actions)
    base = Engine(plan, two_node_topology(), FixedCosts()).run().spans
    moved = Engine(Plan(plan.strategy, 1, 2, plan.stages, plan.rank_to_device, renumbered, 1.0),
                   two_node_topology(), FixedCosts()).run().spans
    assert sorted(s[4:6] for s in moved) == sorted(s[4:6] for s in base)


def test_a_receive_nobody_sends_is_a_deadlock():
    plan = chain_plan(1)
    lonely = plan.actions[1] + (Recv(2, 0, ("never",)), Compute(3, "F", 0, 1, 1.0, deps=(2,)))
    with pytest.raises(SimulationError, match="never ran"):
        Engine(Plan("mp", 1, 2, plan.stages, (0, 1), (plan.actions[0], lonely), 1.0), two_node_topology(),
               FixedCosts()).run()


def test_collective_waits_for_every_participant():
    """An allreduce starts when the later rank reaches it; both ranks' spans share its start."""
    slow = (Compute(0, "F", 0, 1, 3.0), Collective(1, "allreduce", (0, 1), 1e6, ("ar",), deps=(0,)))
    fast = (Compute(0, "F", 0, 1, 1.0), Collective(1, "allreduce", (0, 1), 1e6, ("ar",), deps=(0,)))
    plan = Plan("dp", 2, 1, (Stage(0, 0, 1, 0),), (0, 1), (slow, fast), 1.0)
    spans = Engine(plan, two_node_topology(), FixedCosts()).run().spans
    comm = [span for span in spans if span[1] == "comm"]
    assert len(comm) == 2 and all(span[4] == pytest.approx(3.0) for span in comm)


def test_flow_callbacks_and_events_finish_alike():
    """A flow's on_done callback fires at the time its event would succeed, alone or sharing a link."""
    finishes = {}
    for mode in ("event", "callback"):
        env = simpy.Environment()
        network = FlowNetwork(env, [100.0, 100.0])
        times = finishes[mode] = []
        for size, usage in ((100.0, ((0, 1),)), (300.0, ((0, 1), (1, 1))), (50.0, ((1, 1),))):
            if mode == "event":
                network.transfer(size, usage).callbacks.append(lambda _e: times.append(env.now))
            else:
                network.transfer(size, usage, on_done=lambda: times.append(env.now))
        env.run()
    assert finishes["event"] == finishes["callback"] == pytest.approx([1.0, 2.0, 4.0])  # C, A, then B alone


UNFOLDED = {"kind": "dp", "symmetry": "off"}
"""Data parallelism simulated rank by rank (`simulator.grid_symmetry` folds it otherwise)."""


def dp_scenario(nodes: int):
    return load_scenario({**BASE, "cluster": {"num_nodes": nodes, "gpus_per_node": 8, "gpu": "V100"},
                          "strategy": UNFOLDED, "training": {"global_batch_size": 8 * nodes}})


def test_data_parallel_peers_are_one_tuple():
    """Every rank's allreduce names the same peers tuple: the plan grows linearly with the ranks."""
    scenario = dp_scenario(8)
    from simulator.model_source import resolve_workload
    from simulator.simulate import analytic_costs
    from simulator.fabrics import build_topology
    workload = resolve_workload(scenario.model)
    topology = build_topology(scenario.cluster)
    plan = compile_plan(scenario, workload, topology, analytic_costs(scenario, workload))
    peers = {id(a.ranks) for rank in plan.actions for a in rank if isinstance(a, Collective)}
    assert len(peers) == 1 and plan.num_ranks == 64


def test_a_plan_larger_than_memory_is_refused_up_front(monkeypatch):
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 2**14)
    with pytest.raises(ScenarioError, match=r"simulating 64 ranks x ~\d+ actions needs ~.* GiB, more than the 0.0 GiB"):
        simulate(dp_scenario(8))


def test_the_refusal_names_the_share_of_memory_a_simulation_may_use(monkeypatch):
    # needed between the headroom's share and all of the memory: the message must not claim that
    # the need exceeds what the machine has
    needed = 64 * 1_000 * limits.BYTES_PER_ACTION
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: needed / (limits.MEMORY_HEADROOM + 0.1))
    with pytest.raises(ScenarioError) as refused:
        limits.check_simulation_size(64, 1_000)
    message = str(refused.value)
    assert "a simulation may use (80% of the" in message and message.count("GiB") == 3
    limits.check_simulation_size(64, 800)  # within the share: no error


def test_cli_refuses_an_oversized_simulation_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 2**14)
    path = write_scenario(tmp_path, {**BASE, "cluster": {"num_nodes": 2, "gpus_per_node": 8, "gpu": "V100"},
                                     "strategy": UNFOLDED})
    assert_one_line_error(run_cli(capsys, "simulate", path), "16 ranks", "GiB")


def test_a_simulation_pauses_the_cyclic_collector_and_restores_it(monkeypatch):
    import gc
    import importlib

    simulate_module = importlib.import_module("simulator.simulate")  # the package exports the function
    seen = []
    run = simulate_module._simulate
    monkeypatch.setattr(simulate_module, "_simulate", lambda *args: seen.append(gc.isenabled()) or run(*args))
    scenario = load_scenario("scenarios/demo.yaml")
    assert gc.isenabled()
    step = simulate(scenario).step_time_s
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:  # a caller's own setting is kept, and an error restores it too
        assert simulate(scenario).step_time_s == step and not gc.isenabled()
    finally:
        gc.enable()
    monkeypatch.setattr(simulate_module, "_simulate", lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        simulate(scenario)
    assert gc.isenabled()
