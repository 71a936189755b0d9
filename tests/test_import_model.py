"""`validator.import_model`: a torch nn.Module factory -> a layer table the simulator loads.

The factories live in `tests/byo_models.py`. The tables are checked against the real modules
(parameter counts, shapes, GEMM FLOPs by hand), written with `yaml.safe_dump`, loaded with
`simulator.model_source.load_layer_table` and simulated through `model: {file: ...}`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.model_source import load_layer_table
from simulator.workload import LAYER_TABLE_COLUMNS
from tests import byo_models
from validator.import_model import import_model

MLP = "tests.byo_models:tiny_mlp"


def write_table(tmp_path, document) -> str:
    path = tmp_path / f"{document['name']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def test_sequential_mlp_rows():
    document = import_model(MLP, (32,))
    assert document["name"] == "tiny_mlp"
    assert document["input_spec"]["shape"] == [32]
    rows = document["layers"]
    assert [row["name"] for row in rows] == ["linear0", "relu1", "linear2", "relu3", "linear4"]
    assert [row["kind"] for row in rows] == ["linear", "elementwise", "linear", "elementwise",
                                             "linear"]
    assert all(list(row) == list(LAYER_TABLE_COLUMNS) for row in rows)
    real = byo_models.tiny_mlp()
    assert sum(row["num_params"] for row in rows) == sum(p.numel() for p in real.parameters())
    assert [row["num_params"] for row in rows] == [32 * 64 + 64, 0, 64 * 64 + 64, 0, 64 * 10 + 10]
    assert [row["forward_flops_per_sample"] for row in rows] == [2 * 32 * 64, 64, 2 * 64 * 64,
                                                                 64, 2 * 64 * 10]
    assert [row["backward_flops_per_sample"] for row in rows] == [
        2 * 2 * 32 * 64, 64, 2 * 2 * 64 * 64, 64, 2 * 2 * 64 * 10]
    assert [(row["input_elements_per_sample"], row["output_elements_per_sample"]) for row in rows] \
        == [(32, 64), (64, 64), (64, 64), (64, 64), (64, 10)]
    assert all(row["saved_elements_per_sample"] == row["input_elements_per_sample"] for row in rows)


def test_factory_kwargs_and_name():
    document = import_model(MLP, (20,), name="custom", kwargs={"in_features": 20, "hidden": 8,
                                                               "num_classes": 3})
    assert document["name"] == "custom"
    assert sum(row["num_params"] for row in document["layers"]) == 20 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3


def test_table_loads_and_simulates(tmp_path):
    path = write_table(tmp_path, import_model(MLP, (32,)))
    workload = load_layer_table(Path(path))
    assert workload.name == "tiny_mlp" and workload.num_layers == 5
    assert workload.num_params == sum(p.numel() for p in byo_models.tiny_mlp().parameters())
    for kind in ("dp", "mp"):
        scenario = load_scenario({
            "cluster": {"num_nodes": 1, "gpus_per_node": 2},
            "model": {"file": path},
            "strategy": {"kind": kind},
            "training": {"global_batch_size": 8},
        })
        result = simulate(scenario)
        assert result.step_time_s > 0


def test_conv_net_with_functional_flatten(tmp_path):
    document = import_model("tests.byo_models:SmallConvNet", (3, 16, 16))
    features, classifier = document["layers"]
    assert features["name"] == "features" and features["kind"] == "conv"
    assert classifier["kind"] == "linear"
    conv = 2 * 3 * 9 * 8 * 16 * 16
    elementwise = 5 * 8 * 256 + 8 * 256 + 4 * 8 * 64  # BN, ReLU, 2x2 max pool
    assert features["forward_flops_per_sample"] == conv + elementwise
    assert classifier["forward_flops_per_sample"] == 2 * 512 * 10
    assert features["num_params"] == 3 * 9 * 8 + 8 + 2 * 8  # BN running stats are buffers
    assert (features["output_elements_per_sample"], classifier["input_elements_per_sample"]) \
        == (512, 512)
    load_layer_table(Path(write_table(tmp_path, document)))


def test_wrapper_is_unwrapped():
    rows = import_model("tests.byo_models:Wrapped", (32,))["layers"]
    assert [row["name"] for row in rows] == ["net.0", "net.1", "net.2", "net.3", "net.4"]


def test_token_model_module_list_and_tied_head(tmp_path):
    document = import_model("tests.byo_models:TinyLM", (12,))
    rows = {row["name"]: row for row in document["layers"]}
    assert list(rows) == ["embed", "blocks.0", "blocks.1", "head"]
    assert rows["embed"]["kind"] == "embedding" and rows["embed"]["input_elements_per_sample"] == 12
    assert rows["blocks.0"]["kind"] == "attention"
    real = byo_models.TinyLM()
    assert sum(row["num_params"] for row in rows.values()) == sum(p.numel() for p in real.parameters())
    head = rows["head"]
    assert head["num_params"] == 0  # tied to the embedding, counted there
    assert head["backward_flops_per_sample"] == 2 * head["forward_flops_per_sample"]
    assert head["forward_flops_per_sample"] == 2 * 12 * 16 * 50
    s, h, f, heads = 12, 16, 64, 2
    gemm = 2 * s * h * 3 * h + 2 * s * h * h + 4 * s * s * h + 4 * s * h * f  # QKV, out, QK^T+PV, MLP
    elementwise = 2 * 5 * s * h + 2 * s * h + s * f + 5 * heads * s * s  # LNs, adds, ReLU, softmax
    assert rows["blocks.0"]["forward_flops_per_sample"] == gemm + elementwise
    load_layer_table(Path(write_table(tmp_path, document)))


@pytest.mark.parametrize("target, fragment", [
    ("no_colon_here", "expected 'package.module:factory'"),
    ("tests.byo_models:", "expected 'package.module:factory'"),
    ("tests.no_such_module:f", "cannot import module"),
    ("tests.byo_models:missing", "has no attribute"),
    ("tests.byo_models:NOT_A_FACTORY", "not callable"),
    ("tests.byo_models:failing_factory", "factory raised"),
    ("tests.byo_models:not_a_module", "not a torch.nn.Module"),
    ("tests.byo_models:ReadsValues", "forward reading them fails"),
])
def test_bad_targets(target, fragment):
    with pytest.raises(ScenarioError) as info:
        import_model(target, (32,))
    message = str(info.value)
    assert fragment in message and target in message and "\n" not in message


@pytest.mark.parametrize("shape, fragment", [((3, 8, 8), "failed"), ((), "input_shape"),
                                             ((0,), "input_shape"), ("32", "input_shape")])
def test_bad_input_shape(shape, fragment):
    with pytest.raises(ScenarioError) as info:
        import_model(MLP, shape)
    message = str(info.value)
    assert fragment in message and MLP in message and "\n" not in message
