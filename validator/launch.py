"""Launch ranks: a local spawn launcher (tests, one machine) and torchrun's env:// rendezvous.

Faults end the whole run within a bounded time: every rank initialises its process group with a
timeout (rendezvous and collectives), and the spawn launcher's watchdog kills all ranks once the
deadline passes, naming the ranks that had not finished. A rank that raises ends the run at once
with its error and rank. No rank outlives the launcher: the launcher stops its ranks when it
ends, and a rank whose launcher was killed outright (SIGKILL, or a SIGTERM that skips Python's
clean-up) exits within LAUNCHER_POLL_S seconds on its own.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import threading
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from validator.allocator import tune_allocator
from validator.comm_device import set_rank_device
from validator.errors import RankFailure


@dataclass(frozen=True)
class LaunchConfig:
    world_size: int
    backend: str = "gloo"
    device: str = "cpu"
    timeout_s: float = 120.0
    collective_timeout_s: float = 60.0
    num_threads: int = 1


LAUNCHER_POLL_S = 1.0
"""How often a rank checks that its launcher is still alive."""


def exit_with(launcher_pid: int, poll_s: float = LAUNCHER_POLL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (exit code 1) once `launcher_pid` is gone."""
    def watch() -> None:
        while True:
            time.sleep(poll_s)
            try:
                os.kill(launcher_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # alive, owned by someone else
                pass

    thread = threading.Thread(target=watch, name="ghpsim-launcher-watch", daemon=True)
    thread.start()
    return thread


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def init_rank(rank: int, config: LaunchConfig, init_method: str) -> None:
    """Join the process group (gloo or nccl) with a bounded timeout; pin threads and device; steady
    malloc settings (validator.allocator)."""
    tune_allocator()
    torch.set_num_threads(config.num_threads)
    set_rank_device(config.device)
    if config.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(config.backend, init_method=init_method, rank=rank, world_size=config.world_size,
                            timeout=datetime.timedelta(seconds=config.collective_timeout_s))


def _entry(rank: int, function, args, config: LaunchConfig, init_method: str, results, launcher_pid: int) -> None:
    exit_with(launcher_pid)
    try:
        init_rank(rank, config, init_method)
        value = function(rank, *args)
        results.put((rank, "ok", value))
    except BaseException as error:  # reported to the parent with the rank; never swallowed
        results.put((rank, "error", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=6)}"))
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(function, args: tuple, config: LaunchConfig) -> list:
    """Run `function(rank, *args)` on `world_size` local processes; return their values by rank.

    Raises RankFailure naming the first rank that failed, or the ranks still running at the deadline.
    """
    context = mp.get_context("forkserver")
    # Ranks fork from a server that has imported torch once: much faster than a fresh
    # interpreter per rank, and unlike plain fork it inherits no threads from the caller.
    context.set_forkserver_preload(["torch", "torch.distributed", "validator.measure"])
    results = context.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    processes = []
    for rank in range(config.world_size):
        process = context.Process(target=_entry, args=(rank, function, args, config, init_method, results, os.getpid()),
                                  daemon=True)
        process.start()
        processes.append(process)
    values: dict[int, object] = {}
    deadline = time.monotonic() + config.timeout_s
    try:
        while len(values) < config.world_size:
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue.Empty:
                _check_alive(processes, values, deadline)
                continue
            if status == "error":
                raise RankFailure(f"rank {rank} failed: {value.splitlines()[0]}")
            values[rank] = value
    finally:
        _stop(processes)
    return [values[rank] for rank in range(config.world_size)]


def _check_alive(processes, values, deadline) -> None:
    for rank, process in enumerate(processes):
        if rank not in values and not process.is_alive() and process.exitcode not in (0, None):
            raise RankFailure(f"rank {rank} died with exit code {process.exitcode}")
    if time.monotonic() > deadline:
        missing = [rank for rank in range(len(processes)) if rank not in values]
        raise RankFailure(f"ranks {missing} did not finish before the deadline (hung or too slow)")


def _stop(processes) -> None:
    for process in processes:
        process.join(timeout=5)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def torchrun_rank() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment (env:// rendezvous)."""
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError as missing:
        raise RankFailure(f"not under torchrun: environment variable {missing} is not set") from None
