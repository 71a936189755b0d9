"""Bad input to `ghpsim fit` and `ghpsim merge-profiles`: one line on stderr naming the flag or file
and the value, exit 2, no traceback, and no input overwritten nor output written."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest

import simulator.fit as fit_module
from ghpsim.cli import main
from simulator.errors import ScenarioError
from simulator.fit import read_runs
from simulator.profile_merge import merge_profiles

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "scenarios" / "runs" / "vtrain_a100_sample.csv"
CALIBRATION = ROOT / "reports" / "profiles" / "mlp_cpu_ws2.json"
KERNEL = ROOT / "reports" / "gpu" / "h200_kernels" / "kernel_profile.json"


@pytest.fixture
def runs_csv(tmp_path) -> Path:
    """The first four rows of a committed RUNS.csv, with the base scenario they name, under tmp_path."""
    lines = RUNS.read_text().splitlines(keepends=True)[:5]
    base = lines[1].split(",")[0]
    shutil.copy(RUNS.parent / base, tmp_path / base)
    path = tmp_path / "runs.csv"
    path.write_text("".join(lines))
    return path


def _refused(capsys, argv: list[str]) -> str:
    """Runs the CLI, asserts the bad-input rule (exit 2, one line, no traceback) and returns the line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("ghpsim: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _stub_simulation(monkeypatch) -> None:
    """Predictions from the measurement itself: a fit in milliseconds."""
    monkeypatch.setattr(fit_module, "predict_s", lambda run, point: run.measured_s * (1 + point["host_overhead_s"]))


# ghpsim fit


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (takes no new file)")
@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_fit_refuses_an_output_where_nothing_can_be_made_before_fitting(runs_csv, capsys, monkeypatch, flag):
    monkeypatch.setattr(fit_module, "read_runs", _never)
    monkeypatch.setattr(fit_module, "_read_runs", _never)
    monkeypatch.setattr(fit_module, "fit_runs", _never)
    bad = "/proc/ghpsim_no_such/fit" + (".json" if flag == "--out" else ".png")
    given, before = {"--out": str(runs_csv.parent / "p.json"), flag: bad}, sorted(os.listdir(runs_csv.parent))
    err = _refused(capsys, ["fit", str(runs_csv), *(part for item in given.items() for part in item)])
    assert f"{flag} {bad}: cannot make a folder in /proc" in err
    assert sorted(os.listdir(runs_csv.parent)) == before  # no --out profile written beside a refused --plot


def _never(*_args, **_kwargs):
    raise AssertionError("the runs were read or fitted: the bad output should have been refused before")


def test_fit_refuses_an_out_that_is_the_runs_csv(runs_csv, capsys):
    before = runs_csv.read_bytes()
    err = _refused(capsys, ["fit", str(runs_csv), "--out", str(runs_csv), "--folds", "2"])
    assert f"--out {runs_csv}: the same file as the runs CSV" in err
    assert runs_csv.read_bytes() == before


def test_fit_refuses_an_out_that_is_a_hard_link_to_the_runs_csv(runs_csv, tmp_path, capsys):
    link = tmp_path / "link.json"
    os.link(runs_csv, link)
    before = runs_csv.read_bytes()
    err = _refused(capsys, ["fit", str(runs_csv), "--out", str(link), "--folds", "2"])
    assert f"--out {link}: the same file as the runs CSV" in err
    assert runs_csv.read_bytes() == before


def test_fit_refuses_a_plot_that_is_the_runs_csv(runs_csv, tmp_path, capsys):
    before = runs_csv.read_bytes()
    out, plot = tmp_path / "kernel.json", tmp_path / "fit.png"
    plot.symlink_to(runs_csv)  # a .png name, so the figure format is accepted
    err = _refused(capsys, ["fit", str(runs_csv), "--out", str(out), "--plot", str(plot), "--folds", "2"])
    assert f"--plot {plot}: the same file as the runs CSV" in err
    assert runs_csv.read_bytes() == before and not out.exists()


def test_fit_reads_a_csv_that_starts_with_a_byte_order_mark(runs_csv, tmp_path, capsys, monkeypatch):
    runs_csv.write_bytes(b"\xef\xbb\xbf" + runs_csv.read_bytes())
    runs = read_runs(runs_csv)
    assert len(runs) == 4 and runs[0].document["model"]["params"]["hidden_size"] == 1024
    _stub_simulation(monkeypatch)
    out = tmp_path / "kernel.json"
    assert main(["fit", str(runs_csv), "--out", str(out), "--folds", "2", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["kind"] == "kernel"


def test_fit_says_a_base_folder_is_a_directory(runs_csv, tmp_path, capsys):
    rows = runs_csv.read_text().splitlines(keepends=True)
    runs_csv.write_text("".join(line.split(",", 1)[1] for line in rows))  # no base column
    (tmp_path / "adir").mkdir()
    out = tmp_path / "g.json"
    err = _refused(capsys, ["fit", str(runs_csv), "--out", str(out), "--folds", "2", "--base", str(tmp_path / "adir")])
    assert "--base" in err and "adir" in err and "is a directory" in err and "not found" not in err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--plot", "--out", "--base"])
def test_fit_refuses_an_empty_file_name(runs_csv, tmp_path, capsys, flag):
    options = {"--out": str(tmp_path / "kernel.json"), "--plot": str(tmp_path / "fit.png"), flag: ""}
    argv = ["fit", str(runs_csv), "--folds", "2"] + [part for item in options.items() for part in item]
    err = _refused(capsys, argv)
    assert f"{flag}: needs a file name (got '')" in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["megatron_gpt_a100_node.yaml", "runs.csv"]


# ghpsim merge-profiles


def _inputs(tmp_path) -> tuple[Path, Path]:
    """A committed calibration profile and a byte copy of it."""
    first, copied = tmp_path / "a.json", tmp_path / "copy.json"
    shutil.copy(CALIBRATION, first)
    shutil.copy(CALIBRATION, copied)
    return first, copied


def test_merge_refuses_a_copy_of_the_same_calibration(tmp_path, capsys):
    first, copied = _inputs(tmp_path)
    out = tmp_path / "m.json"
    err = _refused(capsys, ["merge-profiles", str(first), str(copied), "--out", str(out)])
    assert f"{copied} holds the same calibration as {first}" in err
    assert not out.exists()


def test_merge_refuses_the_same_calibration_re_saved_with_other_provenance(tmp_path, capsys):
    first, copied = _inputs(tmp_path)
    document = json.loads(first.read_text())
    document["provenance"]["notes"] = ["re-saved"]
    copied.write_text(json.dumps(document, indent=4))
    err = _refused(capsys, ["merge-profiles", str(first), str(copied), "--out", str(tmp_path / "m.json")])
    assert "holds the same calibration" in err and str(first) in err and str(copied) in err


def test_merge_refuses_an_out_that_is_an_input(tmp_path, capsys):
    first, second = _inputs(tmp_path)
    document = json.loads(second.read_text())
    document["p2p"]["latency_s"] *= 2
    second.write_text(json.dumps(document))
    before = first.read_bytes(), second.read_bytes()
    err = _refused(capsys, ["merge-profiles", str(first), str(second), "--out", str(second)])
    assert f"--out {second}: the same file as the input profile {second}" in err
    assert (first.read_bytes(), second.read_bytes()) == before


@pytest.mark.parametrize("order", ["calibration first", "kernel first"])
def test_merge_names_a_kernel_profile(tmp_path, capsys, order):
    first, _ = _inputs(tmp_path)
    kernel = tmp_path / "kernel.json"
    shutil.copy(KERNEL, kernel)
    paths = [first, kernel] if order == "calibration first" else [kernel, first]
    out = tmp_path / "m.json"
    err = _refused(capsys, ["merge-profiles", *map(str, paths), "--out", str(out)])
    assert f"{kernel}: a kernel profile" in err and "pools calibration profiles of one model" in err
    assert not out.exists()


def test_merge_refuses_two_kernel_profiles(tmp_path, capsys):
    kernel, other = tmp_path / "k1.json", tmp_path / "k2.json"
    shutil.copy(KERNEL, kernel)
    document = json.loads(KERNEL.read_text())
    document["architecture"] = "ampere"
    other.write_text(json.dumps(document))
    err = _refused(capsys, ["merge-profiles", str(kernel), str(other), "--out", str(tmp_path / "m.json")])
    assert f"{kernel}: a kernel profile" in err and "lacks" not in err
    assert not (tmp_path / "m.json").exists()


def test_merge_names_the_first_differing_model_key_briefly():
    profile = json.loads(CALIBRATION.read_text())
    other = copy.deepcopy(profile)
    other["model"]["params"]["hidden_dim"] = 2048
    with pytest.raises(ScenarioError) as error:
        merge_profiles([profile, other], ["a.json", "b.json"])
    message = str(error.value)
    assert message.startswith("b.json: model.params.hidden_dim: 2048 differs from a.json's 1024;"), message
    assert "{" not in message and "\n" not in message
    other = copy.deepcopy(profile)
    other["model"]["layer_names"] = other["model"]["layer_names"][:-1]
    with pytest.raises(ScenarioError, match=r"b\.json: model\.layer_names: 6 items differs from a\.json's 7 items"):
        merge_profiles([profile, other], ["a.json", "b.json"])
