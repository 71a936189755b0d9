"""A rank that crashes or hangs ends the whole run in bounded time, naming the rank; no orphans."""

import time

import pytest

pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402

from validator.launch import LaunchConfig, RankFailure, spawn  # noqa: E402


def crash_on_rank_one(rank):
    if rank == 1:
        raise RuntimeError("simulated crash")
    dist.barrier()  # rank 0 waits for a peer that never comes
    return rank


def hang_on_rank_two(rank):
    if rank == 2:
        time.sleep(600)
    return rank


def all_fine(rank):
    dist.barrier()
    return rank * 10


def _live_children():
    return [child for child in torch_mp.active_children() if child.is_alive()]


def test_healthy_run_returns_every_rank_value():
    assert spawn(all_fine, (), LaunchConfig(world_size=2, timeout_s=60)) == [0, 10]


def test_crashing_rank_is_named_and_ends_the_run_quickly():
    started = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 failed: RuntimeError: simulated crash"):
        spawn(crash_on_rank_one, (), LaunchConfig(world_size=2, timeout_s=60, collective_timeout_s=30))
    assert time.monotonic() - started < 30
    assert not _live_children()


def test_hung_rank_is_named_at_the_deadline_and_killed():
    started = time.monotonic()
    with pytest.raises(RankFailure, match=r"ranks \[2\] did not finish"):
        spawn(hang_on_rank_two, (), LaunchConfig(world_size=4, timeout_s=8))
    assert time.monotonic() - started < 25
    assert not _live_children()
