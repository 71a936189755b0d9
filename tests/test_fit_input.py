"""`ghpsim fit` on bad input (simulator.fit_csv, simulator.fit.run): one line on stderr naming the file,
row and column and the bad value (never more of the file), exit 2, no traceback, and no --out or
--plot file left behind. Each case fails before any fitting, or fits with a stubbed simulation."""

from __future__ import annotations

import errno
import math
import shutil
from pathlib import Path

import pytest

import simulator.fit as fit_module
import simulator.fit_command as fit_command
from ghpsim.cli import main
from simulator.errors import ScenarioError
from tests.test_fit import BASE, _write

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
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
        fit_command._json_text({"fit": {"held_out_mape_pct": math.nan}}, "--out k.json", 1)


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


@pytest.mark.parametrize("column, value, why", [
    ("costs.model", "analytic", "every run uses the kernel model it fits"),
    ("costs.host_overhead_s", "1e-05", "it is fitted"),
    ("costs.efficiency.attention", "0.5", "the analytic model's"),
    ("costs", '"{model: analytic}"', "it could set costs.model")])
def test_a_column_the_fit_would_ignore_is_refused_naming_the_columns_accepted(tmp_path, capsys, column, value, why):
    """Every run is simulated with the kernel model and its host time fitted: a costs.model column
    (analytic here) was silently ignored, and the fit written as if it held."""
    err = _refused(tmp_path, capsys, f"base,{column},measured_step_s\ntiny.yaml,{value},0.01\ntiny.yaml,,0.02\n")
    assert (f"runs.csv:1: column '{column}' is not supported: fit's columns are base, measured_step_s and "
            f"scenario keys other than costs.model, costs.efficiency, costs.host_overhead_s ({why}") in err


def test_a_base_scenario_on_the_analytic_model_is_refused_before_any_fitting(tmp_path, capsys, monkeypatch):
    """The fit replaces the kernel model's parameters: a base that asks for the roofline would be
    fitted and predicted with the kernel model all the same."""
    monkeypatch.setattr(fit_module, "predict_s", lambda *_: pytest.fail("fitted"))
    runs_csv = _write(tmp_path, HEADER + GOOD + GOOD, base=BASE + "costs: {model: analytic}\n")
    code = main(["fit", str(runs_csv), "--out", str(tmp_path / "kernel.json"), "--folds", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "costs.model analytic" in err and "set costs.model kernel" in err
    assert not (tmp_path / "kernel.json").exists()


def test_an_empty_cell_keeps_the_base_scenarios_value(tmp_path):
    runs = fit_module.read_runs(_write(tmp_path, "base,training.global_batch_size,measured_step_s\n"
                                                 "tiny.yaml,,0.01\ntiny.yaml,4,0.02\n"))
    assert [run.document["training"]["global_batch_size"] for run in runs] == [2, 4]  # BASE has 2


def test_a_base_scenarios_relative_model_file_is_read_from_its_own_folder(tmp_path, monkeypatch):
    """A row's base in another folder keeps its `model.file` relative to that folder, as simulate does."""
    folder = tmp_path / "bases"
    (folder / "layers").mkdir(parents=True)
    shutil.copy(SCENARIOS / "custom_layers.yaml", folder / "mlp.yaml")  # model.file: layers/tiny_mlp.yaml
    shutil.copy(SCENARIOS / "layers" / "tiny_mlp.yaml", folder / "layers")
    monkeypatch.chdir(tmp_path)  # not the base's folder
    runs = fit_module.read_runs(_write(tmp_path, "base,measured_step_s\nbases/mlp.yaml,0.01\n"))
    assert runs[0].base_dir == str(folder) and fit_module.predict_s(runs[0], None) > 0


def test_out_naming_a_base_scenario_of_the_rows_is_refused_and_the_scenario_kept(tmp_path, capsys):
    base_text = BASE
    code = main(["fit", str(_write(tmp_path, HEADER + GOOD + GOOD)), "--out", str(tmp_path / "tiny.yaml"),
                 "--folds", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "the same file as the base scenario" in err
    assert (tmp_path / "tiny.yaml").read_text() == base_text


def test_a_seed_a_profile_cannot_hold_is_refused_before_the_rows_are_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fit_module, "_read_runs", lambda *_: pytest.fail("rows read"))
    err = _refused(tmp_path, capsys, HEADER + GOOD + GOOD, "--seed", str(2**53 + 1))
    assert "--seed: 9007199254740993 is beyond" in err


def test_an_existing_plot_survives_a_failed_profile_write(tmp_path, capsys, monkeypatch):
    """The figure is drawn beside --plot and renamed onto it only once --out is written."""
    import simulator.output
    _stub_simulation(monkeypatch)
    (tmp_path / "fit.png").write_bytes(b"the user's own figure")

    def full_disk(path, _text):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(simulator.output, "write_text_atomic", full_disk)
    code, _out, err = _fit(tmp_path, capsys, HEADER + GOOD + GOOD)
    assert code == 2 and "No space left on device" in err
    assert (tmp_path / "fit.png").read_bytes() == b"the user's own figure"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fit.png", "runs.csv", "tiny.yaml"]


def test_a_row_whose_plan_is_refused_is_named_when_the_rows_are_read(tmp_path):
    """Two micro-batches do not divide a batch of 3: the plan's check fires as the rows are read
    (before any fitting), naming the row and the column that causes it."""
    header = "base,strategy.num_microbatches,training.global_batch_size,measured_step_s\n"
    with pytest.raises(ScenarioError) as error:
        fit_module.read_runs(_write(tmp_path, header + "tiny.yaml,1,2,0.01\ntiny.yaml,2,3,0.01\n"))
    assert f"{tmp_path / 'runs.csv'}:3: strategy.num_microbatches: '2'" in str(error.value)


@pytest.mark.parametrize("name", ["fit_plot", ".png"])
def test_a_plot_named_without_a_suffix_is_drawn_as_png(tmp_path, capsys, monkeypatch, name):
    """The figure is drawn beside --plot under a temporary name ending in the figure's own format,
    so `--plot fit_plot` (or `.png`, a name that is all suffix) is a PNG, not a format 'partial'."""
    _stub_simulation(monkeypatch)
    runs_csv = _write(tmp_path, HEADER + GOOD + GOOD)
    code = main(["fit", str(runs_csv), "--out", str(tmp_path / "kernel.json"), "--plot", str(tmp_path / name),
                 "--folds", "2"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (tmp_path / name).read_bytes().startswith(b"\x89PNG") and (tmp_path / "kernel.json").is_file()
    assert not [path.name for path in tmp_path.iterdir() if "partial" in path.name]  # no temporary figure left
