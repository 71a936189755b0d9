"""SpecTrain's step over PipeDream's, measured and as predicted in each committed CPU pipeline run
(the CSVs of `../ws4_async_gap/whatif_variants.py`'s RUNS, predictions as each run made them).

The two asynchronous schedules share the 1F1B order without flush and differ only in their weight
passes (SpecTrain: predict before a forward, repredict before a backward; PipeDream: stash before a
forward), so the ratio isolates what the model charges for those passes against what they add.

Run: python reports/diagnostics/stage_ranges/spectrain_over_pipedream.py
"""

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "reports/diagnostics/ws4_async_gap"))

from whatif_variants import RUNS  # noqa: E402

MEASURED, PREDICTED = "measured_s", "predicted_jitter_s"


def ratio(frame: pd.DataFrame, column: str) -> float:
    by_kind = {kind.split(":")[0]: value for kind, value in zip(frame["kind"], frame[column])}
    return by_kind["spectrain"] / by_kind["pipedream"]


def main() -> int:
    rows = []
    for name, (csv, _profiles) in RUNS.items():
        frame = pd.read_csv(ROOT / csv)
        for (model, stages), group in frame.groupby(["model", "world_size"]):
            rows.append({"run": name, "case": f"{model.split('_')[0]} p={stages}",
                         "measured": ratio(group, MEASURED), "predicted": ratio(group, PREDICTED)})
    table = pd.DataFrame(rows)
    print("SpecTrain step / PipeDream step, per run (measured | as predicted)")
    wide = table.pivot(index="run", columns="case", values=["measured", "predicted"]).round(2)
    print(wide.swaplevel(axis=1).sort_index(axis=1).to_string())
    summary = table.groupby("case")[["measured", "predicted"]].agg(["median", "min", "max"]).round(2)
    print("\nover the runs:")
    print(summary.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
