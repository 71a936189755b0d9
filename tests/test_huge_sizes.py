"""Huge model sizes: refused up front with one line naming the field and the value (exit 2), never a
MemoryError traceback; and the CLI's last line of defence turns a MemoryError into one line.

Every command runs in a subprocess whose address space is capped (`resource.RLIMIT_AS`, 2 GiB), so a
regression fails the test with a MemoryError instead of eating the (shared) machine's memory."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import yaml

from simulator.limits import MAX_PARAMS

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "scenarios" / "demo.yaml")
LLAMA_SCENARIO = ROOT / "scenarios" / "llama3_8b_dgx_h100.yaml"
LLAMA_CONFIG = ROOT / "scenarios" / "models" / "llama3_8b_config.json"
MEMORY_CAP_BYTES = 2 * 2**30


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def run_capped(*argv: str, code: str | None = None) -> subprocess.CompletedProcess:
    """`python -m ghpsim ARGV` (or `python -c CODE ARGV`) with at most MEMORY_CAP_BYTES of memory."""
    command = [sys.executable, "-c", code, *argv] if code else [sys.executable, "-m", "ghpsim", *argv]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          preexec_fn=_cap_memory)


def assert_one_line(done: subprocess.CompletedProcess, *needles: str) -> str:
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip("\n").splitlines()
    assert len(lines) == 1, done.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert done.stdout == ""
    return lines[0]


def hf_scenario(tmp_path: Path, **config_changes) -> Path:
    """The LLaMA-3 8B scenario reading a copy of its config.json with `config_changes`."""
    config = {**json.loads(LLAMA_CONFIG.read_text()), **config_changes}
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    scenario = yaml.safe_load(LLAMA_SCENARIO.read_text())
    scenario["model"] = {"hf_config": "cfg.json"}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def test_mlp_hidden_dim_of_a_billion_is_refused_in_one_line():
    line = assert_one_line(run_capped("simulate", DEMO, "--set", "model.name=mlp",
                                      "--set", "model.params.hidden_dim=1000000000"),
                           "demo.yaml", "model.params.hidden_dim=1000000000", "parameters", f"{MAX_PARAMS:.0e}")
    assert "ran out of memory" not in line


def test_hf_config_hidden_size_of_a_billion_is_refused_in_one_line(tmp_path):
    path = hf_scenario(tmp_path, hidden_size=1_000_000_000)
    assert_one_line(run_capped("simulate", str(path)), str(path), "cfg.json", "hidden_size=1000000000",
                    "parameters")


def test_hf_config_hidden_size_1e9_names_the_value(tmp_path):
    path = hf_scenario(tmp_path, hidden_size=1e9)  # a JSON float: not a size
    assert_one_line(run_capped("simulate", str(path)), "hidden_size", "positive integer", "1000000000.0")


def test_huge_layer_table_row_is_refused_naming_the_row(tmp_path):
    rows = [{"name": f"l{i}", "forward_flops_per_sample": 1e6, "num_params": 2**52,
             "input_elements_per_sample": 10, "output_elements_per_sample": 10} for i in range(3)]
    rows[1]["num_params"] = 2**53
    (tmp_path / "table.yaml").write_text(yaml.safe_dump(rows))
    scenario = yaml.safe_load(Path(DEMO).read_text())
    scenario["model"] = {"file": "table.yaml"}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    assert_one_line(run_capped("simulate", str(path)), "table.yaml", "layers row 1", f"num_params={2**53}")


def test_search_refuses_a_huge_model_too():
    assert_one_line(run_capped("search", DEMO, "--set", "model.name=mlp", "--set",
                               "model.params.hidden_dim=1000000000"), "model.params.hidden_dim=1000000000")


def test_model_just_under_the_bound_simulates_within_the_cap():
    """~1.9e14 parameters, the whole model on every rank (dp) with fp16 Adam, the most the optimizer
    step materialises: fits in the 2 GiB cap (0.7 GB measured)."""
    done = run_capped("simulate", DEMO, "--json", "--set", "model.name=mlp", "--set", "model.params.hidden_dim=8000000",
                      "--set", "strategy.kind=dp", "--set", "training.dtype=fp16", "--set", "training.optimizer=adam")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["step_time_s"] > 0


OUT_OF_MEMORY = """
import importlib
import sys
from ghpsim.cli import main

def hog(*args, **kwargs):
    return [bytearray(2**28) for _ in range(64)]  # 16 GiB: past the cap

importlib.import_module("simulator.simulate").resolve_workload = hog  # the module, not the function
sys.exit(main(["simulate", sys.argv[1]]))
"""


def test_cli_turns_a_real_memory_error_into_one_line():
    line = assert_one_line(run_capped(DEMO, code=OUT_OF_MEMORY), "ghpsim: error: ran out of memory",
                           "ghpsim simulate", "demo.yaml")
    assert line.startswith("ghpsim: error:")


def test_main_reports_memory_error_of_any_command(monkeypatch, capsys):
    import simulator.pase.cli
    from ghpsim.cli import main

    def exhausted(args):
        raise MemoryError

    monkeypatch.setattr(simulator.pase.cli, "run", exhausted)
    assert main(["search", DEMO]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ran out of memory running `ghpsim search` on " in err and DEMO in err
