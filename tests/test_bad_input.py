"""Bad input: exit code 2, exactly one line on stderr naming the file, the field and the value,
and no traceback."""

from __future__ import annotations

import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import yaml

from ghpsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "scenarios" / "small_fast_dp_wins.yaml")

BASE = {
    "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "V100"},
    "model": {"name": "resnet20"},
    "strategy": {"kind": "dp"},
    "training": {"global_batch_size": 64},
}

TWO_LAYERS = [
    {"name": "a", "forward_flops_per_sample": 1000, "num_params": 10,
     "input_elements_per_sample": 10, "output_elements_per_sample": 10},
    {"name": "b", "forward_flops_per_sample": 1000, "num_params": 10,
     "input_elements_per_sample": 10, "output_elements_per_sample": 10},
]


def run_cli(capsys, *argv):
    """main(argv) in-process -> (exit code, stdout, stderr); an escaping exception is what the
    real command would print as a traceback, so it is reported as one (exit code 1)."""
    try:
        code = main([str(arg) for arg in argv])
    except SystemExit as error:
        code = error.code
    except Exception:  # noqa: BLE001 - this is the bug being detected
        captured = capsys.readouterr()
        return 1, captured.out, captured.err + traceback.format_exc()
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(result, *needles):
    code, _out, err = result
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert str(needle) in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def write_scenario(tmp_path, data=None, name="scenario.yaml", text=None, **sections):
    """A scenario file: BASE with `sections` replaced (a None value drops the section)."""
    path = tmp_path / name
    if text is None:
        raw = {key: dict(value) for key, value in (data or BASE).items()}
        for key, value in sections.items():
            if value is None:
                raw.pop(key, None)
            else:
                raw[key] = value
        text = yaml.safe_dump(raw, sort_keys=False)
    path.write_text(text)
    return path


def simulate_file(capsys, path, *extra):
    return run_cli(capsys, "simulate", path, *extra)


# ----------------------------------------------------------------------------- schema errors

def test_unknown_top_level_key(capsys, tmp_path):
    path = write_scenario(tmp_path, frobnicate=1)
    assert_one_line_error(simulate_file(capsys, path), path, "frobnicate", "unknown key")


def test_unknown_nested_key(capsys, tmp_path):
    path = write_scenario(tmp_path, cluster={"num_nodes": 1, "gpu_per_node": 8})
    assert_one_line_error(simulate_file(capsys, path), path, "cluster.gpu_per_node", "unknown key")


def test_a_misspelt_required_key_is_named_with_the_field_it_leaves_missing(capsys, tmp_path):
    path = write_scenario(tmp_path, model=None, modle=dict(BASE["model"]))
    assert_one_line_error(simulate_file(capsys, path), path, "modle: unknown key (model: missing required field)")
    path = write_scenario(tmp_path, model=None, name="two.yaml")  # missing alone: said as before
    assert_one_line_error(simulate_file(capsys, path), path, "model: missing required field")


def test_unknown_key_in_inline_gpu_spec(capsys, tmp_path):
    gpu = {"peak_flops_per_s": {"fp32": "10 TFLOP/s"}, "memory_bytes": "16 GiB",
           "memory_bandwidth_bytes_per_s": "900 GB/s", "colour": "green"}
    path = write_scenario(tmp_path, cluster={"gpu": gpu})
    assert_one_line_error(simulate_file(capsys, path), path, "cluster.gpu.colour")


def test_missing_field(capsys, tmp_path):
    path = write_scenario(tmp_path, training={"dtype": "fp32"})
    assert_one_line_error(simulate_file(capsys, path), path, "training.global_batch_size", "missing")


def test_missing_section(capsys, tmp_path):
    path = write_scenario(tmp_path, model=None)
    assert_one_line_error(simulate_file(capsys, path), path, "model", "missing")


def test_wrong_type(capsys, tmp_path):
    path = write_scenario(tmp_path, cluster={"num_nodes": "four"})
    assert_one_line_error(simulate_file(capsys, path), path, "cluster.num_nodes", "'four'")


@pytest.mark.parametrize("section, field, value", [
    ("cluster", "num_nodes", 0),
    ("cluster", "gpus_per_node", 0),
    ("training", "global_batch_size", -1),
])
def test_non_positive_size(capsys, tmp_path, section, field, value):
    path = write_scenario(tmp_path, **{section: {**BASE[section], field: value}})
    assert_one_line_error(simulate_file(capsys, path), path, f"{section}.{field}", f"got {value}")


def test_non_positive_bandwidth(capsys, tmp_path):
    link = {"latency_s": "2 us", "bandwidth_bytes_per_s": 0}
    path = write_scenario(tmp_path, cluster={"num_nodes": 2, "gpus_per_node": 4, "inter_node_link": link})
    assert_one_line_error(simulate_file(capsys, path), path,
                          "cluster.inter_node_link.bandwidth_bytes_per_s", "got 0")


def test_quantity_with_a_wrong_unit(capsys, tmp_path):
    link = {"latency_s": "2 us", "bandwidth_bytes_per_s": "25 GB"}
    path = write_scenario(tmp_path, cluster={"intra_node_link": link})
    assert_one_line_error(simulate_file(capsys, path), path,
                          "cluster.intra_node_link.bandwidth_bytes_per_s", "25 GB")


def test_groups_do_not_divide_gpus(capsys, tmp_path):
    path = write_scenario(tmp_path, strategy={"kind": "ghp", "num_groups": 3})
    assert_one_line_error(simulate_file(capsys, path), path, "strategy.num_groups", "3", "8")


def test_ghp_without_num_groups(capsys, tmp_path):
    path = write_scenario(tmp_path, strategy={"kind": "ghp"})
    assert_one_line_error(simulate_file(capsys, path), path, "strategy.num_groups")


def test_placement_not_a_permutation(capsys, tmp_path):
    path = write_scenario(tmp_path, strategy={"kind": "dp", "placement": [0, 1, 2]})
    assert_one_line_error(simulate_file(capsys, path), path, "strategy.placement", "[0, 1, 2]")


def _mp_on_two_layers(tmp_path):
    return write_scenario(tmp_path, cluster={"num_nodes": 1, "gpus_per_node": 4},
                          model={"layers": TWO_LAYERS}, strategy={"kind": "mp"})


def test_more_workers_per_group_than_layers(capsys, tmp_path):
    path = _mp_on_two_layers(tmp_path)
    assert_one_line_error(simulate_file(capsys, path), "strategy", "4", "2 layers")


def test_more_workers_per_group_than_layers_names_the_file(capsys, tmp_path):
    path = _mp_on_two_layers(tmp_path)
    assert_one_line_error(simulate_file(capsys, path), path)


def test_unknown_gpu_preset_suggests_nearest(capsys, tmp_path):
    path = write_scenario(tmp_path, cluster={"gpu": "A100-80G"})
    assert_one_line_error(simulate_file(capsys, path), path, "cluster.gpu", "'A100-80G'", "A100-80GB")


def test_unknown_link_preset(capsys, tmp_path):
    path = write_scenario(tmp_path, cluster={"num_nodes": 2, "inter_node_link": "ib-hdrr"})
    assert_one_line_error(simulate_file(capsys, path), path, "cluster.inter_node_link", "'ib-hdrr'", "ib-hdr")


def test_unknown_model_suggests_nearest(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"name": "resnet5"})
    assert_one_line_error(simulate_file(capsys, path), "model.name", "'resnet5'", "resnet50")


def test_unknown_model_names_the_file(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"name": "resnet5"})
    assert_one_line_error(simulate_file(capsys, path), path)


def test_model_with_two_sources(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"name": "resnet20", "file": "x.yaml"})
    assert_one_line_error(simulate_file(capsys, path), path, "model", "exactly one")


def test_bad_model_params(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"name": "resnet20", "params": {"depth": 7}})
    assert_one_line_error(simulate_file(capsys, path), "model.params", "depth")


# ----------------------------------------------------------------------------- files

def test_malformed_yaml(capsys, tmp_path):
    path = write_scenario(tmp_path, text="cluster: {num_nodes: 1\nmodel: [\n")
    assert_one_line_error(simulate_file(capsys, path), path, "malformed YAML", "line 2")


def test_missing_scenario_file(capsys, tmp_path):
    path = tmp_path / "nowhere.yaml"
    assert_one_line_error(simulate_file(capsys, path), path, "not found")


def test_scenario_file_is_a_directory(capsys, tmp_path):
    assert_one_line_error(simulate_file(capsys, tmp_path), tmp_path)


def test_missing_model_file(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"file": "layers/nope.yaml"})
    assert_one_line_error(simulate_file(capsys, path), "model.file", "nope.yaml", "not found")


def test_missing_model_file_names_the_scenario_file(capsys, tmp_path):
    path = write_scenario(tmp_path, model={"file": "layers/nope.yaml"})
    assert_one_line_error(simulate_file(capsys, path), path)


def test_bad_row_in_layer_table_file(capsys, tmp_path):
    rows = [dict(TWO_LAYERS[0]), {**TWO_LAYERS[1], "num_params": -5}]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"layers": rows}))
    path = write_scenario(tmp_path, model={"file": "t.yaml"}, cluster={"num_nodes": 1})
    assert_one_line_error(simulate_file(capsys, path), "t.yaml", "num_params", "-5")


def test_top_level_list(capsys, tmp_path):
    path = write_scenario(tmp_path, text="- cluster\n- model\n")
    assert_one_line_error(simulate_file(capsys, path), path, "list")


def test_empty_file(capsys, tmp_path):
    path = write_scenario(tmp_path, text="")
    assert_one_line_error(simulate_file(capsys, path), path)


def test_non_utf8_scenario_file(capsys, tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_bytes(b"name: \"\xff\xfe\"\nmodel: {name: resnet20}\ntraining: {global_batch_size: 8}\n")
    assert_one_line_error(simulate_file(capsys, path), path)


def test_empty_csv_layer_table(capsys, tmp_path):
    (tmp_path / "t.csv").write_text("")
    path = write_scenario(tmp_path, model={"file": "t.csv"}, cluster={"num_nodes": 1})
    assert_one_line_error(simulate_file(capsys, path), "t.csv")


CSV_HEADER = "name,kind,forward_flops_per_sample,num_params,input_elements_per_sample,output_elements_per_sample\n"
CSV_ROWS = ["a,linear,1000,10,10,10\n", "b,linear,1000,10,10,10\n", "c,linear,1000,10,10,10\n"]


@pytest.mark.parametrize("row, bad, needles", [
    (2, "c,linear,1000,abc,10,10\n", ("layers row 2: num_params", "expected a number, not text")),
    (1, "b,linear,nan,10,10,10\n", ("layers row 1: forward_flops_per_sample: nan is not a finite number",)),
    (2, "c,linear,-inf,10,10,10\n", ("layers row 2: forward_flops_per_sample: -inf is not a finite number",)),
    (0, "a,linear,2000000,1000,10,10,10\n", ("layers row 0: 7 fields where the header has 6",)),
    (1, "b,linear,1000,10,10,10,5\n", ("layers row 1: 7 fields where the header has 6",)),
])
def test_a_bad_csv_layer_table_cell_names_its_own_row_and_column(capsys, tmp_path, row, bad, needles):
    rows = [*CSV_ROWS]
    rows[row] = bad
    (tmp_path / "t.csv").write_text(CSV_HEADER + "".join(rows))
    path = write_scenario(tmp_path, model={"file": "t.csv"}, cluster={"num_nodes": 1})
    line = assert_one_line_error(simulate_file(capsys, path), "t.csv", *needles)
    assert "abc" not in line.replace(str(tmp_path), "") and "Field required" not in line and "kind:" not in line


def test_inline_gpu_without_the_training_dtype(capsys, tmp_path):
    gpu = {"peak_flops_per_s": {"fp32": "10 TFLOP/s"}, "memory_bytes": "16 GiB",
           "memory_bandwidth_bytes_per_s": "900 GB/s"}
    path = write_scenario(tmp_path, cluster={"gpu": gpu}, training={"global_batch_size": 8, "dtype": "bf16"})
    assert_one_line_error(simulate_file(capsys, path), path, "bf16")


# ----------------------------------------------------------------------------- command-line options

@pytest.mark.parametrize("assignment, needle", [
    ("cluster.num_nodes", "expected key.path=value"),
    ("=4", "empty key"),
    ("cluster.num_nodes.x=1", "not a section"),
])
def test_bad_set_syntax(capsys, assignment, needle):
    assert_one_line_error(run_cli(capsys, "simulate", SMALL, "--set", assignment), SMALL, "--set", needle)


def test_set_with_an_invalid_value(capsys):
    assert_one_line_error(run_cli(capsys, "simulate", SMALL, "--set", "cluster.num_nodes=0"),
                          SMALL, "cluster.num_nodes", "got 0")


@pytest.mark.parametrize("strategies, bad", [("dp,xx", "'xx'"), ("dp,ghp:x", "'ghp:x'"),
                                             ("mp:2", "'mp:2'"), ("ghp:0", "'ghp:0'")])
def test_unknown_strategies_entry(capsys, strategies, bad):
    assert_one_line_error(run_cli(capsys, "compare", SMALL, "--strategies", strategies), "--strategies", bad)


def test_empty_strategies(capsys):
    assert_one_line_error(run_cli(capsys, "compare", SMALL, "--strategies", ","), "--strategies")


# ----------------------------------------------------------------------------- no partial output

def test_trace_not_written_when_the_scenario_is_invalid(capsys, tmp_path):
    path = write_scenario(tmp_path, cluster={"num_nodes": 0})
    out = tmp_path / "out.json"
    assert_one_line_error(simulate_file(capsys, path, "--trace", out), path, "cluster.num_nodes")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario.yaml"]


def test_trace_not_written_when_the_plan_fails(capsys, tmp_path):
    path = _mp_on_two_layers(tmp_path)
    out = tmp_path / "out.json"
    assert_one_line_error(simulate_file(capsys, path, "--trace", out), "strategy")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario.yaml"]


# ----------------------------------------------------------------------------- end to end

def test_subprocess_bad_input_one_line_exit_2(tmp_path):
    path = write_scenario(tmp_path, cluster={"num_nodes": "four"})
    done = subprocess.run([sys.executable, "-m", "ghpsim", "simulate", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip("\n").splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "cluster.num_nodes" in lines[0]
    assert done.stdout == ""


def test_a_placement_of_the_wrong_length_says_why_before_any_long_list(capsys):
    path = Path(__file__).resolve().parents[1] / "scenarios" / "mixtral_8x7b_ep_h100.yaml"
    code, _out, err = run_cli(capsys, "simulate", path, "--set", "cluster.num_nodes=16")
    assert code == 2 and err.endswith("strategy.placement: a list of 64 devices is not a permutation of the "
                                      "128 device indices 0..127\n"), err
