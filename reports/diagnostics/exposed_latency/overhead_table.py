"""Where the 2-stage asynchronous over-prediction sits: the time a step spends outside compute,
predicted against measured, over the committed CPU pipeline runs (nineteenth session).

Per case: predicted (median step under pass jitter) minus the predicted mean compute per rank, and
measured (median step) minus the measured mean compute per rank, both from the run's CSV
(`predicted_compute_s`, `measured_compute_s`: the mean over ranks of their compute in the step, or in
the steady-state window for asynchronous kinds). Prints min-max over the runs, ms, per model, depth
and kind, and the compute ratio predicted / measured. Writes nothing.

    python reports/diagnostics/exposed_latency/overhead_table.py [RUN,...]
"""

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "reports/diagnostics/ws4_async_gap"))

from whatif_variants import RUNS  # noqa: E402


def main() -> int:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(RUNS)
    frames = []
    for name in names:
        frame = pd.read_csv(ROOT / RUNS[name][0])
        frames.append(frame.assign(run=name))
    table = pd.concat(frames)
    table["kind"] = table["kind"].str.split(":").str[0]
    table["predicted_outside_ms"] = 1e3 * (table["predicted_jitter_s"] - table["predicted_compute_s"])
    table["measured_outside_ms"] = 1e3 * (table["measured_s"] - table["measured_compute_s"])
    table["compute_ratio"] = table["predicted_compute_s"] / table["measured_compute_s"]
    grouped = table.groupby(["model", "world_size", "kind"])
    span = lambda column, digits: grouped[column].agg(  # noqa: E731
        lambda values: f"{values.min():.{digits}f}-{values.max():.{digits}f}")
    summary = pd.DataFrame({"runs": grouped.size(),
                            "outside compute, predicted ms": span("predicted_outside_ms", 1),
                            "measured ms": span("measured_outside_ms", 1),
                            "compute predicted / measured": span("compute_ratio", 2)})
    print(f"runs: {', '.join(names)}")
    print(summary.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
