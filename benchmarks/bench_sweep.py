"""Sweep throughput: 1,000 points of 64-GPU scenarios (ResNet-50, GHP, 8 nodes x 8 A100) through
`run_sweep` with the default local process pool. Target: under 60 s on a 2-core machine.

    python benchmarks/bench_sweep.py [--workers N]

Prints: total seconds (expansion + simulation + SQLite commits + CSV export), points/s, the
median simulate() time per point inside the workers, and the time of a re-run (all points
already in the store).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from simulator.sweep import load_sweep, run_sweep

ROOT = Path(__file__).resolve().parent.parent
SWEEP = {
    "name": "bench_resnet50_ghp_64",
    "base": str(ROOT / "scenarios" / "resnet50_dp_a100.yaml"),
    "axes": {
        "cluster.num_nodes": [8],
        "strategy.kind": ["ghp"],
        "strategy.num_groups": [4, 8, 16, 32, 64],
        "training.global_batch_size": {"start": 128, "stop": 1280, "step": 128},
        "cluster.inter_node_link": ["ib-edr", "ib-hdr", "100gbe", "25gbe"],
        "strategy.bucket_size_bytes": ["5 MiB", "10 MiB", "25 MiB", "50 MiB", "100 MiB"],
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--workers", type=int, default=None, help="default: the number of CPUs")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        sweep_path = Path(folder) / "bench.yaml"
        sweep_path.write_text(yaml.safe_dump(SWEEP))
        started = time.perf_counter()
        sweep = load_sweep(sweep_path)
        points = sweep.points()
        expand_s = time.perf_counter() - started
        report = run_sweep(sweep, Path(folder) / "out", workers=args.workers, progress=False)
        total_s = time.perf_counter() - started
        again = time.perf_counter()
        rerun = run_sweep(load_sweep(sweep_path), Path(folder) / "out", workers=args.workers, progress=False)
        rerun_s = time.perf_counter() - again
    frame = report.frame
    counts = report.counts()
    median_ms = statistics.median(frame["sim_wall_s"].dropna()) * 1e3
    print(f"points: {len(points)} ({counts['ok']} ok, {counts['failed']} failed, {counts['invalid']} invalid), "
          f"64 GPUs each, workers: {args.workers or os.cpu_count()}, load average before: {load:.1f}")
    print(f"total: {total_s:.1f} s (target < 60 s): expansion {expand_s:.2f} s, run + commits {report.wall_s:.1f} s")
    workers = args.workers or os.cpu_count()
    busy_s = frame["sim_wall_s"].sum() / workers
    print(f"throughput: {len(points) / total_s:.1f} points/s; median simulate() per point: {median_ms:.1f} ms; "
          f"sum of simulate() times / workers: {busy_s:.1f} s (the rest of the run is pool, pickling and commits)")
    print(f"re-run with every point in the store: {rerun_s:.2f} s ({rerun.skipped} skipped, {rerun.computed} computed)")


if __name__ == "__main__":
    main()
