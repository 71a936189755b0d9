"""Summarize a log of `../ws4_async_gap/whatif_variants.py` runs (several variants over the same runs):
per variant the mean over runs of MAPE / worst, the same with each profile's level removed, the mean
|asynchronous - synchronous| over the six profiles, and how many runs each variant moved up or down
against `none`.

    python reports/diagnostics/stage_loops/summarize_whatif.py LOG
"""

import re
import statistics
import sys

KEYS = ("mlp2", "mlp4", "resnet2", "resnet4", "transformer2", "transformer4")


def read(path: str) -> dict:
    rows, current = {}, None
    for line in open(path):
        match = re.match(r"(\S+)\s+(\S+)\s+MAPE\s+([\d.]+) worst\s+([\d.]+)", line)
        if match:
            current = (match.group(1), match.group(2))
            rows[current] = {"mape": float(match.group(3)), "worst": float(match.group(4))}
        match = re.search(r"level removed: MAPE ([\d.]+) %, worst ([\d.]+)", line)
        if match and current:
            rows[current].update(lr_mape=float(match.group(1)), lr_worst=float(match.group(2)))
        match = re.search(r"asynchronous minus synchronous: (\{.*\})", line)
        if match and current:
            gaps = {key: float(value) for key, value in re.findall(r"'(\w+)': (-?[\d.]+)", match.group(1))}
            rows[current].update(gaps=gaps, gap=statistics.mean(abs(value) for value in gaps.values()))
    return rows


def main() -> None:
    rows = read(sys.argv[1])
    variants = list(dict.fromkeys(variant for variant, _ in rows))
    runs = [run for variant, run in rows if variant == "none"]
    mean = lambda variant, key: statistics.mean(rows[(variant, run)][key] for run in runs)  # noqa: E731
    for variant in variants:
        print(f"{variant:16s} {len(runs)} runs: MAPE {mean(variant, 'mape'):.2f} worst {mean(variant, 'worst'):.2f}"
              f" | level removed {mean(variant, 'lr_mape'):.2f} / {mean(variant, 'lr_worst'):.2f}"
              f" | mean |async - sync| {mean(variant, 'gap'):.2f}")
    for variant in variants[1:]:
        moved = {key: (sum(rows[(variant, r)][key] < rows[("none", r)][key] for r in runs),
                       sum(rows[(variant, r)][key] > rows[("none", r)][key] for r in runs))
                 for key in ("mape", "worst", "lr_mape", "lr_worst", "gap")}
        print(f"{variant} against none, runs lower / higher: "
              + ", ".join(f"{key} {low}/{high}" for key, (low, high) in moved.items()))
    for key in KEYS:
        print(f"{key:13s} " + "  ".join(
            f"{variant}: {statistics.mean(rows[(variant, r)]['gaps'][key] for r in runs):+5.1f}"
            f" (|{statistics.mean(abs(rows[(variant, r)]['gaps'][key]) for r in runs):4.1f}|)" for variant in variants))


if __name__ == "__main__":
    main()
