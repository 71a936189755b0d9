"""`ghpsim validate`'s input and output: a bare `ghp` resolved as `ghpsim compare` resolves it,
every flag and the --out folder checked before anything runs, --out left as it was by a failed
run, and the deadline's message naming --timeout. No torch process is started: the ranks' launch
(`validator.validate.spawn`) is replaced by a stand-in."""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("torch")

import validator.validate  # noqa: E402
from simulator.errors import ScenarioError  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.profile import FORMAT  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from tests.test_bad_input import ROOT, assert_one_line_error, run_cli  # noqa: E402
from validator.errors import RankFailure  # noqa: E402
from validator.launch import LaunchConfig, _check_alive, _is_stopped, deadline_message  # noqa: E402
from validator.measure import RunOptions  # noqa: E402
from validator.report import staged_folder  # noqa: E402
from validator.validate import predictions  # noqa: E402

SCENARIO = str(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml")  # 4 ranks, strategy dp (num_groups 2)
WS2 = str(ROOT / "reports" / "profiles" / "mlp_cpu_ws2.json")
WS4 = str(ROOT / "reports" / "profiles" / "mlp_cpu_ws4.json")
SGD = RunOptions(optimizer="sgd")
RUN = ["--steps", "1", "--warmup", "0", "--timeout", "60"]


def validate_cli(capsys, *argv, profile=WS2):
    return run_cli(capsys, "validate", SCENARIO, "--profile", profile, *RUN, *argv)


def rank_result(rank: int) -> dict:
    """What `validator.measure.run_rank` returns for one rank, in brief."""
    return {"step_times_s": [0.01], "spans": [(rank, "compute", "fwd", "forward", 0.0, 0.005, 0, 0)]}


@pytest.fixture
def launches(monkeypatch):
    """Stand-in launches: each returns every rank's `rank_result`; `fail_at` (a launch index)
    raises RankFailure instead, as a killed rank does. Records each launch's LaunchConfig."""
    record = types.SimpleNamespace(configs=[], fail_at=None)

    def spawn(function, args, config):
        if len(record.configs) == record.fail_at:
            record.configs.append(config)
            raise RankFailure("rank 1 was killed by signal SIGKILL")
        record.configs.append(config)
        return [rank_result(rank) for rank in range(config.world_size)]

    monkeypatch.setattr(validator.validate, "spawn", spawn)
    return record


def synthetic_profile(tmp_path, scenario, world_size: int) -> str:
    """A CPU profile of `scenario`'s model at `world_size` (the format of simulator/profile.py)."""
    workload = resolve_workload(scenario.model, scenario.base_dir)
    fit = {"latency_s": 1e-4, "bandwidth_bytes_per_s": 1e9}
    sizes = [str(size) for size in range(2, world_size + 1) if world_size % size == 0]
    document = {
        "format": FORMAT, "device": {"kind": "cpu", "name": "test", "num_threads": 1}, "backend": "gloo",
        "world_size": world_size,
        "model": {"name": "mlp", "params": dict(scenario.model.params),
                  "layer_names": [layer.name for layer in workload.layers], "num_params": workload.num_params},
        "layers": [{"name": layer.name, "forward": {"intercept_s": 1e-4, "per_sample_s": 2e-5 * (i + 1)},
                    "backward": {"intercept_s": 2e-4, "per_sample_s": 4e-5 * (i + 1)}}
                   for i, layer in enumerate(workload.layers)],
        "optimizer": {"name": "sgd", "intercept_s": 1e-5, "per_param_s": 1e-9},
        "p2p": fit, "allreduce": {size: fit for size in sizes},
        "compute_slowdown": {size: 1.0 + 0.1 * int(size) for size in ["1", *sizes]},
        "shared_processors": {"parallelism": 2.0, "measured_ranks": world_size},
    }
    path = tmp_path / f"profile_ws{world_size}.json"
    path.write_text(json.dumps(document))
    return str(path)


def listing(folder: Path) -> dict:
    """Every file under `folder` (hidden ones included) with its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


# 1. ghp without G, as compare takes it

def test_a_bare_ghp_takes_the_only_feasible_g_and_a_ghp_scenario_its_own():
    scenario = load_scenario(SCENARIO)  # kind dp: its num_groups is not a ghp G
    bare = predictions(scenario, WS4, [("ghp", None)], SGD)
    assert bare == predictions(scenario, WS4, [("ghp", 2)], SGD) and list(bare) == ["ghp (G=2 x M=2)"]
    own = load_scenario(SCENARIO, ["strategy.kind=ghp"])
    assert predictions(own, WS4, [("ghp", None)], SGD) == bare


def test_a_bare_ghp_takes_the_fastest_feasible_g(tmp_path):
    scenario = load_scenario(SCENARIO, ["cluster.gpus_per_node=8"])  # G = 2 or 4
    profile = synthetic_profile(tmp_path, scenario, 8)
    each = predictions(scenario, profile, [("ghp", 2), ("ghp", 4)], SGD)
    fastest = min(each, key=each.get)
    assert predictions(scenario, profile, [("ghp", None)], SGD) == {fastest: each[fastest]}
    slower = 4 if fastest.startswith("ghp (G=2") else 2
    own = load_scenario(SCENARIO, ["cluster.gpus_per_node=8", "strategy.kind=ghp", f"strategy.num_groups={slower}"])
    assert list(predictions(own, profile, [("ghp", None)], SGD)) == [f"ghp (G={slower} x M={8 // slower})"]


def test_a_bare_ghp_without_a_feasible_g_is_refused_or_left_out_of_the_default_list():
    scenario = load_scenario(SCENARIO)  # validated at the profile's 2 ranks: no 1 < G < 2
    with pytest.raises(ScenarioError, match=r"^--strategies: ghp: no G with 1 < G < 2 fits 2 ranks"):
        predictions(scenario, WS2, [("dp", None), ("ghp", None)], SGD)
    assert list(predictions(scenario, WS2, [("dp", None), ("ghp", None)], SGD, skip_unfit_ghp=True)) == [
        "dp (G=2 x M=1)"]


def test_cli_bare_ghp_runs_and_its_refusal_is_one_line_before_any_run(capsys, tmp_path, launches):
    out = tmp_path / "out"
    code, stdout, err = validate_cli(capsys, "--strategies", "ghp", "--out", out, "--json", profile=WS4)
    assert code == 0, err
    assert [row["strategy"] for row in json.loads(stdout)["rows"]] == ["ghp (G=2 x M=2)"]
    assert [config.world_size for config in launches.configs] == [4]
    launches.configs.clear()
    for overrides in ([], ["--set", "cluster.gpus_per_node=2"]):
        assert_one_line_error(validate_cli(capsys, "--strategies", "ghp", "--out", tmp_path / "no", *overrides),
                              "--strategies: ghp: no G with 1 < G < 2")
    assert not launches.configs and not (tmp_path / "no").exists()


def test_cli_default_list_leaves_out_a_ghp_that_does_not_fit(capsys, tmp_path, launches):
    code, _out, err = validate_cli(capsys, "--out", tmp_path / "out")
    assert code == 0, err
    assert "ghp left out of the default strategies" in err
    rows = (tmp_path / "out" / "mlp_cpu.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["dp (G=2 x M=1)", "mp (G=1 x M=2)"]


@pytest.mark.parametrize("strategies", ["", " , "])
def test_empty_strategies_are_refused(capsys, tmp_path, launches, strategies):
    assert_one_line_error(validate_cli(capsys, "--strategies", strategies, "--out", tmp_path / "out"),
                          "--strategies", "empty")
    assert not launches.configs and not (tmp_path / "out").exists()


# 2. a failed run leaves --out as it was

def test_a_failed_case_leaves_a_new_out_folder_unmade(capsys, tmp_path, launches):
    launches.fail_at = 0  # a rank of dp killed: nothing measured (a measured dp is kept:
    out = tmp_path / "made" / "out"  # tests/test_validate_robustness.py)
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp,mp", "--out", out, "--json"), "rank 1 was killed")
    assert len(launches.configs) == 1 and os.listdir(tmp_path) == []


def test_a_failed_case_leaves_an_existing_out_folder_as_it_was(capsys, tmp_path, launches):
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "mlp_cpu.csv").write_text("older\n")
    (out / "traces" / "keep.json").write_text("{}")
    before = listing(tmp_path)
    launches.fail_at = 0  # nothing measured
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp,mp", "--step-spans", "--out", out, "--json"),
                          "rank 1 was killed")  # --json: no progress lines before the error
    assert listing(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["out"]
    code, _stdout, err = validate_cli(capsys, "--strategies", "dp,mp", "--out", out)  # all cases succeed
    assert code == 0, err
    after = listing(tmp_path)
    assert after["out/traces/keep.json"] == b"{}" and after["out/mlp_cpu.csv"] != b"older\n"
    assert {"out/mlp_cpu.png", "out/traces/dp_G2xM1.measured.trace.json"} <= set(after)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging folder left beside it


def test_a_failed_move_into_out_puts_back_what_it_replaced(tmp_path):
    out = tmp_path / "out"
    (out / "z" / "a.json").mkdir(parents=True)  # a folder where a result file would go: its move fails
    (out / "x.csv").write_text("old")
    before = listing(tmp_path)
    with pytest.raises(OSError) as failed:
        with staged_folder(out) as staging:
            (staging / "x.csv").write_text("new")
            (staging / "y" / "b.json").parent.mkdir()
            (staging / "y" / "b.json").write_text("{}")
            (staging / "z").mkdir()
            (staging / "z" / "a.json").write_text("{}")
    assert failed.value.filename == str(out / "z" / "a.json")  # the user's path, not the staging folder's
    assert listing(tmp_path) == before and sorted(os.listdir(out)) == ["x.csv", "z"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


# 3. --out checked before any run

def test_bad_out_folders_are_refused_before_any_run(capsys, tmp_path, launches):
    afile = tmp_path / "afile"
    afile.write_text("")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out, needle in ((afile / "sub", f"--out {afile / 'sub'}: {afile} is not a directory"),
                        (afile, f"--out {afile}: exists and is not a directory"),
                        (fifo, f"--out {fifo}: exists and is not a directory"),
                        ("", "--out: needs a folder name (got '')"),
                        (tmp_path / "dangling", f"--out {tmp_path / 'dangling'}: a symbolic link to nothing")):
        assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", out), needle)
        assert_one_line_error(validate_cli(capsys, "--rank", "--out", out), needle)
    out = tmp_path / "out"
    for name in ("mlp_cpu.csv", "mlp_cpu_rank.csv", "traces"):  # a folder where a result file goes, or a file
        (out / name).mkdir(parents=True) if name != "traces" else (out / name).write_text("")
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", out),
                          f"--out {out / 'mlp_cpu.csv'}: is a directory")
    (out / "mlp_cpu.csv").rmdir()
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", out),
                          f"--out {out / 'traces'}: exists and is not a directory")
    assert_one_line_error(validate_cli(capsys, "--rank", "--out", out),
                          f"--out {out / 'mlp_cpu_rank.csv'}: is a directory")
    assert not launches.configs


def test_an_out_folder_that_cannot_be_written_is_refused_before_any_run(capsys, tmp_path, launches, monkeypatch):
    import validator.report

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(validator.report.os, "access",  # as if `locked` were read-only (root writes anyway)
                        lambda path, mode: Path(path) != locked and real_access(path, mode))
    for out in (locked, locked / "new" / "out"):
        assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", out),
                              f"--out {out}: {locked} is not writable")
    assert not launches.configs and os.listdir(locked) == []


# 4. flags of the other mode

@pytest.mark.parametrize("argv, needle", [
    (["--gpus", "4"], "--gpus 4: only with --rank"),
    (["--top", "0"], "--top 0: only with --rank"),
    (["--others", "5"], "--others 5: only with --rank"),
    (["--rank", "--top", "1", "--others", "0", "--strategies", "foo"], "--strategies 'foo': not with --rank"),
    (["--rank", "--strategies", "dp"], "--strategies 'dp': not with --rank"),
    (["--rank", "--pipeline-runtime", "torch"], "--pipeline-runtime torch: not with --rank"),
])
def test_flags_of_the_other_mode_are_refused_before_any_run(capsys, tmp_path, launches, argv, needle):
    assert_one_line_error(validate_cli(capsys, *argv, "--out", tmp_path / "out"), needle)
    assert not launches.configs and not (tmp_path / "out").exists()


# 5. the deadline names --timeout

def test_the_deadline_message_gives_the_timeout():
    assert deadline_message([0, 1], 60.0, "--timeout") == (
        "ranks [0, 1] did not finish before the deadline (--timeout 60 s; hung or too slow)")
    assert deadline_message([2], 0.5) == "ranks [2] did not finish before the deadline (0.5 s; hung or too slow)"
    running = [types.SimpleNamespace(is_alive=lambda: True, exitcode=None)] * 2
    config = LaunchConfig(world_size=2, timeout_s=60.0, timeout_option="--timeout")
    with pytest.raises(RankFailure) as failure:
        _check_alive(running, {}, deadline=0.0, config=config)
    assert str(failure.value) == deadline_message([0, 1], 60.0, "--timeout")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
def test_the_deadline_message_names_a_stopped_rank():
    import signal
    import subprocess
    import sys
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _is_stopped(frozen.pid) and time.monotonic() < deadline:  # the stop lands asynchronously
            time.sleep(0.01)
        ranks = [types.SimpleNamespace(is_alive=lambda: True, exitcode=None, pid=os.getpid()),
                 types.SimpleNamespace(is_alive=lambda: True, exitcode=None, pid=frozen.pid)]
        with pytest.raises(RankFailure) as failure:
            _check_alive(ranks, {}, deadline=0.0, config=LaunchConfig(world_size=2, timeout_s=5.0))
    finally:
        frozen.kill()
        frozen.wait()
    assert str(failure.value) == deadline_message([0, 1], 5.0) + f"; rank 1 is stopped, pid {frozen.pid}"


def test_validate_launches_with_the_timeout_flag_named(capsys, tmp_path, launches):
    code, _out, err = validate_cli(capsys, "--strategies", "dp", "--out", tmp_path / "out")
    assert code == 0, err
    (config,) = launches.configs
    assert (config.timeout_s, config.timeout_option) == (60.0, "--timeout")



# 6. --json is strict JSON

def _strict(text: str):
    """json.loads refusing NaN and Infinity, which strict JSON parsers (jq, JavaScript) reject."""
    def refuse(constant):
        raise ValueError(f"non-finite {constant} in the JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_ready_writes_null_for_a_figure_not_measured():
    from validator.report import json_ready
    document = {"rows": [{"launch_noise_pct": float("nan"), "x": (1.0, float("inf"))}], "tau": -float("inf")}
    assert json_ready(document) == {"rows": [{"launch_noise_pct": None, "x": [1.0, None]}], "tau": None}
    assert _strict(json.dumps(json_ready(document), allow_nan=False))["rows"][0]["launch_noise_pct"] is None


def test_validate_json_with_one_launch_is_strict_json(capsys, tmp_path, launches):
    out = tmp_path / "out"
    code, stdout, err = validate_cli(capsys, "--strategies", "dp,mp", "--out", out, "--json")
    assert code == 0, err
    rows = _strict(stdout)["rows"]  # --repeats 1: the launch noise is undefined
    assert [row["launches"] for row in rows] == [1, 1]
    assert [row["launch_noise_pct"] for row in rows] == [None, None]
    table = (out / "mlp_cpu.csv").read_text().splitlines()
    column = table[0].split(",").index("launch_noise_pct")
    assert [line.split(",")[column] for line in table[1:]] == ["", ""]  # empty in the CSV, as before
    column = table[0].split(",").index("partition")  # the layers per stage each run played
    assert [line.split(",")[column] for line in table[1:]] == [row["partition"] for row in rows]
    assert [len(row["partition"].split()) for row in rows] == [1, 2]
    assert sum(int(count) for count in rows[1]["partition"].split()) == int(rows[0]["partition"])


def test_megatron_on_another_kinds_scenario_says_what_validate_runs(capsys, launches):
    """validate's megatron runs tp = pp = 1, so a dp scenario's tp_degree cannot make one: the line
    gives the remedy that works, before any rank starts."""
    line = assert_one_line_error(validate_cli(capsys, "--strategies", "dp,megatron", "--set", "strategy.tp_degree=2"),
                                 "--strategies megatron", "is kind dp", "--set strategy.kind=megatron")
    assert "tp_degree=T" not in line and launches.configs == []


def test_two_items_of_one_plan_are_refused_before_any_rank_starts(capsys, launches):
    """As compare (`simulator.compare.resolve_specs`): 1f1b and 1f1b:4 on a scenario of 4 micro-batches
    are one plan, which would have run twice."""
    assert_one_line_error(validate_cli(capsys, "--strategies", "1f1b,1f1b:4", "--set", "strategy.num_microbatches=4"),
                          "1f1b and 1f1b:4 resolve to the same plan")
    assert launches.configs == []
