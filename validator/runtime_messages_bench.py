"""The profile's `handoff.runtime` section: the pre-posted message figures of `validator.handoff_bench`
timed inside the pipeline runtime itself (`validator.pipeline_runtime.PipelineExecutor`) running an
asynchronous PipeDream plan of a synthetic MLP that no validation scenario uses, at the profile's
world size, instead of inside the calibration's stand-in cycle (`handoff.cycle`).

Why: on the 2-core host the cycle's figures were about twice what the runtime pays. Back to back in
one launch (2026-11-24, twentieth session, `reports/diagnostics/runtime_messages/`), with the
cycle's own definitions, mean over four rounds at 2 ranks: the cycle's isend call 0.34-0.49 ms,
wait on an arrived message 0.86-1.16 ms, delay to a waiting receiver 0.69-1.24 ms; the runtime on
the synthetic MLP 0.19-0.28, 0.27-0.59 and 0.36-0.55 ms. At 4 ranks the runtime's were 0.6-0.8 of
the cycle's. The 2-stage asynchronous steps measure a message's exposed latency almost directly
(0.06-0.26 ms, `reports/diagnostics/exposed_latency/`), and the model charges the cycle's.

Played since the twenty-second session (2026-11-24) for asynchronous plans on a shared CPU host
with a core per rank (`simulator.profile_costs.ProfileCosts.runtime_messages`), together with the
weight passes timed by all ranks at once there (`validator.calibration_phases.
weight_pass_ranks_at_once`): alone, in the twentieth session, they under-predicted the MLP's 2-stage
SpecTrain further (MAPE 8.1 against 9.3 %, worst 27.9 against 23.3 %;
`reports/diagnostics/runtime_messages/results.md`), whose weight passes the memory traffic of the
other rank slows by 1.4-1.6x (`reports/diagnostics/concurrent_passes/`). Where ranks outnumber
cores the cycle's figures stay.

Since the twenty-eighth session it also records `thread_cpu_per_message_s`: the CPU time of the
ranks' other threads (gloo's communication threads) per message end, over the same steps. Recorded
for diagnostics, not played: on the Intel Xeon host it measured 0.09-0.11 ms at 2 ranks and 0.21-0.29
ms at 4, and charged as work on the shared cores it moved the 4-stage synchronous cases up as much
as the asynchronous ones (`reports/diagnostics/message_threads/`).

Definitions as `handoff_bench.handoff_summary`: a receive waited for before its message's isend
began gives the delay from that isend to the wait's end; a receive whose isend began at least
`READY_MARGIN_S` before the wait gives the wait (with posting the next receive); every isend call
is timed. Ranks share the host's monotonic clock (single host only). Only steps after `warmup`
count.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch.distributed as dist

from simulator.compare import with_strategy
from simulator.model_source import resolve_workload
from simulator.scenario import scenario_from_dict
from simulator.schedules.steady_state import steady_state_plan
from simulator.simulate import analytic_costs
from simulator.topology import build_topology
from validator import comm_device
from validator.handoff_bench import CYCLE_REQUIRED_KEYS, PREPOSTED_KEYS, handoff_summary
from validator.pipeline_runtime import PipelineExecutor

SYNTHETIC_MLP = {"input_dim": 512, "hidden_dim": 768, "num_hidden_layers": 8, "num_classes": 10}
"""The runtime's workload: an MLP unlike the validation ones (`scenarios/validation/mlp_cpu.yaml`
has hidden 1024 x 6); a 16-sample micro-batch's activations are 48 KiB, the order of the
validation models' messages."""
MICROBATCH_SIZE = 16
NUM_MICROBATCHES = 4
RUNTIME_STEPS, RUNTIME_WARMUP = 8, 2
"""Each step is the steady-state plan's whole run (K m >= 3p + m + 1 micro-batches): at 2 ranks
about 90 waited and 90 arrived messages over 8 steps, at 4 ranks about 450 of each."""


def synthetic_plan(world_size: int):
    """(PipeDream's steady-state plan of the synthetic MLP over `world_size` stages, its workload)."""
    scenario = scenario_from_dict({
        "name": "runtime_messages",
        "cluster": {"num_nodes": 1, "gpus_per_node": world_size, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": {"name": "mlp", "params": dict(SYNTHETIC_MLP)},
        "strategy": {"kind": "pipedream", "num_groups": 1, "num_microbatches": NUM_MICROBATCHES},
        "training": {"global_batch_size": MICROBATCH_SIZE * NUM_MICROBATCHES, "optimizer": "momentum"},
    }, origin="<runtime_messages>")
    workload = resolve_workload(scenario.model, scenario.base_dir)
    variant = with_strategy(scenario, f"pipedream:{NUM_MICROBATCHES}", None)
    costs = analytic_costs(variant, workload)
    return steady_state_plan(variant, workload, build_topology(variant.cluster), costs), workload


def message_records(spans: Sequence[tuple], step: int, rank: int, step_start_s: float) -> tuple[list, list, list]:
    """One step's runtime spans (`PipelineExecutor.step`, times from `step_start_s`) as
    `handoff_summary`'s records: sends (step, direction, microbatch, target, isend start), receives
    (step, direction, microbatch, rank, wait start, wait end) and the isend call durations.
    Direction +1 for activations (to rank + 1), -1 for gradients."""
    sends, receives, posts = [], [], []
    for _rank, stream, label, _kind, start_s, end_s, _size, microbatch in spans:
        if stream not in ("send", "recv"):
            continue
        direction = +1 if label.split(" ")[1].startswith("act") else -1
        if stream == "send":
            sends.append((step, direction, microbatch, rank + direction, step_start_s + start_s))
            posts.append(end_s - start_s)
        else:
            receives.append((step, direction, microbatch, rank, step_start_s + start_s, step_start_s + end_s))
    return sends, receives, posts


def thread_cpu_per_message_s(per_rank: Sequence[tuple[float, int]]) -> float:
    """CPU time of the ranks' other threads (gloo's communication threads: the main thread runs the
    plan) per message end, each message counted at its sender and at its receiver: the sum over
    ranks of (process CPU - main-thread CPU) over the timed steps, over the sum of their messages
    sent and received. 0 where no message was timed."""
    cpu_s = sum(max(0.0, seconds) for seconds, _ in per_rank)
    ends = sum(count for _, count in per_rank)
    return cpu_s / ends if ends else 0.0


def measure_runtime_messages(steps: int = RUNTIME_STEPS, warmup: int = RUNTIME_WARMUP) -> dict | None:
    """The `handoff.runtime` section (`PREPOSTED_KEYS`, plus the workload it ran), or None if the
    runs timed no waited or no arrived message. Every rank must call it at the same time."""
    world, rank = dist.get_world_size(), dist.get_rank()
    plan, workload = synthetic_plan(world)
    executor = PipelineExecutor(plan, workload, rank, "momentum", 0.01, 0, str(comm_device.data_device()))
    sends, receives, posts = [], [], []
    other_threads_cpu_s, message_ends = 0.0, 0
    for step in range(warmup + steps):
        executor.load_batch(step)
        dist.barrier()
        process_cpu_s, thread_cpu_s = time.process_time(), time.thread_time()
        spans = executor.step(step)
        if step >= warmup:
            other_threads_cpu_s += (time.process_time() - process_cpu_s) - (time.thread_time() - thread_cpu_s)
            sent, received, posted = message_records(spans, step, rank, executor.step_start)
            sends += sent
            receives += received
            posts += posted
            message_ends += len(sent) + len(received)
    everyone = [None] * world
    dist.all_gather_object(everyone, (sends, receives, posts))
    threads = [None] * world
    dist.all_gather_object(threads, (other_threads_cpu_s, message_ends))
    try:
        summary = handoff_summary(everyone, 0, 0.0, NUM_MICROBATCHES)
    except ValueError:
        return None
    kept = {key: summary[key] for key in PREPOSTED_KEYS if summary[key] is not None}
    if not all(key in kept for key in CYCLE_REQUIRED_KEYS):
        return None
    kept["thread_cpu_per_message_s"] = thread_cpu_per_message_s(threads)
    return {**kept, "workload": f"mlp {SYNTHETIC_MLP['hidden_dim']}x{SYNTHETIC_MLP['num_hidden_layers']}, "
                                f"pipedream:{NUM_MICROBATCHES}, micro-batch {MICROBATCH_SIZE}"}
