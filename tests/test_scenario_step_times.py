"""Every scenario in scenarios/ keeps its step time: `tests/golden/scenario_step_times.json` holds
the figures the analytic model gave them before the engine lost its host corrections (none of
which ever applied to an analytic cost model). Regenerate deliberately, after reviewing the diff:

    GHPSIM_REGENERATE_GOLDEN=1 python -m pytest tests/test_scenario_step_times.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import simulated_scenario

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "scenario_step_times.json"
EXPECTED = json.loads(GOLDEN.read_text())
SCENARIOS = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "scenarios").rglob("*.yaml")
                   if "sweeps" not in path.parts and path.parent.name != "layers")


def test_every_scenario_file_has_a_golden_step_time():
    assert sorted(EXPECTED) == SCENARIOS


@pytest.mark.parametrize("path", SCENARIOS)
def test_step_time_is_unchanged(path):
    step_time_s = simulated_scenario(ROOT / path).step_time_s
    if os.environ.get("GHPSIM_REGENERATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({**json.loads(GOLDEN.read_text()), path: step_time_s}, indent=1,
                                     sort_keys=True) + "\n")
        return
    assert step_time_s == pytest.approx(EXPECTED[path], rel=1e-9)
