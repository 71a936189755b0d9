"""`ghpsim validate` and `ghpsim calibrate` when something goes wrong, and the names of what
validate writes: a later strategy's failed rank, or an interrupt, keeps the strategies measured
before it (a complete result, named in the one error line); a staging folder left by a killed run
removed by the next; a layer table without torch specs refused before
any rank starts; the written paths in --json; trace names without ':' (Windows refuses it).
No torch process is started: the ranks' launches are replaced by stand-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import yaml

pytest.importorskip("torch")

import validator.calibrate  # noqa: E402
import validator.validate  # noqa: E402
import validator.validate_output  # noqa: E402
from simulator.errors import MAX_MESSAGE_CHARS, ScenarioError  # noqa: E402
from simulator.model_source import resolve_workload  # noqa: E402
from simulator.records import span_table  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from tests.test_bad_input import ROOT, assert_one_line_error, run_cli  # noqa: E402
from validator.errors import RankFailure  # noqa: E402
from validator.import_model import import_model  # noqa: E402
from validator.models import build_layer_module, check_torch_specs  # noqa: E402
from validator.report import trace_stem  # noqa: E402
from validator.validate_output import Kept, kept_after_failure  # noqa: E402

SCENARIO = str(ROOT / "scenarios" / "validation" / "mlp_cpu.yaml")
WS2 = str(ROOT / "reports" / "profiles" / "mlp_cpu_ws2.json")
RUN = ["--steps", "1", "--warmup", "0", "--timeout", "60"]
KILLED = "rank 1 was killed by signal SIGKILL"


def validate_cli(capsys, *argv, scenario=SCENARIO):
    return run_cli(capsys, "validate", scenario, "--profile", WS2, *RUN, *argv)


@pytest.fixture
def launches(monkeypatch):
    """Stand-in launches: each returns every rank's result in brief; the launch whose index is
    `fail_at` raises RankFailure instead, as a killed rank does. Records each launch's world size."""
    record = types.SimpleNamespace(sizes=[], fail_at=None)

    def spawn(function, args, config):
        record.sizes.append(config.world_size)
        if len(record.sizes) - 1 == record.fail_at:
            raise RankFailure(KILLED)
        return [{"step_times_s": [0.01], "spans": [(rank, "compute", "fwd", "forward", 0.0, 0.005, 0, 0)]}
                for rank in range(config.world_size)]

    monkeypatch.setattr(validator.validate, "spawn", spawn)
    return record


def files_under(folder) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


# 1. a later strategy's failure keeps the strategies measured before it

def test_a_failed_later_strategy_keeps_the_finished_one(capsys, tmp_path, launches):
    launches.fail_at = 1  # dp measured, then a rank of mp killed
    out = tmp_path / "out"
    code, stdout, err = validate_cli(capsys, "--strategies", "dp,mp", "--step-spans", "--out", out, "--json")
    line = assert_one_line_error((code, stdout, err), KILLED)
    assert line.endswith(f"; the 1 finished strategy [dp (G=2 x M=1)] is in {out / 'mlp_cpu.csv'}")
    assert stdout == "" and launches.sizes == [2, 2]
    assert files_under(tmp_path) == ["out/mlp_cpu.csv", "out/mlp_cpu.png", "out/traces/dp_G2xM1.measured.trace.json",
                                     "out/traces/dp_G2xM1.simulated.trace.json", "out/traces/dp_G2xM1.steps.csv"]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging folder left
    table = (out / "mlp_cpu.csv").read_text().splitlines()
    assert len(table) == 2 and table[1].startswith("dp (G=2 x M=1),dp,")
    events = json.loads((out / "traces" / "dp_G2xM1.measured.trace.json").read_text())
    assert events  # a complete trace, not a stub


def test_a_failure_in_a_later_round_keeps_every_strategy_with_its_launches(capsys, tmp_path, launches):
    launches.fail_at = 3  # --repeats 2: dp, mp, dp, then mp's second launch fails
    out = tmp_path / "out"
    line = assert_one_line_error(validate_cli(capsys, "--strategies", "dp,mp", "--repeats", "2", "--out", out,
                                              "--json"), KILLED, "the 2 strategies [dp (G=2 x M=1), mp (G=1 x M=2)]",
                                 f"are in {out / 'mlp_cpu.csv'} (some in fewer than the --repeats 2 rounds")
    assert "finished" not in line
    table = (out / "mlp_cpu.csv").read_text().splitlines()
    launches_column = table[0].split(",").index("launches")
    assert [row.split(",")[launches_column] for row in table[1:]] == ["2", "1"]


def test_a_failure_before_any_strategy_finished_writes_nothing(capsys, tmp_path, launches):
    launches.fail_at = 0
    line = assert_one_line_error(validate_cli(capsys, "--strategies", "dp,mp", "--out", tmp_path / "out", "--json"),
                                 KILLED)
    assert line == f"ghpsim: error: {KILLED}" and os.listdir(tmp_path) == []


def test_kept_results_that_cannot_be_written_leave_out_as_it_was(capsys, tmp_path, launches, monkeypatch):
    def full_disk(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(validator.validate_output, "write_plot", full_disk)
    launches.fail_at = 1
    out = tmp_path / "out"
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp,mp", "--out", out, "--json"), KILLED,
                          f"could not be written to {out}: No space left on device")
    assert os.listdir(tmp_path) == []  # the CSV written before the plot failed is not left behind


def test_an_interrupt_keeps_the_finished_strategies_as_a_failed_rank_does(capsys, tmp_path, launches, monkeypatch):
    stand_in = validator.validate.spawn

    def spawn(function, args, config):
        if launches.sizes:  # dp measured, then Ctrl-C while mp runs
            raise KeyboardInterrupt
        return stand_in(function, args, config)

    monkeypatch.setattr(validator.validate, "spawn", spawn)
    out = tmp_path / "out"
    code, stdout, err = validate_cli(capsys, "--strategies", "dp,mp", "--out", out, "--json")
    assert (code, stdout) == (130, "") and "Traceback" not in err
    assert err == f"ghpsim: interrupted; the 1 finished strategy [dp (G=2 x M=1)] is in {out / 'mlp_cpu.csv'}\n"
    assert files_under(tmp_path) == ["out/mlp_cpu.csv", "out/mlp_cpu.png", "out/traces/dp_G2xM1.measured.trace.json",
                                     "out/traces/dp_G2xM1.simulated.trace.json"]
    launches.sizes.clear()
    monkeypatch.setattr(validator.validate, "spawn", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    assert validate_cli(capsys, "--strategies", "dp", "--out", tmp_path / "new", "--json") == (
        130, "", "ghpsim: interrupted\n")
    assert not (tmp_path / "new").exists()  # nothing measured: nothing written


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stop_while_the_results_are_written_waits_for_them_and_keeps_them(capsys, tmp_path, launches, monkeypatch,
                                                                           signal_name, fresh_stop_handlers):
    import signal

    from ghpsim.cli import main
    plot = validator.validate_output.write_plot

    def stopped_mid_write(*args, **kwargs):  # Ctrl-C (or timeout's SIGTERM) after every strategy ran
        os.kill(os.getpid(), getattr(signal, signal_name))
        return plot(*args, **kwargs)

    monkeypatch.setattr(validator.validate_output, "write_plot", stopped_mid_write)
    out = tmp_path / "out"
    code = main(["validate", SCENARIO, "--profile", WS2, *RUN, "--strategies", "dp,mp", "--out", str(out), "--json"])
    stdout, err = capsys.readouterr()
    assert code == 128 + getattr(signal, signal_name) and stdout == "" and "Traceback" not in err
    assert err == (f"ghpsim: interrupted; the 2 finished strategies [dp (G=2 x M=1), mp (G=1 x M=2)] are in "
                   f"{out / 'mlp_cpu.csv'}\n")
    assert "out/mlp_cpu.png" in files_under(tmp_path) and len(open(out / "mlp_cpu.csv").readlines()) == 3


def test_a_second_validation_into_the_same_out_replaces_the_first_ones_traces(capsys, tmp_path, launches):
    out = tmp_path / "out"
    assert validate_cli(capsys, "--strategies", "dp,mp", "--out", out, "--json")[0] == 0
    (out / "traces" / "notes.txt").write_text("mine")
    assert validate_cli(capsys, "--strategies", "dp", "--out", out, "--json")[0] == 0
    assert files_under(tmp_path) == ["out/mlp_cpu.csv", "out/mlp_cpu.png", "out/traces/dp_G2xM1.measured.trace.json",
                                     "out/traces/dp_G2xM1.simulated.trace.json", "out/traces/notes.txt"]


def test_a_staging_folder_left_by_a_killed_run_is_removed_by_the_next(capsys, tmp_path, launches):
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()  # its pid is free: a run killed with SIGKILL while writing
    (tmp_path / "out").mkdir()
    stale = [tmp_path / f".out.{child.pid}.0123abcd.tmp", tmp_path / "out" / f".out.{child.pid}.4567abcd.tmp"]
    kept = [tmp_path / f".out.{os.getppid()}.89abcdef.tmp",  # a live process's (another run writing now)
            tmp_path / f".other.{child.pid}.0123abcd.tmp"]  # another --out's
    for folder in stale + kept:
        (folder / "traces").mkdir(parents=True)
        (folder / "mlp_cpu.csv").write_text("partial")
    code, _stdout, err = validate_cli(capsys, "--strategies", "dp", "--out", tmp_path / "out")
    assert code == 0, err
    assert not any(folder.exists() for folder in stale) and all(folder.is_dir() for folder in kept)
    assert sorted(os.listdir(tmp_path / "out")) == ["mlp_cpu.csv", "mlp_cpu.png", "traces"]


def test_the_kept_file_is_named_in_full_after_a_long_failure(tmp_path):
    kept = Kept()
    kept.case({"strategy": "dp (G=2 x M=1)", "error_pct": 5.0, "launches": 1, "predicted_s": 1.0,
               "measured_s": 1.0, "launch_median_min_s": 1.0, "launch_median_max_s": 1.0}, [],
              types.SimpleNamespace(spans=span_table([])))
    out = tmp_path / ("deep" * 20) / "out"
    error = kept_after_failure(RankFailure("rank 1 failed: ValueError: " + "x" * 280), kept, out, "mlp_cpu")
    assert len(str(error)) <= MAX_MESSAGE_CHARS and str(error).endswith(f"is in {out / 'mlp_cpu.csv'}")
    assert (out / "mlp_cpu.csv").is_file()


# 2. a layer table without torch specs is refused before any rank starts

def layer_table_scenario(tmp_path):
    """A 2-rank scenario on `ghpsim import-model`'s table of tests.byo_models:tiny_mlp, models/mlp.yaml."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mlp.yaml").write_text(yaml.safe_dump(import_model("tests.byo_models:tiny_mlp", (32,))))
    scenario = tmp_path / "S.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "mlp_file", "model": {"file": "models/mlp.yaml"}, "strategy": {"kind": "dp", "num_groups": 2},
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "cpu", "intra_node_link": "loopback",
                    "inter_node_link": "loopback"},
        "training": {"global_batch_size": 16, "optimizer": "sgd"}}))
    return scenario


NO_SPEC = ("model.file models/mlp.yaml: layer 'linear0' has no torch spec; a layer table without torch specs can "
           "be simulated but not calibrated or validated")


def test_calibrate_refuses_a_layer_table_before_any_rank_starts(capsys, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(validator.calibrate, "spawn", lambda *args: started.append(args))
    scenario, profile = layer_table_scenario(tmp_path), tmp_path / "P.json"
    assert_one_line_error(run_cli(capsys, "calibrate", "--scenario", scenario, "--world-size", "2", "--out", profile),
                          NO_SPEC, "calibrate a zoo model")
    assert started == [] and not profile.exists()


def test_validate_refuses_a_layer_table_before_any_rank_starts(capsys, tmp_path, launches):
    scenario = layer_table_scenario(tmp_path)
    assert_one_line_error(validate_cli(capsys, "--strategies", "dp", "--out", tmp_path / "out", scenario=scenario),
                          NO_SPEC)
    assert_one_line_error(validate_cli(capsys, "--rank", "--top", "1", "--others", "1", "--out", tmp_path / "out",
                                       scenario=scenario), NO_SPEC)
    assert launches.sizes == [] and not (tmp_path / "out").exists()


def test_the_spec_check_is_the_builders_own(tmp_path):
    zoo = load_scenario(SCENARIO)
    check_torch_specs(resolve_workload(zoo.model, zoo.base_dir))  # a zoo model builds: no error
    table = load_scenario(str(layer_table_scenario(tmp_path)))
    workload = resolve_workload(table.model, table.base_dir)
    with pytest.raises(ScenarioError, match=r"^model\.layers: layer 'linear0' has no torch spec"):
        check_torch_specs(workload, "model.layers")
    with pytest.raises(ValueError, match=r"^layer 'linear0': no spec"):  # what a rank would have raised
        build_layer_module(workload.layers[0])
    odd = workload.layers[0].__class__(**{**vars(workload.layers[0]), "spec": {"kind": "nonesuch"}})
    with pytest.raises(ScenarioError, match=r"^model: layer 'linear0': unknown spec kind 'nonesuch'"):
        check_torch_specs(types.SimpleNamespace(layers=[odd], input_spec={}))


# 3. --json names what it wrote

def test_validate_json_gives_the_paths_it_wrote(capsys, tmp_path, launches):
    out = tmp_path / "out"
    code, stdout, err = validate_cli(capsys, "--strategies", "dp,mp", "--out", out, "--json")
    assert code == 0, err
    document = json.loads(stdout)
    assert (document["csv"], document["plot"], document["traces"]) == (
        str(out / "mlp_cpu.csv"), str(out / "mlp_cpu.png"), str(out / "traces"))
    assert sorted(document["files"]) == [str(tmp_path / name) for name in files_under(tmp_path)]
    assert len(document["files"]) == 6 and os.path.isdir(document["traces"])


# 4. trace names every file system takes

def test_trace_names_have_no_colon():
    assert trace_stem("1f1b:4 (G=1 x M=2)") == "1f1b-m4_G1xM2"
    assert trace_stem("interleaved_1f1b:8 (G=1 x M=2)") == "interleaved_1f1b-m8_G1xM2"
    assert trace_stem("megatron:full_shard (G=2 x M=1)") == "megatron-full_shard_G2xM1"
    assert trace_stem("dp (G=2 x M=1)") == "dp_G2xM1"


def test_validate_writes_a_pipeline_trace_without_a_colon(capsys, tmp_path, launches):
    out = tmp_path / "out"
    code, _stdout, err = validate_cli(capsys, "--strategies", "1f1b:2", "--step-spans", "--out", out)
    assert code == 0, err
    assert files_under(out / "traces") == ["1f1b-m2_G1xM2.measured.trace.json", "1f1b-m2_G1xM2.simulated.trace.json",
                                           "1f1b-m2_G1xM2.steps.csv"]
