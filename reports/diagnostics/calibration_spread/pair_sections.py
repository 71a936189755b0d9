"""One calibration against another, section by section (twenty-fifth session).

Re-predicts MODEL's 2-rank cases from REFERENCE's profile, then with each section taken from OTHER's
profile in turn, then with OTHER's whole profile; prints each case's predicted change in %. Shows
whether two calibrations differ in one section or in all of them at once (a host state).

Run: python reports/diagnostics/calibration_spread/pair_sections.py REFERENCE OTHER [MODEL]
"""

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ws4_async_gap"))
sys.path.insert(0, str(HERE))

import section_spread as ss  # noqa: E402
import whatif_variants as w  # noqa: E402


def predicted_ms(root: Path, scratch: Path, reference: str, own: str, section: str | None, model: str):
    """MODEL's 2-rank predicted steps (ms, by kind) from `reference`'s profiles with `section` from
    `own`'s (all of `own`'s when section is None), against `own`'s measurements."""
    tag = f"{section or 'all'}-{own}"
    folder = ss.mixed_profiles(root / w.RUNS[reference][1], root / w.RUNS[own][1], section, scratch / tag)
    w.RUNS[f"pair-{tag}"] = (w.RUNS[own][0], str(folder))
    errors = w.case_errors(f"pair-{tag}", model)
    return errors[errors["world_size"] == 2].set_index("kind")["predicted_jitter_s"] * 1e3


def main() -> int:
    if len(sys.argv) < 3 or any(name not in w.RUNS for name in sys.argv[1:3]):
        print(f"usage: pair_sections.py REFERENCE OTHER [MODEL] (runs: {', '.join(w.RUNS)})", file=sys.stderr)
        return 2
    reference, other = sys.argv[1], sys.argv[2]
    model = sys.argv[3] if len(sys.argv) > 3 else "resnet_cpu"
    w.patch("prefix_sets")  # the model as it stands on every run's profiles
    scratch = Path(tempfile.mkdtemp(prefix="pair-sections-"))
    base = predicted_ms(w.ROOT, scratch, reference, reference, None, model)
    print(f"{reference} predicted (ms): {base.round(2).to_dict()}")
    for section in ss.SECTIONS:
        moved = predicted_ms(w.ROOT, scratch, reference, other, section, model)
        print(f"{section:18s} {((moved / base - 1) * 100).round(1).to_dict()}")
    whole = predicted_ms(w.ROOT, scratch, other, other, None, model)
    print(f"{'all of ' + other:18s} {((whole / base - 1) * 100).round(1).to_dict()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
