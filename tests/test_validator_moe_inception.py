"""The validator's mixture-of-experts and InceptionV3 modules (`validator/moe_modules.py`,
`validator/inception_modules.py`) against the zoo (`simulator.zoo.moe`, `simulator.zoo.inception`):
- layer by layer, each module's parameters equal the zoo's `num_params` and its output (and input)
  element count per sample the zoo's; a forward + backward through the chain gives a finite loss
  near ln(classes) and a finite gradient for every parameter;
- the MoE router keeps each token's top-k experts with weights summing to 1 (Mixtral), and the
  block equals a per-token loop over those experts;
- (slow) 2-process data-parallel training of a small MoE over gloo ends with the parameters of
  single-process full-batch training (1e-5 relative, as `tests/test_validator_llama.py`);
- full-size InceptionV3 on the meta device: torchvision's parameter count and, layer by layer, the
  zoo's forward FLOPs exactly. (MoE routing is data-dependent: it cannot run on meta.)"""

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from simulator.grid_symmetry import every_rank  # noqa: E402
from simulator import simulate  # noqa: E402
from simulator.zoo import build_model  # noqa: E402
from validator.layers_flops import ForwardFlopCounter  # noqa: E402
from validator.models import build_layer_module, build_modules, count_params, loss_fn, make_batch  # noqa: E402
from validator.moe_modules import MoEBlock  # noqa: E402
from tests.test_validator_llama import (LR, STEPS, relative_error, trained_on_two_ranks_and_alone,  # noqa: E402
                                        two_rank_cpu_scenario)

BATCH = 2
SMALL_MOE = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "seq_len": 16,
             "vocab_size": 128, "num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32}
CASES = {
    "moe": ("moe", SMALL_MOE),
    "moe-shared-dense": ("moe", {**SMALL_MOE, "num_layers": 3, "num_shared_experts": 1, "num_dense_layers": 1,
                                 "dense_ffn_hidden_size": 96}),
    "deepseek-moe-16b": ("deepseek-moe-16b", {**SMALL_MOE, "num_experts": 6, "top_k": 3,
                                              "expert_ffn_hidden_size": 16, "dense_ffn_hidden_size": 96}),
    "inception_v3-75": ("inception_v3", {"image_size": 75, "num_classes": 10, "aux_logits": False}),
    # the auxiliary classifier needs Mixed_6e's 17x17 map: image_size 299 (the zoo refuses less)
    "inception_v3-aux": ("inception_v3", {"image_size": 299, "num_classes": 10}),
}
_RUNS: dict[str, dict] = {}


def run_case(case: str) -> dict:
    """Build the case, run the chain layer by layer, then backward."""
    if case in _RUNS:
        return _RUNS[case]
    name, params = CASES[case]
    workload = build_model(name, **params)
    modules = build_modules(workload, seed=0)
    x, targets = make_batch(workload, BATCH, seed=0)
    rows = []
    for layer, module in zip(workload.layers, modules):
        out = module(x)
        rows.append((layer, count_params(module), x[0].numel(), out[0].numel()))
        x = out
    loss = loss_fn(workload, x, targets)
    loss.backward()
    grads_ok = all(p.grad is not None and bool(torch.isfinite(p.grad).all())
                   for module in modules for p in module.parameters())
    _RUNS[case] = {"workload": workload, "rows": rows, "loss": float(loss.detach()), "grads_ok": grads_ok,
                   "modules": modules}
    return _RUNS[case]


@pytest.mark.parametrize("case", CASES)
def test_params_per_layer_equal_the_zoo(case):
    run = run_case(case)
    kinds = {layer.spec["kind"] for layer, *_ in run["rows"]}
    assert kinds & {"moe_block", "inception_module"}
    for layer, params, _, _ in run["rows"]:
        assert params == layer.num_params, layer.name
    assert count_params(run["modules"]) == run["workload"].num_params


@pytest.mark.parametrize("case", CASES)
def test_elements_per_sample_equal_the_zoo(case):
    for layer, _, inputs, outputs in run_case(case)["rows"]:
        assert inputs == layer.input_elements_per_sample, layer.name
        assert outputs == layer.output_elements_per_sample, layer.name


@pytest.mark.parametrize("case", CASES)
def test_chain_forward_backward(case):
    run = run_case(case)
    assert math.isfinite(run["loss"]) and run["grads_ok"]
    spec = run["workload"].input_spec
    classes = spec.get("num_classes") or spec["vocab_size"]
    assert abs(run["loss"] - math.log(classes)) < 0.5 * math.log(classes)


def test_auxiliary_classifier_runs_in_training_only_and_gets_a_zero_gradient():
    run = run_case("inception_v3-aux")
    layer_index = next(i for i, (layer, *_) in enumerate(run["rows"]) if layer.spec.get("aux_logits"))
    module = run["modules"][layer_index]
    assert run["rows"][layer_index][0].name == "mixed6e" and module.aux.fc.out_features == 10
    assert all(bool((p.grad == 0).all()) for p in module.aux.parameters())
    assert any(bool((p.grad != 0).any()) for p in module.branches.parameters())
    calls = []
    handle = module.aux.register_forward_hook(lambda *args: calls.append(1))
    x = torch.randn(2, 768, 17, 17)
    module.eval()
    with torch.no_grad():
        evaluated = module(x)
    module.train()
    assert not calls
    assert module(x).shape == evaluated.shape == (2, 768, 17, 17)
    assert len(calls) == 1
    handle.remove()


def moe_spec(**change):
    layer = next(l for l in build_model("moe", **SMALL_MOE).layers if l.spec.get("kind") == "moe_block")
    return {**layer.spec, **change}


@pytest.mark.parametrize("normalise", [True, False])
def test_moe_block_equals_a_per_token_loop_over_its_top_k_experts(normalise):
    torch.manual_seed(5)
    block = MoEBlock(moe_spec(shared_ffn_hidden_size=32, norm_topk_prob=normalise)).double()
    y = torch.randn(2, 16, 64, dtype=torch.float64)
    weights, chosen = block.route(y.reshape(-1, 64))
    assert chosen.shape == (32, 2) and bool((chosen[:, 0] != chosen[:, 1]).all())
    sums = weights.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums)) == normalise
    logits = y.reshape(-1, 64) @ block.router.weight.T
    expected = []
    for token, row in enumerate(y.reshape(-1, 64)):
        top = logits[token].topk(2)
        gates = top.values.softmax(-1) if normalise else logits[token].softmax(-1)[top.indices]
        out = sum(g * block.experts[int(e)](row) for g, e in zip(gates, top.indices))
        expected.append(out + block.shared(row))
    assert torch.allclose(block.mlp(y), torch.stack(expected).reshape(2, 16, 64), atol=1e-12)


def test_inconsistent_moe_and_inception_specs_are_refused_by_name():
    layer = next(l for l in build_model("moe", **SMALL_MOE).layers if l.spec.get("kind") == "moe_block")
    for change, message in [({"top_k": 5}, "top_k 5 exceeds num_experts 4"),
                            ({"num_kv_heads": 3}, "num_heads 4 not divisible by num_kv_heads 3")]:
        bad = replace(layer, spec={**layer.spec, **change})
        with pytest.raises(ValueError, match=f"layer 'block0': bad 'moe_block' spec: {message}"):
            build_layer_module(bad)
    mixed = next(l for l in build_model("inception_v3", image_size=75, aux_logits=False).layers
                 if l.spec.get("module") == "C")
    renamed = replace(mixed, name="custom")
    with pytest.raises(ValueError, match="layer 'custom'.*lacks 'channels_7x7'"):
        build_layer_module(renamed)


# --- two processes against one -------------------------------------------------------------------

DP_BATCH = 8
TINY_MOE = {"name": "moe", "params": {"num_layers": 3, "hidden_size": 32, "num_heads": 4, "num_kv_heads": 2,
                                      "seq_len": 8, "vocab_size": 64, "num_experts": 4, "top_k": 2,
                                      "expert_ffn_hidden_size": 16, "num_shared_experts": 1,
                                      "num_dense_layers": 1, "dense_ffn_hidden_size": 48}}


@pytest.mark.slow
def test_two_process_moe_training_equals_single_process_training():
    result = simulate(every_rank(two_rank_cpu_scenario(TINY_MOE, DP_BATCH, "dp")))
    measured, reference, initial = trained_on_two_ranks_and_alone(result, DP_BATCH)
    assert set(measured) == set(reference)
    assert any("experts" in name for name in reference)
    assert max(relative_error(measured[name], reference[name]) for name in reference) <= 1e-5
    assert max(relative_error(reference[name], initial[name]) for name in reference) > 1e-3


def test_full_size_inception_v3_on_meta_has_the_zoo_parameters_and_forward_flops():
    """torchvision's 27,161,264 parameters (with the auxiliary classifier) and, layer by layer,
    the zoo's forward FLOPs (`validator.layers_flops`: GEMMs and the zoo's elementwise constants),
    a batch of 2 (BatchNorm in training mode refuses 1 sample on the auxiliary classifier's 1x1 map)."""
    workload = build_model("inception_v3")
    with torch.device("meta"):
        modules = [build_layer_module(layer, 1000) for layer in workload.layers]
        x = torch.empty(2, 3, 299, 299)
    assert count_params(modules) == workload.num_params == 27_161_264
    with ForwardFlopCounter() as counter:
        for layer, module in zip(workload.layers, modules):
            before = counter.total
            x = module(x)
            assert counter.total - before == 2 * layer.forward_flops_per_sample, layer.name
            assert x[0].numel() == layer.output_elements_per_sample, layer.name
