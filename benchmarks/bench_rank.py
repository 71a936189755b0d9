"""`ghpsim rank` on GPT-3 175B over every layout (issue 73): the wall time of the whole command, the
median of 3 runs, against its targets, with the search's counts and the best layout.

Targets (2 CPU cores): 1024 GPUs <= 60 s, 8192 GPUs <= 120 s, the three cluster sizes 256 / 1024 /
4096 side by side <= 180 s. Each run is a fresh `python -m ghpsim rank ... --json` process (the
default --top 10 and workers = CPU count). `--only moe` also times Mixtral 8x7B on 256 H100 (expert
parallel degrees searched too), and `--only 405b` LLaMA-3 405B on 256 H100 (context parallel degrees
searched too; 2,048 micro-batches a replica, so long pipelines' steady states are extended), and
`--only 16384` GPT-3 175B on 16,384 GPUs (placements that do not fold are skipped); all reported, no
target. Run: python benchmarks/bench_rank.py [--repeats 3] [--only 1024,8192,compare,moe,405b,16384]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "scenarios/gpt3_175b_dgx_a100_3d.yaml"
CASES = {  # name -> (scenario, --gpus, target seconds or None)
    "1024": (SCENARIO, "1024", 60.0),
    "8192": (SCENARIO, "8192", 120.0),
    "compare": (SCENARIO, "256,1024,4096", 180.0),
    "moe": ("scenarios/mixtral_8x7b_ep_h100.yaml", "256", None),
    "405b": ("scenarios/llama3_405b_4d_h100.yaml", "256", None),
    "16384": (SCENARIO, "16384", None),
}
DEFAULT_CASES = ("1024", "8192", "compare")


def run_once(scenario: str, gpus: str) -> tuple[float, dict]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "ghpsim", "rank", scenario, "--gpus", gpus, "--json",
                             "--tokens", "300e9", "--price-per-gpu-hour", "2"],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"rank --gpus {gpus} failed: {result.stderr.strip()}")
    return elapsed, json.loads(result.stdout)


def summary_lines(document: dict) -> list[str]:
    lines = []
    for size in document.get("sizes", [document]):
        search, best = size["search"], size["rows"][0]
        lines.append(f"    {size['num_gpus']:>5} GPUs: {search['enumerated']} enumerated, {search['pruned_by_memory']} "
                     f"pruned by memory, {search['pruned_by_bound']} by bound, {search['simulated']} simulated; "
                     f"best {best['label']}: {best['step_time_s']:.3f} s/step, "
                     f"{best['time_to_train_s'] / 86400:.1f} days, ${best['cost']:,.0f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(DEFAULT_CASES), help="comma list of " + ", ".join(CASES))
    args = parser.parse_args()
    failed = False
    for name in args.only.split(","):
        scenario, gpus, target_s = CASES[name]
        times, document = [], None
        for _ in range(args.repeats):
            elapsed, document = run_once(scenario, gpus)
            times.append(elapsed)
        median = statistics.median(times)
        verdict = "(no target)" if target_s is None else \
            f"(target <= {target_s:.0f} s) {'ok' if median <= target_s else 'OVER'}"
        failed |= target_s is not None and median > target_s
        print(f"rank {Path(scenario).stem} --gpus {gpus}: median {median:.1f} s of {[round(t, 1) for t in times]} "
              f"{verdict}")
        print("\n".join(summary_lines(document)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
