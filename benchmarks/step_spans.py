"""Where a validated plan's measured time goes, over every step: the per-pass and per-message
figures of a `ghpsim validate --step-spans` table, beside the simulated trace's.

    python benchmarks/step_spans.py OUT/traces/1f1b-m4_G1xM2.steps.csv
    python benchmarks/step_spans.py OUT/traces/1f1b-m4_G1xM2.steps.csv --simulated OUT/traces/1f1b-m4_G1xM2.simulated.trace.json

One line per rank and span name, the micro-batch index dropped (`F3 L0-2` -> `F L0-2`, `send act1`
-> `send act`): how many a step holds, the median, 90th percentile and largest duration over all
steps and launches, the median over steps of their sum per step (and that sum per micro-batch: an
asynchronous plan's recorded step is its whole steady-state run, K m >= 3p + m + 1 micro-batches,
`simulator.schedules.steady_state`), and with `--simulated` the
simulated median and the measured / simulated ratio. The median step's trace hides the tails (an
isend call held for milliseconds once in a few steps); this shows them. Tables with a `cpu_s` column
(compute spans' main-thread CPU time, since 2026-11-23) add the median and mean CPU time and
`waited_pct`: the share of the passes' summed wall time spent off a core (preempted; on a CPU host).
Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

MICROBATCH_INDEX = re.compile(r"^([FB])\d+|(?<=[a-z])\d+(?= |$)")


def pass_name(name: str) -> str:
    """A span's name without its micro-batch index: `B12 L3-6` -> `B L3-6`, `recv grad0` -> `recv grad`,
    `stash3 L0-2` -> `stash L0-2`."""
    return MICROBATCH_INDEX.sub(lambda match: match.group(1) or "", name)


def measured_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, pass name): count per step, median / p90 / max duration and median per-step sum, in ms,
    and that sum per micro-batch of a recorded step (`per_microbatch_ms`: an asynchronous plan's
    recorded step is its whole steady-state run, K m >= 3p + m + 1 micro-batches, while its figure is
    the window of m; `validator.measure`); with a `cpu_s` column also the median and mean CPU time (ms) and the
    percentage of the summed wall time not on a core (NaN for spans without CPU time)."""
    steps = steps.assign(pass_name=steps["name"].map(pass_name), duration_ms=1e3 * steps["duration_s"])
    num_steps = steps.groupby(["launch", "step"]).ngroups
    microbatches = steps[steps["microbatch"] >= 0].groupby(["launch", "step"])["microbatch"].nunique()
    microbatches_per_step = float(microbatches.median()) if len(microbatches) else float("nan")
    per_step = steps.groupby(["rank", "pass_name", "launch", "step"])["duration_ms"].sum()
    grouped = steps.groupby(["rank", "pass_name"])["duration_ms"]
    table = pd.DataFrame({
        "per_step": grouped.count() / num_steps,
        "median_ms": grouped.median(),
        "p90_ms": grouped.quantile(0.9),
        "max_ms": grouped.max(),
        "step_sum_median_ms": per_step.groupby(["rank", "pass_name"]).median(),
    })
    table["per_microbatch_ms"] = table["step_sum_median_ms"] / microbatches_per_step
    if "cpu_s" in steps:
        cpu = steps.assign(cpu_ms=1e3 * steps["cpu_s"]).dropna(subset=["cpu_ms"])
        by_pass = cpu.groupby(["rank", "pass_name"])
        table["cpu_median_ms"] = by_pass["cpu_ms"].median()
        table["cpu_mean_ms"] = by_pass["cpu_ms"].mean()
        table["waited_pct"] = 100.0 * (1.0 - by_pass["cpu_ms"].sum() / by_pass["duration_ms"].sum())
    return table


def simulated_medians_ms(trace_path: Path) -> pd.Series:
    """Per (rank, pass name): the simulated trace's median duration in ms."""
    document = json.loads(trace_path.read_text())
    events = document["traceEvents"] if isinstance(document, dict) else document
    rows = [(event["pid"], pass_name(event["name"]), event["dur"] / 1e3)
            for event in events if event.get("ph") == "X"]
    frame = pd.DataFrame(rows, columns=["rank", "pass_name", "duration_ms"])
    return frame.groupby(["rank", "pass_name"])["duration_ms"].median()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps_csv", type=Path, help="OUT/traces/<strategy>.steps.csv from --step-spans")
    parser.add_argument("--simulated", type=Path, default=None, help="the matching .simulated.trace.json")
    args = parser.parse_args(argv)
    for path in (args.steps_csv, args.simulated):
        if path is not None and not path.is_file():
            print(f"step_spans: {path}: no such file", file=sys.stderr)
            return 2
    table = measured_table(pd.read_csv(args.steps_csv))
    if args.simulated is not None:
        table["simulated_median_ms"] = simulated_medians_ms(args.simulated)
        table["measured_over_simulated"] = table["median_ms"] / table["simulated_median_ms"]
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(table.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
