"""Bad input to `ghpsim validate` and `ghpsim calibrate` refused in one line (exit code 2) before
any torch process starts: an --out where no folder can be made, a folder given to calibrate's
--out, `--fsdp` without two ranks, a strategy given twice, a --rank of fewer than 2 candidates, ranks that would not fit in
this host's memory; and a rank killed by SIGKILL named as a likely out-of-memory. The launchers
are replaced by stand-ins that fail the test if called."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

import validator.calibrate  # noqa: E402
import validator.rank_check  # noqa: E402
import validator.validate  # noqa: E402
from tests.test_bad_input import assert_one_line_error, run_cli  # noqa: E402
from tests.test_validate_cli_input import SCENARIO, WS4, validate_cli  # noqa: E402
from validator.launch import _death  # noqa: E402
from validator.report import check_writable_folder  # noqa: E402


def _never(*_args, **_kwargs):
    raise AssertionError("a launcher ran: the bad input should have been refused before it")


@pytest.fixture
def no_launch(monkeypatch):
    """Every launch of ranks (validate's, calibrate's) fails the test."""
    for module, name in ((validator.validate, "spawn"), (validator.calibrate, "spawn"),
                         (validator.calibrate, "calibrate_kernels")):
        monkeypatch.setattr(module, name, _never)


# 1. --out where no folder can be made

@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (takes no new folder)")
def test_an_out_where_no_folder_can_be_made_is_refused_before_any_run(capsys, no_launch):
    for out in ("/proc/ghpsim_no_such", "/proc/ghpsim_no_such/deeper"):
        assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", out),
                              f"--out {out}: cannot make a folder in /proc")
        assert_one_line_error(validate_cli(capsys, "--rank", "--out", out), f"--out {out}: cannot make a folder")
    assert not Path("/proc/ghpsim_no_such").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (takes no new folder)")
@pytest.mark.parametrize("kernels", [False, True])
def test_calibrate_refuses_an_out_where_nothing_can_be_made_before_any_run(capsys, no_launch, kernels):
    """Refused at once (the microbenchmarks, 45-75 s, would have run first), naming --out."""
    flags = ["--kernels", "--device", "cpu"] if kernels else ["--scenario", SCENARIO]
    out = "/proc/ghpsim_no_such/profile.json"
    started = time.monotonic()
    assert_one_line_error(run_cli(capsys, "calibrate", *flags, "--out", out),
                          f"--out {out}: cannot make a folder in /proc")
    assert time.monotonic() - started < 30  # well below the microbenchmarks, with room for a loaded host


@pytest.mark.parametrize("flags, needle", [
    (["--kernels", "--device", "cpu"], "--fsdp: not used with --kernels"),
    (["--scenario", SCENARIO, "--world-size", "1"], "world_size: 1; timing FSDP (--fsdp) needs at least 2 ranks"),
])
def test_calibrate_fsdp_without_two_ranks_is_refused_before_any_run(capsys, tmp_path, no_launch, flags, needle):
    assert_one_line_error(run_cli(capsys, "calibrate", *flags, "--fsdp", "--out", str(tmp_path / "p.json")), needle)
    assert not (tmp_path / "p.json").exists()


def test_the_writable_check_leaves_nothing_behind(tmp_path):
    check_writable_folder(tmp_path / "new" / "out", "--out")
    (tmp_path / "old").mkdir()
    check_writable_folder(tmp_path / "old", "--out")
    assert os.listdir(tmp_path) == ["old"] and os.listdir(tmp_path / "old") == []


# 2. calibrate writes one file: not into a folder

@pytest.mark.parametrize("kernels", [False, True])
def test_calibrate_refuses_a_folder_for_out_before_any_run(capsys, tmp_path, no_launch, kernels):
    flags = (["--kernels", "--device", "cpu"] if kernels else
             ["--scenario", SCENARIO, "--world-size", "2", "--repeats", "1", "--layer-passes", "1",
              "--batch-sizes", "4,8"])
    trailing = f"{tmp_path / 'adir_nonexist'}{os.sep}"
    assert_one_line_error(run_cli(capsys, "calibrate", *flags, "--out", trailing),
                          f"--out {trailing}: ends with a path separator")
    (tmp_path / "adir").mkdir()
    assert_one_line_error(run_cli(capsys, "calibrate", *flags, "--out", tmp_path / "adir"),
                          f"--out {tmp_path / 'adir'}: is a directory")
    assert os.listdir(tmp_path) == ["adir"] and os.listdir(tmp_path / "adir") == []


# 3. a strategy given twice

@pytest.mark.parametrize("strategies, needle", [
    ("dp,dp", "--strategies 'dp,dp': dp is given twice"),
    ("dp, mp ,dp", "--strategies 'dp, mp ,dp': dp is given twice"),
    ("mp,dp,mp", "mp is given twice"),
])
def test_a_strategy_given_twice_is_refused_before_any_run(capsys, tmp_path, no_launch, strategies, needle):
    assert_one_line_error(validate_cli(capsys, "--strategies", strategies, "--out", tmp_path / "out"), needle)
    assert os.listdir(tmp_path) == []


def test_two_strategies_of_the_same_plan_are_refused_before_any_run(capsys, tmp_path, no_launch):
    assert_one_line_error(validate_cli(capsys, "--strategies", "ghp,ghp:2", "--out", tmp_path / "out", profile=WS4),
                          "--strategies: two of them run the same plan ghp (G=2 x M=2)")
    assert os.listdir(tmp_path) == []


# 4. --rank of fewer than 2 candidates

@pytest.mark.parametrize("argv, needle", [
    (["--top", "1", "--others", "0"], "--rank needs at least 2 candidates: --top 1 + --others 0"),
])
def test_a_rank_of_one_candidate_is_refused_before_any_run(capsys, tmp_path, no_launch, monkeypatch, argv, needle):
    monkeypatch.setattr(validator.rank_check, "rank_candidates", _never)
    assert_one_line_error(validate_cli(capsys, "--rank", *argv, "--out", tmp_path / "out"), needle)
    assert os.listdir(tmp_path) == []


def test_a_rank_that_ran_one_case_says_it_cannot_be_ranked(capsys, tmp_path, monkeypatch):
    row = {"strategy": "mp", "predicted_rank": 1, "measured_rank": 1, "predicted_s": 0.03, "measured_s": 0.03}
    report = {**validator.rank_check.summarize([row]), "num_candidates": 11, "num_distinct": 6, "min_gap_pct": 2.0}
    monkeypatch.setattr(validator.rank_check, "rank_check", lambda *args, **kwargs: report)
    code, out, err = validate_cli(capsys, "--rank", "--top", "2", "--out", tmp_path / "out")
    assert code == 0, err
    assert "one run cannot be ranked" in out and "nan" not in out


# 5. ranks that would not fit in this host's memory

def test_ranks_that_would_not_fit_in_memory_are_refused_before_any_run(capsys, tmp_path, no_launch, monkeypatch):
    monkeypatch.setattr(validator.validate, "available_memory_bytes", lambda: 2.0**30)
    line = assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--set",
                                              "training.global_batch_size=1000000", "--out", tmp_path / "out"),
                                 "training.global_batch_size 1000000:", "GiB", "1.0 GiB available")
    assert "dp (G=2 x M=1)" in line
    assert os.listdir(tmp_path) == []


def test_a_batch_that_fits_is_not_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(validator.validate, "available_memory_bytes", lambda: 2.0**30)
    monkeypatch.setattr(validator.validate, "spawn", lambda function, args, config: [
        {"step_times_s": [0.01], "spans": [(rank, "compute", "fwd", "forward", 0.0, 0.005, 0, 0)]}
        for rank in range(config.world_size)])
    code, _out, err = validate_cli(capsys, "--strategies", "dp", "--out", tmp_path / "out")
    assert code == 0, err


def test_a_rank_killed_by_sigkill_is_named_a_likely_out_of_memory():
    assert _death(1, -9) == "rank 1 was killed by signal SIGKILL (out of memory?)"
    assert _death(0, -15) == "rank 0 was killed by signal SIGTERM"


# 3. names and counts that would write outside --out or run for days

@pytest.mark.parametrize("name", ["../escaped", "/tmp/elsewhere/x", "a/b", ".."])
def test_a_scenario_name_that_is_no_file_name_is_refused_before_any_run(capsys, tmp_path, no_launch, name):
    out = tmp_path / "out"
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", str(out), "--set", f"name={name}"),
                          "name: ", "must be a file name")
    assert list(tmp_path.iterdir()) == []


def test_repeats_beyond_the_limit_are_refused_before_any_run(capsys, tmp_path, no_launch):
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", str(tmp_path / "o"), "--repeats", "100000"),
                          "--repeats: 100000 must be from 1 to 100")
    assert_one_line_error(run_cli(capsys, "calibrate", "--scenario", SCENARIO, "--repeats", "5000",
                                  "--out", str(tmp_path / "p.json")), "--repeats: 5000 must be at most 100")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("timeout, shown", [("1e400", "inf"), ("inf", "inf"), ("nan", "nan"), ("0", "0.0")])
def test_a_timeout_that_is_not_a_finite_positive_number_is_refused_before_any_run(capsys, tmp_path, no_launch,
                                                                                  timeout, shown):
    """1e400 reads as infinity: the message says the number must be finite, not merely positive."""
    for which in (("--strategies", "dp"), ("--rank",)):
        assert_one_line_error(validate_cli(capsys, *which, "--out", str(tmp_path / "o"), "--timeout", timeout),
                              f"--timeout: {shown} must be a finite positive number of seconds")
    assert list(tmp_path.iterdir()) == []


def test_a_plan_refused_at_the_profiles_world_size_says_that_size(capsys, tmp_path, no_launch):
    line = assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", str(tmp_path / "o"), "--set",
                                              "cluster.gpus_per_node=2", "--set", "training.global_batch_size=6",
                                              profile=WS4), "training.global_batch_size: 6 is not divisible")
    assert line.endswith("(at the profile's world size 4; the scenario has 2 ranks)")
