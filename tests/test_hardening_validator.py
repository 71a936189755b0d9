"""Validator faults (issue 75, item 8): a stopped rank ends the run through its heartbeat, naming
it; a killed rank 0 is the rank named (not the peer that lost its connection); out-of-range
`validate` and `calibrate` options are one-line errors with exit code 2."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ghpsim.cli import main
from validator.errors import RankFailure

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "scenarios" / "small_fast_dp_wins.yaml")


def _one_line(capsys, code: int, *needles: str) -> None:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("ghpsim: error: "), (code, err)
    assert all(needle in err for needle in needles), err


@pytest.mark.parametrize("argv, needle", [
    (["validate", SMALL, "--profile", "missing.json", "--steps", "0"], "--steps: 0"),
    (["validate", SMALL, "--profile", "missing.json", "--warmup", "-1"], "--warmup: -1"),
    (["validate", SMALL, "--profile", "missing.json", "--steps", "10001"], "--steps: 10001 must be from 1 to 10,000"),
    (["validate", SMALL, "--profile", "missing.json", "--warmup", "99999999"], "--warmup: 99999999 must be from 0"),
    (["validate", SMALL, "--profile", "missing.json", "--rank", "--warmup", "10001"], "--warmup: 10001"),
    (["validate", SMALL, "--profile", "missing.json", "--timeout", "0"], "--timeout: 0"),
    (["validate", SMALL, "--profile", "missing.json", "--rank", "--steps", "0"], "--steps: 0"),
    (["calibrate", "--scenario", SMALL, "--out", "x.json", "--world-size", "0"], "--world-size: 0"),
    (["calibrate", "--scenario", SMALL, "--out", "x.json", "--repeats", "0"], "--repeats: 0"),
])
def test_out_of_range_options_are_one_line_errors(capsys, tmp_path, monkeypatch, argv, needle):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    _one_line(capsys, main(argv), needle)
    assert not list(tmp_path.iterdir())  # nothing written


torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402

from validator.launch import LaunchConfig, spawn  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`


def stop_rank_one(rank):
    if rank == 1:
        time.sleep(1.5)  # a few heartbeats first
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.barrier()
    return rank


def kill_rank(rank, victim):
    if rank == victim:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # the peers lose their connection to the victim
    return rank


def _no_live_children() -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not [child for child in torch_mp.active_children() if child.is_alive()]:
            return True
        time.sleep(0.1)
    return False


def test_a_stopped_rank_is_named_through_its_heartbeat():
    started = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 stopped answering \(no heartbeat"):
        spawn(stop_rank_one, (), LaunchConfig(world_size=3, timeout_s=300, collective_timeout_s=300,
                                              heartbeat_timeout_s=3.0))
    assert time.monotonic() - started < 30  # not the 300 s deadline, nor the collective timeout
    assert _no_live_children()  # the stopped rank is killed too


def test_the_default_heartbeat_ends_a_stopped_rank_within_a_minute():
    assert LaunchConfig(world_size=2).heartbeat_timeout_s <= 30


@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_is_the_rank_named(victim):
    started = time.monotonic()
    with pytest.raises(RankFailure, match=rf"^rank {victim} was killed by signal SIGKILL"):
        spawn(kill_rank, (victim,), LaunchConfig(world_size=2, timeout_s=120, collective_timeout_s=60))
    assert time.monotonic() - started < 30
    assert _no_live_children()
