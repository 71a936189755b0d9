"""Communication kernels take SMs from concurrent compute (simulator.host_sharing.sm_sharing): while
a collective runs on a GPU, that GPU's compute runs num_sms / (num_sms - NCCL channels) slower."""

from __future__ import annotations

from pathlib import Path

import pytest
import simpy

from simulator.host_sharing import COLLECTIVE, COMPUTE, HostPool, sm_sharing
from simulator.kernel_costs import KernelCosts
from simulator.nccl import NCCL_DEFAULT_NUM_CHANNELS
from simulator.scenario import load_scenario
from simulator.simulate import analytic_costs, simulate
from simulator.zoo import build_model as get_model
from tests.helpers import FixedCosts, Topology, link, run_grid, toy_workload

ROOT = Path(__file__).resolve().parent.parent

A100_FACTOR = 108 / (108 - NCCL_DEFAULT_NUM_CHANNELS)


def test_the_factor_is_the_sms_left_to_compute():
    assert sm_sharing(108).compute_slowdown_while == {COLLECTIVE: pytest.approx(108 / 84)}
    assert sm_sharing(132).compute_slowdown_while[COLLECTIVE] == pytest.approx(132 / 108)
    assert sm_sharing(None) is None  # no SM count: not modelled
    assert sm_sharing(NCCL_DEFAULT_NUM_CHANNELS) is None


def test_a_held_collective_slows_only_its_own_devices_compute():
    # 1 s of compute on devices 0 and 1; a collective on device 0 from 0.2 s to 0.5 s. Device 0
    # does 0.2 + 0.3 / f of work by 0.5 s, the rest at full speed: ends at 1.3 - 0.3 / f.
    env = simpy.Environment()
    pool = HostPool(env, sm_sharing(108), 2)
    finished = {}

    def compute(device):
        yield pool.run(1.0, COMPUTE, ((device, 1),))
        finished[device] = env.now

    def collective():
        yield env.timeout(0.2)
        token = pool.hold(COLLECTIVE, ((0, 1),))
        yield env.timeout(0.3)
        pool.release(token)

    for process in (compute(0), compute(1), collective()):
        env.process(process)
    env.run()
    assert finished[0] == pytest.approx(1.3 - 0.3 / A100_FACTOR)
    assert finished[1] == pytest.approx(1.0)


class ContendedCosts(FixedCosts):
    shared_processors = sm_sharing(108)


def test_the_backward_beside_an_allreduce_stretches_by_the_factor():
    # DP over 2 GPUs, one bucket per layer: layer 1's allreduce (a seconds) runs beside layer 0's
    # backward (d seconds), which does a / f of work meanwhile: it ends a (1 - 1/f) later.
    workload, topology = toy_workload(2), Topology(1, 2, link(1e-6, 1e9), link(1e-6, 1e9))
    options = dict(bucket_size_bytes=1)
    _, free = run_grid(workload, topology, FixedCosts(1e-2), 2, 1, 2, **options)
    _, contended = run_grid(workload, topology, ContendedCosts(1e-2), 2, 1, 2, **options)
    rank0 = free[free["rank"] == 0]
    allreduce = rank0[rank0["name"] == "allreduce b0"].iloc[0]
    backward0 = rank0[(rank0["kind"] == "B")].iloc[1]
    assert allreduce.duration_s < backward0.duration_s and allreduce.start_s == backward0.start_s
    expected_end = backward0.end_s + allreduce.duration_s * (1 - 1 / A100_FACTOR)
    stretched = contended[(contended["rank"] == 0) & (contended["kind"] == "B")].iloc[1]
    assert stretched.end_s == pytest.approx(expected_end, rel=1e-12)
    assert contended["end_s"].max() == pytest.approx(free["end_s"].max() + expected_end - backward0.end_s, rel=1e-12)


def test_the_scenario_key_switches_it_for_kernel_cost_models_only():
    scenario = load_scenario(ROOT / "scenarios/resnet50_dp_a100.yaml")
    off = load_scenario(ROOT / "scenarios/resnet50_dp_a100.yaml", ["costs.comm_sm_contention=false"])
    workload = get_model("resnet50")
    assert analytic_costs(scenario, workload).shared_processors == sm_sharing(108)
    assert analytic_costs(off, workload).shared_processors is None
    assert simulate(scenario).step_time_s > simulate(off).step_time_s
    analytic = load_scenario(ROOT / "scenarios/demo.yaml", ["costs.model=analytic"])  # the roofline: never slowed
    assert analytic_costs(analytic, get_model("resnet50")).shared_processors is None


def test_tensor_parallel_copies_keep_the_switch():
    costs = KernelCosts(get_model("gpt2-small"), load_scenario(ROOT / "scenarios/resnet50_dp_a100.yaml").cluster.gpu,
                        "bf16", "adam", comm_sm_contention=False)
    assert costs.with_tensor_parallel(2, False).shared_processors is None
    assert costs.with_tensor_parallel(2, False).comm_sm_contention is False


def test_pcie_nodes_hold_nccls_two_channels_not_an_nvlink_nodes_twenty_four():
    """NCCL runs 2 collective channels where a node's GPUs meet over PCIe (its init logs), so a
    40-SM T4 computes at 40 / 38 beside a collective, not 40 / 16; NVLink nodes keep 24."""
    scenario = load_scenario(ROOT / "scenarios/resnet50_dp_a100.yaml", ["cluster.gpu=T4", "cluster.intra_node_link=pcie3", "training.dtype=fp16"])
    costs = analytic_costs(scenario, get_model("resnet50"))
    assert costs.shared_processors.compute_slowdown_while[COLLECTIVE] == pytest.approx(40 / 38)
    assert costs.with_tensor_parallel(2, False).shared_processors == costs.shared_processors
    nvlink = load_scenario(ROOT / "scenarios/resnet50_dp_a100.yaml", ["cluster.gpu=T4", "training.dtype=fp16"])
    assert analytic_costs(nvlink, get_model("resnet50")).shared_processors == sm_sharing(40)
