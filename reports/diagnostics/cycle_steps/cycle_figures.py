"""Print the asynchronous cycle's message figures of each profile in a folder: `handoff.cycle` (the
steady state of runs of 24 micro-batches) beside `handoff.cycle_steps` (runs of 4 micro-batches
from a barrier, every message counted; recorded only by calibrations at commit b05866e), and the
`cycle_compute` efficiency and P_cycle. Reads JSON only.

    python reports/diagnostics/cycle_steps/cycle_figures.py [PROFILES_DIR]
"""

import json
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "first_run" / "profiles"


def figures(section: dict | None) -> str:
    if section is None:
        return "none"
    ms = {key: 1e3 * section[key] for key in ("mean_delay_s", "send_post_s", "send_post_mean_s",
                                              "ready_receive_s", "ready_receive_mean_s")}
    return (f"delay {ms['mean_delay_s']:.2f} ms | isend median/mean {ms['send_post_s']:.2f}/"
            f"{ms['send_post_mean_s']:.2f} | arrived wait median/mean {ms['ready_receive_s']:.2f}/"
            f"{ms['ready_receive_mean_s']:.2f} | messages waited/arrived {section['num_messages']}/{section['num_ready']}")


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
        print(f"  steady state  {figures(handoff.get('cycle'))}")
        print(f"  short steps   {figures(handoff.get('cycle_steps'))}")
        print(f"  cycle_compute efficiency {compute.get('efficiency', 0):.3f}, P_cycle {compute.get('host_parallelism', 0):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
