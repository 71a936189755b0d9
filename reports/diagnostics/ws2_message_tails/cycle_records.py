"""Every message of the handoff cycle (`validator.handoff_bench.run_cycle`), kept one by one.

The profile's `handoff.cycle` keeps a median and a mean per figure; this runs the same cycle (its
backward window fitted by `stage_hop_compute_s`, receives posted one ahead, 24 micro-batches, one
warm-up run and RUNS timed) and writes each send (rank, run, direction, micro-batch, target, start,
isend call) and each receive (run, direction, micro-batch, rank, wait began, wait ended) as JSON,
for `message_tails.py`. Nothing enters a profile.

FORWARD_SHARE (default 0.5, as the calibration) sets the forward window over the backward one.

    python reports/diagnostics/ws2_message_tails/cycle_records.py MODEL STAGES OUT.json [SIZE_BYTES] [RUNS] [FORWARD_SHARE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_pipeline_validation import MODELS, pipeline_overrides  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from validator.calibrate import DEFAULT_BATCH_SIZES  # noqa: E402
from validator.handoff_bench import DEFAULT_HANDOFF_BYTES, run_cycle, stage_hop_compute_s  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.microbench import load_models_module  # noqa: E402
from validator.overlap_bench import model_steps  # noqa: E402

MICROBATCHES = 24


def cycle_rank(rank: int, workload, batch: int, size_bytes: int, runs: int, forward_share: float) -> dict | None:
    torch.set_num_threads(1)
    steps = model_steps(workload, batch, load_models_module("validator.models"), seed=0, device="cpu")
    hop_compute_s = stage_hop_compute_s(steps)
    buffer = torch.ones(max(size_bytes // 4, 1))
    sends, receives = [], []
    for run in range(runs + 1):
        dist.barrier()
        sent, received, calls = run_cycle(steps, buffer, MICROBATCHES, hop_compute_s, run, forward_share=forward_share)
        if run:  # run 0 warms up
            sends += [(rank, *record, call) for record, call in zip(sent, calls)]
            receives += list(received)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (sends, receives))
    if rank:
        return None
    return {"hop_compute_s": hop_compute_s, "forward_share": forward_share, "size_bytes": size_bytes, "microbatches": MICROBATCHES,
            "world_size": dist.get_world_size(),
            "sends": [s for part, _ in everyone for s in part], "receives": [r for _, part in everyone for r in part]}


def main() -> int:
    usage = f"usage: cycle_records.py {{{','.join(MODELS)}}} {{2,4}} OUT.json [SIZE_BYTES] [RUNS] [FORWARD_SHARE]"
    if len(sys.argv) not in (4, 5, 6, 7) or sys.argv[1] not in MODELS or sys.argv[2] not in ("2", "4"):
        print(usage, file=sys.stderr)
        return 2
    name, stages, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    optional = [*sys.argv[4:], *[None] * 3][:3]
    try:
        size_bytes = int(optional[0]) if optional[0] else DEFAULT_HANDOFF_BYTES
        runs = int(optional[1]) if optional[1] else 24
        forward_share = float(optional[2]) if optional[2] else 0.5
    except ValueError as error:
        print(f"{usage} ({error})", file=sys.stderr)
        return 2
    scenario = load_scenario(ROOT / "scenarios" / "validation" / f"{name}.yaml", pipeline_overrides(stages))
    workload = resolve_workload(scenario.model, scenario.base_dir)
    batch = DEFAULT_BATCH_SIZES[len(DEFAULT_BATCH_SIZES) // 2]  # as the calibration's handoff phase
    config = LaunchConfig(world_size=stages, backend="gloo", device="cpu", timeout_s=300.0)
    result = spawn(cycle_rank, (workload, batch, size_bytes, runs, forward_share), config)[0]
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
