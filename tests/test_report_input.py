"""`ghpsim report` on a result file with a bad value inside (a simulate or compare JSON, a sweep
results.csv, a validation CSV or JSON): one line naming the file, the field (or row and column)
and the value, exit 2, no traceback, no --out folder; and a megatron scenario, whose layout the
default strategies (dp, mp, ghp) cannot take: its own strategy by default, one line naming
--strategies when they are given."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from ghpsim.cli import main
from simulator.errors import MAX_MESSAGE_CHARS
from tests.test_report import ROOT, SMALL, parse_html, records, run_report
from tests.test_report_tables import SWEEP_CSV, VALIDATION_ROWS

LLAMA_405B = str(ROOT / "scenarios" / "llama3_405b_4d_h100.yaml")
VALIDATION_CPU = ROOT / "reports" / "validation_cpu.csv"


def _cli_json(*argv: str) -> dict:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(list(argv)) == 0
    return json.loads(stdout.getvalue())


@pytest.fixture(scope="module")
def simulated() -> dict:
    """`ghpsim simulate --json` of a small ghp scenario (G=2 x M=2)."""
    return _cli_json("simulate", SMALL, "--set", "strategy.kind=ghp", "--set", "strategy.num_groups=2", "--json")


@pytest.fixture(scope="module")
def compared() -> dict:
    return _cli_json("compare", SMALL, "--json")


def assert_refused(capsys, tmp_path: Path, source: Path, *fragments: str, argv: tuple[str, ...] = ()) -> str:
    """The report of `source` fails with one line holding every fragment, exit 2, and writes nothing."""
    out = tmp_path / "new" / "out"
    code, stdout, err = run_report(capsys, str(source), *argv, "--out", str(out))
    assert code == 2, err
    assert "Traceback" not in err and "building the report" not in err and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ghpsim: error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not out.exists() and not out.parent.exists()
    return lines[0]


def _set(document: dict, dotted: str, value) -> None:
    """document[a][b][c] = value for "a.b.c" (an integer part indexes a list)."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        document = document[int(part)] if part.isdigit() else document[part]
    document[int(leaf) if leaf.isdigit() else leaf] = value


# ----------------------------------------------------------------------------- simulate / compare JSON

SIMULATE_CASES = {
    "step time a string": ("step_time_s", "abc", "step_time_s: 'abc' is not a positive finite number"),
    "step time infinite": ("step_time_s", float("inf"), "step_time_s: Infinity is not"),
    "step time zero": ("step_time_s", 0, "step_time_s: 0 is not a positive"),
    "devices a number": ("devices", 5, "devices: 5 is not a non-empty list of mappings"),
    "devices of numbers": ("devices", [5, 6], "devices: [5, 6] is not"),
    "devices empty": ("devices", [], "devices: [] is not"),
    "device time": ("devices.1.comm_s", "x", "devices[1].comm_s: 'x' is not a finite number"),
    "device rank": ("devices.0.rank", -1, "devices[0].rank: -1 is not a rank"),
    "device peak memory": ("devices.0.peak_memory_bytes", "big", "devices[0].peak_memory_bytes: 'big'"),
    "speedup null": ("speedup", None, "speedup: None is not a finite number"),
    "throughput a bool": ("throughput_samples_per_s", True, "throughput_samples_per_s: True is not"),
    "groups zero": ("num_groups", 0, "num_groups: 0 is not a positive whole number"),
    "workers a fraction": ("workers_per_group", 1.5, "workers_per_group: 1.5 is not a positive whole number"),
    "strategy not a string": ("strategy", ["ghp"], "strategy: ['ghp'] is not a string"),
    "bytes per tier": ("bytes_per_tier", {"intra": 0}, "bytes_per_tier: lacks inter"),
    "inter-node bytes": ("bytes_per_tier.inter", "many", "bytes_per_tier.inter: 'many'"),
    "memory": ("memory", 3, "memory: 3 is not a mapping"),
}


@pytest.mark.parametrize("case", list(SIMULATE_CASES))
def test_bad_value_in_simulate_json(capsys, tmp_path, simulated, case):
    field, value, expected = SIMULATE_CASES[case]
    document = json.loads(json.dumps(simulated))
    _set(document, field, value)
    source = tmp_path / "sim.json"
    source.write_text(json.dumps(document))
    assert_refused(capsys, tmp_path, source, f"INPUT: {source}: {expected}")


def test_missing_placement_of_a_grid(capsys, tmp_path, simulated):
    document = {key: value for key, value in simulated.items() if key != "placement"}
    source = tmp_path / "sim.json"
    source.write_text(json.dumps(document))
    assert_refused(capsys, tmp_path, source, f"INPUT: {source}: the summary lacks placement")


def test_long_bad_value_is_shortened(capsys, tmp_path, simulated):
    source = tmp_path / "sim.json"
    source.write_text(json.dumps({**simulated, "speedup": "x" * 5000}))
    line = assert_refused(capsys, tmp_path, source, f"INPUT: {source}: speedup: 'xxx", "xxx...xxx",
                          "xxx' is not a finite number")
    assert len(line) < MAX_MESSAGE_CHARS  # shortened by reprlib, not cut at the end


COMPARE_CASES = {
    "step time a string": ("summaries.1.step_time_s", "abc", "summaries[1].step_time_s: 'abc' is not"),
    "step time null": ("summaries.0.step_time_s", None, "summaries[0].step_time_s: None is not"),
    "summary a number": ("summaries.2", 7, "summaries[2]: 7 is not a mapping"),
    "devices a string": ("summaries.0.devices", "all", "summaries[0].devices: 'all' is not"),
    "device idle": ("summaries.2.devices.0.idle_s", "nan", "summaries[2].devices[0].idle_s: 'nan' is not"),
}


@pytest.mark.parametrize("case", list(COMPARE_CASES))
def test_bad_value_in_compare_json(capsys, tmp_path, compared, case):
    field, value, expected = COMPARE_CASES[case]
    document = json.loads(json.dumps(compared))
    _set(document, field, value)
    source = tmp_path / "cmp.json"
    source.write_text(json.dumps(document))
    assert_refused(capsys, tmp_path, source, f"INPUT: {source}: {expected}")


def test_valid_results_still_report(capsys, tmp_path, simulated, compared):
    for name, document, kind in (("sim.json", simulated, "simulate"), ("cmp.json", compared, "compare")):
        source = tmp_path / name
        source.write_text(json.dumps(document))
        code, out, err = run_report(capsys, str(source), "--out", str(tmp_path / kind), "--json")
        assert code == 0, err
        assert json.loads(out)["kind"] == kind


# ----------------------------------------------------------------------------- sweep and validation tables


def _write_csv(text_or_path, path: Path, row: int, column: str, value: str) -> Path:
    """A copy of a CSV with the cell (`row`, counted from 1 after the header; `column`) replaced."""
    source = io.StringIO(text_or_path) if isinstance(text_or_path, str) else text_or_path
    frame = pd.read_csv(source, dtype=str, keep_default_na=False)
    frame.loc[row - 1, column] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


SWEEP_CASES = {
    "step time a string": (2, "step_time_s", "abc", "row 2, column step_time_s: 'abc' is not a positive finite number"),
    "GPU count a string": (3, "num_gpus", "zz", "row 3, column num_gpus: 'zz' is not a positive whole number"),
    "GPU count zero": (1, "num_gpus", "0", "row 1, column num_gpus: 0.0 is not a positive whole number"),
    "GPU count missing": (1, "num_gpus", "", "row 1, column num_gpus: empty (a number is needed here)"),
    "throughput missing": (4, "throughput_samples_per_s", "", "row 4, column throughput_samples_per_s: empty"),
    "speedup infinite": (1, "speedup", "inf", "row 1, column speedup: inf is not a finite number"),
    "groups a fraction": (2, "num_groups", "1.5", "row 2, column num_groups: 1.5 is not a positive whole number"),
    "failed row's step time": (6, "step_time_s", "slow", "row 6, column step_time_s: 'slow' is not"),
}


@pytest.mark.parametrize("case", list(SWEEP_CASES))
def test_bad_cell_in_sweep_results(capsys, tmp_path, case):
    row, column, value, expected = SWEEP_CASES[case]
    source = _write_csv(SWEEP_CSV, tmp_path / "sweep" / "results.csv", row, column, value)
    assert_refused(capsys, tmp_path, source.parent, f"INPUT: {source}: {expected}")  # the folder as INPUT


def test_failed_sweep_rows_may_be_empty(capsys, tmp_path):
    """A point that failed has no numbers: not an error (row 6 of SWEEP_CSV)."""
    source = _write_csv(SWEEP_CSV, tmp_path / "results.csv", 6, "num_gpus", "")
    code, _, err = run_report(capsys, str(source), "--out", str(tmp_path / "r"))
    assert code == 0, err


VALIDATION_CASES = {
    "measured a string": (2, "measured_s", "abc", "row 2, column measured_s: 'abc' is not a positive finite number"),
    "predicted missing": (1, "predicted_s", "", "row 1, column predicted_s: empty"),
    "error infinite": (15, "error_pct", "-inf", "row 15, column error_pct: -inf is not a finite number"),
    "world size a string": (3, "world_size", "four", "row 3, column world_size: 'four' is not"),
}


@pytest.mark.parametrize("case", list(VALIDATION_CASES))
def test_bad_cell_in_validation_csv(capsys, tmp_path, case):
    row, column, value, expected = VALIDATION_CASES[case]
    source = _write_csv(VALIDATION_CPU, tmp_path / "validation_cpu.csv", row, column, value)
    assert_refused(capsys, tmp_path, source, f"INPUT: {source}: {expected}")


@pytest.mark.parametrize("rows, expected", [
    ([{**VALIDATION_ROWS[0], "predicted_s": "0.008"}], "rows[0].predicted_s: '0.008' is not a positive"),
    ([VALIDATION_ROWS[0], {**VALIDATION_ROWS[1], "measured_s": None}], "rows[1].measured_s: empty"),
    ([VALIDATION_ROWS[0], 5], "rows[1]: 5 is not a mapping"),
])
def test_bad_value_in_validation_json(capsys, tmp_path, rows, expected):
    source = tmp_path / "validation.json"
    source.write_text(json.dumps({"scenario": "toy", "rows": rows}))
    assert_refused(capsys, tmp_path, source, f"INPUT: {source}: {expected}")


def test_committed_validation_tables_still_report(capsys, tmp_path):
    for index, table in enumerate((VALIDATION_CPU, ROOT / "reports" / "validation_pipelines_cpu.csv")):
        code, _, err = run_report(capsys, str(table), "--out", str(tmp_path / str(index)))
        assert code == 0, err


# ----------------------------------------------------------------------------- megatron scenario


def test_megatron_scenario_reports_its_own_strategy(capsys, tmp_path):
    """llama3_405b_4d_h100 (cp_degree 2: no dp/mp/ghp equivalent): the default is its own layout."""
    code, out, err = run_report(capsys, LLAMA_405B, "--out", str(tmp_path / "r"), "--json")
    assert code == 0, err
    assert json.loads(out)["kind"] == "scenario"
    rows = records(parse_html(tmp_path / "r" / "report.html").tables["ranking-table"])
    assert [row["strategy"] for row in rows] == ["megatron (t=8 x c=2 x p=16 x d=64)"]
    assert (tmp_path / "r" / "traces" / "megatron-t8xc2xp16xd64.trace.json").is_file()


@pytest.mark.parametrize("strategies, fragments", [
    ("1f1b:8", ("--strategies 1f1b:8: the megatron scenario", "leave --strategies out",
                "1f1b with G=1 puts 16384 workers in a group, more than the 128 layers")),
    ("dp,mp,ghp:4", ("training.global_batch_size: 2048 is not divisible by the 16384 groups (--strategies item dp)",))])
def test_megatron_scenario_with_other_strategies_names_the_option(capsys, tmp_path, strategies, fragments):
    # the other kinds run without the scenario's context parallelism (cp 2, megatron's only), so
    # what refuses them is their own shape on 16,384 GPUs, named with the option
    line = assert_refused(capsys, tmp_path, Path(LLAMA_405B), *fragments, argv=("--strategies", strategies))
    assert "--strategies" in line and "cp_degree" not in line


def test_failure_keeps_an_existing_out_folder_untouched(capsys, tmp_path, simulated):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("previous report")
    source = tmp_path / "sim.json"
    source.write_text(json.dumps({**simulated, "step_time_s": "abc"}))
    code, _, err = run_report(capsys, str(source), "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert [path.name for path in out.iterdir()] == ["report.html"]
    assert (out / "report.html").read_text() == "previous report"
    shutil.rmtree(out)


@pytest.mark.parametrize("option, value", [("--strategies", "dp"), ("--set", "cluster.num_nodes=2")])
def test_scenario_options_on_a_results_table_are_refused(capsys, tmp_path, option, value):
    assert_refused(capsys, tmp_path, ROOT / "reports" / "validation_cpu.csv", f"{option}: applies to a scenario INPUT only",
                   "validation_cpu.csv", argv=(option, value))


# ----------------------------------------------------------------------------- audit: nan, error_pct, misleading lines

@pytest.mark.parametrize("value", ["nan", "NaN", "NA"])
def test_a_nan_step_time_of_a_simulated_sweep_row_is_refused(capsys, tmp_path, value):
    """Only an empty cell is missing: `nan` is a value, refused as `inf`, `0` and `abc` are."""
    source = _write_csv(SWEEP_CSV, tmp_path / "results.csv", 1, "step_time_s", value)
    assert_refused(capsys, tmp_path, source, f"INPUT: {source}: row 1, column step_time_s: {value!r} is not a positive")


def test_a_nan_measured_time_is_named_nan_not_empty(capsys, tmp_path):
    source = _write_csv(VALIDATION_CPU, tmp_path / "validation_cpu.csv", 2, "measured_s", "nan")
    line = assert_refused(capsys, tmp_path, source, f"INPUT: {source}: row 2, column measured_s: 'nan' is not")
    assert "empty" not in line
    rows = [VALIDATION_ROWS[0], {**VALIDATION_ROWS[1], "measured_s": float("nan")}]
    json_source = tmp_path / "validation.json"
    json_source.write_text(json.dumps({"scenario": "toy", "rows": rows}))  # NaN: what Python writes
    assert_refused(capsys, tmp_path, json_source, f"INPUT: {json_source}: rows[1].measured_s: nan is not a positive")


def test_an_error_that_disagrees_with_the_step_times_is_refused(capsys, tmp_path):
    source = tmp_path / "v4.csv"
    source.write_text("strategy,predicted_s,measured_s,error_pct\ndp,0.1,0.2,99\n")
    assert_refused(capsys, tmp_path, source, f"INPUT: {source}: row 1, column error_pct: 99 disagrees",
                   "which give -50.00 %")


def test_an_error_rounded_to_a_tenth_is_taken_and_recomputed(capsys, tmp_path):
    source = tmp_path / "v5.csv"
    source.write_text("strategy,predicted_s,measured_s,error_pct\ndp,0.1,0.3,-66.7\n")
    code, _, err = run_report(capsys, str(source), "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert "MAPE 66.7 %" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize("strategies", ["", " , "])
def test_an_empty_strategies_list_is_refused_as_compare_refuses_it(capsys, tmp_path, strategies):
    assert_refused(capsys, tmp_path, Path(SMALL), "--strategies: ", "empty list", argv=("--strategies", strategies))


def test_an_empty_strategies_or_profile_on_a_table_is_refused(capsys, tmp_path):
    assert_refused(capsys, tmp_path, VALIDATION_CPU, "--strategies: applies to a scenario INPUT only",
                   argv=("--strategies", ""))
    assert_refused(capsys, tmp_path, Path(SMALL), "--profile: needs a file name (got '')", argv=("--profile", ""))


def test_a_sweep_file_is_named_as_one(capsys, tmp_path):
    source = tmp_path / "sweep.yaml"
    source.write_text(f"name: s\nbase: {SMALL}\naxes:\n  cluster.num_nodes: [1, 2]\n")
    assert_refused(capsys, tmp_path, source, f"INPUT: {source} is a sweep file", f"`ghpsim sweep {source} --out DIR`")


@pytest.mark.parametrize("text, expected", [("", "the file is empty"), ("# only a comment\n\n", "the file is empty"),
                                            ("~\n", "the file holds only null")])
def test_an_empty_yaml_file_is_said_to_be_empty(capsys, tmp_path, text, expected):
    source = tmp_path / "empty.yaml"
    source.write_text(text)
    line = assert_refused(capsys, tmp_path, source, f"{source}: {expected}")
    assert "NoneType" not in line


@pytest.mark.parametrize("text, expected", [
    ('{"broken\t": 1}', "line 1, column 9: a control character (a raw tab, line break, ...) inside a string"),
    ('{"a": "abc', "line 1, column 7: a string starts here and never ends"),
])
def test_a_json_error_reads_cleanly(capsys, tmp_path, text, expected):
    source = tmp_path / "broken.json"
    source.write_text(text)
    line = assert_refused(capsys, tmp_path, source, f"INPUT: {source}: not valid JSON ({expected}")
    assert " at)" not in line


def test_a_sweep_row_of_an_unknown_status_is_refused_by_its_row(capsys, tmp_path):
    (tmp_path / "results.csv").write_text(SWEEP_CSV.replace("2,2,ib-edr,ok,", "2,2,ib-edr,weird,"))
    code, _out, err = run_report(capsys, str(tmp_path / "results.csv"), "--out", str(tmp_path / "r"))
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "r").exists()
    assert err.endswith("row 3, column status: 'weird' is not one of ok, failed, error, invalid, pending\n"), err
