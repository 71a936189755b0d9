"""Launch ranks: a local spawn launcher (tests, one machine); torchrun's env:// rendezvous is
`validator.torchrun_worker`'s (it reads its environment before torch is imported).

Faults end the whole run within a bounded time: every rank initialises its process group with a
timeout (rendezvous and collectives), and the spawn launcher's watchdog kills all ranks once the
deadline passes, naming the ranks that had not finished. Every rank beats a heartbeat (a thread
writing the time into shared memory every HEARTBEAT_S); a rank whose process stops answering
(stopped with SIGSTOP, frozen) for `heartbeat_timeout_s` ends the run, naming the rank that went
silent first. A rank that raises ends the run at once with its error and rank - unless another
rank died just before it (a killed rank 0 makes its peers fail with "connection reset"), which
is then the one named. No rank outlives the launcher: the launcher stops its ranks when it
ends, and a rank whose launcher was killed outright (SIGKILL, or a SIGTERM that skips Python's
clean-up) exits within LAUNCHER_POLL_S seconds on its own.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import signal
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
    heartbeat_timeout_s: float = 30.0
    """A rank silent this long (its process stopped answering) ends the run."""
    timeout_option: str | None = None
    """The flag that set `timeout_s` (e.g. "--timeout"), named in the deadline's message."""


LAUNCHER_POLL_S = 1.0
"""How often a rank checks that its launcher is still alive."""
HEARTBEAT_S = 0.5
"""How often a rank's heartbeat thread writes the time."""
BLAME_GRACE_S = 1.0
"""After a rank reports an error: how long to look for a peer that died first (and caused it)."""


def heartbeat(beats, rank: int, period_s: float = HEARTBEAT_S) -> threading.Thread:
    """Start a daemon thread writing time.monotonic() into `beats[rank]` every `period_s`."""
    def beat() -> None:
        while True:
            beats[rank] = time.monotonic()
            time.sleep(period_s)

    thread = threading.Thread(target=beat, name="ghpsim-heartbeat", daemon=True)
    thread.start()
    return thread


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


def _entry(rank: int, function, args, config: LaunchConfig, init_method: str, results, launcher_pid: int,
           beats) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's: it stops the ranks (`_stop`)
    exit_with(launcher_pid)
    heartbeat(beats, rank)
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
    beats = context.Array("d", config.world_size, lock=False)  # each rank's last heartbeat; 0: none yet
    init_method = f"tcp://127.0.0.1:{free_port()}"
    processes = []
    values: dict[int, object] = {}
    failed = True
    try:
        with sigint_held():  # the forkserver (importing torch) and the ranks inherit SIGINT blocked
            for rank in range(config.world_size):
                process = context.Process(target=_entry, args=(rank, function, args, config, init_method, results,
                                                               os.getpid(), beats), daemon=True)
                process.start()
                processes.append(process)
        deadline = time.monotonic() + config.timeout_s
        while len(values) < config.world_size:
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue.Empty:
                _check_alive(processes, values, deadline, config)
                _check_heartbeats(processes, values, beats, config.heartbeat_timeout_s)
                continue
            if status == "error":
                _blame_a_dead_peer(processes, values, rank)
                raise RankFailure(f"rank {rank} failed: {value.splitlines()[0]}")
            values[rank] = value
        failed = False
    finally:
        _stop(processes, at_once=failed)
    return [values[rank] for rank in range(config.world_size)]


@contextlib.contextmanager
def sigint_held():
    """Ctrl-C held off for the block and raised as KeyboardInterrupt after it, so no rank starts
    unrecorded (one the launcher never stops). Processes started inside inherit SIGINT blocked, so a
    Ctrl-C at the terminal reaches the launcher alone: no traceback from the forkserver importing
    torch or from a rank (POSIX pthread_sigmask; Python runs signal handlers in the main thread only,
    so elsewhere the block runs as it is). The held Ctrl-C goes to the handler that was in place."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    caught: list[int] = []
    handler = signal.getsignal(signal.SIGINT)
    defer = callable(handler)  # a Python handler (the default raises KeyboardInterrupt); not SIG_IGN or SIG_DFL
    if defer:
        signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        if defer:
            signal.signal(signal.SIGINT, handler)
    if caught:
        handler(signal.SIGINT, None)


def _death(rank: int, exitcode: int) -> str:
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
            return f"rank {rank} was killed by signal {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        except ValueError:
            return f"rank {rank} was killed by signal {-exitcode}"
    return f"rank {rank} died with exit code {exitcode}"


def _check_alive(processes, values, deadline, config: LaunchConfig) -> None:
    for rank, process in enumerate(processes):
        if rank not in values and not process.is_alive() and process.exitcode not in (0, None):
            raise RankFailure(_death(rank, process.exitcode))
    if time.monotonic() > deadline:
        missing = [rank for rank in range(len(processes)) if rank not in values]
        stopped = [f"rank {rank} is stopped, pid {processes[rank].pid}" for rank in missing
                   if _is_stopped(getattr(processes[rank], "pid", None))]
        raise RankFailure(deadline_message(missing, config.timeout_s, config.timeout_option)
                          + "".join(f"; {what}" for what in stopped[:1]))


def _is_stopped(pid: int | None) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a debugger: state T or t in Linux's /proc); False
    where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError, TypeError):
        return False


def deadline_message(missing: list[int], timeout_s: float, option: str | None = None) -> str:
    """One line naming the ranks still running at the deadline and the deadline itself (with the
    flag that set it): `ranks [0, 1] did not finish before the deadline (--timeout 60 s; hung or too slow)`."""
    limit = f"{option} {timeout_s:g} s" if option else f"{timeout_s:g} s"
    return f"ranks {missing} did not finish before the deadline ({limit}; hung or too slow)"


def _check_heartbeats(processes, values, beats, timeout_s: float) -> None:
    """RankFailure naming the rank silent longest, once a running rank (one that has beaten at
    least once) has been silent for `timeout_s`."""
    now = time.monotonic()
    silent = [(beats[rank], rank) for rank, process in enumerate(processes)
              if rank not in values and beats[rank] > 0 and now - beats[rank] > timeout_s and process.is_alive()]
    if silent:
        last_s, rank = min(silent)
        raise RankFailure(f"rank {rank} stopped answering (no heartbeat for {now - last_s:.0f} s; its process "
                          f"is stopped or frozen, pid {processes[rank].pid})")


def _blame_a_dead_peer(processes, values, reporter: int) -> None:
    """Raise naming a rank killed by a signal (so it reported nothing) by BLAME_GRACE_S after
    `reporter`'s error: that death is the cause, the error its consequence."""
    deadline = time.monotonic() + BLAME_GRACE_S
    while True:
        for rank, process in enumerate(processes):
            if rank != reporter and not process.is_alive() and (process.exitcode or 0) < 0:  # killed: no report
                raise RankFailure(f"{_death(rank, process.exitcode)} (rank {reporter} then failed too)")
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _stop(processes, at_once: bool = False) -> None:
    """Let the ranks end (a finished run), or kill them at once (a failed one: no rank waits on a
    stopped peer)."""
    if not at_once:
        for process in processes:
            process.join(timeout=5)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
