"""Tensor-parallel communication overlap (Megatron / TransformerEngine `--tp-comm-overlap`,
`strategy.tp_comm_overlap`): a pass's TP collectives run beside its compute, so each pass takes
max(compute, communication) instead of their sum."""

from __future__ import annotations

import copy

import pytest

from simulator.errors import ScenarioError
from simulator.scenario import load_scenario
from simulator.simulate import simulate

BASE = {"cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node_link": "nvlink3-a100"},
        "model": {"name": "transformer",
                  "params": {"num_layers": 4, "hidden_size": 1024, "num_heads": 16, "seq_len": 1024,
                             "vocab_size": 50257}},
        "strategy": {"kind": "megatron", "tp_degree": 2, "sequence_parallel": True},
        "training": {"global_batch_size": 2, "dtype": "bf16", "optimizer": "adam"},
        "costs": {"comm_sm_contention": False, "host_overhead_s": 0.0}}  # the device's passes alone


def _run(**changes):
    raw = copy.deepcopy(BASE)
    for key, value in changes.items():
        section, name = key.split("__")
        raw[section][name] = value
    return simulate(load_scenario(raw))


def _passes(spans):
    """[(compute seconds, TP communication seconds)] per pass of rank 0 (forward, backward)."""
    rank = spans[spans["rank"] == 0]
    passes = []
    for phase in ("F", "B"):
        compute = rank[rank["kind"] == phase].iloc[0]
        after = rank[(rank["stream"] == "comm") & (rank["start_s"] >= compute.end_s - 1e-15)]
        following = rank[(rank["stream"] == "compute") & (rank["start_s"] > compute.start_s)].iloc[0]
        between = after[after["end_s"] <= following.start_s + 1e-15]
        passes.append((compute.duration_s, between["duration_s"].sum()))
    return passes


def test_each_pass_hides_the_shorter_of_its_compute_and_its_tp_communication():
    serial = _run()
    overlapped = _run(strategy__tp_comm_overlap=True)
    passes = _passes(serial.spans)
    assert all(comm > 0 for _, comm in passes)
    hidden = sum(min(compute, comm) for compute, comm in passes)
    assert overlapped.step_time_s == pytest.approx(serial.step_time_s - hidden, rel=1e-12)
    rank = overlapped.spans[overlapped.spans["rank"] == 0]
    for phase in ("F", "B"):  # the pass's first TP collective starts with its compute
        compute = rank[rank["kind"] == phase].iloc[0]
        first = rank[(rank["stream"] == "comm") & (rank["start_s"] >= compute.start_s)].iloc[0]
        assert first.start_s == compute.start_s


def test_sm_contention_slows_the_overlapped_compute():
    assert (_run(strategy__tp_comm_overlap=True, costs__comm_sm_contention=True).step_time_s
            > _run(strategy__tp_comm_overlap=True).step_time_s)


def test_overlap_needs_sequence_parallelism_as_in_megatron():
    with pytest.raises(ScenarioError, match="tp_comm_overlap: needs strategy.sequence_parallel"):
        _run(strategy__tp_comm_overlap=True, strategy__sequence_parallel=False)


def test_off_by_default():
    assert _run().step_time_s == _run(strategy__tp_comm_overlap=False).step_time_s
