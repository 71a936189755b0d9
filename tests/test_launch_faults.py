"""A rank that crashes or hangs ends the whole run in bounded time, naming the rank; no orphans."""

import time

import pytest

pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402

from validator.launch import LaunchConfig, RankFailure, spawn  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process end-to-end runs: `python -m pytest -m slow`


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


def record_pid_and_sleep(rank, folder):
    import os
    from pathlib import Path

    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(120)
    return rank


LAUNCHER = """
import sys
from tests.test_launch_faults import record_pid_and_sleep
from validator.launch import LaunchConfig, spawn
spawn(record_pid_and_sleep, (sys.argv[1],), LaunchConfig(world_size=2, timeout_s=120))
"""


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its parent is gone as a process
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_ranks_exit_when_their_launcher_is_killed_outright(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=root,
                                env={**os.environ, "PYTHONPATH": str(root)})
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2:
            assert time.monotonic() < deadline, "the ranks never started"
            assert launcher.poll() is None, "the launcher ended early"
            time.sleep(0.2)
        pids = [int(path.read_text()) for path in tmp_path.glob("rank*.pid")]
        assert all(_alive(pid) for pid in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in pids if _alive(pid)], "ranks outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
