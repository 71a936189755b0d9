"""The command line's home, `ghpsim/`: every command is listed, parsing loads no heavy library, a
command's module loads only when it runs, and the simulator's commands run without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ghpsim import arguments
from ghpsim.cli import COMMANDS, load, main

ROOT = Path(__file__).resolve().parent.parent
EVERY_COMMAND = ("demo", "simulate", "compare", "list", "rank", "report", "sweep", "schedule", "search", "gallery",
                 "partition", "merge-profiles", "fit", "calibrate", "validate", "import-model")
HEAVY = ("torch", "pandas", "numpy", "networkx", "simpy", "matplotlib", "pydantic", "simulator", "validator")

HIDE_TORCH = """
import sys

class HideTorch:
    '''torch and its submodules cannot be imported, as on a machine without torch.'''
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, HideTorch)
from ghpsim.cli import main
code = main(sys.argv[1:])
assert "torch" not in sys.modules
sys.exit(code)
"""


def run_python(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def help_text(capsys, *argv: str) -> str:
    """`ghpsim ARGV --help` in-process, its whitespace collapsed (argparse wraps lines)."""
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def listed_commands(text: str) -> list[str]:
    return [name for name in EVERY_COMMAND if f" {name} " in f" {text} "]


# ----------------------------------------------------------------------------- every command, one home

def test_the_dispatch_table_has_every_command_and_each_target_exists():
    assert tuple(COMMANDS) == EVERY_COMMAND
    for name, (target, _help, _add_arguments) in COMMANDS.items():
        assert callable(load(target)), name  # the validator's modules import torch inside the commands only


def test_help_lists_every_command(capsys):
    assert listed_commands(help_text(capsys)) == list(EVERY_COMMAND)


def test_python_dash_m_ghpsim_help_lists_every_command():
    done = run_python("-m", "ghpsim", "--help")
    assert done.returncode == 0, done.stderr
    assert listed_commands(" ".join(done.stdout.split())) == list(EVERY_COMMAND)


def test_the_console_script_is_ghpsim_cli_main():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"ghpsim": "ghpsim.cli:main"}
    assert "ghpsim*" in project["tool"]["setuptools"]["packages"]["find"]["include"]


@pytest.mark.skipif(shutil.which("ghpsim") is None, reason="the package is not installed (no ghpsim on PATH)")
def test_the_installed_ghpsim_help_lists_every_command():
    done = subprocess.run(["ghpsim", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr + " (reinstall: pip install -e .)"
    assert listed_commands(" ".join(done.stdout.split())) == list(EVERY_COMMAND)


# ----------------------------------------------------------------------------- light parsing

def test_importing_the_cli_and_building_its_parser_imports_no_heavy_library():
    done = run_python("-c", "import json, sys, ghpsim.cli; ghpsim.cli.build_parser(); "
                            "print(json.dumps(sorted(sys.modules)))")
    assert done.returncode == 0, done.stderr
    loaded = {name.partition(".")[0] for name in json.loads(done.stdout)}
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_help_of_every_command_imports_no_heavy_library():
    script = ("import json, sys\nfrom ghpsim.cli import COMMANDS, main\nfor name in COMMANDS:\n"
              "    try:\n        main([name, '--help'])\n    except SystemExit:\n        pass\n"
              "print(json.dumps(sorted(sys.modules)), file=sys.stderr)")
    done = run_python("-c", script)
    assert done.returncode == 0, done.stderr
    loaded = {name.partition(".")[0] for name in json.loads(done.stderr)}
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


# ----------------------------------------------------------------------------- without torch

def test_demo_runs_without_torch():
    done = run_python("-c", HIDE_TORCH, "demo")
    assert done.returncode == 0, done.stderr
    assert sum("(G=" in line for line in done.stdout.splitlines()) == 3


def test_simulate_json_runs_without_torch():
    done = run_python("-c", HIDE_TORCH, "simulate", "scenarios/demo.yaml", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["step_time_s"] > 0


def test_a_validator_command_without_torch_is_one_line_exit_2(tmp_path):
    done = run_python("-c", HIDE_TORCH, "validate", "scenarios/validation/mlp_cpu.yaml",
                      "--profile", str(tmp_path / "p.json"), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "validate needs torch" in done.stderr
    assert "Traceback" not in done.stderr


# ----------------------------------------------------------------------------- help texts

def test_validate_warmup_and_calibrate_repeats_have_help(capsys):
    assert "--warmup WARMUP untimed training steps before the measured ones, in every launch (default 3)" \
        in help_text(capsys, "validate")
    assert f"their median (default {arguments.CALIBRATE_REPEATS};" in help_text(capsys, "calibrate")


def test_the_copied_names_and_defaults_match_their_sources(capsys):
    """ghpsim.arguments copies a few names so that parsing imports no simulator: they must agree."""
    from simulator.planner import MICROBATCH_COUNTS
    from simulator.report.gallery import ENTRIES
    from simulator.report.inputs import KINDS_HELP
    from simulator.scenario import PIPELINE_KINDS
    from simulator.schedules import SCHEDULES
    from simulator.sweep.export import CSV_NAME, PARQUET_NAME, parquet_engine
    from simulator.sweep.store import STORE_NAME

    assert arguments.PIPELINE_KINDS == PIPELINE_KINDS == tuple(SCHEDULES)
    assert arguments.REPORT_KINDS_HELP == KINDS_HELP
    assert arguments.MICROBATCH_COUNTS == MICROBATCH_COUNTS
    assert (arguments.SWEEP_STORE_NAME, arguments.SWEEP_CSV_NAME, arguments.SWEEP_PARQUET_NAME) == \
        (STORE_NAME, CSV_NAME, PARQUET_NAME)
    assert arguments.GALLERY_ENTRIES == tuple(ENTRIES)
    engine = parquet_engine()
    assert (f"(engine: {engine})" if engine else "neither is now") in help_text(capsys, "sweep")


def test_the_copied_calibration_defaults_match_the_validator():
    pytest.importorskip("torch")
    from validator.calibrate import DEFAULT_REPEATS
    from validator.layer_passes import DEFAULT_LAYER_PASSES

    assert (arguments.CALIBRATE_REPEATS, arguments.CALIBRATE_LAYER_PASSES) == (DEFAULT_REPEATS, DEFAULT_LAYER_PASSES)
