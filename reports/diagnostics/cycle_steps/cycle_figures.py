"""Print the asynchronous cycle's message figures of each profile in a folder: `handoff.cycle` (the
steady state of runs of 24 micro-batches) beside `handoff.cycle_steps` (runs of 4 micro-batches
from a barrier, every message counted; recorded only by calibrations at commit b05866e), and the
`cycle_compute` efficiency and P_cycle. Reads JSON only.

    python reports/diagnostics/cycle_steps/cycle_figures.py [PROFILES_DIR]
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
FOLDER = Path(__file__).resolve().parent / "first_run" / "profiles"

from handoff_recalibrate import section_figures  # noqa: E402


def figures(label: str, section: dict | None) -> str:
    if section is None:
        return f"{label}: none"
    return (f"{section_figures(label, section)}; messages waited/arrived "
            f"{section['num_messages']}/{section['num_ready']}")


def main() -> int:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER
    paths = sorted(folder.glob("*.json"))
    if not paths:
        print(f"PROFILES_DIR: no profiles in {folder}", file=sys.stderr)
        return 2
    for path in paths:
        document = json.loads(path.read_text())
        handoff, compute = document.get("handoff") or {}, document.get("cycle_compute") or {}
        print(path.name)
        print(f"  {figures('steady state', handoff.get('cycle'))}")
        print(f"  {figures('short steps', handoff.get('cycle_steps'))}")
        print(f"  cycle_compute efficiency {compute.get('efficiency', 0):.3f}, P_cycle {compute.get('host_parallelism', 0):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
