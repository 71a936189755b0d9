"""Torch modules built from the simulator's layer specs (`Layer.spec`, `simulator/zoo/README.md`).

`build_modules(workload)` returns one `nn.Module` per simulator layer, in order: module i takes
layer i's input (layer i-1's output) and returns layer i's output, so any contiguous range of
modules is a pipeline stage. Every module has exactly the parameters, GEMM shapes and output
shape the zoo counts (`tests/test_validator_models.py` checks all three layer by layer).

Choices:
* No dropout anywhere, so that a run is deterministic and matches single-process training. The
  zoo's GPT and BERT specs default to Megatron-LM's dropout, which the kernel and memory models
  count (masks, dropout kernels); `as_built` gives the workload as these modules run it, dropout
  0, and the validator predicts that one.
* BatchNorm runs in training mode like any `nn.BatchNorm2d`: its statistics come from the batch
  a module sees, so training on B/G samples per group is not bit-identical to full-batch
  training, and a batch of 1 sample fails on a 1x1 feature map (torch's own check).
* Attention is written out (Q K^T, scale, causal mask, softmax, P V) rather than with
  `scaled_dot_product_attention`, so its GEMMs are the zoo's `2 s^2 h` twice and it runs the
  same on every backend (`validator.attention_core`, also grouped-query attention and sliding
  windows). GELU is the exact (erf) form.
* LLaMA-family specs (rotary positions, RMSNorm: `simulator.zoo.llama`) are built by
  `validator.llama_modules` (`LLAMA_BUILDERS`), the others by `validator.layer_modules`;
  mixture-of-experts blocks by `validator.moe_modules`, InceptionV3's modules by
  `validator.inception_modules` (`EXTRA_BUILDERS`).
* Transformer weights start as GPT-2 / BERT do: N(0, 0.02) for linear and embedding weights,
  zero biases; CNN / MLP modules keep torch's default initialisation.
* **Tied LM head.** The zoo ties the LM head (GPT) / MLM decoder (BERT) weight to the token
  embedding and counts those V x h parameters once, in the embedding layer. A head built here
  is a standalone layer (possibly on another pipeline stage), so it holds its *own copy* of the
  weight; `build_modules` initialises the copy equal to the embedding table, after which the
  two train independently (no gradient is shared between them). Such copies are listed in the
  module's `tied_parameter_names`, and `count_params` skips them so that it reproduces the
  simulator's `num_params`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from simulator.errors import ScenarioError
from simulator.workload import Layer, Workload
from validator.inception_modules import INCEPTION_BUILDERS, complete_spec
from validator.layer_modules import BUILDERS, TIED_ATTRIBUTE, Embedding
from validator.llama_modules import LLAMA_BUILDERS, LlamaEmbedding, is_llama_spec
from validator.moe_modules import MOE_BUILDERS

EXTRA_BUILDERS = {**MOE_BUILDERS, **INCEPTION_BUILDERS}
"""Spec kinds with their own modules (`validator.moe_modules`, `validator.inception_modules`)."""


# ----------------------------------------------------------------------------- public API

DROPOUT_SPEC_KINDS = ("embedding", "transformer_block")
"""Zoo spec kinds whose dropout defaults to Megatron-LM's when the spec gives none
(`simulator.zoo.transformer`)."""


def _has_dropout(layer: Layer) -> bool:
    spec = layer.spec or {}
    return spec.get("dropout", 0.0) > 0 or (spec.get("kind") in DROPOUT_SPEC_KINDS and "dropout" not in spec)


def as_built(workload: Workload) -> Workload:
    """`workload` as `build_modules` runs it: every spec that has, or defaults to, dropout gets
    dropout 0 (these modules apply none), so a prediction counts no dropout kernel or mask the ranks
    do not run."""
    return replace(workload, layers=tuple(replace(layer, spec={**layer.spec, "dropout": 0.0}) if _has_dropout(layer)
                                          else layer for layer in workload.layers))


def as_built_note(workload: Workload) -> str | None:
    """What `as_built` changes in `workload`, as a line for the user (None where nothing)."""
    changed = [layer.name for layer in workload.layers if _has_dropout(layer)]
    if not changed:
        return None
    return (f"the validator's modules run no dropout: predicted with dropout 0 in {len(changed)} layers "
            f"({changed[0]}{', ...' if len(changed) > 1 else ''}), as they run; `ghpsim simulate` counts the "
            f"scenario's dropout")


def build_layer_module(layer: Layer, num_classes: int | None = None) -> nn.Module:
    """The torch module of one simulator layer, from `layer.spec` (ValueError naming the layer
    if the spec is empty, of an unknown kind, or inconsistent); `num_classes` (the workload's)
    for an Inception auxiliary classifier (`validator.inception_modules.complete_spec`)."""
    builder, spec = _builder(layer, num_classes)
    kind = spec["kind"]
    try:
        return builder(spec)
    except KeyError as error:
        raise ValueError(f"layer {layer.name!r}: spec of kind {kind!r} lacks {error}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"layer {layer.name!r}: bad {kind!r} spec: {error}") from None


class MissingSpec(ValueError):
    """A layer without a torch spec (a layer table's rows: `ghpsim import-model`, model.file or
    model.layers): it can be simulated but not built."""


def _builder(layer: Layer, num_classes: int | None) -> tuple:
    """(builder, spec) of one layer: MissingSpec without a spec, ValueError for an unknown kind."""
    spec = layer.spec or {}
    kind = spec.get("kind")
    if kind in INCEPTION_BUILDERS:
        spec = complete_spec(layer, num_classes)
    if not spec or kind is None:
        raise MissingSpec(f"layer {layer.name!r}: no spec; it can be simulated but not built "
                          f"as a torch module (layer tables carry no spec)")
    builder = EXTRA_BUILDERS.get(kind) or (LLAMA_BUILDERS if is_llama_spec(spec) else BUILDERS).get(kind)
    if builder is None:
        raise ValueError(f"layer {layer.name!r}: unknown spec kind {kind!r}; "
                         f"known: {', '.join(sorted({**BUILDERS, **EXTRA_BUILDERS}))}")
    return builder, spec


def check_torch_specs(workload: Workload, source: str = "model") -> None:
    """One-line ScenarioError naming `source` (the scenario's model field, `model_field`) and the
    first layer `build_layer_module` would refuse (no spec, or a kind without a builder), so that
    calibrate and validate refuse such a model before any rank starts."""
    num_classes = (workload.input_spec or {}).get("num_classes")
    for layer in workload.layers:
        try:
            _builder(layer, num_classes)
        except MissingSpec:
            raise ScenarioError(
                f"{source}: layer {layer.name!r} has no torch spec; a layer table without torch specs can be "
                "simulated but not calibrated or validated (calibrate a zoo model, model.name, or use this "
                "model with simulate / compare only)") from None
        except ValueError as error:
            raise ScenarioError(f"{source}: {error}") from None


def model_field(model) -> str:
    """The scenario field a model comes from, with its value: `model.file models/mlp.yaml`."""
    for key in ("file", "hf_config", "name"):
        if getattr(model, key, None) is not None:
            return f"model.{key} {getattr(model, key)}"
    return "model.layers"


def build_modules(workload: Workload, seed: int = 0) -> list[nn.Module]:
    """One module per layer (module i == layer i), initialised deterministically from `seed`.

    Seeds torch's global generator with `seed` and builds in order (the caller's generator
    state is restored afterwards). A tied head's own copy of the embedding weight is set equal
    to the (preceding) embedding layer's token table."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        num_classes = (workload.input_spec or {}).get("num_classes")
        modules = [build_layer_module(layer, num_classes) for layer in workload.layers]
    embedding = None
    for module in modules:
        if isinstance(module, (Embedding, LlamaEmbedding)):
            embedding = module
        elif getattr(module, TIED_ATTRIBUTE, ()) and embedding is not None:
            weight = module.tied_weight
            if weight.shape == embedding.token.weight.shape:
                with torch.no_grad():
                    weight.copy_(embedding.token.weight)
    return modules


def _task(workload: Workload) -> str:
    spec = workload.input_spec or {}
    return spec.get("task") or ("causal_lm" if "vocab_size" in spec else "classification")


def make_batch(workload: Workload, batch_size: int,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic synthetic (inputs, targets) for `workload.input_spec`.

    * images `[C, H, W]`: float32 N(0, 1) `[B, C, H, W]`; MLP `[D]`: float32 `[B, D]`;
      targets: class ids `[B]` in `[0, num_classes)`.
    * tokens (`vocab_size` given): int64 ids `[B, S]`, targets the next tokens `[B, S]` (one
      sequence of S + 1 tokens, shifted by one); also for `masked_lm`, which only needs some
      token targets to train on.
    Uses a private generator: the global RNG is untouched."""
    spec = workload.input_spec or {}
    if "shape" not in spec:
        raise ValueError(f"workload {workload.name!r}: input_spec has no 'shape'; "
                         f"cannot make a batch")
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    generator = torch.Generator().manual_seed(seed)
    shape = [int(d) for d in spec["shape"]]
    if _task(workload) in ("causal_lm", "masked_lm"):
        (seq,) = shape
        tokens = torch.randint(0, int(spec["vocab_size"]), (batch_size, seq + 1),
                               generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if "num_classes" not in spec:
        raise ValueError(f"workload {workload.name!r}: input_spec has no 'num_classes'")
    inputs = torch.randn(batch_size, *shape, generator=generator, dtype=torch.float32)
    targets = torch.randint(0, int(spec["num_classes"]), (batch_size,), generator=generator)
    return inputs, targets


def loss_fn(workload: Workload, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy: over samples for classification, over all B x S tokens for LMs."""
    if _task(workload) in ("causal_lm", "masked_lm"):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def count_params(modules: nn.Module | Iterable[nn.Module]) -> int:
    """Parameters of `modules` (one module or several) under the simulator's convention: each
    parameter once, tied copies (`tied_parameter_names`) not at all."""
    if isinstance(modules, nn.Module):
        modules = [modules]
    seen: set[int] = set()
    total = 0
    for module in modules:
        skipped = set()
        for owner_name, owner in module.named_modules():
            for tied in getattr(owner, TIED_ATTRIBUTE, ()):
                skipped.add(f"{owner_name}.{tied}" if owner_name else tied)
        for name, parameter in module.named_parameters(remove_duplicate=False):
            if name in skipped or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            total += parameter.numel()
    return total


__all__ = ["BUILDERS", "build_layer_module", "build_modules", "count_params", "loss_fn",
           "make_batch"]
