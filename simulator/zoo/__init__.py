"""Analytic model zoo: per-layer FLOPs, parameters and activation sizes of well-known DNNs.

``MODELS`` maps a zoo name to a factory ``factory(**params) -> Workload``; ``build_model`` looks a
name up and calls it.  Every factory takes keyword parameters only (unknown ones raise
TypeError): CNNs take ``width_multiplier``, ``image_size`` and ``num_classes``; ``resnet_cifar``
also ``depth`` and ``variant``; ``mlp`` takes ``input_dim``, ``hidden_dim``,
``num_hidden_layers``, ``num_classes``; transformers take ``num_layers``, ``hidden_size``,
``num_heads``, ``seq_len``, ``vocab_size`` (and optional ``ffn_hidden_size``, ``max_positions``);
the LLaMA family (``llama``, ``llama2-7b`` ... ``llama3-405b``) also ``num_kv_heads`` and
``tie_embeddings``.
Conventions and the ``spec`` schema: ``simulator/zoo/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.workload import Workload
from simulator.zoo.cnn import alexnet, vgg16
from simulator.zoo.llama import LLAMA_MODELS
from simulator.zoo.mlp import mlp
from simulator.zoo.resnet import (
    resnet20,
    resnet50,
    resnet56,
    resnet101,
    resnet110,
    resnet1001,
    resnet_cifar,
)
from simulator.zoo.transformer import (
    bert_large,
    gpt2_1_5b,
    gpt2_small,
    gpt3_175b,
    transformer,
)

MODELS: dict[str, Callable[..., Workload]] = {
    "resnet20": resnet20,
    "resnet56": resnet56,
    "resnet110": resnet110,
    "resnet1001": resnet1001,
    "resnet_cifar": resnet_cifar,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "vgg16": vgg16,
    "alexnet": alexnet,
    "mlp": mlp,
    "transformer": transformer,
    "gpt2-small": gpt2_small,
    "gpt2-1.5b": gpt2_1_5b,
    "gpt3-175b": gpt3_175b,
    "bert-large": bert_large,
    **LLAMA_MODELS,
}


def build_model(name: str, **params) -> Workload:
    """Build zoo model `name` with factory keyword `params`; KeyError(name) if unknown."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise KeyError(name) from None
    return factory(**params)


__all__ = ["MODELS", "build_model"]
