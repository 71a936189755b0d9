"""Tests of the analytic model zoo (simulator/zoo): counts against published figures, chain
consistency, FLOP conventions and scaled-down variants."""

from __future__ import annotations

import pytest

from simulator.workload import Workload
from simulator.zoo import MODELS, build_model

EXPECTED_NAMES = {
    "resnet20", "resnet56", "resnet110", "resnet1001", "resnet_cifar", "resnet50", "resnet101",
    "vgg16", "alexnet", "mlp", "transformer", "gpt2-small", "gpt2-1.5b", "gpt3-175b",
    "bert-large",
}
LAYER_KINDS = {"conv", "linear", "attention", "embedding", "norm", "pool", "elementwise"}

_CACHE: dict[str, Workload] = {}


def model(name: str) -> Workload:
    if name not in _CACHE:
        _CACHE[name] = build_model(name)
    return _CACHE[name]


# --- registry ---------------------------------------------------------------------------------

def test_registry_names():
    assert EXPECTED_NAMES <= set(MODELS)


def test_unknown_model_raises_key_error():
    with pytest.raises(KeyError, match="nope"):
        build_model("nope")


@pytest.mark.parametrize("name", ["resnet20", "resnet50", "vgg16", "mlp", "gpt2-small",
                                  "bert-large", "transformer"])
def test_unknown_kwarg_raises_type_error(name):
    with pytest.raises(TypeError):
        build_model(name, no_such_param=1)


# --- parameter counts -------------------------------------------------------------------------

# (zoo name, published count, source); compared within 1%.
PUBLISHED_PARAMS = [
    ("resnet50", 25_557_032, "torchvision resnet50"),
    ("resnet101", 44_549_160, "torchvision resnet101"),
    ("vgg16", 138_357_544, "torchvision vgg16"),
    ("alexnet", 61_100_840, "torchvision alexnet"),
    ("bert-large", 335_174_458, "HF BertForMaskedLM bert-large-uncased (MLM head, no pooler)"),
    ("bert-large", 335_141_888, "HF BertModel bert-large-uncased (pooler, no MLM head)"),
    ("gpt2-small", 124_439_808, "HF gpt2"),
    ("gpt2-1.5b", 1_558e6, "GPT-2 XL, Radford et al. 2019"),
    ("gpt3-175b", 175e9, "Brown et al. 2020"),
    ("resnet1001", 10_327_706, "osmr/imgclsmob preresnet1001_cifar10"),
    ("resnet110", 1_727_962, "option-A CIFAR ResNet-110 implementation count"),
    ("resnet56", 853_018, "option-A CIFAR ResNet-56 implementation count"),
    ("resnet20", 269_722, "option-A CIFAR ResNet-20 implementation count"),
]


@pytest.mark.parametrize("name,published,source", PUBLISHED_PARAMS)
def test_params_match_published(name, published, source):
    assert model(name).num_params == pytest.approx(published, rel=0.01), source


# Paper figures rounded to 2-3 significant digits (He et al. 2016 Table 6; Identity Mappings
# Table 2): our count must round to the printed figure, except ResNet-1001 whose printed 10.2M
# omits ~149K BatchNorm affine parameters (10.33M with them, 10.18M without).
@pytest.mark.parametrize("name,printed,unit", [
    ("resnet20", 0.27, 1e6), ("resnet56", 0.85, 1e6), ("resnet110", 1.7, 1e6)])
def test_cifar_params_round_to_paper_figures(name, printed, unit):
    digits = len(str(printed).split(".")[1])
    assert round(model(name).num_params / unit, digits) == printed


def test_resnet1001_vs_paper():
    w = model("resnet1001")
    assert w.num_params == pytest.approx(10.2e6, rel=0.015)
    bn_params = sum(2 * c for c in _resnet1001_bn_channels())
    assert round((w.num_params - bn_params) / 1e6, 1) == 10.2


def _resnet1001_bn_channels():
    """BN channel counts of the pre-activation bottleneck ResNet-1001 (3 BNs per block + head)."""
    for width in (16, 32, 64):
        for i in range(111):
            cin = (16 if width == 16 else 2 * width) if i == 0 else 4 * width
            yield from (cin, width, width)
    yield 256


def test_gpt_weight_tying_counted_once():
    w = build_model("transformer", num_layers=2, hidden_size=64, num_heads=4, seq_len=16,
                    vocab_size=100)
    emb, head = w.layers[0], w.layers[-1]
    assert emb.num_params == 100 * 64 + 16 * 64
    assert head.num_params == 2 * 64  # final LayerNorm only; projection tied to the embedding
    assert head.forward_flops_per_sample >= 2 * 16 * 64 * 100
    assert all(b.num_params == 12 * 64 ** 2 + 13 * 64 for b in w.layers[1:-1])


# --- FLOPs ------------------------------------------------------------------------------------

def test_resnet50_forward_flops():
    assert model("resnet50").forward_flops_per_sample == pytest.approx(2 * 4.09e9, rel=0.05)


def test_resnet101_forward_flops():
    assert model("resnet101").forward_flops_per_sample == pytest.approx(2 * 7.80e9, rel=0.05)


def test_vgg16_forward_flops():
    assert model("vgg16").forward_flops_per_sample == pytest.approx(2 * 15.47e9, rel=0.05)


def test_alexnet_forward_flops():
    assert model("alexnet").forward_flops_per_sample == pytest.approx(2 * 0.714e9, rel=0.05)


def _megatron_forward(l, h, s, v):
    """Narayanan et al. 2021: fwd+bwd = 72 B s l h^2 (1 + s/6h + V/16lh) = 3x forward."""
    return 72 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)) / 3


@pytest.mark.parametrize("name", ["gpt3-175b", "gpt2-1.5b", "gpt2-small"])
def test_gpt_forward_flops_match_megatron_formula(name):
    w = model(name)
    emb, head = w.layers[0].spec, w.layers[-1].spec
    l, h, s, v = w.num_layers - 2, emb["hidden_size"], emb["seq_len"], emb["vocab_size"]
    # exact GEMM part: 24sh^2 + 4s^2h per block + 2shV for the head
    gemm = l * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * v
    assert w.forward_flops_per_sample == pytest.approx(gemm, rel=0.02)
    if name == "gpt3-175b":
        assert w.forward_flops_per_sample == pytest.approx(_megatron_forward(l, h, s, v),
                                                           rel=0.05)
        kaplan = 2 * w.num_params * s + 2 * l * s * s * h  # Kaplan et al. 2020, per token x s
        assert w.forward_flops_per_sample == pytest.approx(kaplan, rel=0.05)


@pytest.mark.parametrize("name", ["gpt3-175b", "bert-large"])
def test_transformer_training_is_three_forwards(name):
    w = model(name)
    assert w.flops_per_sample == pytest.approx(3 * w.forward_flops_per_sample)


def test_transformer_block_saved_elements():
    s, h, a = 2048, 12288, 96
    block = model("gpt3-175b").layers[1]
    assert block.saved_elements_per_sample == 16 * s * h + a * s * s  # Korthikanti et al. 2022


# --- chain consistency and per-layer sanity ---------------------------------------------------

@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_chain_consistency(name):
    w = model(name)
    assert w.num_layers >= 2
    for prev, nxt in zip(w.layers, w.layers[1:]):
        assert prev.output_elements_per_sample == nxt.input_elements_per_sample, (prev, nxt)
    for layer in w.layers:
        assert layer.kind in LAYER_KINDS
        assert layer.spec["kind"]
        assert layer.forward_flops_per_sample > 0
        assert layer.input_elements_per_sample > 0
        assert layer.output_elements_per_sample > 0
        assert layer.saved_elements_per_sample > 0
        assert layer.num_params >= 0
        ratio = 2.0 if layer.num_params > 0 else 1.0
        expected_backward = ratio * layer.forward_flops_per_sample
        assert layer.backward_flops_per_sample == pytest.approx(expected_backward)
    first_in = w.layers[0].input_elements_per_sample
    shape = w.input_spec["shape"]
    assert first_in == _prod(shape)
    assert len({layer.name for layer in w.layers}) == w.num_layers


def _prod(values):
    out = 1
    for v in values:
        out *= v
    return out


def test_output_is_classes_or_logits():
    assert model("resnet50").layers[-1].output_elements_per_sample == 1000
    assert model("resnet20").layers[-1].output_elements_per_sample == 10
    assert model("bert-large").layers[-1].output_elements_per_sample == 512 * 30522
    assert model("gpt2-small").layers[-1].output_elements_per_sample == 1024 * 50257


def test_layer_counts():
    assert model("resnet20").num_layers == 1 + 9 + 1
    assert model("resnet1001").num_layers == 1 + 333 + 1
    assert model("resnet50").num_layers == 1 + 16 + 1
    assert model("vgg16").num_layers == 16
    assert model("alexnet").num_layers == 8
    assert model("gpt3-175b").num_layers == 98
    assert model("mlp").num_layers == 5


# --- scaled-down variants ---------------------------------------------------------------------

def test_width_multiplier_resnet56_quarter():
    full, small = model("resnet56"), build_model("resnet56", width_multiplier=0.25)
    assert small.num_params == pytest.approx(full.num_params / 16, rel=0.2)
    assert small.forward_flops_per_sample < full.forward_flops_per_sample / 10


@pytest.mark.parametrize("name,params", [
    ("resnet20", {"width_multiplier": 0.5, "image_size": 16, "num_classes": 5}),
    ("resnet1001", {"width_multiplier": 0.25, "image_size": 16}),
    ("resnet50", {"width_multiplier": 0.125, "image_size": 64, "num_classes": 10}),
    ("resnet101", {"width_multiplier": 0.125, "image_size": 32}),
    ("vgg16", {"width_multiplier": 0.125, "image_size": 32, "num_classes": 10}),
    ("alexnet", {"width_multiplier": 0.125, "image_size": 64, "num_classes": 10}),
    ("gpt2-small", {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32,
                    "vocab_size": 128}),
    ("gpt3-175b", {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32,
                   "vocab_size": 128}),
    ("bert-large", {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_len": 32,
                    "vocab_size": 128}),
])
def test_scaled_variants_shrink(name, params):
    full, small = model(name), build_model(name, **params)
    assert small.num_params < full.num_params
    assert small.forward_flops_per_sample < full.forward_flops_per_sample
    for prev, nxt in zip(small.layers, small.layers[1:]):
        assert prev.output_elements_per_sample == nxt.input_elements_per_sample


def test_resnet_cifar_generic():
    assert build_model("resnet_cifar", depth=56).num_params == model("resnet56").num_params
    assert (build_model("resnet_cifar", depth=1001, variant="preact_bottleneck").num_params
            == model("resnet1001").num_params)
    assert build_model("resnet_cifar", depth=164, variant="preact_bottleneck").num_params \
        == 1_703_258  # imgclsmob preresnet164bn_cifar10; Identity Mappings: 1.7M
    with pytest.raises(ValueError):
        build_model("resnet_cifar", depth=21)


def test_image_size_too_small_raises():
    with pytest.raises(ValueError):
        build_model("alexnet", image_size=32)


def test_invalid_transformer_config():
    with pytest.raises(ValueError):
        build_model("transformer", hidden_size=100, num_heads=3)


def test_mlp_configurable():
    w = build_model("mlp", input_dim=20, hidden_dim=8, num_hidden_layers=2, num_classes=3)
    assert w.num_params == (20 * 8 + 8) + (8 * 8 + 8) + (8 * 3 + 3)
    assert w.forward_flops_per_sample >= 2 * (20 * 8 + 8 * 8 + 8 * 3)
    assert w.input_spec == {"shape": [20], "num_classes": 3, "task": "classification"}


def test_input_specs():
    assert model("resnet50").input_spec["shape"] == [3, 224, 224]
    assert model("resnet20").input_spec["num_classes"] == 10
    assert model("gpt3-175b").input_spec == {"shape": [2048], "vocab_size": 50257,
                                             "task": "causal_lm"}
    assert model("bert-large").input_spec["task"] == "masked_lm"


def test_gpt_dropout_zero_launches_no_dropout_kernels_and_keeps_no_masks():
    from simulator.kernels import layer_kernels
    from simulator.memory_activations import Sharding, block_bytes
    default, none = build_model("gpt2-small"), build_model("gpt2-small", dropout=0.0)
    assert default.num_params == none.num_params and "dropout" not in default.layers[1].spec
    names = {kernel.name for kernel in layer_kernels(none.layers[1], "F", 1, dtype="bf16")}
    assert not any("dropout" in name for name in names)
    assert any("dropout" in k.name for k in layer_kernels(default.layers[1], "F", 1, dtype="bf16"))
    sharding = Sharding()
    kept_none, _ = block_bytes(none.layers[1].spec, 2, sharding)
    kept_default, _ = block_bytes(default.layers[1].spec, 2, sharding)
    assert kept_none < kept_default


@pytest.mark.parametrize("dropout", [-0.1, 1.0])
def test_gpt_dropout_outside_zero_to_one_is_refused(dropout):
    with pytest.raises(ValueError, match="dropout"):
        build_model("transformer", dropout=dropout)


def test_every_factory_shows_its_keywords_with_annotations():
    """`model.params` are checked against each factory's signature (`simulator.model_source.checked_params`):
    one that forwards **overrides shows the keywords it forwards, annotated, with its own defaults."""
    import inspect
    for name, factory in MODELS.items():
        parameters = inspect.signature(factory, eval_str=True).parameters.values()
        assert parameters and all(p.kind == p.KEYWORD_ONLY for p in parameters), name
        assert all(p.annotation is not inspect.Parameter.empty and not isinstance(p.annotation, str)
                   for p in parameters), name
    assert inspect.signature(MODELS["gpt2-1.5b"]).parameters["num_layers"].default == 48
    assert inspect.signature(MODELS["bert-large"]).parameters["seq_len"].default == 512
