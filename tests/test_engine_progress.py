"""Progress of long simulations (simulator/engine_progress.py): reported inside the block, every
PROGRESS_EVERY actions, with the same result; the plain engine runs outside it."""

from __future__ import annotations

import importlib
from pathlib import Path

from simulator import load_scenario, simulate

progress_module = importlib.import_module("simulator.engine_progress")
ROOT = Path(__file__).resolve().parents[1]


def test_engines_report_their_actions_inside_the_block_and_play_the_same(monkeypatch):
    scenario = load_scenario(ROOT / "scenarios" / "gpt2_1.5b_dgx_a100_3d.yaml")
    monkeypatch.setattr(progress_module, "PROGRESS_EVERY", 100)
    calls = []
    with progress_module.reporting_progress(lambda done, total: calls.append((done, total))):
        reported = simulate(scenario)
    assert calls and all(done % 100 == 0 and 0 < done <= total for done, total in calls)
    assert any(later > earlier for (earlier, _), (later, _) in zip(calls, calls[1:]))  # a run counts up

    def refused(*_args):
        raise AssertionError("the reporting engine ran outside reporting_progress")
    monkeypatch.setattr(progress_module._ReportingEngine, "__init__", refused)
    plain = simulate(scenario)
    assert reported.step_time_s == plain.step_time_s
    assert reported.summary["num_events"] == plain.summary["num_events"]
