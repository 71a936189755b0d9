"""Re-predict a pipeline benchmark's measurements with one section of each profile removed, beside
the errors as run: what one modelling change does on the same measurements and profiles (a fresh
run mixes it with the day's calibration). Nothing is fitted to the measurements.

    python benchmarks/repredict_without.py CSV PROFILES_DIR SECTION

SECTION is a dotted key of the profile, e.g. `cycle_compute` or `weight_passes.copy_forward`. The
CSV is `bench_pipeline_validation.py`'s (one or both depths); each case is re-predicted with its
`<model>_ws<stages>_momentum.json` from PROFILES_DIR, without SECTION, as the benchmark predicts it
(the median step under pass jitter). Prints a table and the MAPE / worst per depth; writes only
temporary profiles.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from repredict import cases
from validator.validate import predictions


def without(document: dict, section: str) -> tuple[dict, bool]:
    """A copy of `document` without the dotted key `section`; whether it was there."""
    trimmed = copy.deepcopy(document)
    *parents, last = section.split(".")
    node = trimmed
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    return trimmed, isinstance(node, dict) and node.pop(last, None) is not None


def main() -> int:
    if len(sys.argv) != 4:
        print("usage: " + next(line.strip() for line in __doc__.splitlines() if "repredict_without.py CSV" in line),
              file=sys.stderr)
        return 2
    csv_path, profiles, section = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    out = []
    for scenario, path, specs, group in cases(pd.read_csv(csv_path), True, profiles=profiles):
        trimmed, present = without(json.loads(path.read_text()), section)
        temporary = Path(tempfile.gettempdir()) / f"{path.stem}_without_{section}.json"
        temporary.write_text(json.dumps(trimmed))
        figures = predictions(scenario, str(temporary), specs)
        for _, row in group.iterrows():
            predicted_s = figures[row.strategy]["predicted_jitter_s"]
            out.append((row.model, row.world_size, row.kind, present, row.jitter_error_pct,
                        100 * (predicted_s - row.measured_s) / row.measured_s))
    table = pd.DataFrame(out, columns=["model", "stages", "kind", "had_section", "as_run_pct", "without_pct"])
    print(table.round(1).to_string(index=False))
    for stages, part in [("all", table), *table.groupby("stages")]:
        for column in ("as_run_pct", "without_pct"):
            print(f"{stages} stages, {column}: MAPE {part[column].abs().mean():.1f} %, "
                  f"worst {part[column].abs().max():.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
