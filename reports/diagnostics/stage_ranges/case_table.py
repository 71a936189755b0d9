"""Per-case errors of two what-if variants on one run, side by side (re-predicted from its profiles).

Run: python reports/diagnostics/stage_ranges/case_table.py VARIANT_A VARIANT_B RUN
Each variant is re-predicted in its own process (`whatif_variants.patch` is not undone).
"""

import subprocess
import sys
from io import StringIO
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
WHATIF = HERE.parent / "ws4_async_gap"

ONE_VARIANT = """
import sys
sys.path.insert(0, {whatif!r})
import whatif_variants as w
w.patch({variant!r})
print(w.case_errors({run!r}).to_csv(index=False))
"""


def errors(variant: str, run: str) -> pd.DataFrame:
    code = ONE_VARIANT.format(whatif=str(WHATIF), variant=variant, run=run)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return pd.read_csv(StringIO(out))


def main() -> int:
    if len(sys.argv) != 4:
        print("usage: case_table.py VARIANT_A VARIANT_B RUN", file=sys.stderr)
        return 2
    first, second, run = sys.argv[1:]
    keys = ["model", "world_size", "kind"]
    table = errors(first, run)[keys + ["jitter_error_pct"]].merge(
        errors(second, run)[keys + ["jitter_error_pct"]], on=keys, suffixes=(f" {first}", f" {second}"))
    table["change"] = table[f"jitter_error_pct {first}"].abs() - table[f"jitter_error_pct {second}"].abs()
    print(f"{run}: error % of each case, {first} against {second} (change: |{first}| - |{second}|)")
    print(table.round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
