"""Hostile scenario input (issue 75, items 1-5 and 9): deep nesting, alias bombs, long or
control-character messages, huge sizes, numeric extremes, text numbers, duplicate keys and file
paths each end in one line of at most 300 characters on stderr with exit code 2, at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from ghpsim.cli import main
from simulator.errors import MAX_MESSAGE_CHARS, ScenarioError, one_line
from simulator.limits import MAX_FAT_TREE_K, MAX_GPUS, MAX_LAYERS
from simulator.scenario import load_scenario, scenario_from_dict
from simulator.yaml_loading import StrictLoader, load_yaml_text

ROOT = Path(__file__).resolve().parent.parent
BASE = "model: {name: mlp}\ntraining: {global_batch_size: 8}\n"


def bomb(levels: int = 9) -> str:
    """A "billion laughs": 9^levels values from a few hundred bytes of YAML."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def run(capsys, tmp_path, text: str, *extra: str, name: str = "s.yaml") -> tuple[int, str, str]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code = main(["simulate", str(path), "--json", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(result, *needles: str) -> str:
    code, _out, err = result
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, (code, err[:3000])
    line = lines[0]
    assert line.startswith("ghpsim: error: ") and len(line) <= MAX_MESSAGE_CHARS and line.isprintable(), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


# ----------------------------------------------------------------------------- 1. nesting, 2. aliases

def test_deep_nesting_is_one_line_not_a_recursion_error(capsys, tmp_path):
    one_error_line(run(capsys, tmp_path, "[" * 500 + "]" * 500), "nested more than 32 levels deep")


def test_deep_nesting_from_the_command_line_is_one_line(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("[" * 500 + "]" * 500)
    done = subprocess.run([sys.executable, "-m", "ghpsim", "simulate", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


def test_deep_set_value_is_one_line(capsys, tmp_path):
    one_error_line(run(capsys, tmp_path, BASE, "--set", "strategy.placement=" + "[" * 200 + "]" * 200),
                   "--set strategy.placement", "nested")


@pytest.mark.parametrize("field", ["strategy: {placement: *l8}", "model: {layers: *l8}"])
def test_alias_bomb_is_refused_before_validation(capsys, tmp_path, field):
    text = bomb() + "cluster: {num_nodes: 1}\ntraining: {global_batch_size: 8}\n" + field + "\n"
    if field.startswith("strategy"):
        text += "model: {name: mlp}\n"
    one_error_line(run(capsys, tmp_path, text), "more than 200000 values")


def test_recursive_alias_is_refused(capsys, tmp_path):
    one_error_line(run(capsys, tmp_path, BASE + "strategy: &s {placement: *s}\n"), "refers to itself")


def test_an_alias_used_a_few_times_still_loads(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("cluster: &c {num_nodes: 2, gpus_per_node: 2}\nmodel: {name: mlp}\n"
                    "training: {global_batch_size: 8}\nname: &n aliased\ndescription: *n\n")
    scenario = load_scenario(path)
    assert scenario.num_gpus == 4 and scenario.description == "aliased"


# ----------------------------------------------------------------------------- 3. long messages

def test_one_line_escapes_control_characters_and_cuts():
    assert one_line("a\nb\x1b[31mc\x00") == "a\\nb\\x1b[31mc\\x00"
    cut = one_line("x" * 10_000)
    assert len(cut) == MAX_MESSAGE_CHARS and cut.endswith("...")
    assert str(ScenarioError("bad\nkey")) == "bad\\nkey"


def test_unknown_key_with_control_characters_is_escaped(capsys, tmp_path):
    line = one_error_line(run(capsys, tmp_path, BASE + '"evil\\nkey\\e[2J\\a": 1\n'), "unknown key")
    assert "evil\\nkey\\x1b[2J\\x07" in line


def test_huge_value_in_an_error_is_cut(capsys, tmp_path):
    placement = json.dumps(list(range(50_000)))
    one_error_line(run(capsys, tmp_path, BASE + f"strategy: {{placement: {placement}}}\n"), "strategy.placement")


# ----------------------------------------------------------------------------- 4. sizes

@pytest.mark.parametrize("cluster, needle", [
    ({"num_nodes": 10**5}, "cluster.num_nodes"),
    ({"gpus_per_node": 2**63 - 1}, "cluster.gpus_per_node"),
    ({"num_nodes": 1024, "gpus_per_node": 1024}, "cluster.gpus_per_node"),
    ({"num_nodes": 8192, "nics_per_node": 4, "gpus_per_node": 2}, "cluster.nics_per_node"),
    ({"topology": "fat_tree", "fat_tree_k": 1_000_000}, "cluster.fat_tree_k"),
])
def test_huge_clusters_are_refused_at_load(capsys, tmp_path, cluster, needle):
    one_error_line(run(capsys, tmp_path, BASE + f"cluster: {json.dumps(cluster)}\n"), needle)


def test_bounds_are_documented():
    security = (ROOT / "SECURITY.md").read_text()
    for value in (MAX_GPUS, MAX_LAYERS, MAX_FAT_TREE_K):
        assert f"{value:,}" in security or str(value) in security, value


def test_a_gpt_of_10000_layers_is_refused_before_building(capsys, tmp_path):
    text = ("model: {name: gpt2-small, params: {num_layers: 10000}}\ntraining: {global_batch_size: 8}\n"
            "cluster: {num_nodes: 1, gpus_per_node: 4}\nstrategy: {kind: gpipe, num_microbatches: 4}\n")
    one_error_line(run(capsys, tmp_path, text), "model.params.num_layers", "10000", str(MAX_LAYERS))


def test_a_layer_table_file_of_too_many_rows_is_refused(capsys, tmp_path):
    row = {"name": "l", "forward_flops_per_sample": 1, "num_params": 1, "input_elements_per_sample": 1,
           "output_elements_per_sample": 1}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump([row] * (MAX_LAYERS + 1)))
    one_error_line(run(capsys, tmp_path, "model: {file: t.yaml}\ntraining: {global_batch_size: 8}\n"),
                   "model.file", f"{MAX_LAYERS + 1} layers")


def test_too_many_microbatches_are_refused(capsys, tmp_path):
    one_error_line(run(capsys, tmp_path, BASE + "strategy: {kind: gpipe, num_microbatches: 100000}\n"),
                   "strategy.num_microbatches")


# ----------------------------------------------------------------------------- 5. numbers

@pytest.mark.parametrize("factor", ["5.0e-324", "1e-300", "1e-9"])
def test_tiny_degraded_link_factors_are_refused(capsys, tmp_path, factor):
    text = BASE + "cluster: {num_nodes: 2}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's RuntimeWarnings would fail here
        one_error_line(run(capsys, tmp_path, text, "--set", f"cluster.degraded_links={{node0: {factor}}}"),
                       "cluster.degraded_links.node0")


def test_smallest_allowed_degraded_link_factor_gives_a_finite_step(capsys, tmp_path):
    text = BASE + "cluster: {num_nodes: 2}\n"
    code, out, err = run(capsys, tmp_path, text, "--set", "cluster.degraded_links={node0: 1e-6}")
    assert code == 0, err
    step_s = json.loads(out)["step_time_s"]
    assert 0 < step_s < 1e6


@pytest.mark.parametrize("value", ["'8'", '"8"', "0x10", "010", "0b11", "1:20", ".inf", ".nan", "true"])
def test_batch_size_must_be_a_plain_number(capsys, tmp_path, value):
    text = f"model: {{name: mlp}}\ntraining: {{global_batch_size: {value}}}\n"
    one_error_line(run(capsys, tmp_path, text), "training.global_batch_size")


@pytest.mark.parametrize("field, value", [("strategy.compression_density", "'0.5'"),
                                          ("cluster.stragglers", "{0: '2.0'}"),
                                          ("strategy.num_microbatches", "'4'")])
def test_text_numbers_are_refused_in_number_fields(capsys, tmp_path, field, value):
    one_error_line(run(capsys, tmp_path, BASE, "--set", f"{field}={value}"), field)


def test_yaml_numbers_are_yaml_1_2():
    data = yaml.load("a: 1e9\nb: 1_000\nc: 010\nd: 0x10\ne: -2.5\nf: .inf\ng: '8'\nh: 1:20\n", Loader=StrictLoader)
    assert data == {"a": 1e9, "b": 1000, "c": "010", "d": "0x10", "e": -2.5, "f": float("inf"), "g": "8", "h": "1:20"}


def test_duplicate_keys_are_refused(capsys, tmp_path):
    one_error_line(run(capsys, tmp_path, BASE + "training: {global_batch_size: 16}\n"), "key 'training' given twice")
    one_error_line(run(capsys, tmp_path, "model: {name: mlp, name: vgg16}\ntraining: {global_batch_size: 8}\n"),
                   "key 'name' given twice")


def test_yaml_merge_keys_still_override():
    data = load_yaml_text("base: &b {x: 1, y: 2}\nderived: {<<: *b, y: 3}\n", "t")
    assert data["derived"] == {"x": 1, "y": 3}


def test_existing_scenarios_still_load():
    """The hardened loader (no duplicate keys, YAML 1.2 numbers, bounded aliases and sizes) reads
    every committed scenario as PyYAML's plain safe loader does: the same validated scenario."""
    paths = sorted((ROOT / "scenarios").glob("*.yaml"))
    assert paths
    for path in paths:
        plain = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert load_scenario(path) == scenario_from_dict(plain, str(path), str(path.parent)), path.name


# ----------------------------------------------------------------------------- 9. paths

def test_model_file_errors_never_print_the_file_contents(capsys, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "creds.csv").write_text("user,password\nadmin,hunter2-SECRET\n")
    scenario = tmp_path / "scenarios"
    scenario.mkdir()
    line = one_error_line(run(capsys, scenario, "model: {file: ../secret/creds.csv}\n"
                                                "training: {global_batch_size: 8}\n"), "model.file", "layers row 0")
    for text in ("hunter2", "SECRET", "admin", "password", "user"):
        assert text not in line.replace(str(tmp_path), ""), line


def test_model_file_text_values_are_not_quoted(capsys, tmp_path):
    (tmp_path / "t.yaml").write_text(yaml.safe_dump([{"name": "l", "forward_flops_per_sample": "TOPSECRET",
                                                      "num_params": 1, "input_elements_per_sample": 1,
                                                      "output_elements_per_sample": 1}]))
    line = one_error_line(run(capsys, tmp_path, "model: {file: t.yaml}\ntraining: {global_batch_size: 8}\n"),
                          "layers row 0", "forward_flops_per_sample")
    assert "TOPSECRET" not in line


def test_topology_file_is_read_from_the_scenarios_folder(tmp_path):
    folder = tmp_path / "cluster"
    folder.mkdir()
    graph = {"directed": False, "multigraph": False, "graph": {}, "nodes": [{"id": "gpu0"}, {"id": "gpu1"},
                                                                           {"id": "sw"}],
             "links": [{"source": "gpu0", "target": "sw", "bandwidth": "10 GB/s", "latency": "1 us"},
                       {"source": "gpu1", "target": "sw", "bandwidth": "10 GB/s", "latency": "1 us"}]}
    (folder / "graph.json").write_text(json.dumps(graph))
    (folder / "s.yaml").write_text("cluster: {num_nodes: 2, gpus_per_node: 1, topology: graph_file, "
                                   "topology_file: graph.json}\n" + BASE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "ghpsim", "simulate", str(folder / "s.yaml"), "--json"],
                          cwd=elsewhere, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["step_time_s"] > 0


def test_oversized_files_are_refused_unread(capsys, tmp_path):
    big = tmp_path / "big.yaml"
    with big.open("w") as stream:
        stream.write("# " + "x" * (17 * 2**20) + "\n")
    code = main(["simulate", str(big)])
    err = capsys.readouterr().err
    assert code == 2 and "bytes" in err and err.count("\n") == 1


def test_import_model_says_it_runs_the_users_code(tmp_path, capsys):
    """Issue item 9: import-model executes user code; the user is told before it runs."""
    pytest.importorskip("torch")
    out = tmp_path / "mlp.yaml"
    assert main(["import-model", "tests.byo_models:tiny_mlp", "--input-shape", "32", "--out", str(out)]) == 0
    assert "runs its code with your permissions" in capsys.readouterr().out  # stderr is for errors only
    assert out.exists()
    assert main(["import-model", "tests.byo_models:tiny_mlp", "--input-shape", "32", "--out", str(out), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["out"] == str(out) and written["layers"] == len(yaml.safe_load(out.read_text())["layers"]) > 0


@pytest.mark.parametrize("flags, named", [
    (["--input-shape", "99999999999999999999"], "input_shape [99999999999999999999] holds 1e+20 elements"),
    (["--input-shape", "32,99999,99999,99999"], "input_shape [32, 99999, 99999, 99999] holds 3.2e+16"),
    (["--input-shape", "32", "--name", "a" * 10_001], "--name: 'aaaa"),
    (["--input-shape", "32", "--name", "a\nb"], "--name: 'a\\nb' (3 characters) must be printable"),
])
def test_import_model_refuses_a_shape_torch_cannot_hold_and_a_name_its_table_could_not_be_read_with(
        tmp_path, capsys, flags, named):
    pytest.importorskip("torch")
    out = tmp_path / "mlp.yaml"
    assert main(["import-model", "tests.byo_models:tiny_mlp", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ghpsim: error:") and named in err and err.count("\n") == 1
    assert not out.exists()


# ----------------------------------------------------------------------------- stragglers, switches, model params

@pytest.mark.parametrize("factor", ["0.05", "0.999"])
def test_a_straggler_factor_below_one_is_refused(capsys, tmp_path, factor):
    text = BASE + "cluster: {gpus_per_node: 2}\n"
    one_error_line(run(capsys, tmp_path, text, "--set", f"cluster.stragglers={{1: {factor}}}"),
                   "cluster.stragglers.1:", "slowdown", f"(got {factor})")


def test_a_straggler_factor_of_one_is_full_speed(capsys, tmp_path):
    text = BASE + "cluster: {gpus_per_node: 2}\n"
    code, out, err = run(capsys, tmp_path, text, "--set", "cluster.stragglers={1: 1}")
    code_plain, out_plain, _ = run(capsys, tmp_path, text)
    assert code == code_plain == 0, err
    assert json.loads(out)["step_time_s"] == json.loads(out_plain)["step_time_s"]


@pytest.mark.parametrize("field, value", [("costs.flash_attention", "1"), ("costs.flash_attention", "'yes'"),
                                          ("training.offload_activations", "0"),
                                          ("strategy.sequence_parallel", "'true'")])
def test_switches_take_true_or_false_only(capsys, tmp_path, field, value):
    one_error_line(run(capsys, tmp_path, BASE, "--set", f"{field}={value}"), f"{field}: expected true or false")


def test_switches_still_take_true_and_false(capsys, tmp_path):
    for value in ("true", "false"):
        code, _out, err = run(capsys, tmp_path, BASE, "--set", f"costs.flash_attention={value}")
        assert code == 0, err
    scenario = load_scenario({"model": {"name": "mlp"}, "training": {"global_batch_size": 8},
                              "costs": {"flash_attention": True}, "strategy": {"overlap_backward": False}})
    assert scenario.costs.flash_attention is True and scenario.strategy.overlap_backward is False


@pytest.mark.parametrize("model, key, value", [("gpt2-1.5b", "seq_len", "1024.5"), ("gpt2-1.5b", "num_layers", "12.5"),
                                               ("resnet50", "image_size", "224.5"),
                                               ("resnet50", "num_classes", "10.5"),
                                               ("mixtral-8x7b", "top_k", "1.5")])
def test_a_fraction_for_a_whole_number_model_parameter_is_refused(capsys, tmp_path, model, key, value):
    text = f"model: {{name: {model}}}\ntraining: {{global_batch_size: 8}}\n"
    line = one_error_line(run(capsys, tmp_path, text, "--set", f"model.params.{key}={value}"))
    assert line.endswith(f"model.params.{key}: {value} is not a whole number")


@pytest.mark.parametrize("model, key, value, message", [
    ("gpt2-1.5b", "seq_len", "0", "model.params.seq_len 0 must be at least 1"),
    ("mlp", "num_hidden_layers", "-1", "model.params.num_hidden_layers -1 must be at least 0"),
    ("llama2-7b", "num_kv_heads", "-2", "model.params.num_kv_heads -2 must be at least 1"),
    ("mixtral-8x7b", "top_k", "0", "model.params.top_k 0 must be at least 1"),
    ("gpt2-1.5b", "num_heads", "7", "model.params.hidden_size 1600 not divisible by model.params.num_heads 7")])
def test_a_model_dimension_out_of_range_is_named_with_its_value(capsys, tmp_path, model, key, value, message):
    text = f"model: {{name: {model}}}\ntraining: {{global_batch_size: 8}}\n"
    assert one_error_line(run(capsys, tmp_path, text, "--set", f"model.params.{key}={value}")).endswith(message)


def test_a_whole_float_model_parameter_is_its_integer():
    from simulator.model_source import resolve_workload
    from simulator.scenario import ModelConfig
    as_float = resolve_workload(ModelConfig(name="gpt2-small", params={"num_layers": 2.0, "seq_len": 1e3}))
    as_int = resolve_workload(ModelConfig(name="gpt2-small", params={"num_layers": 2, "seq_len": 1000}))
    assert as_float.layers == as_int.layers and as_float.num_layers == 4


def test_width_multiplier_and_capacity_factor_still_take_fractions():
    from simulator.model_source import resolve_workload
    from simulator.scenario import ModelConfig
    narrow = resolve_workload(ModelConfig(name="resnet20", params={"width_multiplier": 0.5}))
    assert narrow.num_params < resolve_workload(ModelConfig(name="resnet20")).num_params
    padded = resolve_workload(ModelConfig(name="mixtral-8x7b", params={"capacity_factor": 1.25, "num_layers": 1}))
    assert padded.layers[1].spec["capacity_factor"] == 1.25


def test_an_unknown_model_parameter_names_the_model_s_parameters(capsys, tmp_path):
    text = "model: {name: vgg16}\ntraining: {global_batch_size: 8}\n"
    line = one_error_line(run(capsys, tmp_path, text, "--set", "model.params.seq_len=1024"))
    assert line.endswith("model.params.seq_len: not a parameter of vgg16 (its parameters: "
                         "width_multiplier, image_size, num_classes)")
    text = "model: {name: gpt2-small}\ntraining: {global_batch_size: 8}\n"  # a factory forwarding **overrides
    one_error_line(run(capsys, tmp_path, text, "--set", "model.params.image_size=32"),
                   "model.params.image_size: not a parameter of gpt2-small (its parameters: num_layers, ")
