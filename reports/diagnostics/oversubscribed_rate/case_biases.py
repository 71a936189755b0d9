"""Which pipeline cases a model misses the same way run after run (twenty-first session).

Re-predicts every committed CPU pipeline run (`../ws4_async_gap/whatif_variants.py`'s RUNS, each
from its own profiles) with the model patched as VARIANT, and prints:

- per case (model, stages, kind), its error in each run, the mean over runs and the standard
  deviation: a case whose mean is large against its deviation is a structural miss of the model,
  not noise of one calibration;
- per run, MAPE / worst as predicted, and the same with every case's mean error over the *other*
  runs subtracted (leave one run out). That second figure is a diagnostic, not a model: it is
  fitted on measurements. It bounds what a model without the structural misses could reach on
  this host with these calibrations, the noise of each calibration and run left in.

Writes nothing.

Run: python reports/diagnostics/oversubscribed_rate/case_biases.py [VARIANT] [RUN,RUN,...]
     (default: none, the six runs of the kept model's last measurement protocol)
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ws4_async_gap"))

import pandas as pd  # noqa: E402

import whatif_variants  # noqa: E402

RECENT = ("latest", "second_run", "first_run", "s18_first", "s19_fifth", "s20_fresh")
CASE = ["model", "world_size", "kind"]


def table(runs, variant: str) -> pd.DataFrame:
    whatif_variants.patch(variant)
    frames = []
    for name in runs:
        errors = whatif_variants.case_errors(name)
        errors["run"] = name
        frames.append(errors)
    return pd.concat(frames, ignore_index=True)


def main() -> int:
    variant = sys.argv[1] if len(sys.argv) > 1 else "none"
    runs = sys.argv[2].split(",") if len(sys.argv) > 2 else list(RECENT)
    if variant not in whatif_variants.VARIANTS or any(name not in whatif_variants.RUNS for name in runs):
        print(f"usage: case_biases.py [{'|'.join(whatif_variants.VARIANTS)}] [RUN,...] "
              f"(RUN: {', '.join(whatif_variants.RUNS)})", file=sys.stderr)
        return 2
    errors = table(runs, variant)
    by_case = errors.pivot_table(index=CASE, columns="run", values="jitter_error_pct")[runs]
    by_case["mean"] = by_case[runs].mean(axis=1)
    by_case["sd"] = by_case[runs].std(axis=1)
    pd.set_option("display.width", 250)
    print(f"# {variant}: jittered error %, per case and run")
    print(by_case.round(1).to_string())
    print()
    for name in runs:
        own = errors[errors["run"] == name].set_index(CASE)["jitter_error_pct"]
        others = errors[errors["run"] != name].groupby(CASE)["jitter_error_pct"].mean()
        corrected = own - others.reindex(own.index)
        print(f"{name:11s} as predicted MAPE {own.abs().mean():4.1f} worst {own.abs().max():4.1f} | "
              f"each case's mean over the other runs removed (diagnostic) "
              f"MAPE {corrected.abs().mean():4.1f} worst {corrected.abs().max():4.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
