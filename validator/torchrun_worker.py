"""Run one scenario's plan under torchrun (env:// rendezvous), e.g. across the nodes of a cluster:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m validator.torchrun_worker scenarios/my_cluster.yaml --steps 20 --out reports/run.json

Every rank compiles the same plan from the same scenario (compilation is deterministic; the plan's
digest is checked across ranks), runs it with `validator.measure.run_rank`, and rank 0 writes the
step times and all ranks' spans. The scenario's cluster must have WORLD_SIZE devices.

`--timeout` bounds every wait: the rendezvous and every collective time out after it, and a watchdog
(`validator.worker_watchdog`) ends a worker that has not finished a step for --timeout seconds (a
peer stopped or frozen leaves a collective waiting for ever); a long run of quick steps is not cut.

Bad input (flags, scenario, --out, torchrun's environment) is refused before any real work starts,
and a failed run ends the worker: one line on stderr per worker, prefixed `ghpsim worker rank R:`,
exit code 2, no traceback, no output file.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import pickle
import sys

from ghpsim.cli import EXIT_USAGE, OneLineParser
from simulator.errors import ScenarioError, SimulationError, one_line
from simulator.grid_symmetry import every_rank
from simulator.output import check_output_file, write_json_atomic
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from validator.errors import RankFailure
from validator.validate import MAX_RUN_STEPS
from validator.worker_watchdog import Watchdog

PROG = "python -m validator.torchrun_worker"
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""The env:// rendezvous's variables, set by torchrun for every worker."""
USER_ERRORS = (ScenarioError, SimulationError, RankFailure)
"""Bad input or a failed run: one line, exit 2 (as `ghpsim.cli.USER_ERRORS`)."""


def plan_digest(plan) -> str:
    return hashlib.sha256(pickle.dumps((plan.rank_to_device, plan.actions, plan.stages))).hexdigest()[:16]


def worker_prefix(rank: int | None = None) -> str:
    """`ghpsim worker rank R` (torchrun's RANK when `rank` is None and it is a number), else `ghpsim worker`."""
    if rank is None:
        text = os.environ.get("RANK", "").strip()
        rank = int(text) if text.isdigit() else None
    return "ghpsim worker" if rank is None else f"ghpsim worker rank {rank}"


def error_line(message: object, rank: int | None = None) -> str:
    return one_line(f"{worker_prefix(rank)}: error: {message}")


class WorkerParser(OneLineParser):
    """`ghpsim.cli.OneLineParser` with the worker's prefix: one line per worker under torchrun, exit 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, one_line(f"{worker_prefix()}: error: {message} (see {self.prog} --help)") + "\n")


def count_at_least(minimum: int, maximum: int = MAX_RUN_STEPS):
    """argparse type: a whole number from `minimum` to `maximum` (the error names the value and the bounds)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({minimum} to {maximum:,})")
        return value
    return parse


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is out of range (positive, finite seconds)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = WorkerParser(prog=PROG, description="Run one scenario's plan under torchrun; rank 0 writes --out.")
    parser.add_argument("scenario", help="scenario YAML; its cluster must have WORLD_SIZE devices")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key (dotted), e.g. cluster.gpus_per_node=2")
    parser.add_argument("--steps", type=count_at_least(1), default=10, help="measured steps (1 to 10,000)")
    parser.add_argument("--warmup", type=count_at_least(0), default=3, help="untimed steps before them")
    parser.add_argument("--out", default="reports/torchrun_run.json", help="JSON file rank 0 writes")
    parser.add_argument("--timeout", type=positive_seconds, default=300.0,
                        help="seconds: the rendezvous and each collective time out after it, and a worker "
                             "that finishes no step for this long ends (exit 2)")
    return parser


def torchrun_env() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; RankFailure naming the variable if one is
    missing or malformed (run outside torchrun)."""
    for name in TORCHRUN_VARIABLES:
        if not os.environ.get(name, "").strip():
            raise RankFailure(f"not under torchrun: environment variable {name} is not set "
                              f"(launch it as: torchrun --nproc-per-node N -m validator.torchrun_worker ...)")
    numbers = {}
    for name in ("RANK", "WORLD_SIZE"):
        text = os.environ[name].strip()
        if not text.isdigit():
            raise RankFailure(f"environment variable {name}={text!r}: not a whole number")
        numbers[name] = int(text)
    rank, world_size = numbers["RANK"], numbers["WORLD_SIZE"]
    if not 0 <= rank < world_size:
        raise RankFailure(f"environment variable RANK={rank}: not below WORLD_SIZE={world_size}")
    return rank, world_size


def prepare(args: argparse.Namespace):
    """Every check of the user's input, before any real work: torchrun's environment, --out, the
    scenario and its plan's size. -> (rank, world size, scenario, simulation result)."""
    rank, world_size = torchrun_env()
    check_output_file(args.out, "--out")
    scenario = load_scenario(args.scenario, args.overrides)
    result = simulate(every_rank(scenario))  # every rank's actions: each process runs its own
    if result.plan.num_ranks != world_size:
        raise RankFailure(f"{args.scenario}: the plan has {result.plan.num_ranks} ranks (the scenario's cluster, "
                          f"cluster.num_nodes x cluster.gpus_per_node) but WORLD_SIZE is {world_size}: "
                          f"launch {result.plan.num_ranks} workers or change the cluster")
    return rank, world_size, scenario, result


def run(args: argparse.Namespace, rank: int, world_size: int, scenario, result) -> dict | None:
    """The real run, under a watchdog of --timeout seconds; -> the document rank 0 writes (else None).
    A collective's failure or timeout is a RankFailure."""
    import datetime

    import torch
    import torch.distributed as dist

    from validator.allocator import tune_allocator
    from validator.measure import RunOptions, run_rank

    watchdog = Watchdog(args.timeout, error_line(f"--timeout {args.timeout:g} s passed without a finished step "
                                                 "(a peer may have stopped)", rank))
    with watchdog:
        try:
            tune_allocator()
            use_cuda = torch.cuda.is_available()
            if use_cuda:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            else:
                torch.set_num_threads(1)
            dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://",
                                    timeout=datetime.timedelta(seconds=args.timeout))
            try:
                digests = [None] * world_size
                dist.all_gather_object(digests, plan_digest(result.plan))
                if len(set(digests)) != 1:
                    raise RankFailure(f"ranks compiled different plans (digests {digests}): "
                                      "give every worker the same scenario, --set and ghpsim version")
                options = RunOptions(steps=args.steps, warmup=args.warmup, optimizer=scenario.training.optimizer,
                                     device="cuda" if use_cuda else "cpu")
                measured = run_rank(rank, result.plan, result.workload, options, on_step=watchdog.kick)
                gathered = [None] * world_size
                dist.all_gather_object(gathered, measured["spans"])
            finally:
                dist.destroy_process_group()
        except RankFailure:
            raise
        except RuntimeError as error:  # torch.distributed's errors (DistError) and the runtime's
            raise RankFailure(f"the run failed: {type(error).__name__}: {error}") from error
    if rank != 0:
        return None
    return {"scenario": scenario.name, "world_size": world_size, "predicted_step_s": result.step_time_s,
            "step_times_s": measured["step_times_s"], "spans": [span for spans in gathered for span in spans]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank = None
    try:
        rank, world_size, scenario, result = prepare(args)
        document = run(args, rank, world_size, scenario, result)
    except USER_ERRORS as error:
        print(error_line(error, rank), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(error_line("interrupted", rank), file=sys.stderr)
        return 130
    if document is not None:
        try:
            write_json_atomic(args.out, document)
        except OSError as error:
            print(error_line(f"--out {error.filename or args.out}: {error.strerror or error}", rank),
                  file=sys.stderr)
            return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
