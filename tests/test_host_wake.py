"""The host-wake microbenchmark (validator.host_wake_bench): its summaries, one real launch, and
the benchmark's refusal of bad input."""

import subprocess
import sys
from pathlib import Path

import pytest

from validator.host_wake_bench import host_wake_rank_main, summary_ms, wake_table
from validator.launch import LaunchConfig, spawn

ROOT = Path(__file__).resolve().parent.parent


def test_summary_gives_median_mean_and_nearest_rank_p90_in_milliseconds():
    values_s = [0.001 * v for v in (1, 2, 3, 4, 5, 6, 7, 8, 9, 100)]
    summary = summary_ms(values_s)
    assert summary["n"] == 10
    assert summary["median_ms"] == pytest.approx(5.5)
    assert summary["mean_ms"] == pytest.approx(14.5)
    assert summary["p90_ms"] == pytest.approx(100.0)  # index int(0.9 * 10) = 9: the largest


def test_wake_table_times_each_message_from_its_send_to_the_receivers_wake_after_warmup():
    starts = [0.0, 1.0, 2.0, 3.0]
    calls = [0.5, 0.0001, 0.0002, 0.0003]
    wakes = [0.9, 1.001, 2.003, 3.002]
    level = [(starts, calls, []), ([], [], wakes)]  # rank 0 sends, rank 1 wakes
    rows = wake_table([[level[0]], [level[1]]], warmup=1)
    assert rows[0]["busy_ranks"] == 0
    assert rows[0]["delay"]["n"] == 3
    assert rows[0]["delay"]["median_ms"] == pytest.approx(2.0)
    assert rows[0]["delay"]["mean_ms"] == pytest.approx(2.0)
    assert rows[0]["call"]["median_ms"] == pytest.approx(0.2)  # the warm-up's 0.5 s call dropped


def test_wake_table_refuses_a_level_whose_messages_do_not_pair_up():
    with pytest.raises(ValueError, match="busy level 0: 2 messages sent but 1 received"):
        wake_table([[([0.0, 1.0], [0.1, 0.1], [])], [([], [], [0.5])]], warmup=0)


def test_one_launch_times_every_busy_level_and_the_crossing_sends():
    """3 gloo ranks: levels 0 and 1 (rank 2 computing), 8 messages each of which 5 are warm-up."""
    result = spawn(host_wake_rank_main, (8, 16 << 10, 0.001, (0.0,)),
                   LaunchConfig(world_size=3, backend="gloo", device="cpu", timeout_s=120.0))[0]
    assert result["world_size"] == 3
    assert [row["busy_ranks"] for row in result["wake"]] == [0, 1]
    for row in result["wake"]:
        assert row["delay"]["n"] == 3 and row["call"]["n"] == 3
        assert row["delay"]["median_ms"] > 0  # the receiver wakes after the send began
        assert row["delay"]["median_ms"] < 1000
    assert result["crossing"][0]["offset_ms"] == 0.0
    assert result["crossing"][0]["call"]["n"] == 6  # both senders' 3 timed calls


def test_the_benchmark_refuses_a_world_size_below_two_in_one_line():
    completed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_host_wake.py"), "--world-size", "1"],
                               capture_output=True, text=True, cwd=ROOT / "benchmarks", timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip() == "--world-size: needs 2 or more ranks, got 1"
