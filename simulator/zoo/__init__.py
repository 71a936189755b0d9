"""Analytic model zoo: per-layer FLOPs, parameters and activation sizes of well-known DNNs.

``MODELS`` maps a zoo name to a factory ``factory(**params) -> Workload``; ``build_model`` looks a
name up and calls it.  Every factory takes keyword parameters only (unknown ones raise
TypeError): CNNs take ``width_multiplier``, ``image_size`` and ``num_classes``
(``inception_v3``: ``image_size``, ``num_classes``, ``aux_logits``); ``resnet_cifar``
also ``depth`` and ``variant``; ``mlp`` takes ``input_dim``, ``hidden_dim``,
``num_hidden_layers``, ``num_classes``; transformers take ``num_layers``, ``hidden_size``,
``num_heads``, ``seq_len``, ``vocab_size`` (and optional ``ffn_hidden_size``, ``max_positions``,
``sliding_window`` for GPT and LLaMA decoders, ``dropout`` for GPT and BERT);
the LLaMA family (``llama``, ``llama2-7b`` ... ``llama3-405b``) also ``num_kv_heads`` and
``tie_embeddings``; mixtures of experts (``moe``, ``mixtral-8x7b``, ``deepseek-moe-16b``) also
``num_experts``, ``top_k``, ``expert_ffn_hidden_size``, ``num_shared_experts``,
``num_dense_layers``, ``dense_ffn_hidden_size`` and ``capacity_factor`` (``simulator/zoo/moe.py``).
Conventions and the ``spec`` schema: ``simulator/zoo/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.workload import Workload
from simulator.zoo.cnn import alexnet, vgg16
from simulator.zoo.inception import inception_v3
from simulator.zoo.llama import LLAMA_MODELS
from simulator.zoo.mlp import mlp
from simulator.zoo.moe import MOE_MODELS
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
    "inception_v3": inception_v3,
    "mlp": mlp,
    "transformer": transformer,
    "gpt2-small": gpt2_small,
    "gpt2-1.5b": gpt2_1_5b,
    "gpt3-175b": gpt3_175b,
    "bert-large": bert_large,
    **LLAMA_MODELS,
    **MOE_MODELS,
}


def build_model(name: str, **params) -> Workload:
    """Build zoo model `name` with factory keyword `params`; KeyError(name) if unknown."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise KeyError(name) from None
    return factory(**params)


__all__ = ["MODELS", "build_model"]
