"""Run one scenario's plan under torchrun (env:// rendezvous), e.g. across the nodes of a cluster:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m validator.torchrun_worker scenarios/my_cluster.yaml --steps 20 --out reports/run.json

Every rank compiles the same plan from the same scenario (compilation is deterministic; the plan's
digest is checked across ranks), runs it with `validator.measure.run_rank`, and rank 0 writes the
step times and all ranks' spans. The scenario's cluster must have WORLD_SIZE devices.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import pickle
import sys

import torch
import torch.distributed as dist

from simulator.grid_symmetry import every_rank
from simulator.output import write_json_atomic
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from validator.allocator import tune_allocator
from validator.errors import RankFailure
from validator.launch import torchrun_rank
from validator.measure import RunOptions, run_rank


def plan_digest(plan) -> str:
    return hashlib.sha256(pickle.dumps((plan.rank_to_device, plan.actions, plan.stages))).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validator.torchrun_worker")
    parser.add_argument("scenario")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default="reports/torchrun_run.json")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or not 0 < args.timeout < float("inf"):
        parser.error(f"--steps {args.steps} (at least 1), --warmup {args.warmup} (at least 0), --timeout "
                     f"{args.timeout} (positive seconds): out of range")
    rank, world_size = torchrun_rank()
    tune_allocator()
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))
    try:
        scenario = load_scenario(args.scenario, args.overrides)
        result = simulate(every_rank(scenario))  # every rank's actions: each process runs its own
        if result.plan.num_ranks != world_size:
            raise RankFailure(f"rank {rank}: the plan has {result.plan.num_ranks} ranks but WORLD_SIZE is {world_size}")
        digests = [None] * world_size
        dist.all_gather_object(digests, plan_digest(result.plan))
        if len(set(digests)) != 1:
            raise RankFailure(f"rank {rank}: ranks compiled different plans: {digests}")
        options = RunOptions(steps=args.steps, warmup=args.warmup, optimizer=scenario.training.optimizer,
                             device="cuda" if use_cuda else "cpu")
        measured = run_rank(rank, result.plan, result.workload, options)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, measured["spans"])
        if rank == 0:
            write_json_atomic(args.out, {"scenario": scenario.name, "world_size": world_size,
                                         "predicted_step_s": result.step_time_s,
                                         "step_times_s": measured["step_times_s"],
                                         "spans": [span for spans in gathered for span in spans]})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
