"""simulator.nccl: NCCL's tuner as tables, checked in closed form and against published nccl-tests
allreduce bus bandwidth on 8 GPUs in one node (A100, H100, H200; published/README.md)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from simulator.hardware import LINKS
from simulator.nccl import (
    BASE_LATENCY_S,
    HOP_LATENCY_S,
    LINK_EFFICIENCY,
    LINK_KINDS,
    NCCL_DEFAULT_NUM_CHANNELS,
    PIPELINE_SLICE_BYTES,
    PROTOCOL_EFFICIENCY,
    CollectiveTime,
    Tier,
    allgather_time_s,
    allreduce_bus_bandwidth_bytes_per_s,
    allreduce_candidates,
    allreduce_time_s,
    alltoall_time_s,
    collective_channels,
    compute_slowdown_while_communicating,
    p2p_time_s,
    pipeline_fill_s,
    reduce_scatter_time_s,
)

us = 1e-6
GB = 1e9
MB = 2**20
# The published development data live beside the checkout (shared/data/published, README there).
CSV = Path(__file__).resolve().parents[2] / "shared/data/published/nccl_allreduce_8gpu_node.csv"

NVLINK3 = Tier("nvlink", LINKS["nvlink3-a100"].bandwidth_bytes_per_s, LINKS["nvlink3-a100"].latency_s)
NVLINK4_NVLS = Tier("nvlink", LINKS["nvlink4-h100"].bandwidth_bytes_per_s, LINKS["nvlink4-h100"].latency_s,
                    nvls=True)
PCIE4 = Tier("pcie", LINKS["pcie4"].bandwidth_bytes_per_s, LINKS["pcie4"].latency_s)
IB_HDR = Tier("infiniband", LINKS["ib-hdr"].bandwidth_bytes_per_s, LINKS["ib-hdr"].latency_s)

# column of the CSV -> the node's NVLink tier (datasheet line rates from the hardware catalogue).
GPUS = {
    "a100_sxm4_80gb_busbw_gb_per_s": NVLINK3,       # NVLink3 + NVSwitch, no NVLS
    "h100_sxm_busbw_gb_per_s": NVLINK4_NVLS,        # NVLink4 + NVSwitch gen3, NVLS
    "h200_sxm_busbw_gb_per_s": NVLINK4_NVLS,
}


# ----------------------------------------------------------------------------- published curves

def comparison(column: str) -> list[tuple[int, float, float, CollectiveTime]]:
    """(size, measured busbw, predicted busbw, choice) for one GPU of the CSV, 8 ranks."""
    if not CSV.exists():
        pytest.skip(f"published nccl-tests data not found at {CSV}")
    rows = []
    with CSV.open() as handle:
        for row in csv.DictReader(handle):
            size = int(row["size_bytes"])
            choice = allreduce_time_s(size, 8, intra=GPUS[column])
            predicted = allreduce_bus_bandwidth_bytes_per_s(size, 8, choice.time_s)
            rows.append((size, float(row[column]) * GB, predicted, choice))
    return rows


def table(column: str) -> str:
    lines = [f"{column}: size, measured GB/s, predicted GB/s, error, choice"]
    for size, measured, predicted, choice in comparison(column):
        lines.append(f"{size:>11d} {measured / GB:8.2f} {predicted / GB:8.2f} {predicted / measured - 1:+7.1%}"
                     f"  {choice.algorithm}/{choice.protocol}")
    return "\n".join(lines)


def misses(column: str, bound_at_most_1mb: float, bound_above_1mb: float) -> list[str]:
    found = []
    for size, measured, predicted, _ in comparison(column):
        bound = bound_at_most_1mb if size <= MB else bound_above_1mb
        if abs(predicted / measured - 1) > bound:
            found.append(f"{size} B: {predicted / measured - 1:+.0%}")
    return found


@pytest.mark.parametrize("column", GPUS)
def test_bandwidth_bound_messages_are_within_10_percent(column):
    """From 256 MB up the link's sourced line rate x efficiency (x NVLS factor) sets the time."""
    wrong = [miss for miss in misses(column, 0.10, 0.10)
             if int(miss.split()[0]) >= 256 * MB]
    assert not wrong, f"{wrong}\n{table(column)}"


@pytest.mark.parametrize("column", GPUS)
def test_every_size_is_within_the_bounds_the_model_meets_today(column):
    """A regression guard, not the goal: 85 % at and below 1 MB, 20 % above (see the xfail below)."""
    wrong = misses(column, 0.85, 0.20)
    assert not wrong, f"{wrong}\n{table(column)}"


@pytest.mark.xfail(strict=True, reason=(
    "with the pipeline fill, above 1 MB: A100 +12 % at 128 MB (the measured curve dips there), "
    "H100 +17 % at 2 MB and -13 % at 16 MB, H200 -15 % at 16 MB; at/below 1 MB A100 1-2 KB +29 %, "
    "H100 16 KB-1 MB +31..+80 % (NVLS at 23 us vs ~42 us measured), H200 1 KB-16 KB +30..+35 %"))
@pytest.mark.parametrize("column", GPUS)
def test_published_target_10_percent_above_1mb_and_25_percent_at_or_below(column):
    wrong = misses(column, 0.25, 0.10)
    assert not wrong, f"{wrong}\n{table(column)}"


def test_the_pipeline_fill_halves_mid_size_bus_bandwidth_and_vanishes_relative_to_huge_sizes():
    """Closed form of nccl.pipeline_fill_s: below channels x slice per rank the fill is (2n-3)/(2n-2)
    of the transfer; above, a constant (steps - 1) x channels x slice / bandwidth."""
    bandwidth = 200 * GB
    mid = 2 * MB * 8  # S / n = 2 MB < 24 channels x 128 KiB = 3 MiB
    transfer_s = 14 / 8 * mid / bandwidth
    assert pipeline_fill_s("ring", "Simple", 14, mid / 8, bandwidth) == pytest.approx(13 / 14 * transfer_s)
    cap_s = 13 * NCCL_DEFAULT_NUM_CHANNELS * PIPELINE_SLICE_BYTES / bandwidth
    assert pipeline_fill_s("ring", "Simple", 14, 1e12, bandwidth) == pytest.approx(cap_s)
    assert pipeline_fill_s("ring", "LL", 14, mid / 8, bandwidth) == 0.0
    assert pipeline_fill_s("tree", "Simple", 14, mid / 8, bandwidth) == 0.0


def test_without_the_fill_the_a100_mid_sizes_miss_by_half():
    """The fill is what brings A100 2-128 MB from +18..+56 % to within 12 %."""
    import simulator.nccl as module
    saved = module.PIPELINE_SLICE_BYTES
    try:
        module.PIPELINE_SLICE_BYTES = 0
        without = misses("a100_sxm4_80gb_busbw_gb_per_s", 10.0, 0.30)
    finally:
        module.PIPELINE_SLICE_BYTES = saved
    assert any(int(miss.split()[0]) == 16 * MB for miss in without)
    assert misses("a100_sxm4_80gb_busbw_gb_per_s", 10.0, 0.12) == []


# ----------------------------------------------------------------------------- closed forms

@pytest.mark.parametrize("tier", [NVLINK3, PCIE4], ids=["nvlink", "pcie"])
@pytest.mark.parametrize("num_ranks", [2, 3, 4, 8, 16])
def test_ring_latency_is_2_n_minus_1_hops_at_tiny_sizes(tier, num_ranks):
    hop = max(HOP_LATENCY_S[tier.kind, "ring", "LL"], tier.latency_s)
    ring_ll = allreduce_candidates(1, num_ranks, intra=tier)["ring", "LL"]
    assert ring_ll == pytest.approx(BASE_LATENCY_S["ring", "LL"] + 2 * (num_ranks - 1) * hop, rel=1e-4)


def test_ring_latency_reproduces_the_measured_dgx_a100_figures():
    """README: single-channel ring latency 10 us at 2 GPUs, 34 us at 8 on DGX-A100 (8-128 B)."""
    assert allreduce_time_s(8, 2, intra=NVLINK3).time_s == pytest.approx(10 * us, rel=0.07)
    assert allreduce_time_s(8, 8, intra=NVLINK3).time_s == pytest.approx(34 * us, rel=0.07)


@pytest.mark.parametrize("tier", [NVLINK3, PCIE4, NVLINK4_NVLS], ids=["nvlink", "pcie", "nvls"])
@pytest.mark.parametrize("num_ranks", [2, 4, 8])
def test_bandwidth_term_dominates_at_huge_sizes(tier, num_ranks):
    size = 1e15
    busbw = tier.bandwidth_bytes_per_s * LINK_EFFICIENCY[tier.kind] * (480 / 370 if tier.nvls else 1.0)
    expected = 2 * (num_ranks - 1) / num_ranks * size / busbw
    assert allreduce_time_s(size, num_ranks, intra=tier).time_s == pytest.approx(expected, rel=1e-6)


def protocols_by_size(tier: Tier, num_ranks: int = 8) -> list[str]:
    return [allreduce_time_s(2**k, num_ranks, intra=tier).protocol for k in range(3, 37)]


def test_protocol_switches_ll_then_ll128_then_simple_as_size_grows():
    protocols = protocols_by_size(NVLINK3)
    first = [p for i, p in enumerate(protocols) if i == 0 or protocols[i - 1] != p]
    assert first == ["LL", "LL128", "Simple"], protocols


def test_ll128_is_not_run_over_pcie():
    assert not any(protocol == "LL128" for (_, protocol) in allreduce_candidates(MB, 8, intra=PCIE4))
    protocols = protocols_by_size(PCIE4)
    first = [p for i, p in enumerate(protocols) if i == 0 or protocols[i - 1] != p]
    assert first == ["LL", "Simple"], protocols


def test_protocol_efficiencies_are_the_published_payload_fractions():
    assert PROTOCOL_EFFICIENCY["LL"] <= 0.5
    assert PROTOCOL_EFFICIENCY["LL128"] == pytest.approx(0.95, abs=0.02)
    assert PROTOCOL_EFFICIENCY["Simple"] == 1.0


@pytest.mark.parametrize("num_ranks", [2, 4, 8])
def test_nvls_only_when_available_and_for_large_messages(num_ranks):
    no_nvls = Tier("nvlink", NVLINK4_NVLS.bandwidth_bytes_per_s, NVLINK4_NVLS.latency_s)
    for k in range(3, 37):
        assert allreduce_time_s(2**k, num_ranks, intra=no_nvls).algorithm == "ring"
    for size in (256 * MB, 1024 * MB, 8192 * MB):  # README: ~480 GB/s with NVLS above 256 MB
        assert allreduce_time_s(size, num_ranks, intra=NVLINK4_NVLS).algorithm == "nvls"
    if num_ranks <= 4:  # a short ring's latency is below NVLS's 23 us: small messages stay on the ring
        assert allreduce_time_s(1024, num_ranks, intra=NVLINK4_NVLS).algorithm == "ring"


def test_nvls_is_single_node_only():
    candidates = allreduce_candidates(GB, 16, intra=NVLINK4_NVLS, inter=IB_HDR, ranks_per_node=8)
    assert not any(algorithm == "nvls" for algorithm, _ in candidates)


def test_tree_only_across_nodes_and_chosen_at_mid_sizes_when_faster():
    assert not any(algorithm == "tree" for algorithm, _ in allreduce_candidates(MB, 8, intra=NVLINK3))
    layout = {"intra": NVLINK3, "inter": IB_HDR, "ranks_per_node": 8}
    mid = allreduce_candidates(MB, 16 * 8, **layout)
    best_tree = min(t for (a, _), t in mid.items() if a == "tree")
    best_ring = min(t for (a, _), t in mid.items() if a == "ring")
    assert best_tree < best_ring
    assert allreduce_time_s(MB, 16 * 8, **layout).algorithm == "tree"
    assert allreduce_time_s(4 * 2**30, 2 * 8, **layout).algorithm == "ring"  # bandwidth-bound, 2 nodes


@pytest.mark.parametrize("size", [2**k for k in range(0, 36, 5)])
@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_the_choice_is_the_least_predicted_time(size, nodes):
    layout = {"intra": NVLINK3, "inter": IB_HDR if nodes > 1 else None, "ranks_per_node": 8}
    candidates = allreduce_candidates(size, 8 * nodes, **layout)
    choice = allreduce_time_s(size, 8 * nodes, **layout)
    assert choice.time_s == min(candidates.values())
    assert candidates[choice.algorithm, choice.protocol] == choice.time_s


def test_multi_node_bandwidth_is_bounded_by_the_nodes_nics():
    """README: ~24 GB/s busbw per HDR NIC; 8 NICs per node -> ~190 GB/s."""
    size = 1e14
    time_s = allreduce_time_s(size, 4 * 8, intra=NVLINK3, inter=IB_HDR, ranks_per_node=8).time_s
    busbw = allreduce_bus_bandwidth_bytes_per_s(size, 32, time_s)
    assert busbw == pytest.approx(8 * 25 * GB * LINK_EFFICIENCY["infiniband"], rel=1e-3)
    assert 8 * 23 * GB < busbw < 8 * 24.5 * GB


@pytest.mark.parametrize("collective", [allgather_time_s, reduce_scatter_time_s])
@pytest.mark.parametrize("num_ranks", [2, 8])
def test_allgather_and_reduce_scatter_are_half_a_ring_allreduce(collective, num_ranks):
    hop = max(HOP_LATENCY_S["nvlink", "ring", "LL"], NVLINK3.latency_s)
    tiny = collective(1, num_ranks, intra=NVLINK3)
    assert tiny.time_s == pytest.approx(BASE_LATENCY_S["ring", "LL"] + (num_ranks - 1) * hop, rel=1e-4)
    size = 1e15
    huge = collective(size, num_ranks, intra=NVLINK3).time_s
    assert huge == pytest.approx((num_ranks - 1) / num_ranks * size / (300 * GB * 0.8), rel=1e-6)
    assert allreduce_time_s(size, num_ranks, intra=NVLINK3).time_s == pytest.approx(2 * huge, rel=1e-6)


def test_alltoall_moves_n_minus_1_over_n_over_the_slowest_tier():
    size = 1e15
    single = alltoall_time_s(size, 8, intra=NVLINK3)
    assert single.time_s == pytest.approx(7 / 8 * size / (300 * GB * 0.8), rel=1e-6)
    across = alltoall_time_s(size, 16, intra=NVLINK3, inter=IB_HDR, ranks_per_node=8)
    assert across.time_s == pytest.approx(15 / 16 * size / (25 * GB * LINK_EFFICIENCY["infiniband"]), rel=1e-6)
    tiny = alltoall_time_s(1, 8, intra=NVLINK3)
    assert tiny.time_s == pytest.approx(BASE_LATENCY_S["ring", "Simple"] + 7 * HOP_LATENCY_S["nvlink", "ring", "Simple"],
                                        rel=1e-4)


def test_p2p_is_simple_latency_plus_bytes_at_the_achievable_rate():
    assert p2p_time_s(GB, NVLINK3) == pytest.approx(
        BASE_LATENCY_S["ring", "Simple"] + HOP_LATENCY_S["nvlink", "ring", "Simple"] + GB / (300 * GB * 0.8))
    tcp = Tier("ethernet", 100e9 / 8, 20 * us)  # the link's 20 us floors NCCL's 14 us network hop
    assert p2p_time_s(0.0, tcp) == 0.0
    assert p2p_time_s(1, tcp) == pytest.approx(BASE_LATENCY_S["ring", "Simple"] + 20 * us, rel=1e-4)


def test_nothing_to_do_for_one_rank_or_no_bytes():
    assert allreduce_time_s(GB, 1, intra=NVLINK3).time_s == 0.0
    assert allreduce_time_s(0, 8, intra=NVLINK3).time_s == 0.0
    assert allgather_time_s(GB, 1, intra=NVLINK3).time_s == 0.0


def test_tables_cover_every_link_kind_algorithm_and_protocol():
    for kind in LINK_KINDS:
        assert 0 < LINK_EFFICIENCY[kind] <= 1
        for algorithm in ("ring", "tree"):
            for protocol in ("LL", "LL128", "Simple"):
                assert HOP_LATENCY_S[kind, algorithm, protocol] > 0
    assert [key for key in HOP_LATENCY_S if key[1] == "nvls"] == [("nvlink", "nvls", "Simple")]


def test_bad_tiers_and_layouts_are_value_errors():
    with pytest.raises(ValueError, match="unknown link kind 'nvswitch'.*nvlink"):
        Tier("nvswitch", 1.0, 0.0)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        Tier("nvlink", -1.0, 0.0)
    with pytest.raises(ValueError, match="ranks_per_node 8"):
        allreduce_time_s(MB, 12, intra=NVLINK3, inter=IB_HDR, ranks_per_node=8)


# ----------------------------------------------------------------------------- SMs taken by NCCL

def test_communication_takes_one_sm_per_channel_from_compute():
    assert compute_slowdown_while_communicating(108, 24) == pytest.approx(108 / 84)
    assert compute_slowdown_while_communicating(132) == pytest.approx(132 / (132 - NCCL_DEFAULT_NUM_CHANNELS))
    assert compute_slowdown_while_communicating(132, 0) == 1.0
    assert compute_slowdown_while_communicating(40, collective_channels("pcie")) == pytest.approx(40 / 38)
    assert collective_channels("nvlink") == NCCL_DEFAULT_NUM_CHANNELS
    with pytest.raises(ValueError, match="num_channels"):
        compute_slowdown_while_communicating(24, 24)
    assert math.isfinite(compute_slowdown_while_communicating(108, 107))
