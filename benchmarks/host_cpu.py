"""Where a host's cores go while a command runs: CPU time per thread name of the command's processes
(and their children), and the share of the machine left idle. Linux only (reads /proc).

    python benchmarks/host_cpu.py --skip 12 --seconds 15 -- ghpsim validate SCENARIO --profile P --strategies pipedream:4 --steps 600

Samples every thread of the command's process tree every `--interval` seconds, between `--skip`
seconds after the start (past the launch and the warm-up) and `--seconds` later (or the command's
end), and prints per thread name (`python` is a rank's main thread, `gloo_tcp_loop` gloo's
transport thread that reads and writes every message's socket) the cores it used on average, user
and system time apart, and the machine's busy fraction over the same window (all its processes;
`validator.machine_cpu.machine_cpu_s`, which leaves a VM host's steal out). The command is stopped
after the window (its whole process group, SIGTERM then SIGKILL) unless `--wait` is given. The
simulator plays a rank's passes and per-message work on its host's cores (`simulator.host_sharing`);
the transport threads' share is what a validation's host spends that the ranks' own spans do not
show. Per-phase CPU totals inside pipeline runs: `bench_pipeline_cpu_time.py`. Prints; writes
nothing. Exit 2 on a command that cannot start or a host without /proc.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from validator.machine_cpu import machine_cpu_s

PROC = Path("/proc")


def descendants(root_pid: int) -> set[int]:
    """`root_pid` and every process below it (from /proc/*/stat's parent field)."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    tree, grew = {root_pid}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def thread_ticks(pids: set[int]) -> dict[tuple[int, int], tuple[str, int, int]]:
    """{(pid, tid): (thread name, user ticks, system ticks)} of every thread of `pids`."""
    ticks = {}
    for pid in pids:
        try:
            tids = os.listdir(PROC / str(pid) / "task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = (PROC / str(pid) / "task" / tid / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            ticks[(pid, int(tid))] = (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[11]), int(fields[12]))
    return ticks


def sample(process: subprocess.Popen, skip_s: float, seconds: float, interval_s: float) -> tuple[Counter, Counter, float, float]:
    """(user ticks, system ticks) per thread name, the window's seconds and the machine's busy fraction."""
    deadline = time.monotonic() + skip_s
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(min(interval_s, deadline - time.monotonic()))
    user, system = Counter(), Counter()
    previous = thread_ticks(descendants(process.pid))
    busy_0_s = machine_cpu_s()[0]
    started = time.monotonic()
    while time.monotonic() - started < seconds and process.poll() is None:
        time.sleep(interval_s)
        current = thread_ticks(descendants(process.pid))
        for key, (name, user_ticks, system_ticks) in current.items():
            if key in previous:
                user[name] += user_ticks - previous[key][1]
                system[name] += system_ticks - previous[key][2]
        previous = current
    busy_1_s = machine_cpu_s()[0]
    window_s = time.monotonic() - started
    return user, system, window_s, (busy_1_s - busy_0_s) / max(window_s * (os.cpu_count() or 1), 1e-9)


def stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End the command's process group if it still runs: SIGTERM, then SIGKILL after `grace_s`."""
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal_number)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip", type=float, default=10.0, help="seconds after the start before sampling")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds sampled")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--wait", action="store_true", help="let the command finish instead of stopping it after the window")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("host_cpu: command: none given (put it after --)", file=sys.stderr)
        return 2
    if not (PROC / "stat").is_file():
        print("host_cpu: /proc/stat: not found (Linux only)", file=sys.stderr)
        return 2
    try:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError as error:
        print(f"host_cpu: command: {command[0]!r} cannot start ({error.strerror})", file=sys.stderr)
        return 2
    try:
        user, system, window_s, busy = sample(process, args.skip, args.seconds, args.interval)
    finally:
        if not args.wait:
            stop(process)
        process.wait()
    if window_s <= 0 or not user + system:
        print(f"host_cpu: the command ended before the window (--skip {args.skip} s)", file=sys.stderr)
        return 2
    hz, cores = os.sysconf("SC_CLK_TCK"), os.cpu_count()
    ended = f"command exit {process.returncode}" if args.wait else "command stopped after the window"
    print(f"window {window_s:.1f} s on {cores} cores; machine busy {100 * busy:.1f} % "
          f"({busy * cores:.2f} cores), idle {(1 - busy) * cores:.2f} cores; {ended}")
    for name, ticks in (user + system).most_common():
        print(f"  {name:20s} {ticks / hz / window_s:5.2f} cores  (user {user[name] / hz / window_s:5.2f}, "
              f"system {system[name] / hz / window_s:5.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
