"""The profile's `stage_loops` section, measuring side: every rank runs its stage of each
asynchronous kind's steady-state plan (`simulator.stage_loop.stage_loop_plan`) through the pipeline
runtime itself (`validator.pipeline_runtime.PipelineExecutor`) with its messages taken out
(`LoopExecutor`), all ranks at once, in turns with 1F1B's loop of the same shape; each rank's median
step is `measured_s`, 1F1B's `reference_s`. What the section is for, and how the calibration models
the same loops: `simulator.stage_loop`.

Without messages no rank waits for another, so a step is the rank's own passes back to back with
the next stage's at once: what a pass of the validated runs meets besides its messages. A received
activation or gradient is a copy of a random tensor of its shape made once (a receive writes a
fresh buffer in the runtime); a sent one is dropped.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from simulator.plan import Recv, Send
from simulator.stage_loop import LOOP_KINDS, REFERENCE_KIND, stage_loop_plan
from simulator.workload import Workload
from validator.microbench import _sync
from validator.pipeline_runtime import PipelineExecutor

LOOP_STEPS, LOOP_WARMUP = 8, 2
"""Steps timed per kind after the warm-up ones, the kinds in turns; a step is the steady-state
plan's whole run (at 2 stages 12 micro-batches a stage, at 4 stages 16)."""


class LoopExecutor(PipelineExecutor):
    """The runtime's stage without messages: receives hand over a copy of a stand-in tensor of the
    message's shape, sends drop theirs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stand_ins: dict[int, torch.Tensor] = {}  # chunk -> the tensor its messages copy

    def _post_next_receive(self) -> None:
        return None

    def _stand_in(self, chunk: int) -> torch.Tensor:
        stand_ins = self._stand_ins
        if chunk not in stand_ins:
            layer = self.chunks[chunk][1] - 1
            generator = torch.Generator().manual_seed(self.seed + 7 * chunk + 1)
            stand_ins[chunk] = torch.randn((self.microbatch_size, *self.output_shapes[layer]),
                                           generator=generator).to(self.device)
        return stand_ins[chunk]

    def _recv(self, action: Recv) -> None:
        kind, _, chunk, microbatch = action.key
        self.received[(kind, chunk, microbatch)] = self._stand_in(chunk).clone()

    def _send(self, action: Send) -> None:
        kind, _, chunk, microbatch = action.key
        if kind == "grad":  # what the runtime sends, no longer held by the micro-batch
            self.flight[(chunk + 1, microbatch)].input_grads.pop(self.chunks[chunk + 1][0])


def time_stage_loops(plans: dict, workload: Workload, optimizer: str, device: str, steps: int,
                     warmup: int) -> dict[str, float]:
    """kind -> this rank's median step (s) of that kind's plan without messages, the kinds' steps
    taken in turns (each step after a barrier), so that every kind meets the same spells of the
    machine's speed; every rank calls it at once."""
    executors = {kind: LoopExecutor(plan, workload, dist.get_rank(), optimizer, 0.01, 0, device)
                 for kind, plan in plans.items()}
    times_s = {kind: [] for kind in plans}
    for step in range(warmup + steps):
        for kind, executor in executors.items():
            executor.load_batch(step)
            dist.barrier()
            _sync(executor.device)
            started = time.perf_counter()
            executor.step(step)
            _sync(executor.device)
            if step >= warmup:
                times_s[kind].append(time.perf_counter() - started)
    return {kind: statistics.median(values) for kind, values in times_s.items()}


def measure_stage_loops(workload: Workload, optimizer: str, device: str, device_kind: str = "cpu",
                        steps: int = LOOP_STEPS, warmup: int = LOOP_WARMUP) -> dict:
    """weight mode -> {"kind", "measured_s": [rank 0's median step, rank 1's, ...], "reference_s":
    [the same for 1F1B's loop, timed in turns with it]} for each asynchronous kind (SpecTrain only
    with momentum, whose buffer it predicts from); {} on one rank. Every rank must call it at the
    same time; rank 0's return is the section's measuring half (`simulator.stage_loop.loop_entry`
    adds the model's half)."""
    world = dist.get_world_size()
    if world < 2:
        return {}
    kinds = [kind for kind in LOOP_KINDS if kind != "spectrain" or optimizer == "momentum"]
    plans = {kind: stage_loop_plan(workload, world, kind, device_kind) for kind in (REFERENCE_KIND, *kinds)}
    medians = time_stage_loops(plans, workload, optimizer, device, steps, warmup)
    everyone = [None] * world
    dist.all_gather_object(everyone, medians)
    reference_s = [float(ranks[REFERENCE_KIND]) for ranks in everyone]
    return {LOOP_KINDS[kind]: {"kind": kind, "measured_s": [float(ranks[kind]) for ranks in everyone],
                               "reference_s": reference_s} for kind in kinds}


__all__ = ["LoopExecutor", "measure_stage_loops", "time_stage_loops"]
