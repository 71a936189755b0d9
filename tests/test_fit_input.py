"""`ghpsim fit` on bad input (simulator.fit_csv, simulator.fit.run): one line on stderr naming the file,
row and column and the bad value (never more of the file), exit 2, no traceback, and no --out or
--plot file left behind. Each case fails before any fitting, or fits with a stubbed simulation."""

from __future__ import annotations

import errno
import math

import pytest

import simulator.fit as fit_module
from ghpsim.cli import main
from simulator.errors import ScenarioError
from tests.test_fit import BASE, _write

HEADER = "base,model.params.hidden_size,training.global_batch_size,measured_step_s\n"
GOOD = "tiny.yaml,256,2,0.01\n"


def _fit(tmp_path, capsys, rows: str, *options: str) -> tuple[int, str, str]:
    """`ghpsim fit runs.csv --out kernel.json --plot fit.png --folds 2 *options`: (code, stdout, stderr)."""
    runs_csv = _write(tmp_path, rows)
    code = main(["fit", str(runs_csv), "--out", str(tmp_path / "kernel.json"), "--plot", str(tmp_path / "fit.png"),
                 "--folds", "2", *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(tmp_path, capsys, rows: str, *options: str) -> str:
    """The product's rule for bad input; returns the error line."""
    code, _out, err = _fit(tmp_path, capsys, rows, *options)
    assert code == 2, err
    assert err.startswith("ghpsim: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "kernel.json").exists() and not (tmp_path / "fit.png").exists()
    return err


def _stub_simulation(monkeypatch) -> None:
    """Predictions from the measurement itself, worst at the largest host time: a fit in milliseconds."""
    monkeypatch.setattr(fit_module, "predict_s", lambda run, point: run.measured_s * (1 + point["host_overhead_s"]))


def test_a_row_with_too_few_cells_names_its_row_and_counts(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + GOOD + "tiny.yaml,256,2\n")
    assert "runs.csv:3: 3 cells, fewer than the 4 columns of the header" in err


def test_a_row_with_an_extra_cell_names_its_row(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + GOOD + "tiny.yaml,256,2,0.02,9\n")
    assert "runs.csv:3: 5 cells, more than the 4 columns of the header" in err


@pytest.mark.parametrize("value, reason", [
    ("inf", "'inf' is not a finite number"), ("-inf", "'-inf' is not a finite number"),
    ("nan", "'nan' is not a finite number"), ("1e300", "'1e300' is outside 1e-06 to 86400 s"),
    ("1e-300", "'1e-300' is outside 1e-06 to 86400 s"), ("0", "0.0 must be > 0"),
])
def test_a_measured_step_time_must_be_finite_positive_and_bounded(tmp_path, capsys, value, reason):
    err = _refused(tmp_path, capsys, HEADER + GOOD + f"tiny.yaml,256,2,{value}\n")
    assert f"runs.csv:3: measured_step_s: {reason}" in err


def test_a_fit_that_gives_a_non_finite_number_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fit_module, "predict_s", lambda run, point: math.nan)
    err = _refused(tmp_path, capsys, HEADER + GOOD + GOOD)
    assert "runs.csv:2: simulated step time nan, not a positive finite number" in err


def test_the_json_written_or_printed_never_holds_nan():
    with pytest.raises(ScenarioError, match="--out k.json: the fit gave a number that is not finite"):
        fit_module._json_text({"fit": {"held_out_mape_pct": math.nan}}, "--out k.json", 1)


def test_a_plot_that_fails_leaves_no_profile(tmp_path, capsys, monkeypatch):
    import simulator.fit_plot

    def fail(*_args):
        raise ScenarioError("--plot fit.png: cannot draw")
    _stub_simulation(monkeypatch)
    monkeypatch.setattr(simulator.fit_plot, "write_fit_plot", fail)
    assert "--plot fit.png: cannot draw" in _refused(tmp_path, capsys, HEADER + GOOD + GOOD)


def test_a_profile_that_cannot_be_written_leaves_no_plot(tmp_path, capsys, monkeypatch):
    import simulator.output

    def fail(path, _text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    _stub_simulation(monkeypatch)
    monkeypatch.setattr(simulator.output, "write_text_atomic", fail)
    assert "kernel.json: No space left on device" in _refused(tmp_path, capsys, HEADER + GOOD + GOOD)


def test_an_unterminated_quote_names_the_row_it_opens_in_and_echoes_nothing(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + GOOD + '"tiny.yaml,256,2,0.02\n' + GOOD)
    assert "runs.csv:3: unterminated quote" in err and "tiny.yaml,256" not in err


def test_a_stray_quote_names_its_row(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + GOOD + 'tiny.yaml,"256"x,2,0.02\n')
    assert "runs.csv:3: malformed row (csv: ',' expected after '\"')" in err


def test_text_for_a_number_names_the_row_column_and_value(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + "tiny.yaml,abc,2,0.01\n" + GOOD)
    assert "runs.csv:2: model.params.hidden_size: 'abc' is not a number (the base scenario has 256)" in err


def test_a_long_bad_value_is_shortened(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + GOOD + f"tiny.yaml,{'x' * 5000},2,0.01\n")
    assert "runs.csv:3: model.params.hidden_size: 'xxx" in err and "x" * 100 not in err


def test_a_value_the_scenario_refuses_names_its_column(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "base,strategy.tp_degree,measured_step_s\ntiny.yaml,3,0.01\ntiny.yaml,2,0.01\n")
    assert "runs.csv:2: strategy.tp_degree: '3': " in err


def test_a_column_named_twice_is_refused(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "base,measured_step_s, measured_step_s\ntiny.yaml,0.01,0.02\n")
    assert "runs.csv:1: column 'measured_step_s' appears twice in the header (columns 2 and 3)" in err


def test_a_missing_base_file_is_refused_even_when_every_row_names_its_own(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + GOOD + GOOD, "--base", str(tmp_path / "nope.yaml"))
    assert "--base" in err and "nope.yaml" in err and "file not found" in err


def test_a_base_file_that_is_not_used_is_said_so(tmp_path, capsys, monkeypatch):
    _stub_simulation(monkeypatch)
    (tmp_path / "other.yaml").write_text(BASE)
    code, out, err = _fit(tmp_path, capsys, HEADER + GOOD + GOOD, "--base", str(tmp_path / "other.yaml"), "--json")
    assert code == 0 and '"runs": 2' in out
    note, *warnings = err.splitlines()  # the stub ignores the GEMM ceiling: its grid's first value wins
    assert "other.yaml is not used: every row names its own base" in note
    assert [line.split(" is ")[0] for line in warnings] == ["ghpsim: warning: gemm_efficiency = 0.65"]


def test_a_missing_base_of_a_row_names_its_row(tmp_path, capsys):
    err = _refused(tmp_path, capsys, HEADER + GOOD + "nope.yaml,256,2,0.01\n")
    assert "runs.csv:3: base: 'nope.yaml': file not found" in err


@pytest.mark.parametrize("header", ["base,trainig.global_batch_size,measured_step_s",
                                    "base,training.global_batch_sise,measured_step_s"])
def test_a_misspelt_column_is_refused_even_when_all_its_cells_are_empty(tmp_path, capsys, header):
    """An empty cell keeps the base's value, but the column's name is checked whatever the cells hold."""
    column = header.split(",")[1]
    err = _refused(tmp_path, capsys, f"{header}\ntiny.yaml,,0.01\ntiny.yaml,,0.02\n")
    assert f"runs.csv:1: column '{column}' is not a scenario key" in err


def test_an_empty_cell_keeps_the_base_scenarios_value(tmp_path):
    runs = fit_module.read_runs(_write(tmp_path, "base,training.global_batch_size,measured_step_s\n"
                                                 "tiny.yaml,,0.01\ntiny.yaml,4,0.02\n"))
    assert [run.document["training"]["global_batch_size"] for run in runs] == [2, 4]  # BASE has 2
