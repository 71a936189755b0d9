"""What-if: a pipeline run re-predicted with one tail of the profiles' `handoff.cycle` scaled.

Each tail is a mean over its median (the isend call, the wait on an arrived message, the delay to a
waiting receiver); `KEY=FACTOR` keeps the median and multiplies the excess by FACTOR (0: no tail).
Every case of the CSV is re-predicted with its own profile (`<CSV folder>/profiles`), as the
benchmark predicts it (median step under pass jitter). Writes only temporary profiles.

    python reports/diagnostics/ws2_message_tails/zero_tails.py CSV KEY=FACTOR [KEY=FACTOR ...]

KEY: send_post_mean_s, ready_receive_mean_s or mean_delay_s.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from repredict import cases  # noqa: E402
from validator.validate import predictions  # noqa: E402

MEDIANS = {"send_post_mean_s": "send_post_s", "ready_receive_mean_s": "ready_receive_s",
           "mean_delay_s": "median_delay_s"}


def parse_scalings(arguments: list[str]) -> dict[str, float] | None:
    scalings = {}
    for argument in arguments:
        key, _, factor = argument.partition("=")
        try:
            scalings[key] = float(factor)
        except ValueError:
            return None
        if key not in MEDIANS:
            return None
    return scalings or None


def main() -> int:
    scalings = parse_scalings(sys.argv[2:]) if len(sys.argv) > 2 else None
    if scalings is None or not Path(sys.argv[1]).is_file():
        print(__doc__.strip().splitlines()[-3].strip(), file=sys.stderr)
        return 2
    csv_path = Path(sys.argv[1])
    out = []
    for scenario, path, specs, group in cases(pd.read_csv(csv_path), True, profiles=csv_path.parent / "profiles"):
        document = json.loads(path.read_text())
        cycle = document["handoff"]["cycle"]
        for key, factor in scalings.items():
            cycle[key] = cycle[MEDIANS[key]] + factor * (cycle[key] - cycle[MEDIANS[key]])
        temporary = Path(tempfile.gettempdir()) / f"{path.stem}_scaled_tails.json"
        temporary.write_text(json.dumps(document))
        figures = predictions(scenario, str(temporary), specs)
        for _, row in group.iterrows():
            predicted_s = figures[row.strategy]["predicted_jitter_s"]
            out.append((row.model, row.world_size, row.kind, row.jitter_error_pct,
                        100 * (predicted_s - row.measured_s) / row.measured_s))
    table = pd.DataFrame(out, columns=["model", "stages", "kind", "as_run_pct", "scaled_pct"])
    print(f"scaled: {' '.join(sys.argv[2:])}")
    print(table.round(1).to_string(index=False))
    for label, part in (("all", table), *((f"{s} stages", g) for s, g in table.groupby("stages"))):
        print(f"{label:9s} as run MAPE {part.as_run_pct.abs().mean():5.1f} % worst {part.as_run_pct.abs().max():5.1f} % | "
              f"scaled MAPE {part.scaled_pct.abs().mean():5.1f} % worst {part.scaled_pct.abs().max():5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
