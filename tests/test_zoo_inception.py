"""InceptionV3 in the simulate zoo: torchvision's parameter counts and multiply-adds, the layer chain,
and `ghpsim simulate` runs it (it was known to `ghpsim search` only)."""

import pytest

from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.zoo import MODELS, build_model

TORCHVISION_PARAMS = 27_161_264
"""torchvision `Inception_V3_Weights.IMAGENET1K_V1.meta["num_params"]` (auxiliary classifier included)."""
TORCHVISION_GMACS = 5.71
"""torchvision's table, "GFLOPS 5.71" at 299x299: multiply-adds of the eval-mode model (no auxiliary head)."""


def test_parameter_counts_match_torchvision_with_and_without_the_auxiliary_classifier():
    assert build_model("inception_v3").num_params == TORCHVISION_PARAMS
    aux = 768 * 128 + 2 * 128 + 128 * 25 * 768 + 2 * 768 + 768 * 1000 + 1000
    assert build_model("inception_v3", aux_logits=False).num_params == TORCHVISION_PARAMS - aux == 23_834_568


def test_forward_flops_are_twice_torchvisions_multiply_adds_plus_the_elementwise_terms():
    flops = build_model("inception_v3", aux_logits=False).forward_flops_per_sample
    assert 2 * TORCHVISION_GMACS * 1e9 <= flops <= 2 * TORCHVISION_GMACS * 1e9 * 1.01  # BN, ReLU, pools < 1 %


def test_layers_chain_shapes_from_299_to_the_2048_channel_8x8_map():
    workload = build_model("inception_v3")
    names = [layer.name for layer in workload.layers]
    assert names[:5] == ["conv1a", "conv2a", "conv2b", "conv3b", "conv4a"] and names[-1] == "head"
    assert len(names) == 17 and "mixed6e" in names
    for before, after in zip(workload.layers, workload.layers[1:]):
        assert before.output_elements_per_sample == after.input_elements_per_sample, after.name
    by_name = {layer.name: layer for layer in workload.layers}
    assert by_name["mixed5b"].output_elements_per_sample == 256 * 35 * 35
    assert by_name["mixed6a"].output_elements_per_sample == 768 * 17 * 17
    assert by_name["mixed7c"].output_elements_per_sample == 2048 * 8 * 8
    assert by_name["mixed6e"].spec["aux_logits"] is True
    assert workload.layers[-1].output_elements_per_sample == 1000
    assert "inception_v3" in MODELS


def test_image_size_below_the_stem_minimum_is_refused_by_name():
    with pytest.raises(ValueError, match="image_size 64"):
        build_model("inception_v3", image_size=64)


def test_simulate_runs_inception_v3():
    scenario = load_scenario("scenarios/resnet50_dp_a100.yaml",
                             ["model.name=inception_v3", "cluster.num_nodes=1", "cluster.gpus_per_node=2",
                              "training.global_batch_size=64"])
    summary = simulate(scenario).summary
    assert summary["model"] == "inception_v3" and summary["step_time_s"] > 0
    assert summary["num_gpus"] == 2


def test_the_validator_builds_an_inception_module_with_the_zoo_s_parameters():
    pytest.importorskip("torch")
    from validator.models import build_layer_module
    layer = next(layer for layer in build_model("inception_v3").layers if layer.name == "mixed5b")
    module = build_layer_module(layer)
    assert sum(p.numel() for p in module.parameters()) == layer.num_params
