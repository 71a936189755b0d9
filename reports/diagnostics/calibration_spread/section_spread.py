"""Which profile section makes the pipeline predictions move from run to run (twenty-fifth session).

Over the held-out runs with the current protocol's sections (`RUNS` below), the predicted step of a
profile's cases moves more from run to run than the measured step does at 2 ranks. This script
re-predicts every case from a reference run's profile with ONE section taken from each run's own
profile, for each section in turn: the spread of those predictions over the runs is that section's
own share of the prediction's run-to-run spread (the others held at the reference's values).

Prints, per profile (model, ranks) and per section, the coefficient of variation over the runs of
the mean predicted step of the profile's cases, beside the measured one and the prediction with
every section the run's own. The measured spread is the host's own from run to run; a section whose
spread alone reaches it adds calibration noise, not information. Writes only temporary profiles.

Run: python reports/diagnostics/calibration_spread/section_spread.py [REFERENCE_RUN]
"""

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ws4_async_gap"))

import pandas as pd  # noqa: E402

import whatif_variants  # noqa: E402

RUNS = ("s20_fresh", "s21_fresh", "s22_fresh", "s22_second", "s23_fresh")
SECTIONS = ("layers", "layer_sweep", "cold_start", "compute_slowdown", "cycle_compute", "weight_passes",
            "optimizer", "handoff", "p2p", "pass_jitter", "overlap", "allreduce")


def mixed_profiles(reference: Path, own: Path, section: str | None, out: Path) -> Path:
    """`reference`'s profiles with `section` from `own`'s (all of `own` when section is None)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(own.glob("*.json")):
        document = json.loads(path.read_text())
        if section is not None:
            base = json.loads((reference / path.name).read_text())
            if section in document:
                base[section] = document[section]
            else:
                base.pop(section, None)
            document = base
        (out / path.name).write_text(json.dumps(document))
    return out


def spread_pct(values: pd.Series) -> float:
    return float(values.std() / values.mean() * 100)


def main() -> int:
    reference = sys.argv[1] if len(sys.argv) > 1 else "s22_fresh"
    if reference not in RUNS:
        print(f"REFERENCE_RUN: {reference!r} is not one of {', '.join(RUNS)}", file=sys.stderr)
        return 2
    whatif_variants.patch("prefix_sets")  # the model as it stands on every run's profiles
    root = whatif_variants.ROOT
    reference_profiles = root / whatif_variants.RUNS[reference][1]
    scratch = Path(tempfile.mkdtemp(prefix="section-spread-"))
    rows = []
    for section in (None,) + SECTIONS:
        for run in RUNS:
            csv, profiles = whatif_variants.RUNS[run]
            folder = mixed_profiles(reference_profiles, root / profiles, section, scratch / f"{section}-{run}")
            whatif_variants.RUNS[f"mixed-{run}"] = (csv, str(folder))
            errors = whatif_variants.case_errors(f"mixed-{run}")
            errors["run"], errors["section"] = run, section or "all own"
            rows.append(errors)
        print(f"  {section or 'all own'} done", file=sys.stderr, flush=True)
    table = pd.concat(rows, ignore_index=True)
    means = table.groupby(["model", "world_size", "section", "run"])[["predicted_jitter_s", "measured_s"]].mean()
    spreads = means.groupby(["model", "world_size", "section"]).agg(spread_pct)
    predicted = spreads["predicted_jitter_s"].unstack("section")[["all own", *SECTIONS]]
    measured = spreads["measured_s"].unstack("section")["all own"].rename("measured")
    pd.set_option("display.width", 250)
    print(f"# run-to-run spread (CV %, over {', '.join(RUNS)}) of a profile's mean step; "
          f"a section column: that section from each run, the rest from {reference}")
    print(pd.concat([measured, predicted], axis=1).round(1).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
