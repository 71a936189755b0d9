"""The schedule IR: golden grids, unit-time closed forms, per-stage figures, the checker, the CLI."""

from __future__ import annotations

import json

import pytest

from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.schedules import Op, Schedule, ScheduleError, build_schedule, check_schedule, unit_time_run
from simulator.schedules.analysis import stage_metrics
from simulator.schedules.grid import render_grid

GOLDEN_CASES = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved_1f1b", 4, 8, 2), ("pipedream", 4, 8, 1),
                ("spectrain", 4, 8, 1), ("delayed_gradient", 4, 8, 1), ("1f1b", 3, 2, 1),
                ("interleaved_1f1b", 2, 4, 3)]


def _golden_name(kind, p, m, v):
    return f"schedules/{kind}_p{p}_m{m}" + (f"_v{v}" if v > 1 else "") + ".txt"


@pytest.mark.parametrize("kind,p,m,v", GOLDEN_CASES)
def test_grid_matches_golden(golden, kind, p, m, v):
    golden(_golden_name(kind, p, m, v), render_grid(build_schedule(kind, p, m, v)))


def test_1f1b_grid_by_hand():
    # Warm-up p - 1 - k forwards on stage k, then one forward one backward, then the cool-down.
    expected = ("1f1b: p=2 stages, m=3 micro-batches; one slot per F or B; 8 slots\n"
                "rank 0 | F0 F1 .  B0 F2 B1 .  B2\n"
                "rank 1 | .  F0 B0 F1 B1 F2 B2 .\n")
    assert render_grid(build_schedule("1f1b", 2, 3)) == expected


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "pipedream", "spectrain", "delayed_gradient"])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (3, 5), (4, 8), (4, 2), (5, 16)])
@pytest.mark.parametrize("tf,tb", [(1.0, 1.0), (1.0, 2.0)])
def test_flushed_makespan_is_m_plus_p_minus_1_times_tf_plus_tb(kind, p, m, tf, tb):
    assert unit_time_run(build_schedule(kind, p, m), tf, tb).makespan == (m + p - 1) * (tf + tb)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 2), (2, 6, 3), (4, 12, 3), (3, 9, 2), (8, 16, 4)])
@pytest.mark.parametrize("tf,tb", [(1.0, 1.0), (1.0, 2.0)])
def test_interleaving_cuts_the_bubble_to_p_minus_1_over_v_m(p, m, v, tf, tb):
    # A chunk pass takes 1/v of a stage pass; ideal = m (tf + tb) in stage units.
    makespan = unit_time_run(build_schedule("interleaved_1f1b", p, m, v), tf / v, tb / v).makespan
    ideal = m * (tf + tb)
    assert (makespan - ideal) / ideal == pytest.approx((p - 1) / (v * m), rel=1e-12)


def test_per_stage_figures():
    p, m = 4, 8
    gpipe = stage_metrics(build_schedule("gpipe", p, m), False)
    assert gpipe["microbatches_in_flight"] == [m] * p and gpipe["weight_staleness"] == [0] * p
    one_f_one_b = stage_metrics(build_schedule("1f1b", p, m), False)
    assert one_f_one_b["microbatches_in_flight"] == [p - k for k in range(p)]
    assert one_f_one_b["weight_staleness"] == [0] * p
    stash = stage_metrics(build_schedule("pipedream", p, m), True)
    assert stash["weight_staleness"] == [p - 1 - k for k in range(p)]
    assert stash["stashed_weight_versions"] == [p - 1 - k for k in range(p)]
    assert stash["extra_weight_copies"] == [0] * p
    spectrain = stage_metrics(build_schedule("spectrain", p, m), False)
    assert spectrain["stashed_weight_versions"] == [0] * p and spectrain["extra_weight_copies"] == [1] * p
    assert spectrain["weight_staleness"] == [p - 1 - k for k in range(p)]
    # Megatron's interleaved warm-up holds 2 (p - 1 - k) + (v - 1) p + 1 chunk micro-batches.
    interleaved = stage_metrics(build_schedule("interleaved_1f1b", p, m, 2), False)
    assert interleaved["microbatches_in_flight"] == [2 * (p - 1 - k) + p + 1 for k in range(p)]


def test_asynchronous_kinds_update_after_every_backward_and_spectrain_predicts():
    for kind in ("pipedream", "spectrain", "delayed_gradient"):
        for ops in build_schedule(kind, 3, 5).ranks:
            phases = [op.phase for op in ops]
            assert phases.count("U") == 5
            assert all(phases[i + 1] == "U" for i, phase in enumerate(phases) if phase == "B")
    staggered = build_schedule("spectrain", 3, 5, staggered_prediction=True).ranks[0]
    forward_only = build_schedule("spectrain", 3, 5, staggered_prediction=False).ranks[0]
    assert [op.phase for op in staggered].count("P") == 10
    assert [op.phase for op in forward_only].count("P") == 5
    assert all(forward_only[i + 1].phase == "F" for i, op in enumerate(forward_only) if op.phase == "P")
    for kind in ("gpipe", "1f1b", "interleaved_1f1b"):
        for ops in build_schedule(kind, 2, 4).ranks:
            assert [op.phase for op in ops].count("U") == 1 and ops[-1] == Op("U", ops[-1].chunk, -1)


def _schedule(ranks, p=2, m=2):
    return Schedule("test", p, m, 1, tuple(tuple(Op(*op) for op in ops) for ops in ranks))


def test_checker_reports_a_deadlock_and_the_stuck_ranks():
    # Rank 0 wants B0 before sending F1; rank 1 waits for F1 before B0.
    broken = _schedule([[("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)],
                        [("F", 1, 0), ("F", 1, 1), ("B", 1, 0), ("B", 1, 1)]])
    with pytest.raises(ScheduleError, match="deadlocks: rank 0 at B0 .* rank 1 at F1") as error:
        check_schedule(broken)
    assert error.value.stuck_ranks == (0, 1)


def test_checker_rejects_backward_before_forward_missing_ops_and_wrong_ranks():
    with pytest.raises(ScheduleError, match="rank 1: B0 .* before its forward"):
        check_schedule(_schedule([[("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("B", 0, 1)],
                                  [("B", 1, 0), ("F", 1, 0), ("F", 1, 1), ("B", 1, 1)]]))
    with pytest.raises(ScheduleError, match="rank 0: missing B1"):
        check_schedule(_schedule([[("F", 0, 0), ("F", 0, 1), ("B", 0, 0)],
                                  [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1)]]))
    with pytest.raises(ScheduleError, match="rank 0: F0 .* belongs to rank 1"):
        check_schedule(_schedule([[("F", 1, 0)], []]))


def test_every_builder_passes_the_checker():
    # check_schedule raises ScheduleError on a bad schedule and returns its unit-time run (F = B = 1
    # slot): every schedule must run to the end in the closed-form makespan, (m + p - 1) x 2 slots
    # for the flushed and asynchronous kinds, 2 v m + 2 (p - 1) chunk slots when interleaved
    # (the bubble (p - 1) / (v m) of the ideal 2 v m).
    for kind in ("gpipe", "1f1b", "pipedream", "spectrain", "delayed_gradient"):
        for p in range(1, 6):
            for m in range(1, 9):
                timeline = check_schedule(build_schedule(kind, p, m))
                assert timeline.makespan == 2 * (m + p - 1), (kind, p, m)
    for p in range(2, 6):
        for v in range(1, 4):
            for m in (p, 2 * p, 3 * p):
                timeline = check_schedule(build_schedule("interleaved_1f1b", p, m, v))
                assert timeline.makespan == 2 * v * m + 2 * (p - 1), (p, m, v)


def test_which_schedules_interleave_forwards_and_backwards():
    """What decides the message figures a shared host pays (`Engine._messages_as_in_cycle`): a rank
    that runs a forward after a backward. GPipe never does; 1F1B does once m >= 2 (the last stage
    alternates from its first micro-batch); with one micro-batch it is a chain one way then back."""
    for p in (1, 2, 4):
        for m in (1, 4, 8):
            assert not build_schedule("gpipe", p, m).interleaves_passes
    for kind in ("1f1b", "pipedream", "spectrain", "delayed_gradient"):
        assert build_schedule(kind, 2, 4).interleaves_passes
        assert not build_schedule(kind, 2, 1).interleaves_passes
    assert build_schedule("interleaved_1f1b", 2, 4, 2).interleaves_passes
    assert _schedule([[("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("B", 0, 1)]], p=1).interleaves_passes is False
    assert _schedule([[("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]], p=1).interleaves_passes is True


def test_impossible_settings_are_scenario_errors():
    with pytest.raises(ScenarioError, match="strategy.num_microbatches: 6 is not a multiple of the 4 stages"):
        build_schedule("interleaved_1f1b", 4, 6, 2)
    with pytest.raises(ScenarioError, match="strategy.num_virtual_stages: 2 is only used by interleaved_1f1b"):
        build_schedule("1f1b", 4, 8, 2)


def test_cli_prints_the_grid_and_json(capsys, golden):
    assert main(["schedule", "1f1b", "--stages", "4", "--microbatches", "8"]) == 0
    golden(_golden_name("1f1b", 4, 8, 1), capsys.readouterr().out)
    assert main(["schedule", "interleaved_1f1b", "--stages", "4", "--microbatches", "8", "--virtual-stages", "2",
                 "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["num_slots"] == 38 and len(document["grid"]) == 4
    assert document["grid"][0][:2] == ["F0.0", "F1.0"]
    assert document["stages"]["chunk_passes_in_flight"] == [11, 9, 7, 5]  # (chunk, micro-batch) pairs
    assert document["stages"]["microbatches_in_flight"] == [8, 8, 7, 5]  # of only 8 micro-batches


def test_cli_bad_options_exit_2(capsys):
    assert main(["schedule", "interleaved_1f1b", "--stages", "4", "--microbatches", "6"]) == 2
    assert "not a multiple of the 4 stages" in capsys.readouterr().err
    assert main(["schedule", "gpipe", "--stages", "0", "--microbatches", "3"]) == 2
    assert capsys.readouterr().err.strip() == "ghpsim: error: --stages: 0 must be at least 1"
