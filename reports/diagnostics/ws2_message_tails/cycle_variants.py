"""The calibration cycle's waits on arrived messages, under variants that bisect it towards the runtime.

Runs `validator.handoff_bench.run_cycle` (receives posted one ahead, windows fitted by
`stage_hop_compute_s`) on STAGES ranks of this host, one warm-up run and RUNS timed, and prints one
JSON line: the waits on arrived messages (sent at least `READY_MARGIN_S` before the wait began, the
isend call returned), their mean, the share over 0.3 ms, and for those slow ones the share of their
time the rank's thread spent runnable but not running (`/proc/thread-self/schedstat`, field 2: run
queue delay; Linux only). Nothing enters a profile.

VARIANT:
- `torch`: as calibrated (the model's layer steps in the compute windows);
- `spin`: the windows busy-wait instead (no torch work, no allocation);
- `tagged`: as `torch`, but each message with its own tag and a fresh receive buffer, as
  `validator.pipeline_runtime` posts them;
- `syscall`: as `spin`, with a system call every 20 loop turns (a return to user space, where a
  pending reschedule is honoured).

MICROBATCHES (default 24, as calibrated): per run. With at least 2 x STAGES + 2 only the steady
state counts (micro-batches STAGES .. MICROBATCHES - STAGES - 1, as the calibration); with fewer,
every message (a short step of fill and drain, as the validated plans' 4 micro-batches run).

    python reports/diagnostics/ws2_message_tails/cycle_variants.py MODEL STAGES VARIANT [RUNS] [MICROBATCHES]
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_pipeline_validation import MODELS, pipeline_overrides  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from validator import comm_device, handoff_bench  # noqa: E402
from validator.calibrate import DEFAULT_BATCH_SIZES  # noqa: E402
from validator.handoff_bench import DEFAULT_HANDOFF_BYTES, READY_MARGIN_S, run_cycle, stage_hop_compute_s  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.microbench import load_models_module  # noqa: E402
from validator.overlap_bench import model_steps  # noqa: E402

VARIANTS = ("torch", "spin", "tagged", "syscall")
SLOW_S = 0.0003
SPIN_STEP_S = 0.0005
"""A busy-wait step's length (a layer step of the validation models takes 0.2-16 ms here)."""


def run_queue_delay_s() -> float:
    """Seconds this thread has spent runnable but waiting for a core (Linux schedstat)."""
    with open("/proc/thread-self/schedstat") as stats:
        return int(stats.read().split()[1]) * 1e-9


def spin_steps(syscall_every: int) -> list:
    def spin() -> None:
        end, turns = time.perf_counter() + SPIN_STEP_S, 0
        while time.perf_counter() < end:
            turns += 1
            if syscall_every and turns % syscall_every == 0:
                os.getppid()
    return [spin]


def tag_messages() -> None:
    """Make the cycle's sends and receives as `validator.pipeline_runtime` posts them: each message
    with its own tag (a count per peer and direction) and each receive into a fresh buffer."""
    isend, irecv, counts = comm_device.isend, comm_device.irecv, {}

    def next_tag(key: tuple) -> int:
        counts[key] = counts.get(key, -1) + 1
        return counts[key]

    comm_device.isend = lambda tensor, dst, tag=0: isend(tensor, dst=dst, tag=next_tag(("send", dst)))
    comm_device.irecv = lambda tensor, src, tag=0: irecv(torch.empty_like(tensor), src=src,
                                                         tag=next_tag(("recv", src)))


def timed_waits(original_wait, log: list):
    def wait(self) -> None:
        started, delay_before = time.perf_counter(), run_queue_delay_s()
        original_wait(self)
        log.append((started, time.perf_counter() - started, run_queue_delay_s() - delay_before))
    return wait


def variant_rank(rank: int, workload, batch: int, variant: str, runs: int, microbatches: int) -> dict | None:
    torch.set_num_threads(1)
    steps = model_steps(workload, batch, load_models_module("validator.models"), seed=0, device="cpu")
    hop_compute_s = stage_hop_compute_s(steps)
    if variant in ("spin", "syscall"):
        steps = spin_steps(20 if variant == "syscall" else 0)
    if variant == "tagged":
        tag_messages()
    log: list = []
    handoff_bench._Receives.wait = timed_waits(handoff_bench._Receives.wait, log)
    buffer = torch.ones(DEFAULT_HANDOFF_BYTES // 4)
    sends, receives = [], []
    for run in range(runs + 1):
        dist.barrier()
        sent, received, calls = run_cycle(steps, buffer, microbatches, hop_compute_s, run)
        if run:  # run 0 warms up
            sends += [(*record, call) for record, call in zip(sent, calls)]
            receives += list(received)
    world = dist.get_world_size()
    steady = range(world, microbatches - world) if microbatches >= 2 * world + 2 else range(microbatches)
    everyone = [None] * world
    dist.all_gather_object(everyone, (sends, receives, log))
    if rank:
        return None
    sent_at = {record[:4]: (record[4], record[5]) for part, _, _ in everyone for record in part}
    waits = []
    for part_rank, (_, received, rank_log) in enumerate(everyone):
        starts = [entry[0] for entry in rank_log]
        for run, direction, microbatch, receiver, waited_from, _ in received:
            start_s, call_s = sent_at[(run, direction, microbatch, receiver)]
            if microbatch in steady and waited_from - start_s >= READY_MARGIN_S and waited_from > start_s + call_s:
                waits.append(rank_log[bisect.bisect_left(starts, waited_from)])  # the wait it stands for
    slow = [entry for entry in waits if entry[1] > SLOW_S]
    return {"variant": variant, "world_size": world, "microbatches": microbatches, "runs": runs,
            "hop_compute_ms": round(hop_compute_s * 1e3, 3), "arrived": len(waits),
            "mean_wait_ms": round(statistics.fmean(entry[1] for entry in waits) * 1e3, 3) if waits else None,
            "share_over_0.3ms": round(len(slow) / len(waits), 3) if waits else None,
            "slow_run_queue_share": (round(sum(entry[2] for entry in slow) / sum(entry[1] for entry in slow), 3)
                                     if slow else None)}


def main() -> int:
    usage = (f"usage: cycle_variants.py {{{','.join(MODELS)}}} {{2,4}} {{{','.join(VARIANTS)}}} "
             "[RUNS] [MICROBATCHES]")
    arguments = sys.argv[1:]
    if len(arguments) not in (3, 4, 5) or arguments[0] not in MODELS or arguments[1] not in ("2", "4") \
            or arguments[2] not in VARIANTS:
        print(usage, file=sys.stderr)
        return 2
    try:
        runs = int(arguments[3]) if len(arguments) > 3 else 24
        microbatches = int(arguments[4]) if len(arguments) > 4 else 24
    except ValueError as error:
        print(f"{usage} ({error})", file=sys.stderr)
        return 2
    if runs < 1 or microbatches < 2:
        print(f"{usage} (RUNS >= 1 and MICROBATCHES >= 2, got {runs} and {microbatches})", file=sys.stderr)
        return 2
    name, stages, variant = arguments[0], int(arguments[1]), arguments[2]
    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml", pipeline_overrides(stages))
    workload = resolve_workload(scenario.model, scenario.base_dir)
    batch = DEFAULT_BATCH_SIZES[len(DEFAULT_BATCH_SIZES) // 2]  # as the calibration's handoff phase
    config = LaunchConfig(world_size=stages, backend="gloo", device="cpu", timeout_s=300.0)
    print(json.dumps(spawn(variant_rank, (workload, batch, variant, runs, microbatches), config)[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
